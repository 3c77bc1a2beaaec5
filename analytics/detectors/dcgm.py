"""What dcgm-exporter's series say about a GPU, for the detectors that read them whether or not fleetlens's
exporter runs beside (docs/stock-exporters.md says what each detector reads and what it falls back to).

- Clock-event reasons: fleetlens's exporter names each active reason (fleetlens_gpu_clock_throttle_reason
  {reason} = 1); dcgm-exporter can export the raw NVML bitmask instead, as DCGM field 112, named
  DCGM_FI_DEV_CLOCK_THROTTLE_REASONS before DCGM 3.3 and DCGM_FI_DEV_CLOCKS_EVENT_REASONS since. Neither
  is in dcgm-exporter's default counter set. The bits are NVML's nvmlClocksEventReason* values, the
  exporter's table (collectors.gpu.model.THROTTLE_REASONS, the one arrow from analytics to collectors).
- A GPU that answers: fleetlens's exporter says so per scrape (fleetlens_gpu_up). dcgm-exporter skips a
  field DCGM answers blank for, and exports nothing of a GPU DCGM lost, so the series of a few readings
  every GPU has stand for "it answered" (ANSWERS). The last-Xid gauge is not one of them: it keeps its
  value until dcgm-exporter restarts (NVIDIA/dcgm-exporter#500), whatever the GPU does.
- PCIe links: fleetlens's own link gauges, or DCGM's link fields where a user enabled them.
"""

from __future__ import annotations

from collections.abc import Sequence

from collectors.gpu.model import THROTTLE_REASONS

CLOCK_EVENT_REASONS = "fleetlens_gpu_clock_throttle_reason"  # {reason} = 1 while NVML reports it
CLOCK_EVENT_MASKS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
# NVML's clocks-event reason bits, under the reason names fleetlens's exporter gives them: defined once,
# beside the GPU collectors (standard library only; the one module of collectors analytics may import)
CLOCK_EVENT_BITS = THROTTLE_REASONS
MASK_LIMIT = 1 << 32  # a mask reading at or above this (or negative, NaN, infinite) is no mask: no reason

# Readings of dcgm-exporter's default counter set that every GPU has, one series each per GPU: while
# either is exported, DCGM still reads the GPU. Two basic ones, not every field: each one more is read
# over gpu_fault's whole lookback for every GPU, and DCGM blanks the utilisation fields after some Xids
# (NVIDIA/DCGM#202), not the clock and temperature.
ANSWERS = ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP")
GPU_UP = "fleetlens_gpu_up"

# Each PCIe link figure: fleetlens's gauge and DCGM's field (fields 235-238), the first one present read.
PCIE_LINK = {
    "gen": ("fleetlens_gpu_pcie_link_generation", "DCGM_FI_DEV_PCIE_LINK_GEN"),
    "width": ("fleetlens_gpu_pcie_link_width", "DCGM_FI_DEV_PCIE_LINK_WIDTH"),
    "max_gen": ("fleetlens_gpu_pcie_max_link_generation", "DCGM_FI_DEV_PCIE_MAX_LINK_GEN"),
    "max_width": ("fleetlens_gpu_pcie_max_link_width", "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH"),
}


def metric_in(names: Sequence[str]) -> str:
    """SQL: whether the row's `metric` is one of `names` (constants of this package, never outside text)."""
    return f"metric IN ({', '.join(repr(name) for name in names)})"


def mask_reasons(mask: str) -> str:
    """SQL: the reason names (CLOCK_EVENT_BITS) of the bits set in the SQL expression `mask`, an NVML
    clocks-event bitmask as a Float64; none for a value that is no mask (MASK_LIMIT)."""
    names = ", ".join(repr(name) for name in CLOCK_EVENT_BITS)
    bits = ", ".join(str(bit) for bit in CLOCK_EVENT_BITS.values())
    valid = f"isFinite({mask}) AND {mask} >= 0 AND {mask} < {MASK_LIMIT}"
    return (
        f"arrayFilter((name, bit) -> bitAnd(toUInt64(if({valid}, {mask}, 0)), bit) != 0, [{names}], [{bits}])"
    )

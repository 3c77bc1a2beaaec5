"""What the GPU collectors and backends share: how a GPU is named, what one reading of it holds, and
the backend protocol that NVML and the simulator both answer (dcgm-exporter's units and labels)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")  # dcgm-exporter's, on the series of one MIG GPU instance
MIB = 1024 * 1024
GIB = 1024 * MIB

# NVML's nvmlClocksEventReason* bits (nvml.h; the older nvmlClocksThrottleReason* share them).
THROTTLE_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

_PCI_BUS_ID = re.compile(
    r"(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})"
    r"(?:\.(?P<function>[0-7]))?"
)


def normalize_pci_bus_id(text: str) -> str:
    """NVML's spelling `00000000:9B:00.0` of a PCI address written `0000:9b:00` (kernel log) or alike."""
    match = _PCI_BUS_ID.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a PCI bus id: {text!r}")
    return "{:08X}:{:02X}:{:02X}.{:X}".format(
        int(match["domain"], 16), int(match["bus"], 16), int(match["device"], 16), int(match["function"] or 0)
    )


@dataclass(frozen=True)
class GpuIdentity:
    """What names a GPU in labels; fields a failing device could not tell stay empty."""

    index: int | None
    uuid: str = ""
    pci_bus_id: str = ""
    minor_number: int | None = None
    model_name: str = ""

    def labels(self, hostname: str) -> dict[str, str]:
        """dcgm-exporter's label set for this GPU on `hostname`."""
        values = (
            "" if self.index is None else str(self.index),
            self.uuid,
            self.pci_bus_id,
            "" if self.minor_number is None else f"nvidia{self.minor_number}",
            self.model_name,
            hostname,
        )
        return dict(zip(LABELS, values, strict=True))

    @property
    def where(self) -> str:
        """How error reports name this GPU."""
        return f"gpu {'?' if self.index is None else self.index} ({self.pci_bus_id or 'unknown PCI address'})"


@dataclass(frozen=True)
class GpuSample:
    """One device's readings in dcgm-exporter's units; None: the device does not support that field."""

    sm_clock_mhz: float | None = None
    memory_clock_mhz: float | None = None
    max_sm_clock_hz: float | None = None
    gpu_temp_c: float | None = None
    memory_temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_mj: float | None = None
    gpu_util_percent: float | None = None
    mem_copy_util_percent: float | None = None
    fb_free_mib: float | None = None
    fb_used_mib: float | None = None
    fb_reserved_mib: float | None = None
    pcie_replays: float | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_link_gen: float | None = None
    pcie_link_width: float | None = None
    pcie_max_link_gen: float | None = None
    pcie_max_link_width: float | None = None
    clock_throttle_reasons: int | None = None
    ecc_sbe_volatile: float | None = None
    ecc_dbe_volatile: float | None = None
    ecc_sbe_aggregate: float | None = None
    ecc_dbe_aggregate: float | None = None
    remapped_rows_correctable: float | None = None
    remapped_rows_uncorrectable: float | None = None
    row_remap_pending: float | None = None
    row_remap_failure: float | None = None
    nvlink_crc_flit_errors: float | None = None
    nvlink_crc_data_errors: float | None = None
    nvlink_replay_errors: float | None = None
    nvlink_recovery_errors: float | None = None
    nvlink_bandwidth_bytes: float | None = None
    mig_mode: int | None = None  # NVML_DEVICE_MIG_ENABLE (1) or _DISABLE (0)


@dataclass(frozen=True)
class MigReading:
    """One MIG GPU instance of a device: its id, its profile ("3g.40gb"; "" where NVML cannot say) and
    what NVML reads per instance (the framebuffer: clocks, power and temperature are the whole GPU's)."""

    gpu_instance_id: int
    profile: str
    sample: GpuSample

    def labels(self, gpu_labels: dict[str, str]) -> dict[str, str]:
        """dcgm-exporter's labels of this instance's series: its GPU's, with GPU_I_PROFILE and GPU_I_ID
        before Hostname."""
        device = {name: value for name, value in gpu_labels.items() if name != "Hostname"}
        mig = dict(zip(MIG_LABELS, (self.profile, str(self.gpu_instance_id)), strict=True))
        return device | mig | {"Hostname": gpu_labels["Hostname"]}


def mig_profile_name(gpu_instance_slices: int, memory_mib: int, device_memory_bytes: int) -> str:
    """NVIDIA's name of a GPU instance profile, as `nvidia-smi -L` prints it ("3g.40gb"): the slices, then
    the instance's memory rounded up to eighths of the device's, in GB of the device's size rounded up
    (go-nvlib's MigProfile rule). "" when the device's memory is unknown."""
    if device_memory_bytes <= 0:
        return ""
    eighths = math.ceil(memory_mib * MIB * 8 / device_memory_bytes)
    device_gb = math.ceil(device_memory_bytes / GIB)
    return f"{gpu_instance_slices}g.{math.floor(eighths * device_gb / 8 + 0.5)}gb"


@dataclass(frozen=True)
class GpuReading:
    """One scrape of one device: its sample, or None when the device is down, plus what went wrong, the
    readings of its MIG GPU instances when MIG is on, and how old its values are, by the cadence that
    renews them (("polled", 0.4), ("sampled", 3.1); none where the backend reads at scrape time)."""

    identity: GpuIdentity
    sample: GpuSample | None
    problems: tuple[str, ...] = ()
    mig_instances: tuple[MigReading, ...] = ()
    ages_s: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class XidEvent:
    """One Xid error of the GPU at `pci_bus_id` (NVML spelling), seen by `source` (nvml or kernel_log)."""

    pci_bus_id: str
    xid: int
    source: str


class XidWatch(Protocol):
    """A running subscription to a backend's Xid events."""

    def stop(self) -> None: ...


class GpuBackend(Protocol):
    """What the gpu and xid collectors need from NVML or the simulator."""

    def identities(self) -> list[GpuIdentity]: ...

    def read(self) -> list[GpuReading]: ...

    def watch_xids(
        self, on_xid: Callable[[XidEvent], None], report: Callable[[str, str], None]
    ) -> XidWatch: ...

    def close(self) -> None: ...

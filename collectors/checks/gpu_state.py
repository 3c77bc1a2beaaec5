"""Light GPU checks read from what the exporter's GPU backend already reads: remapped rows and power
slowdown, one CheckResult per GPU each.

Thresholds and their sources:
- "remapped_rows": "Remapping Failure Occurred" (NVML nvmlDeviceGetRemappedRows `isFailure`) is FAIL:
  the GPU ran out of spare rows or could not remap one, which NVIDIA's GPU memory error management guide
  sends to RMA evaluation. A remap "Pending" (`isPending`) is WARN: the row is remapped at the next GPU
  reset, until then the faulty row stays in use (the same guide; IBM Autopilot's gpu-remapped check
  flags "Pending: Yes" as well).
- "power_slowdown": HW Slowdown, HW Thermal Slowdown or HW Power Brake Slowdown active (NVML clocks-event
  reasons 0x8, 0x40, 0x80: clocks cut by half or more, nvml.h) is FAIL, as IBM Autopilot's gpu-power
  check fails a GPU on `clocks_event_reasons.hw_slowdown`; SW Thermal Slowdown (0x20) is WARN (the GPU is
  past its software temperature limit). A software power cap or idle clocks are normal and PASS.
A value the backend could not read, or a GPU that is down, is ERROR: never PASS on no reading.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from collectors.checks.result import CheckResult, Status
from collectors.errors import GpuBackendError
from collectors.gpu.model import THROTTLE_REASONS, GpuBackend, GpuReading, GpuSample

REMAPPED_ROWS = "remapped_rows"
POWER_SLOWDOWN = "power_slowdown"
CHECKS = (REMAPPED_ROWS, POWER_SLOWDOWN)

_HW_SLOWDOWN = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
_SW_SLOWDOWN = ("sw_thermal_slowdown",)


class UnavailableBackend:
    """A GPU backend that could not be opened (no NVML, no driver): run_gpu_state reports `reason` as an
    ERROR for each of its checks, never a pass."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def read(self) -> list[GpuReading]:
        raise GpuBackendError(self.reason)


def run_gpu_state(
    node: str, backend: GpuBackend, clock: Callable[[], float] = time.time
) -> list[CheckResult]:
    """Read `backend` once and judge each GPU; a backend that cannot read at all gives one ERROR per
    check for the node."""
    started = clock()
    began = time.monotonic()
    try:
        readings = backend.read()
    except GpuBackendError as error:
        evidence = {"problem": f"the GPU backend could not read: {error}"}
        return [
            CheckResult(
                node, check, "", Status.ERROR, None, "", None, started, time.monotonic() - began, evidence
            )
            for check in CHECKS
        ]
    return gpu_state_results(node, readings, started=started, duration_s=time.monotonic() - began)


def gpu_state_results(
    node: str, readings: Sequence[GpuReading], *, started: float, duration_s: float
) -> list[CheckResult]:
    """The remapped_rows and power_slowdown results of each reading, GPU by GPU."""
    results = []
    for reading in readings:
        identity = reading.identity
        target = f"gpu:{identity.pci_bus_id if identity.index is None else identity.index}"
        for check, judge in ((REMAPPED_ROWS, _remapped_rows), (POWER_SLOWDOWN, _power_slowdown)):
            if reading.sample is None:
                problems = "; ".join(reading.problems) or "no reading"
                status, value, evidence = (
                    Status.ERROR,
                    None,
                    {"problem": f"{identity.where} is down: {problems}"},
                )
            else:
                status, value, evidence = judge(reading.sample)
            unit = "rows" if check == REMAPPED_ROWS else ""
            results.append(
                CheckResult(node, check, target, status, value, unit, None, started, duration_s, evidence)
            )
    return results


Judgement = tuple[Status, float | None, dict[str, object]]


def _remapped_rows(sample: GpuSample) -> Judgement:
    """FAIL on a remapping failure, WARN on a pending remap; value: rows remapped for uncorrectable errors."""
    evidence: dict[str, object] = {
        "correctable": sample.remapped_rows_correctable,
        "uncorrectable": sample.remapped_rows_uncorrectable,
        "pending": sample.row_remap_pending,
        "failure": sample.row_remap_failure,
    }
    value = sample.remapped_rows_uncorrectable
    if sample.row_remap_failure is None or sample.row_remap_pending is None:
        return Status.ERROR, value, {**evidence, "problem": "the driver reports no row remapping state"}
    if sample.row_remap_failure:
        return Status.FAIL, value, {**evidence, "reason": "row remapping failed: evaluate the GPU for RMA"}
    if sample.row_remap_pending:
        return Status.WARN, value, {**evidence, "reason": "a row remap is pending: reset the GPU to apply it"}
    return Status.PASS, value, evidence


def _power_slowdown(sample: GpuSample) -> Judgement:
    """FAIL on any hardware slowdown, WARN on a software thermal slowdown; value: the reason bits."""
    reasons = sample.clock_throttle_reasons
    if reasons is None:
        return Status.ERROR, None, {"problem": "the driver reports no clocks-event reasons"}
    active = [name for name, bit in THROTTLE_REASONS.items() if reasons & bit]
    evidence: dict[str, object] = {"active": active}
    if any(name in active for name in _HW_SLOWDOWN):
        return Status.FAIL, float(reasons), evidence
    if any(name in active for name in _SW_SLOWDOWN):
        return Status.WARN, float(reasons), evidence
    return Status.PASS, float(reasons), evidence

"""Remapped rows and power slowdown judged on real `nvidia-smi -q` captures through the exporter's own
NVML path (collectors.gpu.replay): a throttled or remap-pending GPU is never PASS."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.checks.gpu_state import POWER_SLOWDOWN, REMAPPED_ROWS, gpu_state_results, run_gpu_state
from collectors.checks.result import CheckResult, Status
from collectors.errors import GpuBackendError
from collectors.gpu.model import GpuIdentity, GpuReading
from collectors.gpu.nvml import NvmlBackend
from collectors.gpu.replay import load_capture

GPUD = "gpud/nvidia-smi-query.535.161.08.out.0.valid"
H200 = "nvidia_gpu_exporter/linux-x86_64__nvidia-h200__590.48.01.txt"


def judge(capture: Path, snapshot: int = 1) -> list[CheckResult]:
    backend = NvmlBackend(nvml=load_capture(capture, snapshot))
    try:
        return run_gpu_state("vela-001", backend, clock=lambda: 7.0)
    finally:
        backend.close()


def by_target(results: list[CheckResult], check: str) -> dict[str, Status]:
    return {result.target: result.status for result in results if result.check == check}


def capture_with(fixtures: Path, tmp_path: Path, key: str, gpu: int) -> Path:
    """The gpud capture with `key`'s "No" turned to "Yes" on the `gpu`th GPU only."""
    lines = (fixtures / GPUD).read_text().splitlines(keepends=True)
    at = [
        index
        for index, line in enumerate(lines)
        if line.strip().startswith(key) and line.rstrip().endswith(": No")
    ]
    assert len(at) == 8, f"the capture has one {key!r} line per GPU"
    lines[at[gpu]] = lines[at[gpu]].replace(": No", ": Yes")
    path = tmp_path / "capture.txt"
    path.write_text("".join(lines))
    return path


def test_power_brake_slowdown_active_on_the_gpud_node_fails_every_gpu(fixtures: Path) -> None:
    results = judge(fixtures / GPUD)
    assert by_target(results, POWER_SLOWDOWN) == {f"gpu:{index}": Status.FAIL for index in range(8)}
    first = next(result for result in results if result.check == POWER_SLOWDOWN)
    assert {"hw_slowdown", "hw_power_brake_slowdown"} <= set(first.evidence["active"])
    assert "hw_thermal_slowdown" not in first.evidence["active"]
    assert by_target(results, REMAPPED_ROWS) == {f"gpu:{index}": Status.PASS for index in range(8)}
    assert {result.started for result in results} == {7.0}


def test_idle_h200_is_not_slowed_down(fixtures: Path) -> None:
    results = judge(fixtures / H200, 2)
    assert set(by_target(results, POWER_SLOWDOWN).values()) == {Status.PASS}


@pytest.mark.parametrize(
    ("key", "expected"), [("Pending", Status.WARN), ("Remapping Failure Occurred", Status.FAIL)]
)
def test_remap_pending_warns_and_remap_failure_fails_only_that_gpu(
    fixtures: Path, tmp_path: Path, key: str, expected: Status
) -> None:
    results = judge(capture_with(fixtures, tmp_path, key, gpu=3))
    statuses = by_target(results, REMAPPED_ROWS)
    assert statuses.pop("gpu:3") is expected
    assert set(statuses.values()) == {Status.PASS}


def test_gpu_that_is_down_or_unread_is_an_error_for_both_checks() -> None:
    down = GpuReading(GpuIdentity(index=2, pci_bus_id="00000000:9B:00.0"), None, ("GPU is lost",))
    results = gpu_state_results("vela-001", [down], started=0.0, duration_s=0.1)
    assert [(result.check, result.target, result.status) for result in results] == [
        (REMAPPED_ROWS, "gpu:2", Status.ERROR),
        (POWER_SLOWDOWN, "gpu:2", Status.ERROR),
    ]
    assert "GPU is lost" in results[0].evidence["problem"]


class UnreadableBackend:
    """A backend whose whole read fails, as NVML does when the driver is gone."""

    def read(self) -> list[GpuReading]:
        raise GpuBackendError("NVML: nvmlDeviceGetCount failed: Driver Not Loaded")


def test_backend_that_cannot_read_is_one_error_per_check_for_the_node() -> None:
    results = run_gpu_state("vela-001", UnreadableBackend())  # type: ignore[arg-type]
    assert [(result.check, result.target, result.status) for result in results] == [
        (REMAPPED_ROWS, "", Status.ERROR),
        (POWER_SLOWDOWN, "", Status.ERROR),
    ]
    assert "Driver Not Loaded" in results[0].evidence["problem"]

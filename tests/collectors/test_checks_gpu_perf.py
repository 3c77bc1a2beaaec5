"""GPU performance checks: the measuring code on a real torch CPU device (timing, sizing, warm-up, median),
and the verdicts through a fake GPU whose operations take the time a real one's would (datasheet-derived
rates), launched asynchronously and finished by synchronize, as CUDA does."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.checks.catalog import CATALOG, CheckOptions
from collectors.checks.gpu_perf import (
    CHECKS,
    GEMM,
    HBM_BANDWIDTH,
    PCIE_BANDWIDTH,
    PEAKS,
    Link,
    Operation,
    Plan,
    TorchDevice,
    cuda_devices,
    median_seconds,
    run_gpu_perf,
)
from collectors.checks.result import Status

H100 = "NVIDIA H100 80GB HBM3"
GEN5_X16 = Link(5, 16, 5, 16)
GEN5_X16_GBPS = 16 * 32 * 128 / 130 / 8
# Sizes chosen so each fake operation takes tens of milliseconds: far above a sleep's overshoot.
FAKE_PLAN = Plan("test", 1 << 30, 64 << 30, 32768, warmup=1, iterations=3, matmul_iterations=3)
CPU_PLAN = Plan("cpu", 4 << 20, 4 << 20, 96, warmup=1, iterations=3, matmul_iterations=3)


class FakeGpu:
    """A GPU of `model` whose operations run at the given rates (GB/s, TFLOPS): a call launches and
    returns at once, synchronize waits out what was launched, as a CUDA stream does."""

    matmul_dtype = "bfloat16"

    def __init__(
        self,
        model: str = H100,
        link: Link | None = GEN5_X16,
        pcie_gbps: float = 0.85 * GEN5_X16_GBPS,
        hbm_gbps: float = 0.92 * PEAKS[H100].hbm_gbps,
        tflops: float = 0.78 * PEAKS[H100].bf16_tflops,
        index: int = 0,
        failing: Operation | None = None,
    ) -> None:
        self.model, self._link, self.index, self._failing = model, link, index, failing
        self._rates = {
            Operation.HOST_TO_DEVICE: pcie_gbps * 1e9,
            Operation.DEVICE_TO_HOST: pcie_gbps * 1e9,
            Operation.DEVICE_TO_DEVICE: hbm_gbps * 1e9 / 2,  # a copy reads and writes each byte
            Operation.MATMUL: tflops * 1e12,
        }
        self._pending = 0.0

    def operation(self, kind: Operation, size: int) -> Callable[[], None]:
        if kind is self._failing:
            raise RuntimeError("CUDA out of memory. Tried to allocate 64.00 GiB")
        work = 2 * size**3 if kind is Operation.MATMUL else size
        cost = work / self._rates[kind]

        def launch() -> None:
            self._pending += cost

        return launch

    def synchronize(self) -> None:
        time.sleep(self._pending)
        self._pending = 0.0

    def link(self) -> Link | None:
        return self._link


def only(results: list, check: str) -> dict[str, object]:
    (result,) = [result for result in results if result.check == check]
    return {"status": result.status, "value": result.value, "threshold": result.threshold, **result.evidence}


def test_a_healthy_h100_passes_every_check_within_the_rates_it_ran_at() -> None:
    gpu = FakeGpu()
    results = [result for check in CHECKS for result in run_gpu_perf("vela-001", check, [gpu], FAKE_PLAN)]
    assert {(result.check, result.target, result.status) for result in results} == {
        (check, "gpu:0", Status.PASS) for check in CHECKS
    }
    pcie, hbm, gemm = (only(results, check) for check in CHECKS)
    # the measured rates are what the GPU ran at, less what sleeping and the clock add
    assert 0.7 * GEN5_X16_GBPS < pcie["value"] <= 0.85 * GEN5_X16_GBPS * 1.01
    assert 0.75 * 3350 < hbm["value"] <= 0.92 * 3350 * 1.01
    assert gemm["threshold"] == pytest.approx(0.5 * 989.4) and gemm["source"].startswith("NVIDIA H100")


@pytest.mark.parametrize(
    ("link", "said"),
    [(Link(4, 16, 5, 16), "Gen4 x16 (max Gen5 x16)"), (Link(5, 8, 5, 16), "Gen5 x8 (max Gen5 x16)")],
)
def test_a_link_trained_down_fails_and_says_so_however_fast_the_copies(link: Link, said: str) -> None:
    (result,) = run_gpu_perf("vela-001", PCIE_BANDWIDTH, [FakeGpu(link=link)], FAKE_PLAN)
    assert result.status is Status.FAIL
    assert result.evidence["reason"] == f"link trained down: {said}"


def test_pcie_rates_are_judged_against_the_links_rate() -> None:
    slow = FakeGpu(pcie_gbps=0.6 * GEN5_X16_GBPS, index=1)  # WARN: between half and 70%
    broken = FakeGpu(pcie_gbps=0.2 * GEN5_X16_GBPS, index=2)
    results = run_gpu_perf("vela-001", PCIE_BANDWIDTH, [slow, broken], FAKE_PLAN)
    assert [(result.target, result.status) for result in results] == [
        ("gpu:1", Status.WARN),
        ("gpu:2", Status.FAIL),
    ]
    assert results[0].threshold == pytest.approx(GEN5_X16_GBPS / 2)
    assert results[0].evidence["link"] == "Gen5 x16 (max Gen5 x16)"


def test_slow_memory_and_a_slowed_gemm_fail() -> None:
    gpu = FakeGpu(hbm_gbps=0.4 * PEAKS[H100].hbm_gbps, tflops=0.3 * PEAKS[H100].bf16_tflops)
    assert run_gpu_perf("vela-001", HBM_BANDWIDTH, [gpu], FAKE_PLAN)[0].status is Status.FAIL
    assert run_gpu_perf("vela-001", GEMM, [gpu], FAKE_PLAN)[0].status is Status.FAIL


def test_an_unknown_model_or_link_is_error_with_the_measurement_kept_never_a_made_up_threshold() -> None:
    gpu = FakeGpu(model="NVIDIA L40S", link=None)
    for check, problem in [
        (HBM_BANDWIDTH, "no reference for model 'NVIDIA L40S'"),
        (GEMM, "no reference for model 'NVIDIA L40S'"),
        (PCIE_BANDWIDTH, "NVML reports no PCIe link"),
    ]:
        (result,) = run_gpu_perf("vela-001", check, [gpu], FAKE_PLAN)
        assert (result.status, result.threshold, result.evidence["problem"]) == (Status.ERROR, None, problem)
        assert result.value is not None and result.value > 0


@pytest.mark.parametrize(("link", "shown"), [(Link(7, 16, 7, 16), "Gen7 x16"), (Link(5, 0, 5, 0), "Gen5 x0")])
def test_a_link_nvml_reports_outside_the_tables_is_error_not_a_pass_against_zero(
    link: Link, shown: str
) -> None:
    (result,) = run_gpu_perf("vela-001", PCIE_BANDWIDTH, [FakeGpu(link=link)], FAKE_PLAN)
    assert (result.status, result.threshold) == (Status.ERROR, None)
    assert result.evidence["problem"] == f"no reference for a PCIe link of {shown} (max {shown})"


def test_a_gpu_that_cannot_run_is_error_and_the_next_gpu_is_still_measured() -> None:
    broken = FakeGpu(failing=Operation.DEVICE_TO_DEVICE)
    results = run_gpu_perf("vela-001", HBM_BANDWIDTH, [broken, FakeGpu(index=1)], FAKE_PLAN)
    assert [(result.target, result.status) for result in results] == [
        ("gpu:0", Status.ERROR),
        ("gpu:1", Status.PASS),
    ]
    assert "CUDA out of memory" in results[0].evidence["problem"]


@settings(max_examples=30, deadline=None)
@given(
    st.integers(3, 5),
    st.sampled_from([1, 2, 4, 8, 16]),
    st.integers(3, 5),
    st.sampled_from([1, 2, 4, 8, 16]),
)
def test_only_a_link_below_its_maximum_fails_however_fast(
    gen: int, width: int, top: int, top_width: int
) -> None:
    link = Link(min(gen, top), min(width, top_width), top, top_width)
    instant = FakeGpu(link=link, pcie_gbps=1e6)  # copies that cost nothing: only the link can fail
    (result,) = run_gpu_perf("vela-001", PCIE_BANDWIDTH, [instant], Plan("p", 1 << 30, 1, 1, 0, 1, 1))
    assert result.status is (Status.FAIL if link.trained_down else Status.PASS)


class CountingDevice:
    """Calls cost `cost(call number)` seconds, paid at synchronize; it counts calls."""

    def __init__(self, cost: Callable[[int], float]) -> None:
        self.calls, self._cost, self._pending = 0, cost, 0.0

    def launch(self) -> None:
        self._pending += self._cost(self.calls)
        self.calls += 1

    def synchronize(self) -> None:
        time.sleep(self._pending)
        self._pending = 0.0


def test_warm_up_is_not_timed_and_one_slow_call_does_not_move_the_median() -> None:
    # calls 0-1 warm up (slow, as first CUDA calls are), call 3 is descheduled; the rest take 20 ms
    device = CountingDevice(lambda call: {0: 0.5, 1: 0.5, 3: 1.0}.get(call, 0.02))
    seconds = median_seconds(device, device.launch, warmup=2, iterations=5)  # type: ignore[arg-type]
    assert device.calls == 7
    assert 0.02 <= seconds < 0.2


def test_the_time_includes_waiting_for_the_launched_work() -> None:
    device = CountingDevice(lambda call: 0.05)
    assert median_seconds(device, device.launch, warmup=0, iterations=3) >= 0.05  # type: ignore[arg-type]


torch_only = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


@pytest.mark.torch
@torch_only
def test_the_same_code_measures_a_real_torch_device() -> None:
    import torch

    cpu = TorchDevice(torch, torch.device("cpu"), 0, H100)
    results = [result for check in CHECKS for result in run_gpu_perf("vela-001", check, [cpu], CPU_PLAN)]
    pcie, hbm, gemm = (only(results, check) for check in CHECKS)
    assert (
        pcie["status"] is Status.ERROR and pcie["host_to_device_gbps"] > 0 and pcie["device_to_host_gbps"] > 0
    )
    assert hbm["status"] is Status.FAIL, "a CPU's memory copy is far below an H100's HBM"
    assert hbm["copy_bytes"] == 4 << 20 and hbm["seconds_per_copy"] > 0
    assert (gemm["status"], gemm["dtype"], gemm["n"]) == (Status.FAIL, "bfloat16", 96)
    assert gemm["value"] == pytest.approx(2 * 96**3 / gemm["seconds_per_matmul"] / 1e12)


@torch_only
def test_without_a_cuda_gpu_every_gpu_check_is_one_error_naming_why() -> None:
    for check in CHECKS:
        (result,) = CATALOG[check].run(CheckOptions(node="vela-001", short=True))
        assert (result.check, result.target, result.status) == (check, "", Status.ERROR)
        assert "torch sees no CUDA GPU" in result.evidence["problem"]


def test_without_torch_the_checks_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    devices = cuda_devices()
    assert isinstance(devices, str) and devices.startswith("torch is not installed")
    (result,) = run_gpu_perf("vela-001", GEMM, devices)
    assert result.status is Status.ERROR and result.evidence["problem"] == devices

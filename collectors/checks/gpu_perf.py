"""GPU performance checks, one CheckResult per GPU each: PCIe copy rate, HBM copy rate and dense matmul rate.

- "pcie_bandwidth": host->device and device->host copies from pinned memory; the value is the slower
  direction. Judged against the link NVML reports while the copy runs (an idle GPU lowers its link
  generation to save power, so the link is read mid-copy): a link trained below its maximum generation or
  width (Gen3 on a Gen5 GPU, x8 on an x16 slot) FAILs and says so; else the rate FAILs below
  PCIE_FAIL_FRACTION and WARNs below PCIE_WARN_FRACTION of the link's per-direction rate (PCI Express Base
  Specification: 8, 16, 32 GT/s per lane for Gen3/4/5 with 128b/130b encoding, so x16 carries 15.75,
  31.5 and 63.0 GB/s each way). Pinned copies reach about 80% of that; half of it is a fault, not noise.
  IBM Autopilot's PCIe check fails a GPU only below an absolute 4 GB/s (autopilot-daemon/gpu-bw/
  entrypoint.py `--threshold` default '4'; pkg/healthcheck/pciebw/pciebw.go checkThreshold `bw <
  threshold`), which a Gen4 x16 link trained down to x4 still passes; the link-relative threshold does not.
- "hbm_bandwidth": a device-to-device copy, counted as read plus write (2 x size per copy, as
  nvbandwidth and STREAM count copy), against the model's peak HBM bandwidth (NVIDIA datasheets, PEAKS):
  FAIL below HBM_FAIL_FRACTION, WARN below HBM_WARN_FRACTION of the peak.
- "gemm": dense BF16 matmul (FP16 where the GPU has no BF16) at 2n^3 operations per product, against the
  model's dense BF16 peak (NVIDIA datasheets, without sparsity): FAIL below GEMM_FAIL_FRACTION, WARN below
  GEMM_WARN_FRACTION of the peak.
The fractions are fleetlens's: healthy GPUs reach 85-90% of peak HBM and 70-80% of peak matmul rate with
cuBLAS; a GPU held at low clocks (power brake, thermal slowdown) or with a degraded memory falls far below.
A model with no datasheet entry is ERROR "no reference for model X" with the measured value kept: no
threshold is made up. No torch, or no CUDA GPU, is an ERROR naming why, never PASS.

The measuring code takes a Device (TorchDevice: torch CUDA in production, torch CPU in tests) and times
each operation as the median of `iterations` after `warmup`, each followed by a synchronize, so a
descheduled operation does not read as a slow GPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from collectors.checks.result import CheckResult, Status
from collectors.errors import TimingError

PCIE_BANDWIDTH = "pcie_bandwidth"
HBM_BANDWIDTH = "hbm_bandwidth"
GEMM = "gemm"
CHECKS = (PCIE_BANDWIDTH, HBM_BANDWIDTH, GEMM)

PCIE_FAIL_FRACTION = 0.5
PCIE_WARN_FRACTION = 0.7
HBM_FAIL_FRACTION = 0.6
HBM_WARN_FRACTION = 0.75
GEMM_FAIL_FRACTION = 0.5
GEMM_WARN_FRACTION = 0.6

# PCIe per-lane data rate each way in GB/s: GT/s x 128/130 / 8 (PCI Express Base Specification 3.0-5.0).
PCIE_LANE_GBPS = {3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8, 5: 32 * 128 / 130 / 8}
PCIE_WIDTHS = (1, 2, 4, 8, 16)  # the link widths a GPU's slot can train to


@dataclass(frozen=True)
class Peak:
    """A model's datasheet figures: peak HBM bandwidth in GB/s and dense BF16 TFLOPS (no sparsity)."""

    hbm_gbps: float
    bf16_tflops: float
    source: str


# NVML's product names (nvmlDeviceGetName) -> NVIDIA's datasheet figures.
PEAKS: dict[str, Peak] = {
    "NVIDIA A100-SXM4-40GB": Peak(1555.0, 312.0, "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM)"),
    "NVIDIA A100-SXM4-80GB": Peak(2039.0, 312.0, "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)"),
    "NVIDIA A100-PCIE-40GB": Peak(1555.0, 312.0, "NVIDIA A100 Tensor Core GPU datasheet (40GB PCIe)"),
    "NVIDIA A100 80GB PCIe": Peak(1935.0, 312.0, "NVIDIA A100 Tensor Core GPU datasheet (80GB PCIe)"),
    "NVIDIA H100 80GB HBM3": Peak(3350.0, 989.4, "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM)"),
    "NVIDIA H100 PCIe": Peak(2000.0, 756.0, "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe)"),
    "NVIDIA H200": Peak(4800.0, 989.4, "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM)"),
}


class Operation(StrEnum):
    HOST_TO_DEVICE = "host_to_device"
    DEVICE_TO_HOST = "device_to_host"
    DEVICE_TO_DEVICE = "device_to_device"
    MATMUL = "matmul"


@dataclass(frozen=True)
class Link:
    """A PCIe link's generation and width now, and the most the GPU supports."""

    generation: int
    width: int
    max_generation: int
    max_width: int

    @property
    def trained_down(self) -> bool:
        return self.generation < self.max_generation or self.width < self.max_width

    @property
    def expected_gbps(self) -> float | None:
        """The per-direction data rate of this link at its maximum; None for a generation or width not in
        the tables (NVML's numbers are judged, not trusted: a width of 0 would make any rate pass)."""
        lane = PCIE_LANE_GBPS.get(self.max_generation)
        return None if lane is None or self.max_width not in PCIE_WIDTHS else lane * self.max_width

    def __str__(self) -> str:
        return f"Gen{self.generation} x{self.width} (max Gen{self.max_generation} x{self.max_width})"


class Device(Protocol):
    """One GPU as the measurements see it. `operation` prepares buffers once and returns the call that
    performs one operation of `size` (bytes for copies, n for an n x n matmul); `synchronize` waits for
    what was launched; `link` is the PCIe link now (None where NVML cannot say)."""

    index: int
    model: str
    matmul_dtype: str

    def operation(self, kind: Operation, size: int) -> Callable[[], None]: ...

    def synchronize(self) -> None: ...

    def link(self) -> Link | None: ...


@dataclass(frozen=True)
class Plan:
    """Sizes and repetitions: FULL for a free node's heavy checks, SHORT for the pre-flight set."""

    name: str
    copy_bytes: int  # each PCIe copy
    hbm_bytes: int  # each device-to-device copy
    matmul_n: int
    warmup: int
    iterations: int
    matmul_iterations: int


# FULL: 1 GiB PCIe copies (20 x ~40 ms on Gen4 x16), 4 GiB HBM copies (20 x ~2.7 ms on an H100),
# 8192^3 BF16 products (200 x ~1.6 ms on an H100).
FULL = Plan("full", 1 << 30, 4 << 30, 8192, warmup=5, iterations=20, matmul_iterations=200)
# SHORT: 256 MiB PCIe and 2 GiB HBM copies, 10 timed of each kind, 50 products: about 0.2 s of copies
# and 0.1 s of matmul per H100, so the pre-flight's time is mostly CUDA start-up (docs/checks.md).
SHORT = Plan("short", 256 << 20, 2 << 30, 8192, warmup=3, iterations=10, matmul_iterations=50)


def median_seconds(device: Device, call: Callable[[], None], warmup: int, iterations: int) -> float:
    """The median wall time of one `call` (launch and synchronize) over `iterations`, after `warmup`."""
    for _ in range(warmup):
        call()
    device.synchronize()
    durations = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        device.synchronize()
        durations.append(time.perf_counter() - start)
    return statistics.median(durations)


def _rate(device: Device, kind: Operation, plan: Plan) -> tuple[float, float]:
    """(work per second, seconds per operation): GB/s for copies (read+write for device-to-device),
    TFLOPS for a matmul."""
    if kind is Operation.MATMUL:
        size, work, iterations = plan.matmul_n, 2 * plan.matmul_n**3 / 1e12, plan.matmul_iterations
    elif kind is Operation.DEVICE_TO_DEVICE:
        size, work, iterations = plan.hbm_bytes, 2 * plan.hbm_bytes / 1e9, plan.iterations
    else:
        size, work, iterations = plan.copy_bytes, plan.copy_bytes / 1e9, plan.iterations
    seconds = median_seconds(device, device.operation(kind, size), plan.warmup, iterations)
    if not seconds > 0:
        raise TimingError(f"a {kind} took {seconds!r} s by the clock: no rate can be computed")
    return work / seconds, seconds


def _link_while_copying(device: Device, plan: Plan) -> Link | None:
    """The link read while a host-to-device copy is in flight (an idle link drops its generation)."""
    call = device.operation(Operation.HOST_TO_DEVICE, plan.copy_bytes)
    call()
    link = device.link()
    device.synchronize()
    return link


Judgement = tuple[Status, float | None, float | None, str, dict[str, Any]]


def _pcie(device: Device, plan: Plan) -> Judgement:
    to_device, _ = _rate(device, Operation.HOST_TO_DEVICE, plan)
    to_host, _ = _rate(device, Operation.DEVICE_TO_HOST, plan)
    link = _link_while_copying(device, plan)
    value = min(to_device, to_host)
    evidence: dict[str, Any] = {"host_to_device_gbps": to_device, "device_to_host_gbps": to_host}
    if link is None:
        return Status.ERROR, value, None, "GB/s", {**evidence, "problem": "NVML reports no PCIe link"}
    evidence["link"] = str(link)
    expected = link.expected_gbps
    if expected is None:
        problem = f"no reference for a PCIe link of {link}"
        return Status.ERROR, value, None, "GB/s", {**evidence, "problem": problem}
    threshold = PCIE_FAIL_FRACTION * expected
    evidence["expected_gbps"] = expected
    if link.trained_down:
        return Status.FAIL, value, threshold, "GB/s", {**evidence, "reason": f"link trained down: {link}"}
    return (*_against(value, expected, PCIE_FAIL_FRACTION, PCIE_WARN_FRACTION), "GB/s", evidence)


def _hbm(device: Device, plan: Plan) -> Judgement:
    value, seconds = _rate(device, Operation.DEVICE_TO_DEVICE, plan)
    evidence = {"copy_bytes": plan.hbm_bytes, "seconds_per_copy": seconds}
    return _against_peak(device, value, "GB/s", evidence, HBM_FAIL_FRACTION, HBM_WARN_FRACTION)


def _gemm(device: Device, plan: Plan) -> Judgement:
    value, seconds = _rate(device, Operation.MATMUL, plan)
    evidence = {"n": plan.matmul_n, "dtype": device.matmul_dtype, "seconds_per_matmul": seconds}
    return _against_peak(device, value, "TFLOPS", evidence, GEMM_FAIL_FRACTION, GEMM_WARN_FRACTION)


def _against_peak(
    device: Device, value: float, unit: str, evidence: dict[str, Any], fail: float, warn: float
) -> Judgement:
    """`value` against the datasheet peak of `device`'s model in `unit` (GB/s: HBM, TFLOPS: BF16)."""
    peak = PEAKS.get(device.model)
    if peak is None:
        problem = f"no reference for model {device.model!r}"
        return Status.ERROR, value, None, unit, {**evidence, "problem": problem}
    reference = {"GB/s": peak.hbm_gbps, "TFLOPS": peak.bf16_tflops}[unit]
    evidence |= {"peak": reference, "source": peak.source}
    return (*_against(value, reference, fail, warn), unit, evidence)


def _against(value: float, reference: float, fail: float, warn: float) -> tuple[Status, float, float]:
    """(status, value, FAIL threshold) of `value` against `fail` and `warn` fractions of `reference`."""
    if value < fail * reference:
        return Status.FAIL, value, fail * reference
    if value < warn * reference:
        return Status.WARN, value, fail * reference
    return Status.PASS, value, fail * reference


_JUDGES: dict[str, Callable[[Device, Plan], Judgement]] = {
    PCIE_BANDWIDTH: _pcie,
    HBM_BANDWIDTH: _hbm,
    GEMM: _gemm,
}


def run_gpu_perf(
    node: str,
    check: str,
    devices: Sequence[Device] | str,
    plan: Plan = FULL,
    clock: Callable[[], float] = time.time,
) -> list[CheckResult]:
    """`check` on each of `devices`, one at a time (so no GPU shares a PCIe switch with another's copies);
    `devices` as a string is why there are none (no torch, no CUDA): one ERROR for the node. A device
    whose operation raises RuntimeError (out of memory, a CUDA error) or times nothing is ERROR with
    that error; the other devices are still measured."""
    judge = _JUDGES[check]
    if isinstance(devices, str):
        return [
            CheckResult(node, check, "", Status.ERROR, None, "", None, clock(), 0.0, {"problem": devices})
        ]
    results = []
    for device in devices:
        started, began = clock(), time.monotonic()
        try:
            status, value, threshold, unit, evidence = judge(device, plan)
        except (RuntimeError, TimingError) as error:
            status, value, threshold, unit = Status.ERROR, None, None, ""
            evidence = {"problem": f"{check} on GPU {device.index} failed: {error}"}
        evidence |= {"model": device.model, "plan": plan.name}
        results.append(
            CheckResult(
                node,
                check,
                f"gpu:{device.index}",
                status,
                value,
                unit,
                threshold,
                started,
                time.monotonic() - began,
                evidence,
            )
        )
    return results


class TorchDevice:
    """A Device on a torch device: CUDA with pinned host memory and NVML's link in production, the CPU
    in tests (same timing code, plain host memory, no link)."""

    def __init__(self, torch: Any, device: Any, index: int, model: str, nvml_handle: Any = None) -> None:
        self._torch = torch
        self._device = device
        self._cuda = device.type == "cuda"
        self._nvml_handle = nvml_handle
        self.index = index
        self.model = model
        bf16 = not self._cuda or torch.cuda.is_bf16_supported()
        self._dtype = torch.bfloat16 if bf16 else torch.float16
        self.matmul_dtype = str(self._dtype).removeprefix("torch.")

    def operation(self, kind: Operation, size: int) -> Callable[[], None]:
        torch, device = self._torch, self._device
        if kind is Operation.MATMUL:
            a, b = (torch.randn(size, size, dtype=self._dtype, device=device) for _ in range(2))
            out = torch.empty(size, size, dtype=self._dtype, device=device)

            def matmul() -> None:
                torch.matmul(a, b, out=out)

            return matmul
        host = torch.empty(size, dtype=torch.uint8, pin_memory=self._cuda)
        on_device = torch.empty(size, dtype=torch.uint8, device=device)
        source, target = {
            Operation.HOST_TO_DEVICE: (host, on_device),
            Operation.DEVICE_TO_HOST: (on_device, host),
            Operation.DEVICE_TO_DEVICE: (on_device, torch.empty(size, dtype=torch.uint8, device=device)),
        }[kind]

        def copy() -> None:
            target.copy_(source, non_blocking=True)

        return copy

    def synchronize(self) -> None:
        if self._cuda:
            self._torch.cuda.synchronize(self._device)

    def link(self) -> Link | None:
        if self._nvml_handle is None:
            return None
        import pynvml as nv

        handle = self._nvml_handle
        try:
            return Link(
                int(nv.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
                int(nv.nvmlDeviceGetCurrPcieLinkWidth(handle)),
                int(nv.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
                int(nv.nvmlDeviceGetMaxPcieLinkWidth(handle)),
            )
        except nv.NVMLError:
            return None


def cuda_devices() -> list[TorchDevice] | str:
    """This node's CUDA GPUs as Devices, each with its NVML handle found by PCI bus id (CUDA's and NVML's
    orders may differ); or why there are none."""
    try:
        import torch
    except ImportError as error:
        return f"torch is not installed ({error}): install the torch extra to run the GPU performance checks"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "torch sees no CUDA GPU (no GPU, no driver, or a CPU-only torch build)"
    nv = _nvml()
    devices = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        handle = None
        if nv is not None:
            domain, bus, slot = properties.pci_domain_id, properties.pci_bus_id, properties.pci_device_id
            try:
                handle = nv.nvmlDeviceGetHandleByPciBusId(f"{domain:08x}:{bus:02x}:{slot:02x}.0")
            except nv.NVMLError:
                handle = None
        devices.append(TorchDevice(torch, torch.device("cuda", index), index, properties.name, handle))
    return devices


def _nvml() -> Any:
    """pynvml, initialized; None where it is missing or NVML cannot load (each link then reads None, so
    pcie_bandwidth is ERROR, never judged without its link)."""
    try:
        import pynvml as nv
    except ImportError:
        return None
    try:
        nv.nvmlInit()
    except nv.NVMLError:
        return None
    return nv

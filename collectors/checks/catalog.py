"""The checks a node can run, by name: what each needs, whether it is light or heavy, and the named sets.

Light checks cost seconds of GPU time and may run on a busy node on a schedule; heavy checks load the
GPUs or the fabric and run only on a node with no work on it, or a drained one (the lifecycle's tests).
The `preflight` set is the light checks plus the GPU performance checks at their short sizes
(CheckOptions.short, gpu_perf.SHORT): what a job launcher runs before every job.
A check whose options are missing (ping without peers) raises CollectorConfigError before anything runs;
a check that runs but cannot judge returns ERROR rows, never an exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from collectors.checks import allreduce, dcgm_diag, gpu_state
from collectors.checks.dcgm_diag import run_dcgm_diag
from collectors.checks.gpu_perf import (
    FULL,
    GEMM,
    HBM_BANDWIDTH,
    PCIE_BANDWIDTH,
    SHORT,
    cuda_devices,
    run_gpu_perf,
)
from collectors.checks.gpu_state import UnavailableBackend, run_gpu_state
from collectors.checks.network import iperf3_pair, ping_mesh
from collectors.checks.result import CheckResult
from collectors.errors import CollectorConfigError, GpuBackendError


class Weight(StrEnum):
    LIGHT = "light"  # seconds of GPU time: scheduled hourly, busy node or not
    HEAVY = "heavy"  # loads the GPUs or links: a free or drained node only, unless forced


@dataclass(frozen=True)
class CheckOptions:
    """What the checks of one run are told: the node's name and each check's own settings."""

    node: str
    dcgm_level: int = 1
    peers: Mapping[str, str] = field(default_factory=dict)  # name -> address, for ping and iperf3
    dev: str = ""  # the interface (or source address) ping sends from
    expected_gbps: float = 100.0  # iperf3's expected rate
    short: bool = False  # the GPU performance checks at their pre-flight sizes

    def needing_peers(self, check: str) -> Mapping[str, str]:
        if not self.peers:
            raise CollectorConfigError(f"{check} needs at least one peer (NAME=ADDR)")
        return self.peers


@dataclass(frozen=True)
class Check:
    """One check: its `--checks` name, its weight, how it runs, and the `check` names its results carry
    (gpu_state's are remapped_rows and power_slowdown; most carry their own name)."""

    name: str
    weight: Weight
    run: Callable[[CheckOptions], list[CheckResult]]
    reports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.reports:
            object.__setattr__(self, "reports", (self.name,))


def _dcgm_diag(options: CheckOptions) -> list[CheckResult]:
    return run_dcgm_diag(options.node, options.dcgm_level)


def _gpu_state(options: CheckOptions) -> list[CheckResult]:
    from collectors.gpu.nvml import NvmlBackend  # needs pynvml only when the check runs

    try:
        backend = NvmlBackend()
    except (ImportError, GpuBackendError) as exc:
        return run_gpu_state(options.node, UnavailableBackend(f"NVML cannot be opened: {exc}"))  # type: ignore[arg-type]
    try:
        return run_gpu_state(options.node, backend)
    finally:
        backend.close()


def _ping(options: CheckOptions) -> list[CheckResult]:
    peers = options.needing_peers("ping")
    if not options.dev:
        raise CollectorConfigError("ping needs a device (the interface, or source address, to ping from)")
    return ping_mesh(options.node, dict(peers), options.dev)


def _iperf3(options: CheckOptions) -> list[CheckResult]:
    """iperf3 to each peer, one at a time (pairs at once would share the link they measure)."""
    expected = options.expected_gbps * 1e9
    peers = options.needing_peers("iperf3")
    return [iperf3_pair(options.node, name, address, expected) for name, address in peers.items()]


def _gpu_perf(check: str) -> Callable[[CheckOptions], list[CheckResult]]:
    def run(options: CheckOptions) -> list[CheckResult]:
        return run_gpu_perf(options.node, check, cuda_devices(), SHORT if options.short else FULL)

    return run


def _allreduce(options: CheckOptions) -> list[CheckResult]:
    """The pairwise all-reduce across this node's GPUs, one process each."""
    devices = cuda_devices()
    if isinstance(devices, str):
        return [allreduce.error_result(options.node, devices, time.time())]
    return allreduce.run_local(options.node, len(devices))


_GPU_PERF = (PCIE_BANDWIDTH, HBM_BANDWIDTH, GEMM)
CATALOG: Mapping[str, Check] = {
    check.name: check
    for check in (
        Check(dcgm_diag.CHECK, Weight.LIGHT, _dcgm_diag),  # level 1 is light; -r 2|3 are asked for by name
        Check("gpu_state", Weight.LIGHT, _gpu_state, gpu_state.CHECKS),
        Check("ping", Weight.LIGHT, _ping),
        Check("iperf3", Weight.HEAVY, _iperf3),
        *(Check(name, Weight.HEAVY, _gpu_perf(name)) for name in _GPU_PERF),
        Check("allreduce", Weight.HEAVY, _allreduce, (allreduce.CHECK,)),
    )
}
# the check a result's name comes from: what the lifecycle waits for, and `--checks` takes, by result name
REPORTED_BY: Mapping[str, str] = {
    reported: check.name for check in CATALOG.values() for reported in check.reports
}

_LIGHT = ("dcgm_diag", "gpu_state")
SETS: Mapping[str, tuple[str, ...]] = {
    "light": _LIGHT,
    "heavy": (*_LIGHT, *_GPU_PERF, "allreduce"),
    "preflight": (*_LIGHT, *_GPU_PERF),  # run with CheckOptions(short=True): `fleetlens checks preflight`
}


def chosen(text: str) -> list[str]:
    """Check names from "a,b" where each is a check's name, a set's, or a name its results carry
    (REPORTED_BY), in order, each once."""
    names: list[str] = []
    for word in (word.strip() for word in text.split(",")):
        if word in SETS:
            names += SETS[word]
        elif word in CATALOG or word in REPORTED_BY:
            names.append(REPORTED_BY.get(word, word))
        elif word:
            known = ", ".join([*CATALOG, *(f"{name} (set)" for name in SETS)])
            raise CollectorConfigError(f"unknown check {word!r}; known: {known}")
    return list(dict.fromkeys(names))

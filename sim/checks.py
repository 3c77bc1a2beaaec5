"""Simulated active checks: what the checks a lifecycle starts on a simulated node report, from its faults.

SimulatedChecks plays both sides of the lifecycle's check contract (alerts.lifecycle, matched by shape):
`start(node, checks, now)` records a request (a CheckTrigger), and `checks(node, since, until)` answers
the CheckRows of the requested checks that finished by `until` and started in [since, until), as the
store's `checks_between` does (a ResultsReader). Times are unix seconds; `epoch` is the scenario's time 0.

A check requested at t runs for CHECK_DURATION_S of its name and reports when that has passed, never at
once. It judges the node over its whole run [t, t + duration): each fault of the node (its own and the
per-node effects of faults of shared layers above it) active at any moment of the run and seen by the
check (seen_by) gives its status on the targets it touches, the worst one winning; every other target
PASSes. A repaired node (sim.scenario, `repair`) is healthy from the repair on, so a check started after
it PASSes. The evidence names the injected faults behind a verdict other than PASS.

Requests use the `--checks` names (REQUESTS, from the real catalog) or the names their rows carry
(catalog.REPORTED_BY), as the lifecycle asks; the rows carry the names the real checks write:
`gpu_state` gives `remapped_rows` and `power_slowdown` rows (collectors.checks.gpu_state) and
`allreduce` the `allreduce_busbw` row (collectors.checks.allreduce). GPU checks give one row per GPU
(`gpu:N`), `ping` and `iperf3` one for the node's peer (the next node of the fleet, `peer:NAME`),
`allreduce` one for the whole node.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from alerts.errors import BackendError
from analytics.store.records import CheckRow
from analytics.xid_catalog import lookup
from collectors.checks import allreduce, dcgm_diag, gpu_state
from collectors.checks.catalog import CATALOG, REPORTED_BY
from collectors.checks.result import SEVERITY, Status
from sim.scenario import Fault, Scenario

PCIE_BANDWIDTH, HBM_BANDWIDTH, GEMM = "pcie_bandwidth", "hbm_bandwidth", "gemm"
PING, IPERF3 = "ping", "iperf3"
ALLREDUCE = "allreduce"  # the request; its row is allreduce.CHECK
DCGM_LEVEL = 3  # the heavy diagnostic a drained node is tested with

# each `--checks` name: the row checks it writes (the real catalog's)
REQUESTS: Mapping[str, tuple[str, ...]] = {name: check.reports for name, check in CATALOG.items()}
# how long each request runs on a node of 8 GPUs, simulated seconds, and where the figure comes from
CHECK_DURATION_S: Mapping[str, float] = {
    dcgm_diag.CHECK: 1800.0,  # `dcgmi diag -r 3`: about 30 minutes (NVIDIA DCGM user guide, "Run Levels")
    "gpu_state": 1.0,  # one NVML read of every GPU (collectors.checks.gpu_state)
    PCIE_BANDWIDTH: 60.0,  # the CUDA samples' bandwidthTest per GPU, H2D and D2H, as Autopilot's pciebw runs
    HBM_BANDWIDTH: 60.0,  # a device-to-device copy per GPU, a few seconds each with warm-up (estimate)
    GEMM: 60.0,  # a large GEMM per GPU timed over ~5 s after warm-up (estimate)
    ALLREDUCE: 120.0,  # torch.distributed start-up and nccl-tests' sweep of sizes (estimate)
    PING: 2.0,  # 10 pings 0.2 s apart (collectors.checks.network: ping_peer's count, PING_INTERVAL_S)
    IPERF3: 2.0,  # iperf3_pair's default `-t 2`
}
# the heavy set a drained node is tested with before it returns: every GPU check and the all-reduce
SIM_HEAVY_CHECKS = (dcgm_diag.CHECK, "gpu_state", PCIE_BANDWIDTH, HBM_BANDWIDTH, GEMM, ALLREDUCE)
SIM_HEAVY_REPORTS = tuple(reported for name in SIM_HEAVY_CHECKS for reported in REQUESTS[name])  # as rows
_GPU_ROWS = frozenset({dcgm_diag.CHECK, *gpu_state.CHECKS, PCIE_BANDWIDTH, HBM_BANDWIDTH, GEMM})
_EVERY_GPU_CHECK = {
    dcgm_diag.CHECK: Status.FAIL,  # the deployment and PCIe tests cannot reach it
    gpu_state.REMAPPED_ROWS: Status.ERROR,  # gpu_state: a GPU that is down is ERROR, never PASS
    gpu_state.POWER_SLOWDOWN: Status.ERROR,
    PCIE_BANDWIDTH: Status.FAIL,
    HBM_BANDWIDTH: Status.FAIL,
    GEMM: Status.FAIL,
    allreduce.CHECK: Status.FAIL,  # its rank cannot start
}
_LINK_LOST = {PING: Status.FAIL, IPERF3: Status.FAIL, allreduce.CHECK: Status.FAIL}


def seen_by(fault: Fault) -> Mapping[str, Status]:
    """The row checks that see `fault` while it is active, and the status each gives the targets it touches.

    A GPU gone or needing a reset (lost, an Xid whose catalog action drains) fails every check on it; a
    double-bit ECC error fails DCGM's memory test and leaves a remap pending (gpu_state: WARN); a throttled
    or power-braked GPU is in HW slowdown and computes slower; a GPU's link trained down fails the PCIe
    tests; a lost port or bit errors fail the network checks, congestion only slows them (WARN), a lost
    GPUDirect RDMA path halves the all-reduce; a slow node computes slower. An application's Xids and a
    contained error leave the hardware healthy: no check sees them.
    """
    match fault.kind:
        case "gpu_lost":
            return _EVERY_GPU_CHECK
        case "xid":
            return _EVERY_GPU_CHECK if lookup(fault.params["code"]).action.drains else {}
        case "dbe_remap":
            return {dcgm_diag.CHECK: Status.FAIL, gpu_state.REMAPPED_ROWS: Status.WARN}
        case "thermal_throttle" | "power_brake":
            return {gpu_state.POWER_SLOWDOWN: Status.FAIL, GEMM: Status.FAIL}
        case "slow_node":
            return {GEMM: Status.FAIL}
        case "dma_degraded" if fault.params.get("mode") == "pcie_downgrade":
            return {dcgm_diag.CHECK: Status.FAIL, PCIE_BANDWIDTH: Status.FAIL}
        case "dma_degraded":
            return {allreduce.CHECK: Status.FAIL}
        case "link_flap" | "link_down" | "port_errors":
            return _LINK_LOST
        case "congestion":
            return {IPERF3: Status.WARN, allreduce.CHECK: Status.WARN}
    return {}


@dataclass(frozen=True)
class _Request:
    node: str
    check: str
    started: float  # unix seconds


class SimulatedChecks:
    """The checks of a scenario's simulated nodes (module doc): `start` them, then read their rows."""

    name = "simulated"

    def __init__(self, scenario: Scenario, epoch: float) -> None:
        self._scenario = scenario
        self._epoch = epoch
        self._requests: list[_Request] = []

    def start(self, node: str, checks: Sequence[str], now: float) -> None:
        """Start `checks` (REQUESTS names, or the names their rows carry, as `checks run --checks` takes
        them) on `node` at `now`; BackendError for an unknown node or check, before any of them starts."""
        names = self._scenario.fleet.names
        if node not in names:
            raise BackendError(f"simulated checks: no node {node!r} in the scenario's fleet of {len(names)}")
        if unknown := sorted(set(checks) - set(REQUESTS) - set(REPORTED_BY)):
            raise BackendError(
                f"simulated checks: unknown check(s) {', '.join(unknown)}; known: {', '.join(REQUESTS)}"
            )
        requested = dict.fromkeys(REPORTED_BY.get(check, check) for check in checks)
        self._requests += [_Request(node, check, now) for check in requested]

    def __call__(self, node: str, since: float, until: float) -> list[CheckRow]:
        """The rows of `node`'s checks that started in [since, until) and finished by `until`, in the
        order started."""
        done = [
            request
            for request in self._requests
            if request.node == node
            and since <= request.started < until
            and request.started + CHECK_DURATION_S[request.check] <= until
        ]
        return [row for request in sorted(done, key=lambda r: r.started) for row in self._rows(request)]

    def _rows(self, request: _Request) -> list[CheckRow]:
        duration = CHECK_DURATION_S[request.check]
        faults = [
            fault
            for fault in self._scenario.played_faults
            if fault.node == request.node and self._meets(fault, request.started, request.started + duration)
        ]
        rows = []
        for check in REQUESTS[request.check]:
            for target in self._targets(request.node, check):
                seen = [(fault, seen_by(fault)[check]) for fault in faults if _touches(fault, check, target)]
                status = max((status for _, status in seen), key=SEVERITY.__getitem__, default=Status.PASS)
                evidence = {"simulated": True, "faults": [fault.describe() for fault, _ in seen]}
                if check == dcgm_diag.CHECK:
                    evidence["level"] = DCGM_LEVEL
                rows.append(
                    CheckRow(
                        node=request.node,
                        check=check,
                        target=target,
                        status=str(status),
                        value=None,
                        unit="",
                        threshold=None,
                        evidence=json.dumps(evidence, sort_keys=True),
                        started=request.started,
                        duration_s=duration,
                    )
                )
        return rows

    def _meets(self, fault: Fault, start: float, end: float) -> bool:
        """The fault is active at some moment of [start, end) (unix seconds, compared as such so that a
        check started at a repair's unix time runs after it); one without an end lasts past the
        scenario's: nothing repaired it."""
        fault_end = math.inf if fault.end_s is None else self._epoch + fault.end_s
        return self._epoch + fault.start_s < end and start < fault_end

    def _targets(self, node: str, check: str) -> list[str]:
        if check in _GPU_ROWS:
            return [f"gpu:{gpu}" for gpu in range(self._scenario.fleet.gpus_per_node)]
        if check in (PING, IPERF3):
            names = self._scenario.fleet.names
            return [f"peer:{names[(names.index(node) + 1) % len(names)]}"]
        return [""]


def _touches(fault: Fault, check: str, target: str) -> bool:
    """The fault is seen by `check` on `target`: a GPU check on the fault's GPU (every GPU where the fault
    has none), any other check on its one target."""
    if check not in seen_by(fault):
        return False
    return check not in _GPU_ROWS or fault.gpu is None or target == f"gpu:{fault.gpu}"

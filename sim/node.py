"""The simulated VM and its timeline: a generated /sys tree, simulated GPUs and its ranks' NCCL logs, read
by a real Exporter with the gpu, xid, infiniband, netclass and nccl_log collectors. Faults and confounders
act on those sources as a real fleet would show them (see `_fault_events`). Simulated time t (seconds from
the scenario's start) is the unix time epoch + t, and tick k, a scrape of every node, happens at
t = k x interval_s. sim.offline and sim.online play a scenario of these nodes into a store.

In the stock flavour (Scenario.exporters "stock", sim.stock) the same sources are read as a fleet that
runs only stock exporters reads them: the GPUs by dcgm-exporter's rendering (sim.dcgm), the /sys tree by
a real node_exporter process (sim.nodeexporter) that the node starts and close() ends.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collectors import registry, textformat
from collectors.base import CollectorOptions, ReadErrors
from collectors.exporter import Exporter, make_app, make_registry
from collectors.gpu.collector import GpuCollector
from collectors.gpu.sim import ManualClock, SimBackend
from collectors.registry import BuiltCollector
from collectors.xid import XidCollector
from sim.dcgm import DcgmExporter
from sim.errors import SimulationError
from sim.fleet import SEED_STRIDE
from sim.jobs import downtimes, nccl_log, nic_of_gpu
from sim.nodeexporter import NodeExporter
from sim.scenario import Fault, Scenario
from sim.sysfs import SimSysfs

SCENARIO_EPOCH: float = 1_767_225_600.0  # 2026-01-01T00:00Z: simulated time 0 is this unix time
EXPORTER_PORT = 9612  # the port in target names: where a real fleet's exporter listens (its default)
SCRAPE_GAP = "simulated scrape gap"  # the reason phrase of the 503 a node answers during a scrape_gap
SCRAPE_GAP_ERROR = f"HTTP 503 {SCRAPE_GAP}"  # what the scraper records for it
FILE_COLLECTORS = ("infiniband", "netclass", "nccl_log")  # built from options; gpu and xid on the node's GPUs
GPU_BUSY_LOAD = 0.95  # a training job's GPU load (1 is gpu-burn)
NIC_IDLE_LOAD = 0.01  # health checks and monitoring while no job runs
NO_GDR_TRAFFIC = 0.6  # share of its healthy throughput a NIC keeps when NCCL stages through host memory
STORM_XIDS = (13, 31, 43)  # what a crashing job's kernels raise: graphics engine exception, MMU fault, stop
DBE_XID, REMAP_XID, CONTAINED_XID = 48, 63, 94  # a double-bit ECC error, its row remap, contained errors


@dataclass
class SimSummary:
    """What one run produced: ticks played, rows stored, scrapes that found the target down, and how
    long it took in real seconds."""

    ticks: int
    samples: int
    steps: int
    targets_down: int
    wall_s: float


@dataclass(frozen=True)
class Event:
    """Something that happens to one node at simulated time `t`."""

    t: float
    apply: Callable[[SimNode], None]


class SimNode:
    """One simulated VM: its /sys tree, GPUs and NCCL logs, the exporter that reads them, and the events
    of the scenario that touch it. Its own simulated clock reads epoch + the time it was played to."""

    def __init__(self, scenario: Scenario, index: int, workdir: Path, epoch: float) -> None:
        self.name = scenario.fleet.names[index]
        self.target = f"{self.name}:{EXPORTER_PORT}"
        self.clock = ManualClock(epoch)
        self.answering = True
        self._scenario = scenario
        self._epoch = epoch
        self._t = 0.0
        seed = scenario.seed * SEED_STRIDE + index
        fleet = scenario.fleet
        self.sysfs = SimSysfs(workdir / self.name / "sys", self.name, nics=fleet.nics_per_node, seed=seed)
        self.sysfs.write()
        self.gpus = SimBackend(count=fleet.gpus_per_node, seed=seed, clock=self.clock)
        self._nccl_dir = workdir / self.name / "nccl"
        self._nccl_dir.mkdir(parents=True, exist_ok=True)
        for stale in self._nccl_dir.glob("*.log"):  # a node boots without the logs of an earlier run
            stale.unlink()
        self._options = CollectorOptions(
            sysfs_root=self.sysfs.root,
            node=self.name,
            gpu_backend="none",
            nccl_logs=f"{self._nccl_dir}/*.log",
        )
        self._jobs = {job.name: job for job in scenario.jobs if self.name in job.nodes}
        self._starts = dict.fromkeys(self._jobs, -1)  # how often each job started; -1: not yet
        self._running: set[str] = set()
        self._host_staged_nics: set[int] = set()
        self._exporter = self._build_exporter()
        self._app = make_app(make_registry(self._exporter, process_metrics=False))
        self._events = timeline(scenario, self.name)
        self.node_exporter: NodeExporter | None = None  # stock flavour: a real one on the /sys tree
        if scenario.exporters == "stock":
            log = workdir / self.name / "node_exporter.log"
            self.node_exporter = NodeExporter(self.sysfs.root, log).start()

    def play_until(self, t: float) -> None:
        """Apply every event up to simulated time `t`, letting traffic flow in between."""
        while self._events and self._events[0].t <= t:
            event = self._events.pop(0)
            self._advance_to(event.t)
            event.apply(self)
        self._advance_to(t)

    def body(self) -> bytes:
        """One scrape of the exporter (in the stock flavour: of dcgm-exporter), in the Prometheus text
        format the hub asks for."""
        return textformat.render(self._exporter.collect())

    def wsgi(self, environ: dict, start_response: Callable) -> list[bytes]:
        """The node's HTTP face: its exporter's app (stock flavour: dcgm-exporter's), or 503 while it
        does not answer (scrape_gap)."""
        return self._answer(self._app, environ, start_response)

    def node_exporter_wsgi(self, environ: dict, start_response: Callable) -> list[bytes]:
        """Its node_exporter's HTTP face (stock flavour): node_exporter's own answers, passed through, or
        503 while the node does not answer. A scrape_gap takes every exporter of the node away at once."""
        if self.node_exporter is None:
            raise SimulationError(f"{self.name} runs fleetlens's exporter, not node_exporter")
        return self._answer(self.node_exporter.wsgi, environ, start_response)

    def _answer(self, app: Callable, environ: dict, start_response: Callable) -> list[bytes]:
        if not self.answering:
            start_response(f"503 {SCRAPE_GAP}", [("Content-Type", "text/plain")])
            return [f"{SCRAPE_GAP}\n".encode()]
        return app(environ, start_response)

    def close(self) -> None:
        self._exporter.close()
        if self.node_exporter is not None:
            self.node_exporter.stop()

    # -- what events do ------------------------------------------------------------------------------------

    def start_job(self, job: str) -> None:
        """The job's processes start on this node (again, after a restart): busy GPUs, fresh NCCL logs."""
        self._starts[job] += 1
        self._running.add(job)
        self._write_nccl_log(job)
        self.gpus.set_load(None, GPU_BUSY_LOAD)

    def stop_job(self, job: str) -> None:
        """The job's processes end here (a restart): the GPUs idle once no job runs."""
        self._running.discard(job)
        if not self._running:
            self.gpus.set_load(None, 0.0)

    def clock_down(self, factor: float | None) -> None:
        """Every GPU's SM clock x `factor` with no reason reported (a silent straggler); None: normal."""
        for gpu in range(self._scenario.fleet.gpus_per_node):
            if factor is None:
                self.gpus.clear_fault(gpu, "slow")
            else:
                self.gpus.set_fault(gpu, "slow", clock_factor=factor)

    def power_brake(self, gpu: int | None, on: bool) -> None:
        """The system asserts (or releases) the power brake on `gpu`, None: on every GPU of the node, as a
        chassis whose power supply failed does (gpud's 8-H100 capture: all eight braked)."""
        gpus = range(self._scenario.fleet.gpus_per_node) if gpu is None else (gpu,)
        for index in gpus:
            if on:
                self.gpus.set_fault(index, "power_brake")
            else:
                self.gpus.clear_fault(index, "power_brake")

    def stage_through_host(self, nic: int, staged: bool) -> None:
        """GPUDirect RDMA lost (or back) on `nic`: it moves less, its GPUs' PCIe carries the bounce, and
        the ranks on it re-initialise NCCL, whose logs say so."""
        self.sysfs.set_traffic(nic, NO_GDR_TRAFFIC if staged else 1.0)
        for gpu in range(self._scenario.fleet.gpus_per_node):
            if nic_of_gpu(gpu, self._scenario.fleet) != nic:
                continue
            if staged:
                self.gpus.set_fault(gpu, "host_staged")
            else:
                self.gpus.clear_fault(gpu, "host_staged")
        (self._host_staged_nics.add if staged else self._host_staged_nics.discard)(nic)
        for job in self._running:
            self._write_nccl_log(job)

    def double_bit_error(self, gpu: int, contained: int) -> None:
        """A double-bit ECC error as a real GPU reports it (gpud's dmesg.0.log): Xid 48, the row marked for
        remapping (Xid 63; pending until the GPU is reset), then `contained` contained errors (Xid 94) as
        the job's channels hit it; the volatile DBE and uncorrectable remapped-row counters go up by one."""
        self.gpus.set_fault(gpu, "ecc", dbe=1, sbe_per_second=0.0)
        for code in (DBE_XID, REMAP_XID, *[CONTAINED_XID] * contained):
            self.gpus.set_fault(gpu, "xid", code=code)

    def restart_exporter(self) -> None:
        """The exporter restarts with a driver reload: a fresh exporter, sysfs counters from zero. In the
        stock flavour dcgm-exporter restarts (it forgets the last Xids); node_exporter keeps no state
        between scrapes, so the driver reload is all its restart would show, and it keeps running."""
        self._exporter.close()
        self.sysfs.reload_driver()
        self._exporter = self._build_exporter()
        self._app = make_app(make_registry(self._exporter, process_metrics=False))

    # -- internals -----------------------------------------------------------------------------------------

    def _advance_to(self, t: float) -> None:
        if t > self._t:
            self.sysfs.advance(t - self._t, load=1.0 if self._running else NIC_IDLE_LOAD)
            self.clock.now = self._epoch + t
            self._t = t

    def _build_exporter(self) -> Exporter | DcgmExporter:
        """fleetlens's exporter on every source of the node; in the stock flavour, dcgm-exporter's
        rendering of its GPUs (its /sys tree is node_exporter's, its NCCL logs nobody's)."""
        if self._scenario.exporters == "stock":
            return DcgmExporter(self.gpus, self.name)
        gpu_errors, xid_errors = ReadErrors("gpu"), ReadErrors("xid")
        built = [
            BuiltCollector("gpu", GpuCollector(self.gpus, self.name, gpu_errors), gpu_errors),
            BuiltCollector("xid", XidCollector(self.name, xid_errors, self.gpus), xid_errors),
            *registry.build(FILE_COLLECTORS, self._options),
        ]
        return Exporter(built, clock=self.clock)

    def _write_nccl_log(self, job: str) -> None:
        """Replace the job's log, as a new NCCL process writes a new one (the collector starts over)."""
        text = nccl_log(
            self._jobs[job], self.name, self._scenario.fleet, self._host_staged_nics, self._starts[job]
        )
        staging = self._nccl_dir / f".{job}.tmp"
        staging.write_text(text)
        os.replace(staging, self._nccl_dir / f"{job}.log")


def timeline(scenario: Scenario, node: str) -> list[Event]:
    """Every event of the scenario on `node`, in time order (same-time events in scenario order)."""
    events = []
    for job in scenario.jobs:
        if node not in job.nodes:
            continue
        events.append(Event(0.0, lambda n, name=job.name: n.start_job(name)))
        for down in downtimes(scenario, job.name):
            events.append(Event(down.start, lambda n, name=job.name: n.stop_job(name)))
            events.append(Event(down.end, lambda n, name=job.name: n.start_job(name)))
    for fault in scenario.played_faults:
        if fault.node == node:
            events += _fault_events(fault)
    for confounder in scenario.confounders:
        if confounder.node != node:
            continue
        if confounder.kind == "exporter_restart":
            events.append(Event(confounder.start_s, SimNode.restart_exporter))
        elif confounder.kind == "scrape_gap":
            events.append(Event(confounder.start_s, lambda n: setattr(n, "answering", False)))
            events.append(Event(confounder.end_s, lambda n: setattr(n, "answering", True)))
    return sorted(events, key=lambda event: event.t)


def _fault_events(fault: Fault) -> list[Event]:
    """What a fault does to its node's sources, as a real fleet would show it."""
    gpu, nic, params = fault.gpu, fault.nic, fault.params
    match fault.kind:
        case "slow_node":  # every GPU of the node clocked down: its ranks compute 1 + severity slower
            factor = 1 / (1 + params["severity"])
            return _span(fault, lambda n: n.clock_down(factor), lambda n: n.clock_down(None))
        case "thermal_throttle" | "gpu_lost":
            kind = fault.kind
            return _span(
                fault, lambda n: n.gpus.set_fault(gpu, kind), lambda n: n.gpus.clear_fault(gpu, kind)
            )
        case "power_brake":
            return _span(fault, lambda n: n.power_brake(gpu, True), lambda n: n.power_brake(gpu, False))
        case "xid":
            return [Event(fault.start_s, lambda n: n.gpus.set_fault(gpu, "xid", code=params["code"]))]
        case "xid_storm":
            return _xid_storm(fault)
        case "dbe_remap":  # the fault's end is the GPU reset that applies the remap
            return _span(
                fault,
                lambda n: n.double_bit_error(gpu, params["contained"]),
                lambda n: n.gpus.clear_fault(gpu, "ecc"),
            )
        case "link_flap":  # down and up again `flaps` times, every period_s, none after its end (a repair)
            period, end = params["period_s"], fault.end_s or math.inf
            events = []
            for flap in range(params["flaps"]):
                down_at = fault.start_s + flap * period
                if down_at >= end:
                    break
                events.append(Event(down_at, lambda n: n.sysfs.set_link(nic, up=False)))
                events.append(Event(min(down_at + period / 2, end), lambda n: n.sysfs.set_link(nic, up=True)))
            return events
        case "link_down":
            return _span(
                fault, lambda n: n.sysfs.set_link(nic, up=False), lambda n: n.sysfs.set_link(nic, up=True)
            )
        case "dma_degraded" if params["mode"] == "no_gdr":
            return _span(
                fault, lambda n: n.stage_through_host(nic, True), lambda n: n.stage_through_host(nic, False)
            )
        case "dma_degraded":  # pcie_downgrade: the GPU's link trained below its maximum, replays growing
            return _span(
                fault,
                lambda n: n.gpus.set_fault(gpu, "pcie_downgrade"),
                lambda n: n.gpus.clear_fault(gpu, "pcie_downgrade"),
            )
        case "congestion":
            level = params["level"]
            return _span(
                fault,
                lambda n: n.sysfs.set_congestion(nic, level),
                lambda n: n.sysfs.set_congestion(nic, 0.0),
            )
        case "port_errors":  # a bad optic or cable; a leaf_degraded fault in mode errors plays one per NIC
            level = params["level"]
            return _span(
                fault, lambda n: n.sysfs.set_errors(nic, level), lambda n: n.sysfs.set_errors(nic, 0.0)
            )
    raise SimulationError(f"fault kind {fault.kind!r} on {fault.node} has no simulated effect")


def _xid_storm(fault: Fault) -> list[Event]:
    """A crashing job's Xids: `events` of them spread evenly over the fault's span and the node's GPUs,
    the first third graphics engine exceptions (13), then MMU faults (31), then stopped channels (43)."""
    events, end = fault.params["events"], fault.end_s
    assert end is not None  # sim.scenario gives every storm an end
    return [
        Event(
            fault.start_s + index * (end - fault.start_s) / events,
            lambda n, index=index: n.gpus.set_fault(
                index % len(n.gpus.identities()), "xid", code=STORM_XIDS[index * len(STORM_XIDS) // events]
            ),
        )
        for index in range(events)
    ]


def _span(fault: Fault, begin: Callable[[SimNode], None], end: Callable[[SimNode], None]) -> list[Event]:
    """`begin` at the fault's start and `end` at its end, if it has one."""
    events = [Event(fault.start_s, begin)]
    if fault.end_s is not None:
        events.append(Event(fault.end_s, end))
    return events


def tick_times(scenario: Scenario) -> list[float]:
    """The simulated times of the scrapes: 0, interval_s, ... up to duration_s."""
    return [k * scenario.interval_s for k in range(int(scenario.duration_s // scenario.interval_s) + 1)]

"""The fleet simulator: plays an sim.scenario.Scenario through the real collectors and into a store.

Each node is a simulated VM (a generated /sys tree, simulated GPUs, the NCCL logs of its ranks) read by
a real Exporter with the gpu, xid, infiniband, netclass and nccl_log collectors. Faults and confounders
act on those sources as a real fleet would show them (see `_fault_events`); the jobs' step records come
from sim.jobs. Simulated time t (seconds from the scenario's start) is the unix time
epoch + t, and tick k, a scrape of every node, happens at t = k x interval_s.

    simulate_offline(scenario, store, workdir)     render, parse and insert, as fast as it goes
    simulate_online(scenario, store, workdir, speed=10)
        the nodes served on loopback and scraped by the hub's Scraper, the rows written by the hub's
        Writer (with its spool), the step records POSTed as JSON lines to a Hub's /api/v1/steps

Both give the same rows for a scenario: the same samples and steps, and the same targets rows but for
duration_s (offline: 0, the simulated time a scrape takes; online: the real one). Targets are named
`<node>:9400`, where a real fleet's exporter listens; the loopback ports are the simulation's. The
clocks are simulated: every exporter reports collector durations of 0, and the same scenario (its
seed) in the same workdir gives identical rows run after run (the NCCL series carry their log file's
path, as on a real node). `workdir` holds the /sys trees, NCCL logs and the online spool; put it on
tmpfs for large fleets.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import multiprocessing
import os
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.queues import Queue
from pathlib import Path
from queue import Empty

from analytics.store import Store
from analytics.store.records import ScrapeBatch, TargetStatus
from collectors import registry, textformat
from collectors.base import CollectorOptions, ReadErrors
from collectors.errors import CollectorError
from collectors.exporter import Exporter, make_app, make_registry
from collectors.gpu.collector import GpuCollector
from collectors.gpu.sim import ManualClock, SimBackend
from collectors.registry import BuiltCollector
from collectors.steprecord import CONTRACT_KEYS, StepRecord
from collectors.xid import XidCollector
from hub.app import Hub
from hub.expfmt import ExpositionParser
from hub.otlp import OtlpStepReceiver
from hub.scraper import Scraper, Target
from hub.spool import Spool
from hub.writer import Writer
from sim.fleet import LOOPBACK, SEED_STRIDE
from sim.jobs import JobModel, downtimes, nccl_log, nic_of_gpu
from sim.loopserver import LoopServer
from sim.scenario import Fault, Scenario
from sim.sysfs import SimSysfs

SCENARIO_EPOCH: float = 1_767_225_600.0  # 2026-01-01T00:00Z: simulated time 0 is this unix time
EXPORTER_PORT = 9400  # the port in target names: where a real fleet's exporter listens
SCRAPE_GAP = "simulated scrape gap"  # the reason phrase of the 503 a node answers during a scrape_gap
SCRAPE_GAP_ERROR = f"HTTP 503 {SCRAPE_GAP}"  # what the scraper records for it
FILE_COLLECTORS = ("infiniband", "netclass", "nccl_log")  # built from options; gpu and xid on the node's GPUs
GPU_BUSY_LOAD = 0.95  # a training job's GPU load (1 is gpu-burn)
NIC_IDLE_LOAD = 0.01  # health checks and monitoring while no job runs
NO_GDR_TRAFFIC = 0.6  # share of its healthy throughput a NIC keeps when NCCL stages through host memory
FLUSH_SAMPLES = 250_000  # offline: samples gathered before one insert, with their targets and steps rows
PARALLEL_NODE_TICKS = 2_000  # offline: smaller scenarios are simulated in-process (a worker starts in ~1 s)
CHUNK_TICKS = 10  # offline: rounds a worker process sends at once
QUEUED_CHUNKS = 4  # ... and how many may wait for the main process
STEPS_PER_POST = 2_000  # online: step records per POST, well under the loopback server's body limit
SPOOL_BYTES = 1 << 30


class SimulationError(CollectorError):
    """The simulation cannot go on: a bad argument, or a part of the pipeline that refused its rows."""


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

    def play_until(self, t: float) -> None:
        """Apply every event up to simulated time `t`, letting traffic flow in between."""
        while self._events and self._events[0].t <= t:
            event = self._events.pop(0)
            self._advance_to(event.t)
            event.apply(self)
        self._advance_to(t)

    def body(self) -> bytes:
        """One scrape of the exporter, in the Prometheus text format the hub asks for."""
        return textformat.render(self._exporter.collect())

    def wsgi(self, environ: dict, start_response: Callable) -> list[bytes]:
        """The node's HTTP face: its exporter's app, or 503 while it does not answer (scrape_gap)."""
        if not self.answering:
            start_response(f"503 {SCRAPE_GAP}", [("Content-Type", "text/plain")])
            return [f"{SCRAPE_GAP}\n".encode()]
        return self._app(environ, start_response)

    def close(self) -> None:
        self._exporter.close()

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

    def restart_exporter(self) -> None:
        """The exporter restarts with a driver reload: a fresh exporter, sysfs counters from zero."""
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

    def _build_exporter(self) -> Exporter:
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
    for fault in scenario.faults:
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
        case "xid":
            return [Event(fault.start_s, lambda n: n.gpus.set_fault(gpu, "xid", code=params["code"]))]
        case "link_flap":  # down and up again `flaps` times, every period_s
            period = params["period_s"]
            events = []
            for flap in range(params["flaps"]):
                down_at = fault.start_s + flap * period
                events.append(Event(down_at, lambda n: n.sysfs.set_link(nic, up=False)))
                events.append(Event(down_at + period / 2, lambda n: n.sysfs.set_link(nic, up=True)))
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
    raise SimulationError(f"fault kind {fault.kind!r} on {fault.node} has no simulated effect")


def _span(fault: Fault, begin: Callable[[SimNode], None], end: Callable[[SimNode], None]) -> list[Event]:
    """`begin` at the fault's start and `end` at its end, if it has one."""
    events = [Event(fault.start_s, begin)]
    if fault.end_s is not None:
        events.append(Event(fault.end_s, end))
    return events


def tick_times(scenario: Scenario) -> list[float]:
    """The simulated times of the scrapes: 0, interval_s, ... up to duration_s."""
    return [k * scenario.interval_s for k in range(int(scenario.duration_s // scenario.interval_s) + 1)]


# -- offline -------------------------------------------------------------------------------------------------


def simulate_offline(
    scenario: Scenario,
    store: Store,
    workdir: Path,
    epoch: float = SCENARIO_EPOCH,
    *,
    workers: int | None = None,
) -> SimSummary:
    """Play the scenario as fast as it goes: each node's exposition rendered, parsed and stored as the hub
    would store its scrape, many ticks per insert.

    The nodes are simulated in `workers` processes (default: one per CPU for scenarios of at least
    PARALLEL_NODE_TICKS node-ticks, else none: this process does it all); the rows do not depend on it.
    Worker processes are spawned, so a script that calls this needs the `if __name__ == "__main__":` guard.
    """
    started = time.perf_counter()
    ticks = tick_times(scenario)
    if workers is None:
        enough = scenario.fleet.nodes * len(ticks) >= PARALLEL_NODE_TICKS
        workers = min(len(os.sched_getaffinity(0)), scenario.fleet.nodes) if enough else 1
    if workers < 1:
        raise SimulationError(f"workers must be at least 1, got {workers}")
    jobs = [JobModel(job, scenario, epoch) for job in scenario.jobs]
    inserts = _Inserts(store)
    with ExitStack() as stack:
        if workers == 1:
            rounds = node_rounds(scenario, range(scenario.fleet.nodes), Path(workdir), epoch)
        else:
            rounds = stack.enter_context(_Workers(scenario, Path(workdir), epoch, workers)).rounds()
        for t, (batches, statuses) in zip(ticks, rounds, strict=True):
            inserts.add(batches, statuses, [row for job in jobs for row in job.steps_until(t)])
    inserts.flush()
    return inserts.summary(len(ticks), time.perf_counter() - started)


Round = tuple[list[ScrapeBatch], list[TargetStatus]]  # one tick: the batches of the nodes that answered


def node_rounds(scenario: Scenario, indices: Iterable[int], workdir: Path, epoch: float) -> Iterator[Round]:
    """Per tick, the scrape of every node in `indices` (its place in the fleet)."""
    nodes = [SimNode(scenario, index, workdir, epoch) for index in indices]
    parsers = [ExpositionParser() for _ in nodes]
    try:
        for t in tick_times(scenario):
            ts = epoch + t
            batches, statuses = [], []
            for node, parser in zip(nodes, parsers, strict=True):
                node.play_until(t)
                if not node.answering:
                    statuses.append(TargetStatus(ts, node.target, node.name, False, 0.0, 0, SCRAPE_GAP_ERROR))
                    continue
                exposition = parser.parse(node.body().decode())
                batch = ScrapeBatch(
                    node.target, node.name, ts, exposition.names, exposition.labels, exposition.values
                )
                batches.append(batch)
                statuses.append(TargetStatus(ts, node.target, node.name, True, 0.0, len(batch)))
            yield batches, statuses
    finally:
        for node in nodes:
            node.close()


class _Workers:
    """Processes that each simulate every n-th node and send their rounds back, CHUNK_TICKS at a time.

    Nodes are independent of each other, so the split changes nothing in the rows. A worker sends
    lists of rounds, then None when done, or its traceback as a string when it failed.
    """

    def __init__(self, scenario: Scenario, workdir: Path, epoch: float, workers: int) -> None:
        context = multiprocessing.get_context("spawn")  # the parent runs chDB threads: never fork it
        self._shards = [range(first, scenario.fleet.nodes, workers) for first in range(workers)]
        self._queues = [context.Queue(maxsize=QUEUED_CHUNKS) for _ in self._shards]
        self._processes = [
            context.Process(
                target=_simulate_shard,
                args=(scenario, shard, workdir, epoch, queue),
                name=f"fleetlens-sim-{number}",
                daemon=True,
            )
            for number, (shard, queue) in enumerate(zip(self._shards, self._queues, strict=True))
        ]

    def __enter__(self) -> _Workers:
        for process in self._processes:
            process.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        """Workers that sent everything end by themselves; after a failure the others are stopped."""
        for process in self._processes:
            if exc_type is not None:
                process.terminate()
            process.join()

    def rounds(self) -> Iterator[Round]:
        """Every tick's rounds of all workers, merged."""
        while True:
            chunks = [self._receive(number) for number in range(len(self._processes))]
            if any(chunk is None for chunk in chunks):
                return
            for parts in zip(*chunks, strict=True):
                yield (
                    [b for batches, _ in parts for b in batches],
                    [s for _, statuses in parts for s in statuses],
                )

    def _receive(self, number: int) -> list[Round] | None:
        process, queue, shard = self._processes[number], self._queues[number], self._shards[number]
        who = f"{process.name}, simulating nodes {shard.start}::{shard.step} of the fleet"
        while True:
            try:
                message = queue.get(timeout=1.0)
            except Empty:
                if not process.is_alive():
                    raise SimulationError(f"{who}, died with exit code {process.exitcode}") from None
                continue
            if isinstance(message, str):
                raise SimulationError(f"{who}, failed:\n{message}")
            return message


def _simulate_shard(scenario: Scenario, indices: range, workdir: Path, epoch: float, queue: Queue) -> None:
    """A worker process's life: simulate its nodes, send the rounds in chunks, then None."""
    try:
        chunk: list[Round] = []
        for one_round in node_rounds(scenario, indices, workdir, epoch):
            chunk.append(one_round)
            if len(chunk) == CHUNK_TICKS:
                queue.put(chunk)
                chunk = []
        if chunk:
            queue.put(chunk)
        queue.put(None)
    except BaseException:
        queue.put(traceback.format_exc())
        raise


class _Inserts:
    """Rows gathered over many ticks and inserted together: one insert per table per FLUSH_SAMPLES."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._run = uuid.uuid4().hex
        self._flushes = 0
        self._batches: list[ScrapeBatch] = []
        self._statuses: list[TargetStatus] = []
        self._steps: list[StepRecord] = []
        self._pending_samples = 0
        self.samples = self.steps = self.targets_down = 0

    def add(self, batches: list[ScrapeBatch], statuses: list[TargetStatus], steps: list[StepRecord]) -> None:
        self._batches += batches
        self._statuses += statuses
        self._steps += steps
        self._pending_samples += sum(len(batch) for batch in batches)
        if self._pending_samples >= FLUSH_SAMPLES:
            self.flush()

    def flush(self) -> None:
        token = f"sim-{self._run}-{self._flushes}"
        self.samples += self._store.insert_samples(self._batches, token=token)
        self._store.insert_targets(self._statuses, token=f"{token}/targets")
        self.steps += self._store.insert_steps(self._steps, token=f"{token}/steps")
        self.targets_down += sum(not status.up for status in self._statuses)
        self._flushes += 1
        self._batches, self._statuses, self._steps, self._pending_samples = [], [], [], 0

    def summary(self, ticks: int, wall_s: float) -> SimSummary:
        return SimSummary(ticks, self.samples, self.steps, self.targets_down, wall_s)


# -- online --------------------------------------------------------------------------------------------------


def simulate_online(
    scenario: Scenario, store: Store, workdir: Path, speed: float = 1.0, epoch: float = SCENARIO_EPOCH
) -> SimSummary:
    """Play the scenario through the hub's own parts: nodes on loopback, scraped once per tick in lockstep
    with the simulation, paced at interval_s / speed real seconds (speed 0 or inf: no pause)."""
    if math.isnan(speed) or speed < 0:
        raise SimulationError(f"speed must be 0 (no pause), positive or inf, got {speed}")
    started = time.perf_counter()
    workdir = Path(workdir)
    fleet_clock = ManualClock(epoch)
    ticks = tick_times(scenario)
    jobs = [JobModel(job, scenario, epoch) for job in scenario.jobs]
    samples = steps = targets_down = 0
    with ExitStack() as stack:
        nodes = [SimNode(scenario, index, workdir, epoch) for index in range(scenario.fleet.nodes)]
        for node in nodes:
            stack.callback(node.close)
        server = LoopServer().start()
        stack.callback(server.stop)
        addresses = {node.name: f"{LOOPBACK}:{server.serve(node.wsgi, LOOPBACK)}" for node in nodes}
        targets = [Target(address, {"node": name}) for name, address in addresses.items()]
        names = {addresses[node.name]: node.target for node in nodes}  # loopback address -> target name
        spool = Spool(tempfile.mkdtemp(prefix="spool-", dir=workdir), SPOOL_BYTES)
        writer = Writer(store, spool)  # a Store is thread-safe: the hub's request threads share it
        stack.callback(writer.close)
        hub = Hub(store, writer, OtlpStepReceiver())
        poster = stack.enter_context(StepPoster(f"{LOOPBACK}:{server.serve(hub.app, LOOPBACK)}"))
        scraper = stack.enter_context(
            Scraper(lambda: targets, interval_s=min(scenario.interval_s, 60.0), clock=fleet_clock)
        )
        for k, t in enumerate(ticks):
            _pace(started, k * scenario.interval_s, speed)
            fleet_clock.now = epoch + t
            for node in nodes:
                node.play_until(t)
            rows = [row for job in jobs for row in job.steps_until(t)]
            poster.post(rows)
            batches, statuses = scraper.scrape_once()
            writer.write("samples", [dataclasses.replace(b, target=names[b.target]) for b in batches])
            writer.write("targets", [dataclasses.replace(s, target=names[s.target]) for s in statuses])
            samples += sum(len(batch) for batch in batches)
            steps += len(rows)
            targets_down += sum(not status.up for status in statuses)
    return SimSummary(len(ticks), samples, steps, targets_down, time.perf_counter() - started)


def _pace(started: float, simulated_s: float, speed: float) -> None:
    """Wait until `simulated_s` of simulated time has passed at `speed` x real time."""
    if speed in (0, math.inf):
        return
    delay = started + simulated_s / speed - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


_STEP_KEYS = CONTRACT_KEYS


def step_lines(rows: Sequence[StepRecord]) -> bytes:
    """Step rows as the step JSON-lines contract (collectors.steps), unknown values left out."""
    records = (
        {key: getattr(row, key) for key in _STEP_KEYS if getattr(row, key) is not None} for row in rows
    )
    return "".join(json.dumps(record) + "\n" for record in records).encode()


class StepPoster:
    """POSTs step records to a hub's /api/v1/steps over one keep-alive connection."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._conn = http.client.HTTPConnection(address, timeout=30)

    def reconnect(self) -> None:
        """Start over on a new connection (after the hub went away)."""
        self._conn.close()
        self._conn = http.client.HTTPConnection(self.address, timeout=30)

    def post(self, rows: Sequence[StepRecord]) -> None:
        for first in range(0, len(rows), STEPS_PER_POST):
            body = step_lines(rows[first : first + STEPS_PER_POST])
            self._conn.request("POST", "/api/v1/steps", body, {"Content-Type": "application/x-ndjson"})
            with self._conn.getresponse() as response:
                answer = response.read()
                if response.status != 200:
                    raise SimulationError(
                        f"hub at {self.address} refused step records: HTTP {response.status}: "
                        f"{answer.decode(errors='replace')[:300]}"
                    )

    def __enter__(self) -> StepPoster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._conn.close()

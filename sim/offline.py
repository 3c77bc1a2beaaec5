"""A scenario played offline: every node's exporter rendered, parsed and inserted straight into the store,
as fast as it goes (in worker processes for large fleets). Same rows as sim.online but for the targets'
duration_s (offline: 0, the simulated time a scrape takes).

In the stock flavour (sim.stock) each node is two targets: its dcgm-exporter rendering, read in process,
and its node_exporter process, read over loopback HTTP once the node is played to the tick; their
samples carry the `job` and `instance` labels Prometheus would add, and the node column is the node's
name, as a hub receiving Prometheus's remote write stores them. Prometheus's own series about each
scrape are left out: `up` is the TargetStatus row (the hub's receiver makes the same of it), and no
detector reads scrape_*. node_exporter's go_* and process_* series are its process's, so they, unlike
every other row, differ from run to run."""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, closing
from multiprocessing.queues import Queue
from pathlib import Path
from queue import Empty

from analytics.store import Store
from analytics.store.records import ScrapeBatch, TargetStatus
from analytics.topology.importers import parser_of
from collectors.steprecord import StepRecord
from hub.expfmt import ExpositionParser
from sim.errors import SimulationError
from sim.hostagents import topology_reports
from sim.jobs import JobModel
from sim.node import SCENARIO_EPOCH, SCRAPE_GAP_ERROR, SimNode, SimSummary, tick_times
from sim.scenario import Scenario
from sim.stock import DCGM_EXPORTER, NODE_EXPORTER

FLUSH_SAMPLES = 250_000  # offline: samples gathered before one insert, with their targets and steps rows
PARALLEL_NODE_TICKS = 2_000  # offline: smaller scenarios are simulated in-process (a worker starts in ~1 s)
CHUNK_TICKS = 10  # offline: rounds a worker process sends at once
QUEUED_CHUNKS = 4  # ... and how many may wait for the main process


def simulate_offline(
    scenario: Scenario,
    store: Store,
    workdir: Path,
    epoch: float = SCENARIO_EPOCH,
    *,
    workers: int | None = None,
    per_round: bool = False,
) -> SimSummary:
    """Play the scenario as fast as it goes: each node's exposition rendered, parsed and stored as the hub
    would store its scrape, many ticks per insert; its topology first, in force from `epoch` on
    (store_topology).

    The nodes are simulated in `workers` processes (default: one per CPU for scenarios of at least
    PARALLEL_NODE_TICKS node-ticks, else none: this process does it all); the rows do not depend on it.
    Worker processes are spawned, so a script that calls this needs the `if __name__ == "__main__":` guard.
    With `per_round`, each tick's rows are inserted alone, as the hub inserts a scrape round, so that the
    store holds the parts the hub's would (its newest rounds in young parts of their own); by default
    FLUSH_SAMPLES are gathered per insert, which is faster.
    """
    started = time.perf_counter()
    ticks = tick_times(scenario)
    if workers is None:
        enough = scenario.fleet.nodes * len(ticks) >= PARALLEL_NODE_TICKS
        workers = min(len(os.sched_getaffinity(0)), scenario.fleet.nodes) if enough else 1
    if workers < 1:
        raise SimulationError(f"workers must be at least 1, got {workers}")
    jobs = [JobModel(job, scenario, epoch) for job in scenario.jobs]
    store_topology(scenario, store, epoch)
    inserts = _Inserts(store, per_round)
    with ExitStack() as stack:
        if workers == 1:
            rounds = stack.enter_context(
                closing(node_rounds(scenario, range(scenario.fleet.nodes), Path(workdir), epoch))
            )
        else:
            rounds = stack.enter_context(_Workers(scenario, Path(workdir), epoch, workers)).rounds()
        for t, (batches, statuses) in zip(ticks, rounds, strict=True):
            inserts.add(batches, statuses, [row for job in jobs for row in job.steps_until(t)])
    inserts.flush()
    return inserts.summary(len(ticks), time.perf_counter() - started)


def store_topology(scenario: Scenario, store: Store, at: float) -> None:
    """The scenario's topology, if it has one, stored from `at` on as a hub stores what its fleet POSTs
    (hub.app's /api/v1/topology): each host agent's report and the operator's inventory
    (sim.hostagents.topology_reports) through its format's importer, then Store.replace_links under the
    report's reporter."""
    for report in topology_reports(scenario):
        parse, source = parser_of(report.format)
        store.replace_links(source, parse(report.text, report.file), at, reporter=report.reporter)


Round = tuple[list[ScrapeBatch], list[TargetStatus]]  # one tick: the batches of the nodes that answered


def node_rounds(scenario: Scenario, indices: Iterable[int], workdir: Path, epoch: float) -> Iterator[Round]:
    """Per tick, the scrape of every target of every node in `indices` (its place in the fleet). Close
    the iterator when done with it early: the nodes hold node_exporter processes in the stock flavour."""
    nodes: list[SimNode] = []
    try:
        for index in indices:
            nodes.append(SimNode(scenario, index, workdir, epoch))
        targets = [(node, _targets(node)) for node in nodes]
        for t in tick_times(scenario):
            ts = epoch + t
            batches, statuses = [], []
            for node, node_targets in targets:
                node.play_until(t)
                for target in node_targets:
                    if not node.answering:
                        down = TargetStatus(ts, target.name, node.name, False, 0.0, 0, SCRAPE_GAP_ERROR)
                        statuses.append(down)
                        continue
                    batch = target.scrape(node.name, ts)
                    batches.append(batch)
                    statuses.append(TargetStatus(ts, target.name, node.name, True, 0.0, len(batch)))
            yield batches, statuses
    finally:
        for node in nodes:
            node.close()


class _Target:
    """One scrape target of a node: how to read it, and the labels a scraper adds to its samples (stock
    flavour: Prometheus's job and instance, attached as target labels by the parser; none for the hub's
    own scraper)."""

    def __init__(self, name: str, read: Callable[[], bytes], labels: dict[str, str]) -> None:
        self.name = name
        self.read = read
        self.parser = ExpositionParser(target_labels=labels)

    def scrape(self, node: str, ts: float) -> ScrapeBatch:
        exposition = self.parser.parse(self.read().decode())
        return ScrapeBatch(self.name, node, ts, exposition.names, exposition.labels, exposition.values)


def _targets(node: SimNode) -> list[_Target]:
    """fleetlens's exporter; or in the stock flavour dcgm-exporter (rendered here) and node_exporter
    (the node's process, over HTTP), as Prometheus scrapes them."""
    if node.node_exporter is None:
        return [_Target(node.target, node.body, {})]
    return [
        _Target(DCGM_EXPORTER.target(node.name), node.body, DCGM_EXPORTER.labels(node.name)),
        _Target(NODE_EXPORTER.target(node.name), node.node_exporter.scrape, NODE_EXPORTER.labels(node.name)),
    ]


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
    """Rows gathered over ticks and inserted together: one insert per table per FLUSH_SAMPLES, or per tick
    (`per_round`)."""

    def __init__(self, store: Store, per_round: bool) -> None:
        self._store = store
        self._per_round = per_round
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
        if self._per_round or self._pending_samples >= FLUSH_SAMPLES:
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

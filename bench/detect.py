"""The detection cycle in its steady state: every detector, window after window, over a Vela-sized fleet
(192 nodes, 1,536 GPUs, 768 RoCE ports), against a naive peer on the same windows.

A 192-node scenario (one job over the whole fleet, a few faults) is simulated offline into a fresh embedded
store, one insert per 10 s round as the hub inserts a scrape round, and its background merges are left to
end (bench/settle.py: they are ingest's CPU, and one ran through the first windows measured). The store
then holds the parts a hub's holds three minutes into a day: the first ten rounds merged into one part
(analytics.store.schema's tiered merges), each later round in a part of its own, so a steady window's read
touches the young parts of its last 20 s, as 9 windows in 10 of a hub's do (the tenth reads a part of 100
s just merged). With `--gathered`, the offline simulator's default instead: 250k samples per insert, all
merged into one part of the whole scenario, which every window's read then scans: the worst a window sees.
Then, as the hub's detection loop (hub/detect.py) does, one DetectionRunner steps through consecutive 10 s
windows at the end of the scenario (what a detector learns from one window is there for the next); the
sequence is run `--repeat` times with a fresh runner, so that the first window of each is a cold start (a
hub just started) and the others are the steady state. CPU is this process's, which includes chDB's
threads: the store is embedded. The peer, measured right after each window of the cycle, on the same
window: pulling the window's raw rows out of the `metrics` view into pandas and taking per-node medians
there, which is what the detectors avoid by aggregating in ClickHouse SQL. The ratio printed is the steady
cycle's median CPU per window over the peer's. Last, each statement's CPU per window and that of its
analysis alone (EXPLAIN PLAN): where the cycle's CPU goes.

    .venv/bin/python bench/detect.py [--nodes 192] [--minutes 3] [--windows 6] [--repeat 3] [--gathered]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.detectors import build
from analytics.detectors.base import Window, frame
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
from analytics.store.protocols import FrameResult, NumbersResult
from analytics.store.records import QueryResult
from bench.settle import settle
from sim.node import SCENARIO_EPOCH
from sim.offline import simulate_offline
from sim.pipeline import EVAL_RETENTION, scratch_dir
from sim.scenario import parse_scenario


def scenario_document(nodes: int, minutes: int) -> dict:
    """One job over the whole fleet (tp 8, pp 8), with a slow node, a throttled GPU and a flapping link."""
    return {
        "seed": 1,
        "duration_s": minutes * 60,
        "interval_s": 10,
        "fleet": {"nodes": nodes},
        "jobs": [{"name": "llm", "nodes": nodes, "step_s": 4.0, "pp": 8, "tp": 8}],
        "faults": [
            {"kind": "slow_node", "node": "vela-007", "start_s": 60, "severity": 0.2},
            {"kind": "thermal_throttle", "node": "vela-011", "gpu": 3, "start_s": 60},
            {"kind": "link_flap", "node": "vela-020", "nic": 2, "start_s": 120, "flaps": 3, "period_s": 30},
        ],
    }


def cpu_and_wall(action) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    action()
    return time.process_time() - cpu, time.perf_counter() - wall


def pandas_peer(store: Store, window: Window) -> None:
    """The naive way: every raw sample of the window into Python, medians per node and metric there."""
    rows = frame(
        store.query(
            "SELECT node, metric, value FROM metrics "
            "WHERE ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}",
            parameters=window.parameters,
            max_rows=10_000_000,
        )
    )
    rows.groupby(["node", "metric"])["value"].median()


def parts(store: Store) -> str:
    """The samples table's parts, oldest first, each as the rounds it holds: the store's layout."""
    rows = store.query("SELECT uniqExact(ts) AS rounds FROM samples GROUP BY _part ORDER BY min(ts)").rows
    return " ".join(str(rounds) for (rounds,) in rows)


def load() -> str:
    """The machine's load averages, printed beside the figures: the machine is shared."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


Timing = tuple[float, float]  # CPU and wall seconds


def sequence(store: Store, windows: list[Window]) -> list[tuple[Timing, Timing]]:
    """Per window, stepped in order by one runner as the hub's loop steps it: the cycle's times, then the
    peer's on the same window right after it, so that chDB's background merges (counted in this
    process's CPU) weigh on both alike."""
    runner = DetectionRunner(build())
    return [
        (cpu_and_wall(partial(runner.step, store, window)), cpu_and_wall(partial(pandas_peer, store, window)))
        for window in windows
    ]


def per_detector(store: Store, windows: list[Window]) -> dict[str, float]:
    """Median CPU per window of each detector run alone (its own queries, none shared), stepped in order."""
    medians = {}
    for detector in build():
        runner = DetectionRunner([detector])
        runs = [cpu_and_wall(partial(runner.step, store, window))[0] for window in windows]
        medians[detector.name] = statistics.median(runs)
    return medians


class QueryClock:
    """A Reader that runs each query on `store` and adds up its CPU by statement, to say where a cycle's
    CPU goes; `analysis()` then times ClickHouse's statement analysis alone (EXPLAIN PLAN) of each."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.cpu: dict[str, list[float]] = {}
        self._last: dict[str, Mapping[str, Any] | None] = {}

    def query(
        self, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = 10_000
    ) -> QueryResult:
        return self._timed(self._store.query, sql, parameters, max_rows)

    def query_frame(
        self, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = 10_000
    ) -> FrameResult:
        """A columnar read (the detectors' tape), timed alike."""
        return self._timed(self._store.query_frame, sql, parameters, max_rows)

    def query_numbers(
        self,
        sql: str,
        columns: Mapping[str, Any],
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = 10_000,
    ) -> NumbersResult:
        """A read of numbers (the detectors' tape), timed alike."""
        return self._timed(partial(self._store.query_numbers, columns=columns), sql, parameters, max_rows)

    def _timed(
        self, read: Callable[..., Any], sql: str, parameters: Mapping[str, Any] | None, max_rows: int
    ) -> Any:
        started = time.process_time()
        result = read(sql, parameters=parameters, max_rows=max_rows)
        self.cpu.setdefault(sql, []).append(time.process_time() - started)
        self._last[sql] = parameters
        return result

    def analysis(self, sql: str) -> float:
        """CPU seconds of EXPLAIN PLAN of `sql` with its last parameters: analysis, no execution."""
        explain = f"EXPLAIN PLAN {sql}"
        return cpu_and_wall(lambda: self._store.query(explain, parameters=self._last[sql]))[0]


def where_it_goes(store: Store, windows: list[Window]) -> None:
    """Each statement's CPU per window (median over the windows that ran it), and its analysis's."""
    clock = QueryClock(store)
    runner = DetectionRunner(build())
    for window in windows:
        runner.step(clock, window)
    print(f"\n{'statement (first line)':64} {'runs':>5} {'CPU ms':>7} {'analysis':>8}")
    for sql, runs in sorted(clock.cpu.items(), key=lambda item: -statistics.median(item[1])):
        first = " ".join(sql.split())[:64]
        analysis = clock.analysis(sql)
        print(f"{first:64} {len(runs):5} {statistics.median(runs) * 1e3:7.0f} {analysis * 1e3:8.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=192)
    parser.add_argument("--minutes", type=int, default=3)
    parser.add_argument("--windows", type=int, default=6, help="consecutive windows per sequence")
    parser.add_argument("--repeat", type=int, default=3, help="sequences, each with a fresh runner")
    parser.add_argument("--gathered", action="store_true", help="many rounds per insert: one part in the end")
    args = parser.parse_args()
    scenario = parse_scenario(scenario_document(args.nodes, args.minutes), "bench-detect")
    with (
        tempfile.TemporaryDirectory(dir=scratch_dir()) as tmp,
        Store.open(f"chdb://{tmp}/store", retention=EVAL_RETENTION) as store,
    ):
        started = time.perf_counter()
        summary = simulate_offline(scenario, store, Path(tmp) / "sim", per_round=not args.gathered)
        print(
            f"simulated {args.nodes} nodes x {args.minutes} min: {summary.samples:,} samples, "
            f"{summary.steps:,} step rows in {time.perf_counter() - started:.0f} s, "
            f"{'gathered' if args.gathered else 'one insert per round'}; "
            f"its merges ended {settle(f'{tmp}/store'):.1f} s later"
        )
        print(f"samples parts (rounds each): {parts(store)}")
        end = SCENARIO_EPOCH + scenario.duration_s
        windows = [Window(end - 10 * k, end - 10 * (k - 1)) for k in range(args.windows, 0, -1)]
        print(f"load before: {load()}")
        sequence(store, windows[:1])  # warm: first queries compile and load marks
        runs = [sequence(store, windows) for _ in range(args.repeat)]
        detectors = per_detector(store, windows)
        where_it_goes(store, windows)
        print(f"load after: {load()}")
    cold = [run[0][0] for run in runs]
    steady = [cycle for run in runs for cycle, _ in run[1:]] or cold
    peer = [peer for run in runs for _, peer in run]
    cold_cpu, cold_wall = (statistics.median(times[i] for times in cold) for i in (0, 1))
    cycle_cpu, cycle_wall = (statistics.median(times[i] for times in steady) for i in (0, 1))
    peer_cpu, peer_wall = (statistics.median(times[i] for times in peer) for i in (0, 1))
    print(
        f"\n10 s windows, {args.nodes} nodes, {args.nodes * 8} GPUs, {args.nodes * 4} ports; "
        f"{args.repeat} sequences of {args.windows} consecutive windows, medians"
    )
    print(f"{'detector (alone, steady)':34} {'CPU ms':>8}")
    for name, cpu in detectors.items():
        print(f"{name:34} {cpu * 1e3:8.0f}")
    print(f"\n{'':34} {'CPU ms':>8} {'wall ms':>8}")
    print(f"{'whole cycle, cold (first window)':34} {cold_cpu * 1e3:8.0f} {cold_wall * 1e3:8.0f}")
    print(f"{'whole cycle, steady (per window)':34} {cycle_cpu * 1e3:8.0f} {cycle_wall * 1e3:8.0f}")
    print(f"{'peer: raw rows to pandas':34} {peer_cpu * 1e3:8.0f} {peer_wall * 1e3:8.0f}")
    print(
        f"steady cycle CPU / peer CPU: {cycle_cpu / peer_cpu:.2f}x (goal <= 1.00x); "
        f"per 192 nodes: {cycle_cpu * 1e3 * 192 / args.nodes:.0f} ms (goal < 100 ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

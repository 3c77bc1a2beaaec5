"""The detection cycle in its steady state: every detector, window after window, over a Vela-sized fleet
(192 nodes, 1,536 GPUs, 768 RoCE ports), against a naive peer on the same windows.

A 192-node scenario (one job over the whole fleet, a few faults) is simulated offline into a fresh
embedded store. Then, as the hub's detection loop (hub/detect.py) does, one DetectionRunner steps through
consecutive 10 s windows at the end of the scenario (what a detector learns from one window is there for
the next); the sequence is run `--repeat` times with a fresh runner, so that the first window of each is a
cold start (a hub just started) and the others are the steady state. CPU is this process's, which includes
chDB's threads: the store is embedded. The peer, measured on the same windows: pulling each window's raw
rows out of the `metrics` view into pandas and taking per-node medians there, which is what the detectors
avoid by aggregating in ClickHouse SQL. The ratio printed is the steady cycle's median CPU per window over
the peer's.

    .venv/bin/python bench/detect.py [--nodes 192] [--minutes 3] [--windows 6] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.detectors import build
from analytics.detectors.base import Window, frame
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
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


def load() -> str:
    """The machine's load averages, printed beside the figures: the machine is shared."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def cycles(store: Store, windows: list[Window]) -> list[tuple[float, float]]:
    """CPU and wall time of each window, stepped in order by one runner, as the hub's loop steps it."""
    runner = DetectionRunner(build())
    return [cpu_and_wall(lambda w=window: runner.step(store, w)) for window in windows]


def per_detector(store: Store, windows: list[Window]) -> dict[str, float]:
    """Median CPU per window of each detector run alone (its own queries, none shared), stepped in order."""
    medians = {}
    for detector in build():
        runner = DetectionRunner([detector])
        runs = [cpu_and_wall(partial(runner.step, store, window))[0] for window in windows]
        medians[detector.name] = statistics.median(runs)
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=192)
    parser.add_argument("--minutes", type=int, default=3)
    parser.add_argument("--windows", type=int, default=6, help="consecutive windows per sequence")
    parser.add_argument("--repeat", type=int, default=3, help="sequences, each with a fresh runner")
    args = parser.parse_args()
    scenario = parse_scenario(scenario_document(args.nodes, args.minutes), "bench-detect")
    with (
        tempfile.TemporaryDirectory(dir=scratch_dir()) as tmp,
        Store.open(f"chdb://{tmp}/store", retention=EVAL_RETENTION) as store,
    ):
        started = time.perf_counter()
        summary = simulate_offline(scenario, store, Path(tmp) / "sim")
        print(
            f"simulated {args.nodes} nodes x {args.minutes} min: {summary.samples:,} samples, "
            f"{summary.steps:,} step rows in {time.perf_counter() - started:.0f} s"
        )
        end = SCENARIO_EPOCH + scenario.duration_s
        windows = [Window(end - 10 * k, end - 10 * (k - 1)) for k in range(args.windows, 0, -1)]
        print(f"load before: {load()}")
        cycles(store, windows[:1])  # warm: first queries compile and load marks
        sequences = [cycles(store, windows) for _ in range(args.repeat)]
        detectors = per_detector(store, windows)
        peer = [cpu_and_wall(lambda w=window: pandas_peer(store, w)) for window in windows * args.repeat]
        print(f"load after: {load()}")
    cold = [sequence[0] for sequence in sequences]
    steady = [timing for sequence in sequences for timing in sequence[1:]] or cold
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

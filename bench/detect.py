"""One detection cycle over a Vela-sized window: every detector, 192 nodes, 1,536 GPUs, 768 RoCE ports.

A 192-node scenario (one job over the whole fleet, a few faults) is simulated offline into a fresh
embedded store; then one 10 s window is run through every detector, several times, timing CPU (this
process's, which includes chDB's threads: the store is embedded) and wall time per detector. The peer,
measured on the same window: pulling the window's raw rows out of the `metrics` view into pandas and
taking per-node medians there, which is what the detectors avoid by aggregating in ClickHouse SQL.

    .venv/bin/python bench/detect.py [--nodes 192] [--minutes 5] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=192)
    parser.add_argument("--minutes", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
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
        window = Window(end - 10, end)
        detectors = build()
        DetectionRunner(detectors).step(store, window)  # warm: first queries compile and load marks
        per_detector = {}
        for detector in detectors:
            runs = [cpu_and_wall(lambda d=detector: d.detect(store, window)) for _ in range(args.repeat)]
            per_detector[detector.name] = (
                statistics.median(c for c, _ in runs),
                statistics.median(w for _, w in runs),
            )
        cycles = [
            cpu_and_wall(lambda: DetectionRunner(detectors).step(store, window)) for _ in range(args.repeat)
        ]
        peer = [cpu_and_wall(lambda: pandas_peer(store, window)) for _ in range(args.repeat)]
    cycle_cpu, cycle_wall = statistics.median(c for c, _ in cycles), statistics.median(w for _, w in cycles)
    peer_cpu, peer_wall = statistics.median(c for c, _ in peer), statistics.median(w for _, w in peer)
    print(f"\none 10 s window, {args.nodes} nodes, {args.nodes * 8} GPUs; median of {args.repeat} runs")
    print(f"{'detector':16} {'CPU ms':>8} {'wall ms':>8}")
    for name, (cpu, wall) in per_detector.items():
        print(f"{name:16} {cpu * 1e3:8.0f} {wall * 1e3:8.0f}")
    print(f"{'whole cycle':16} {cycle_cpu * 1e3:8.0f} {cycle_wall * 1e3:8.0f}")
    print(f"{'peer: raw rows to pandas':16} {peer_cpu * 1e3:8.0f} {peer_wall * 1e3:8.0f}")
    print(f"cycle CPU vs peer: {cycle_cpu / peer_cpu:.2f}x; goal: under 1 s of CPU per cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The shared-fault localization's one store query a window: which nodes were active in it
(analytics.detectors.shared_faults.ACTIVE_SQL: successful scrapes in `targets`, and steps), beside the same
question asked of `samples`, whose rows are one per series instead of one per scrape.

A chDB store holds `--nodes` nodes scraped every 10 s for `--minutes`, `--series` samples a scrape (a
real exporter has hundreds; fewer keep the fill short, and favour the samples query), then merged (OPTIMIZE
FINAL), as background merges leave an hour-old store: one part per insert would let either query skip
every part but the window's. Each query is timed for the last window, median of `--runs`; both must name
every node.

    .venv/bin/python bench/active_nodes.py [--nodes 500] [--series 40] [--minutes 60] [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import clickhouse_connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.detectors.base import Window
from analytics.detectors.shared_faults import ACTIVE_SQL, IN_WINDOW
from analytics.store import Store
from analytics.store.records import ScrapeBatch, TargetStatus

INTERVAL_S = 10.0
EPOCH = 1_796_000_000.0
SAMPLES_SQL = f"SELECT DISTINCT node FROM samples WHERE {IN_WINDOW}"


def fill(store: Store, nodes: int, series: int, ticks: int) -> None:
    """Every node scraped each tick: one targets row and `series` samples."""
    names = [f"fleetlens_bench_metric_{index}" for index in range(series)]
    labels = [{"gpu": str(index % 8)} for index in range(series)]
    for tick in range(ticks):
        ts = EPOCH + tick * INTERVAL_S
        batches, statuses = [], []
        for index in range(nodes):
            node, target = f"vela-{index:04d}", f"vela-{index:04d}:9400"
            batches.append(ScrapeBatch(target, node, ts, names, labels, [float(tick)] * series))
            statuses.append(TargetStatus(ts, target, node, True, 0.05, series))
        store.insert_samples(batches, token=f"samples-{tick}")
        store.insert_targets(statuses, token=f"targets-{tick}")


def timed(store: Store, sql: str, window: Window, runs: int, nodes: int) -> float:
    """Median wall ms of `sql` over `window`; checks it names every node."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        rows = store.query(sql, parameters=window.parameters, max_rows=nodes + 1).rows
        times.append((time.perf_counter() - started) * 1000)
        assert len(rows) == nodes, (sql, len(rows))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--series", type=int, default=40)
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    ticks = int(args.minutes * 60 / INTERVAL_S)
    with tempfile.TemporaryDirectory() as tmp, Store.open(f"chdb://{tmp}/store", database="bench") as store:
        started = time.perf_counter()
        fill(store, args.nodes, args.series, ticks)
        client = clickhouse_connect.get_client(interface="chdb", path=f"{tmp}/store")
        for table in ("samples", "targets"):
            client.command(f"OPTIMIZE TABLE bench.{table} FINAL")
        client.close()
        print(
            f"{args.nodes} nodes x {ticks} scrapes: {args.nodes * ticks:,} targets rows,"
            f" {args.nodes * ticks * args.series:,} samples ({time.perf_counter() - started:.0f} s to fill)"
        )
        end = EPOCH + ticks * INTERVAL_S
        window = Window(end - INTERVAL_S, end)
        active = timed(store, ACTIVE_SQL, window, args.runs, args.nodes)
        samples = timed(store, SAMPLES_SQL, window, args.runs, args.nodes)
        print(f"active nodes of the last window, median of {args.runs}:")
        print(f"  ACTIVE_SQL (targets + steps)   {active:8.1f} ms")
        print(f"  peer: DISTINCT node of samples {samples:8.1f} ms  ({samples / active:.1f}x)")


if __name__ == "__main__":
    main()

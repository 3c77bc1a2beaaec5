"""A week of a 64-node fleet, asked as Grafana asks for a 7-day panel, of the hub and of a real Prometheus.

The same samples (every node scraped every 15 s for 7 days: an InfiniBand receive counter that restarts
once, and a GPU temperature) go into a hub's chDB store (Store.insert_samples) and into Debian's
Prometheus 2.42 (an OpenMetrics file backfilled with `promtool tsdb create-blocks-from openmetrics`).
Each query is then asked of both over HTTP (/api/v1/query_range) several times; the median wall time of
each is printed with their ratio, and the two answers are checked to be the same (1e-9 relative).

    .venv/bin/python bench/promql_range.py [--nodes 64] [--days 7] [--runs 5] [--keep DIR]

--keep DIR fills DIR once (backfilling Prometheus takes minutes) and reuses it on later runs with the same
--nodes and --days.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.store import Store
from analytics.store.records import ScrapeBatch
from hub.app import Hub
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.support.hubserver import on_loopback
from tests.support.peers import peer, prometheus, require_binary
from tests.support.promqlpeers import assert_same, comparable

INTERVAL_S = 15
COUNTER = "node_infiniband_port_data_received_bytes_total"
GAUGE = "DCGM_FI_DEV_GPU_TEMP"
QUERIES = (  # (query, step): Grafana asks a 7-day panel ~1,000 points wide for a 10-minute step
    (f"sum by (node) (rate({COUNTER}[5m]))", 600),
    (f"max_over_time({GAUGE}[10m])", 600),
    (f"avg({GAUGE})", 600),
    (f"sum by (node) (rate({COUNTER}[5m]))", 60),
)
TICKS_PER_INSERT = 240


def scrapes(nodes: int, ticks: int, end_s: int) -> Iterator[tuple[int, list[tuple[str, dict, float]]]]:
    """Each tick's unix seconds and its samples (metric, labels with `node`, value): each node's counter
    grows at a node-specific rate with a wobble and restarts from zero once; its temperature wanders."""
    start = end_s - (ticks - 1) * INTERVAL_S
    for tick in range(ticks):
        rows = []
        for index in range(nodes):
            node = f"vela-{index:03d}"
            restart = ticks // 2 + index
            grown = tick if tick < restart else tick - restart
            counter = grown * (1e9 + index * 1e7) + (tick * 7919 % 101) * 1e5 * (grown > 0)
            rows.append((COUNTER, {"node": node, "device": "mlx5_0", "port": "1"}, counter))
            rows.append((GAUGE, {"node": node, "gpu": "0"}, 40 + (tick * 31 + index * 17) % 37 * 0.5))
        yield start + tick * INTERVAL_S, rows


def fill_hub(store: Store, nodes: int, ticks: int, end_s: int) -> int:
    """Insert every scrape into `store`, TICKS_PER_INSERT ticks at a time; the samples stored."""
    stored, batches = 0, []
    for ts, rows in scrapes(nodes, ticks, end_s):
        by_node: dict[str, ScrapeBatch] = {}
        for metric, labels, value in rows:
            node = labels["node"]
            batch = by_node.get(node) or by_node.setdefault(
                node, ScrapeBatch(f"{node}:9612", node, float(ts), [], [], [])
            )
            batch.names.append(metric)
            batch.labels.append({k: v for k, v in labels.items() if k != "node"})
            batch.values.append(value)
        batches.extend(by_node.values())
        if len(batches) >= nodes * TICKS_PER_INSERT:
            stored += store.insert_samples(batches, token=f"bench-{ts}")
            batches = []
    return stored + store.insert_samples(batches, token="bench-last")


def fill_prometheus(tsdb: Path, work: Path, nodes: int, ticks: int, end_s: int) -> None:
    text = work / "fleet.om"
    with text.open("w") as out:
        for metric in (COUNTER, GAUGE):
            out.write(f"# TYPE {metric} {'counter' if metric == COUNTER else 'gauge'}\n")
            for ts, rows in scrapes(nodes, ticks, end_s):
                for name, labels, value in rows:
                    if name == metric:
                        pairs = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                        out.write(f"{name}{{{pairs}}} {value!r} {ts}\n")
        out.write("# EOF\n")
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(text), str(tsdb)],
        check=True,
        capture_output=True,
    )
    text.unlink()


def ask(url: str, query: str, start: int, end: int, step: int) -> tuple[float, dict]:
    """Seconds `url` took to answer the range query, and its answer (an error's too)."""
    body = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": step}).encode()
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query_range", data=body, timeout=600) as answer:
            data = json.load(answer)
    except urllib.error.HTTPError as error:
        data = json.load(error)
    return time.perf_counter() - started, data


def same(ours: dict, theirs: dict) -> str:
    """'' when both answers hold the same series and values (tests.support.promqlpeers.assert_same:
    1e-9 relative), else what differs."""
    if ours["status"] != "success":
        return f"the hub answered {ours.get('errorType')}: {ours.get('error')}"
    try:
        assert_same(*(comparable(answer["data"]["result"]) for answer in (ours, theirs)), "the week")
    except AssertionError as differs:
        return str(differs)[:300]
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="a folder to fill once and reuse")
    args = parser.parse_args()
    require_binary("promtool")
    ticks = round(args.days * 86400 / INTERVAL_S)
    with contextlib.ExitStack() as cleanup:
        work = args.keep or Path(
            cleanup.enter_context(tempfile.TemporaryDirectory(prefix="fleetlens-promql-"))
        )
        work.mkdir(parents=True, exist_ok=True)
        filled = work / "filled.json"
        shape = {"nodes": args.nodes, "days": args.days}
        kept = json.loads(filled.read_text()) if filled.exists() else {}
        reuse = kept.get("shape") == shape
        end_s = kept["end_s"] if reuse else (int(time.time()) - 600) // 600 * 600
        if not reuse:
            for old in ("store", "tsdb"):
                shutil.rmtree(work / old, ignore_errors=True)
        start_s = end_s - round(args.days * 86400) + 600
        store = cleanup.enter_context(Store.open(f"chdb://{work / 'store'}", database="bench"))
        if not reuse:
            started = time.perf_counter()
            stored = fill_hub(store, args.nodes, ticks, end_s)
            print(f"hub: {stored:,} samples stored in {time.perf_counter() - started:.0f} s", flush=True)
            started = time.perf_counter()
            fill_prometheus(work / "tsdb", work, args.nodes, ticks, end_s)
            print(f"prometheus: backfilled in {time.perf_counter() - started:.0f} s", flush=True)
            filled.write_text(json.dumps({"shape": shape, "end_s": end_s}))
        command, prometheus_url = prometheus(work)
        hub = Hub(
            store,
            Writer(store, Spool(work / "spool", 64 << 20)),
            OtlpStepReceiver(),
            query_max_seconds=300,
        )
        cleanup.enter_context(
            peer([*command, "--storage.tsdb.retention.time=30d"], f"{prometheus_url}/-/ready")
        )
        hub_url = cleanup.enter_context(on_loopback(hub))
        compare(hub_url, prometheus_url, start_s, end_s, args.runs)


def compare(hub_url: str, prometheus_url: str, start_s: int, end_s: int, runs: int) -> None:
    """Ask each of QUERIES of both `runs` times; print the median seconds of each, their ratio, and
    whether the answers differ."""
    print(f"{'query':<62} {'step':>5} {'points':>7} {'hub s':>7} {'prom s':>7} {'ratio':>6}")
    for query, step in QUERIES:
        timings: dict[str, list[float]] = {"hub": [], "prometheus": []}
        answers = {}
        for _ in range(runs):
            for side, url in (("hub", hub_url), ("prometheus", prometheus_url)):
                elapsed, answers[side] = ask(url, query, start_s, end_s, step)
                timings[side].append(elapsed)
        differs = same(answers["hub"], answers["prometheus"])
        hub_s, prom_s = (statistics.median(timings[side]) for side in ("hub", "prometheus"))
        points = sum(len(s["values"]) for s in answers["prometheus"]["data"]["result"])
        print(
            f"{query:<62} {step:>5} {points:>7} {hub_s:>7.3f} {prom_s:>7.3f} "
            f"{hub_s / prom_s:>6.1f}{'  DIFFERENT: ' + differs if differs else ''}",
            flush=True,
        )


if __name__ == "__main__":
    main()

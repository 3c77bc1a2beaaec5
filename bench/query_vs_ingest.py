"""Do long queries cost ingest any interval? A hub scraping real exporters every second, two long queries
through its API at once, then the scrapes the store holds for the whole time, counted per tick.

Each target should have one stored scrape per interval. Reported: intervals expected and lost over the
queries' time and around it, the longest gap between two stored scrapes of a target, and how long each
query took as its client saw it. `--hub-code DIR` runs the hub from another checkout (e.g. the code
before a change, from `git archive`), so both can be measured on the same machine in one sitting.

    .venv/bin/python bench/query_vs_ingest.py [--targets 4] [--query-seconds 30] [--hub-code /tmp/old]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.store import Store
from tests.conftest import fixtures_dir
from tests.support import ttar
from tests.support.peers import fleetlens_exporter, free_port, peer, stop, wait_http

# A query ClickHouse cannot finish: it runs until the hub's time limit stops it.
LONG_QUERY = "SELECT count() FROM numbers(1e13) WHERE sipHash64(number) % 7 = 3"


def run_query(url: str, timings: list[float]) -> None:
    body = json.dumps({"sql": LONG_QUERY}).encode()
    request = urllib.request.Request(
        f"{url}/api/v1/query", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    started = time.monotonic()
    try:
        urllib.request.urlopen(request, timeout=600).read()
    except urllib.error.HTTPError as error:  # 400 TIMEOUT_EXCEEDED: the hub's limit ended it, as intended
        error.read()
    timings.append(time.monotonic() - started)


def lost_intervals(
    store_dir: Path, start: float, end: float, interval: float
) -> dict[str, tuple[int, int, float]]:
    """Per target within [start, end): ticks expected, ticks with no stored scrape, longest gap (s)."""
    with Store.open(f"chdb://{store_dir}") as store:
        rows = store.query(
            "SELECT target, toUnixTimestamp64Milli(ts) / 1000 FROM targets WHERE up ORDER BY target, ts",
            max_rows=1_000_000,
        ).rows
    per_target: dict[str, list[float]] = {}
    for target, ts in rows:
        if start <= ts < end:
            per_target.setdefault(target, []).append(ts)
    expected = int((end - start) // interval)
    result = {}
    for target, stamps in per_target.items():
        ticks = {int(ts // interval) for ts in stamps}
        edges = [start, *stamps, end]
        gap = max(b - a for a, b in itertools.pairwise(edges))
        result[target] = (expected, expected - len(ticks), gap)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=4)
    parser.add_argument("--queries", type=int, default=2)
    parser.add_argument("--query-seconds", type=float, default=30.0)
    parser.add_argument("--settle-seconds", type=float, default=10.0, help="steady scraping before and after")
    parser.add_argument("--hub-code", help="a checkout to run the hub from (default: this one)")
    args = parser.parse_args()
    interval = 1.0

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        sysfs = ttar.extract(fixtures_dir() / "procfs" / "fixtures.ttar", work) / "fixtures" / "sys"
        groups = []
        for index in range(args.targets):
            node = f"bench-{index:03d}"
            exporter, metrics_url = fleetlens_exporter(
                "--sysfs-root", str(sysfs), "--gpu-backend", "sim", "--node", node
            )
            stack.enter_context(peer(exporter, metrics_url))
            groups.append({"targets": [metrics_url.split("/")[2]], "labels": {"node": node}})
        (work / "targets.json").write_text(json.dumps(groups))
        port = free_port()
        env = {**os.environ, "FLEETLENS_HUB_QUERY_MAX_SECONDS": str(args.query_seconds)}
        if args.hub_code:
            env["PYTHONPATH"] = args.hub_code
        hub_args = [
            *(sys.executable, "-m", "fleetlens.cli", "--log-level", "WARNING", "hub"),
            *("--store", f"chdb://{work}/store", "--targets", str(work / "targets.json")),
            *("--listen", f"127.0.0.1:{port}", "--interval-s", str(interval), "--detectors", "none"),
        ]
        log = stack.enter_context((work / "hub.log").open("w"))
        hub = subprocess.Popen(hub_args, cwd=work, env=env, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}/healthz", hub, timeout=60)
            time.sleep(args.settle_seconds)
            window_start = time.time()
            timings: list[float] = []
            threads = [threading.Thread(target=run_query, args=(url, timings)) for _ in range(args.queries)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            queries_end = time.time()
            time.sleep(args.settle_seconds)
            window_end = time.time() - 2 * interval  # the last rounds may still be on their way in
        finally:
            stop(hub, timeout_s=60)
        lost = lost_intervals(work / "store", window_start, window_end, interval)

    code = args.hub_code or "this checkout"
    print(f"hub from {code}: {args.targets} targets scraped every {interval:g} s")
    print(
        f"{args.queries} queries of up to {args.query_seconds:g} s at once took "
        + ", ".join(f"{t:.1f} s" for t in sorted(timings))
        + f" as their clients saw them; window {window_end - window_start:.0f} s "
        + f"({queries_end - window_start:.0f} s of queries, then {args.settle_seconds:g} s)"
    )
    total_expected = sum(expected for expected, _, _ in lost.values())
    total_lost = sum(missing for _, missing, _ in lost.values())
    print(f"intervals lost: {total_lost} of {total_expected}")
    for target, (expected, missing, gap) in sorted(lost.items()):
        print(f"  {target}: {missing} of {expected} lost, longest gap {gap:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Hub ingest of a Vela-sized simulated fleet, next to a stock Prometheus scraping the same targets.

This process serves the simulated fleet (192 nodes x 8 GPUs x 4 RoCE ports by default, each node a
real exporter on its own loopback port); `fleetlens hub` scrapes it into an embedded chDB store, and
Debian's Prometheus scrapes the same file_sd targets, both every `--interval-s`. The hub runs no
detectors, as Prometheus evaluates no rules here (bench/detect.py times detection). After a warm-up both
are measured over one window: samples/s ingested, CPU of each process, the hub's CPU per sample as a
multiple of Prometheus's, scrape durations and failures, and bytes on disk per stored sample. Each
hub's first minute (from its first scrape: migrations, a cold store and cold parsers, the first
roll-ups) is reported too: its failed scrapes and the rounds it skipped, beside the window's. The hubs
start once the fleet has rendered every node in their format and Prometheus has scraped every node,
so that their first minute is theirs, not the fleet's first renders. The parser is then timed against
prometheus_client's on a body served by the fleet.

`--shards n` runs n hubs, `fleetlens hub --shard i/n`, each into a store of its own (one process per
chDB directory), and reports each hub. `--profile DIR` records each hub with py-spy over the window.

    .venv/bin/python bench/ingest.py [--nodes 192] [--seconds 60] [--warmup-s 15]
    .venv/bin/python bench/ingest.py --nodes 192 --seconds 120 --warmup-s 190    # roll-ups included
    .venv/bin/python bench/ingest.py --nodes 1000 --interval-s 10 --shards 2 --seconds 60
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.store.hubclient import HubClient
from bench.exporter import cpu_seconds, stat_cpu_seconds
from bench.parser import prometheus_client_parse, samples_per_second, warm_parse
from hub.targetsession import REQUEST_HEADERS
from sim.fleet import SimFleet
from tests.support.peers import free_port, peer

WARMUP_S = 15
MERGE_THREADS = "MergeMutate"  # chDB's background merge pool, as its threads name themselves
HUB_SAMPLES = "fleetlens_hub_samples_total"
PROM_SAMPLES = "prometheus_tsdb_head_samples_appended_total"


def own_metric(base: str, name: str) -> float:
    """The first sample of `name` on a server's own /metrics (the hub's, or Prometheus's)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def merge_cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of the background merge threads of process `pid` (a hub's chDB)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            if (task / "comm").read_text().strip() == MERGE_THREADS:
                total += stat_cpu_seconds(task / "stat")
    return total


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@dataclass
class Measured:
    """One scraper's figures over the window."""

    name: str
    samples_per_s: float
    cores: float
    merge_cores: float = 0.0  # of `cores`, chDB's background merges (hubs only)
    lag: tuple[float, float, float, int] | None = None  # scrape p50, p99, max (s), failed scrapes
    error: str = ""  # the most frequent scrape error
    first_minute: FirstMinute | None = None  # hubs only

    @property
    def cpu_per_sample(self) -> float:
        return self.cores / max(self.samples_per_s, 1e-9)


class Window:
    """CPU and a samples counter of one process, from the start of the window to its end."""

    def __init__(self, name: str, pid: int, base: str, counter: str) -> None:
        self.name, self.pid, self.base, self.counter = name, pid, base, counter
        self.cpu0, self.samples0, self.t0 = cpu_seconds(pid), own_metric(base, counter), time.monotonic()
        self.merges0 = merge_cpu_seconds(pid)

    def end(self) -> Measured:
        elapsed = time.monotonic() - self.t0
        cores = (cpu_seconds(self.pid) - self.cpu0) / elapsed
        merge_cores = (merge_cpu_seconds(self.pid) - self.merges0) / elapsed
        samples_per_s = (own_metric(self.base, self.counter) - self.samples0) / elapsed
        return Measured(self.name, samples_per_s, cores, merge_cores)


def last_seconds(seconds: float) -> str:
    """A condition on `targets` rows: scrapes of the last `seconds` seconds."""
    return f"ts >= now() - {seconds:.0f}"


def first_minute(interval_s: float) -> str:
    """A condition on `targets` rows: scrapes of the hub's first minute (its first 60 s / interval ticks;
    a first round that started late in its tick may make one less)."""
    return f"ts < (SELECT min(ts) FROM targets) + {60 - interval_s / 2:g}"


def scrape_lag(base: str, where: str) -> tuple[float, float, float, int]:
    """The hub's scrape duration p50, p99, max and its failed scrapes, of the `targets` rows `where` says."""
    return (
        HubClient(base)
        .query(
            "SELECT quantile(0.5)(duration_s), quantile(0.99)(duration_s), max(duration_s), countIf(up = 0) "
            f"FROM targets WHERE {where}"
        )
        .rows[0]
    )


def top_error(base: str, where: str) -> str:
    """The hub's most frequent scrape error among the `targets` rows `where` says, with its count."""
    rows = (
        HubClient(base)
        .query(
            f"SELECT error, count() AS n FROM targets WHERE up = 0 AND {where} "
            "GROUP BY error ORDER BY n DESC LIMIT 1"
        )
        .rows
    )
    return f"{rows[0][1]} x {rows[0][0]!r}" if rows else ""


@dataclass
class FirstMinute:
    """A hub's first minute of scraping: scrapes it recorded, how many failed, rounds it scraped, the
    rounds with failures as (seconds since the first round, failed scrapes, slowest scrape in s, the most
    frequent error), and the rounds missing (seconds since the first round of each)."""

    scrapes: int
    failed: int
    rounds: int
    error: str
    failing_rounds: list[tuple[float, int, float, str]]
    missing: list[float]

    @classmethod
    def of(cls, base: str, interval_s: float) -> FirstMinute:
        client = HubClient(base)
        where = first_minute(interval_s)
        scrapes, failed, ticks = client.query(
            "SELECT count(), countIf(up = 0), arraySort(groupUniqArray(toFloat64(ts))) "
            f"FROM targets WHERE {where}"
        ).rows[0]
        missing = [
            round(earlier - ticks[0] + interval_s, 1)
            for earlier, later in itertools.pairwise(ticks)
            if later - earlier > 1.5 * interval_s
        ]
        failing = client.query(
            "SELECT toFloat64(ts) - (SELECT toFloat64(min(ts)) FROM targets) AS s, countIf(up = 0) AS n, "
            f"max(duration_s), topKIf(1)(error, up = 0)[1] FROM targets WHERE {where} "
            "GROUP BY s HAVING n > 0 ORDER BY s"
        ).rows
        rows = [tuple(row) for row in failing]
        return cls(scrapes, failed, len(ticks), top_error(base, where), rows, missing)


def stored_bytes_per_sample(store: Path) -> float:
    """Bytes on disk of the samples and series tables per stored sample, read from the store the hub left
    (the hub's query API reads only fleetlens's tables, not system.parts)."""
    import clickhouse_connect  # chDB loads only here, after the hubs are gone

    client = clickhouse_connect.get_client(interface="chdb", path=str(store))
    try:
        rows = client.query("SELECT count() FROM fleetlens.samples").result_rows[0][0]
        on_disk = client.query(
            "SELECT sum(bytes_on_disk) FROM system.parts WHERE active AND database = 'fleetlens' "
            "AND table IN ('samples', 'series')"
        ).result_rows[0][0]
    finally:
        client.close()
    return on_disk / max(rows, 1)


@contextlib.contextmanager
def profiled(pids: dict[str, int], out: Path | None, seconds: float) -> Iterator[None]:
    """py-spy records each process for `seconds` while the block runs (nothing when `out` is None)."""
    if out is None:
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    pyspy = str(Path(sys.executable).with_name("py-spy"))
    recorders = [
        subprocess.Popen(
            [
                pyspy,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(seconds)),
                "--nonblocking",
                "--rate",
                "50",
                "--format",
                "raw",
                "--output",
                str(out / f"{name}.raw"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.wait()  # py-spy stops itself after `seconds`


def hub_command(
    store: Path, port: int, *extra: str, interval_s: float = 1, detectors: str = "none"
) -> list[str]:
    """`fleetlens hub` on loopback `port` into a chDB store at `store`; detectors off by default, for
    ingest alone (the Prometheus it is compared with evaluates no rules either)."""
    return [
        sys.executable, "-m", "fleetlens.cli", "--log-level", "WARNING", "hub",
        "--store", f"chdb://{store}", "--listen", f"127.0.0.1:{port}", "--interval-s", f"{interval_s:g}",
        "--detectors", detectors, *extra,
    ]  # fmt: skip


def wait_scraped(prom_base: str, nodes: int, timeout_s: float = 60.0) -> None:
    """Wait until Prometheus has scraped every node once. Its first scrape of a node makes the fleet render
    that node in Prometheus's format (later ones are served from the fleet's cache, re-rendered off the
    request path), a second of the fleet's CPU per 64 nodes that a hub starting meanwhile would be
    measured against: its scrapes would wait for the fleet's answers."""
    url = f"{prom_base}/api/v1/query?query=count(up)"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=10) as response:
            result = json.load(response)["data"]["result"]
        if result and int(result[0]["value"][1]) >= nodes:
            return
        time.sleep(0.5)
    raise TimeoutError(f"Prometheus did not scrape all {nodes} nodes within {timeout_s:g} s")


def prometheus_command(work: Path, targets: Path, port: int, interval_s: float) -> list[str]:
    (work / "prometheus.yml").write_text(
        f"global: {{scrape_interval: {interval_s:g}s, scrape_timeout: {interval_s:g}s}}\nscrape_configs:\n"
        f"  - job_name: fleet\n    file_sd_configs: [{{files: ['{targets}']}}]\n"
    )
    return [
        shutil.which("prometheus") or "prometheus",
        f"--config.file={work / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=192)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument(
        "--interval-s", type=float, default=1.0, help="scrape interval of hubs and Prometheus"
    )
    parser.add_argument("--shards", type=int, default=1, help="hubs, each scraping its --shard i/n")
    parser.add_argument("--cache-s", type=float, default=30.0, help="fleet response cache (see sim.fleet)")
    parser.add_argument("--profile", type=Path, help="py-spy raw profiles of each hub and the fleet here")
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=WARMUP_S,
        help="before the window; past 180 s the window holds the hub's minute roll-ups (one a minute, each "
        "2 min after its minute ends), whose CPU is part of ingest since the rollup has no view",
    )
    args = parser.parse_args()
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir=shm) as trees:
        work = Path(tmp)
        targets = work / "targets.json"
        fleet = SimFleet(args.nodes, Path(trees), cache_s=args.cache_s).start()  # in this process
        try:
            fleet.write_file_sd(targets)
            for node in fleet.nodes:  # render every node once, as the hubs ask, before the scrapers come
                request = urllib.request.Request(f"http://{node.address}/metrics", headers=REQUEST_HEADERS)
                with urllib.request.urlopen(request, timeout=60) as response:
                    response.read()
            ports = [free_port() for _ in range(args.shards)]
            prom_port = free_port()
            prom_base = f"http://127.0.0.1:{prom_port}"
            with contextlib.ExitStack() as stack:
                prom = stack.enter_context(
                    peer(
                        prometheus_command(work, targets, prom_port, args.interval_s), f"{prom_base}/-/ready"
                    )
                )
                wait_scraped(prom_base, args.nodes)
                hubs = {
                    f"hub{i}": (
                        stack.enter_context(
                            peer(
                                hub_command(
                                    work / f"store{i}",
                                    port,
                                    *("--targets", str(targets), "--shard", f"{i}/{args.shards}"),
                                    interval_s=args.interval_s,
                                ),
                                f"http://127.0.0.1:{port}/healthz",
                                cwd=work,
                            )
                        ),
                        f"http://127.0.0.1:{port}",
                    )
                    for i, port in enumerate(ports)
                }
                time.sleep(max(args.warmup_s, 2 * args.interval_s))
                pids = {name: process.pid for name, (process, _) in hubs.items()} | {"fleet": os.getpid()}
                with profiled(pids, args.profile, args.seconds):
                    windows = [Window(name, p.pid, base, HUB_SAMPLES) for name, (p, base) in hubs.items()]
                    windows.append(Window("prometheus", prom.pid, prom_base, PROM_SAMPLES))
                    fleet_cpu0, t0 = cpu_seconds(os.getpid()), time.monotonic()
                    time.sleep(args.seconds)
                    fleet_cores = (cpu_seconds(os.getpid()) - fleet_cpu0) / (time.monotonic() - t0)
                    measured = [window.end() for window in windows]
                for hub, (_, base) in zip(measured, hubs.values(), strict=False):
                    hub.lag = scrape_lag(base, last_seconds(args.seconds))
                    hub.error = top_error(base, last_seconds(args.seconds))
                    hub.first_minute = FirstMinute.of(base, args.interval_s)
                prom_stored = own_metric(prom_base, PROM_SAMPLES)
                load = os.getloadavg()
            with urllib.request.urlopen(f"http://{fleet.nodes[0].address}/metrics", timeout=60) as response:
                body = response.read()
        finally:
            fleet.stop()
        hub_bytes = stored_bytes_per_sample(work / "store0")
        prom_bytes = directory_bytes(work / "tsdb") / max(prom_stored, 1)
        text = body.decode()
        ours = samples_per_second(warm_parse(text), 3)
        theirs = samples_per_second(prometheus_client_parse(text), 3)

    report(args, measured, fleet_cores, load, (hub_bytes, prom_bytes))
    print(
        f"parser on one node's body: {ours:,.0f} samples/s "
        f"vs prometheus_client {theirs:,.0f} ({ours / theirs:.0f}x)"
    )
    return 0


def report(
    args: argparse.Namespace,
    measured: list[Measured],
    fleet_cores: float,
    load: tuple[float, float, float],
    bytes_per_sample: tuple[float, float],
) -> None:
    """The table: each hub and Prometheus, their CPU per sample and its ratio, scrape latency."""
    *hubs, prom = measured
    print(
        f"{args.nodes} nodes, {len(hubs)} hub(s), {args.seconds:.0f} s window after "
        f"{args.warmup_s:.0f} s warm-up, "
        f"{args.interval_s:g} s scrape interval; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"{'':26} {'samples/s':>10} {'CPU cores':>10} {'us CPU/sample':>14} {'vs Prometheus':>14}")
    for row in (*hubs, prom):
        ratio = row.cpu_per_sample / prom.cpu_per_sample
        print(
            f"{row.name:26} {row.samples_per_s:10.0f} {row.cores:10.3f} {row.cpu_per_sample * 1e6:14.2f} "
            f"{ratio:13.2f}x"
        )
    total = Measured("all hubs", sum(h.samples_per_s for h in hubs), sum(h.cores for h in hubs))
    print(
        f"hub CPU per sample / Prometheus CPU per sample: {total.cpu_per_sample / prom.cpu_per_sample:.2f}x "
        f"(hubs took {total.samples_per_s / prom.samples_per_s:.0%} of what Prometheus ingested; "
        f"{total.samples_per_s / max(total.cores, 1e-9):,.0f} samples/s per hub core)"
    )
    for hub in hubs:
        print(
            f"{hub.name} background merges (chDB): {hub.merge_cores:.3f} cores, "
            f"{hub.merge_cores / max(hub.samples_per_s, 1e-9) * 1e6:.2f} us CPU/sample"
        )
        p50, p99, worst, failed = hub.lag
        print(
            f"{hub.name} scrape duration p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms, "
            f"max {worst * 1e3:.0f} ms "
            f"(interval {args.interval_s * 1e3:.0f} ms); failed scrapes {failed}"
            + (f", most often {hub.error}" if hub.error else "")
        )
        first = hub.first_minute
        skipped = ", ".join(f"{at:g} s" for at in first.missing) or "none"
        print(
            f"{hub.name} first minute: failed scrapes {first.failed} of {first.scrapes} "
            f"in {first.rounds} rounds; rounds skipped: {skipped}"
            + (f"; most often {first.error}" if first.error else "")
        )
        if first.failing_rounds:
            print(f"{hub.name} first minute's rounds with failures (failed, slowest scrape, most often):")
            for at, n, slowest, error in first.failing_rounds:
                print(f"  {at:4.0f} s: {n:4d} {slowest:5.2f} s  {error}")
    print(f"simulated fleet (serving, this process): {fleet_cores:.2f} cores")
    print(
        f"bytes/sample: hub0 {bytes_per_sample[0]:.2f} (samples+series parts), "
        f"Prometheus {bytes_per_sample[1]:.2f}"
    )
    print("Prometheus bytes/sample is its WAL and head on disk; it compacts into blocks only after 2 h.")


if __name__ == "__main__":
    sys.exit(main())

"""Hub ingest of a Vela-sized simulated fleet, next to a stock Prometheus scraping the same targets.

Three processes: this one serving the simulated fleet (192 nodes x 8 GPUs x 4 RoCE ports by default,
each node a real exporter on its own loopback port), `fleetlens hub` scraping it every second into an
embedded chDB store, and Debian's Prometheus scraping the same file_sd targets every second. After a
warm-up, both are measured over one window: samples/s ingested, CPU of each process, scrape durations,
and bytes on disk per stored sample. The parser is then timed against prometheus_client's on a body
served by the fleet.

    .venv/bin/python bench/ingest.py [--nodes 192] [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.store.hubclient import HubClient
from bench.exporter import cpu_seconds
from bench.parser import prometheus_client_parse, samples_per_second, warm_parse
from sim.fleet import SimFleet
from tests.support.peers import free_port, peer

WARMUP_S = 15


def own_metric(base: str, name: str) -> float:
    """The first sample of `name` on a server's own /metrics (the hub's, or Prometheus's)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=192)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--cache-s", type=float, default=30.0, help="fleet response cache (see sim.fleet)")
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir=shm) as trees:
        work = Path(tmp)
        targets = work / "targets.json"
        fleet = SimFleet(args.nodes, Path(trees), cache_s=args.cache_s).start()  # in this process
        try:
            fleet.write_file_sd(targets)
            for node in fleet.nodes:  # render every node once before the scrapers come
                with urllib.request.urlopen(f"http://{node.address}/metrics", timeout=60) as response:
                    response.read()
            hub_port, prom_port = free_port(), free_port()
            hub_base, prom_base = f"http://127.0.0.1:{hub_port}", f"http://127.0.0.1:{prom_port}"
            hub_args = [
                sys.executable,
                "-m",
                "fleetlens.cli",
                "--log-level",
                "WARNING",
                "hub",
                "--store",
                f"chdb://{work / 'store'}",
                "--targets",
                str(targets),
                "--listen",
                f"127.0.0.1:{hub_port}",
                "--interval-s",
                "1",
            ]
            (work / "prometheus.yml").write_text(
                "global: {scrape_interval: 1s, scrape_timeout: 1s}\nscrape_configs:\n"
                f"  - job_name: fleet\n    file_sd_configs: [{{files: ['{targets}']}}]\n"
            )
            prom_args = [
                prometheus,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ]
            with (
                peer(hub_args, f"{hub_base}/healthz", cwd=work) as hub,
                peer(prom_args, f"{prom_base}/-/ready") as prom,
            ):
                time.sleep(WARMUP_S)
                start = time.monotonic()
                hub_cpu0, prom_cpu0 = cpu_seconds(hub.pid), cpu_seconds(prom.pid)
                fleet_cpu0 = cpu_seconds(os.getpid())
                hub_samples0 = own_metric(hub_base, "fleetlens_hub_samples_total")
                prom_samples0 = own_metric(prom_base, "prometheus_tsdb_head_samples_appended_total")
                time.sleep(args.seconds)
                window = time.monotonic() - start
                hub_cpu = (cpu_seconds(hub.pid) - hub_cpu0) / window
                prom_cpu = (cpu_seconds(prom.pid) - prom_cpu0) / window
                fleet_cpu = (cpu_seconds(os.getpid()) - fleet_cpu0) / window
                hub_rate = (own_metric(hub_base, "fleetlens_hub_samples_total") - hub_samples0) / window
                prom_rate = (
                    own_metric(prom_base, "prometheus_tsdb_head_samples_appended_total") - prom_samples0
                ) / window
                client = HubClient(hub_base)
                stored = client.query("SELECT count() FROM samples").rows[0][0]
                on_disk = client.query(
                    "SELECT sum(bytes_on_disk) FROM system.parts "
                    "WHERE active AND database = currentDatabase() "
                    "AND table IN ('samples', 'series')"
                ).rows[0][0]
                lag = client.query(
                    "SELECT quantile(0.5)(duration_s), quantile(0.99)(duration_s), max(duration_s), "
                    "countIf(up = 0) FROM targets"
                ).rows[0]
                prom_stored = own_metric(prom_base, "prometheus_tsdb_head_samples_appended_total")
                prom_disk = directory_bytes(work / "tsdb")
            with urllib.request.urlopen(f"http://{fleet.nodes[0].address}/metrics", timeout=60) as response:
                body = response.read()
        finally:
            fleet.stop()
        text = body.decode()
        ours = samples_per_second(warm_parse(text), 3)
        theirs = samples_per_second(prometheus_client_parse(text), 3)

    print(f"{args.nodes} nodes, {args.seconds:.0f} s window after {WARMUP_S} s warm-up, 1 s scrape interval")
    print(f"{'':28} {'samples/s':>10} {'CPU cores':>10} {'bytes/sample':>13}")
    print(f"{'fleetlens hub (chDB)':28} {hub_rate:10.0f} {hub_cpu:10.2f} {on_disk / max(stored, 1):13.2f}")
    print(
        f"{'Prometheus 2.42 (TSDB)':28} {prom_rate:10.0f} {prom_cpu:10.2f} "
        f"{prom_disk / max(prom_stored, 1):13.2f}"
    )
    print(f"{'simulated fleet (serving)':28} {'':10} {fleet_cpu:10.2f}")
    print(
        f"hub: {hub_rate / prom_rate:.0%} of what Prometheus ingested, "
        f"{hub_rate / hub_cpu:,.0f} samples/s per core"
    )
    print(
        f"hub scrape duration p50 {lag[0] * 1e3:.0f} ms, p99 {lag[1] * 1e3:.0f} ms, "
        f"max {lag[2] * 1e3:.0f} ms; "
        f"failed scrapes {lag[3]}"
    )
    print(
        f"parser on one node's body: {ours:,.0f} samples/s "
        f"vs prometheus_client {theirs:,.0f} ({ours / theirs:.0f}x)"
    )
    print("Prometheus bytes/sample is its WAL and head on disk; it compacts into blocks only after 2 h.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scrape cost of the fleetlens exporter next to the real node_exporter, on the same /sys tree, same run.

Both serve the procfs fixture tree (mlx4, mlx5 with hw_counters, hfi1 ports; eth0 and friends); ours
adds 8 simulated GPUs. Reported: scrape latency p50/p99 as seen by a client on loopback, and CPU
seconds the server process spent per scrape (from /proc/<pid>/stat), with ratios to node_exporter.

    .venv/bin/python bench/exporter.py [--scrapes 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import fixtures_dir
from tests.support import ttar
from tests.support.peers import fleetlens_exporter, node_exporter, peer

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU time so far in a /proc stat file: a process's, or one thread's (task/<tid>/stat)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass(frozen=True)
class ScrapeRun:
    """What a run of scrapes saw: each scrape's latency and body, and the CPU the server spent meanwhile."""

    latencies_s: list[float]
    bodies: list[bytes]
    cpu_s: float
    elapsed_s: float

    def figures(self) -> dict[str, float]:
        """Latency p50 and p99 and CPU per scrape, in ms."""
        latencies = sorted(self.latencies_s)
        return {
            "p50_ms": statistics.median(latencies) * 1e3,
            "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1e3,
            "cpu_ms": self.cpu_s / len(latencies) * 1e3,
        }


def warm_up(url: str, scrapes: int) -> None:
    """Scrape `url` a few times unmeasured: imports, first NVML/sysfs reads, connection setup."""
    for _ in range(scrapes):
        urllib.request.urlopen(url).read()


def scrape_run(url: str, pid: int, scrapes: int, rate: float | None = None) -> ScrapeRun:
    """`scrapes` timed scrapes of `url`, in a row or paced at `rate` a second; `pid`'s CPU meanwhile."""
    latencies, bodies = [], []
    cpu_before, started = cpu_seconds(pid), time.perf_counter()
    for number in range(scrapes):
        if rate is not None:
            time.sleep(max(0.0, started + number / rate - time.perf_counter()))
        begin = time.perf_counter()
        with urllib.request.urlopen(url) as response:
            bodies.append(response.read())
        latencies.append(time.perf_counter() - begin)
    elapsed = time.perf_counter() - started
    return ScrapeRun(latencies, bodies, cpu_seconds(pid) - cpu_before, elapsed)


def measure(url: str, pid: int, scrapes: int) -> dict[str, float]:
    """Latency p50/p99 and CPU per scrape of `scrapes` back-to-back scrapes, and the body's size."""
    warm_up(url, 10)
    run = scrape_run(url, pid, scrapes)
    return {**run.figures(), "bytes": len(run.bodies[-1])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=300)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        sysfs = ttar.extract(fixtures_dir() / "procfs" / "fixtures.ttar", tmp) / "fixtures" / "sys"
        contenders = {
            "node_exporter (infiniband+netclass)": node_exporter(sysfs),
            "fleetlens, same collectors": fleetlens_exporter(
                "--sysfs-root",
                str(sysfs),
                "--gpu-backend",
                "none",
                "--node",
                "bench",
                "--disable-collector",
                "gpu",
                "--disable-collector",
                "xid",
                "--disable-collector",
                "nccl_log",
            ),
            "fleetlens, + 8 simulated GPUs": fleetlens_exporter(
                "--sysfs-root", str(sysfs), "--gpu-backend", "sim", "--node", "bench"
            ),
        }
        results = {}
        for name, (command, url) in contenders.items():
            with peer(command, url) as process:
                results[name] = measure(url, process.pid, args.scrapes)

    peer_result = results["node_exporter (infiniband+netclass)"]
    print(f"{args.scrapes} scrapes each, loopback, procfs fixture tree")
    columns = ("p50 ms", "p99 ms", "CPU ms/scrape", "bytes", "p99 ratio", "CPU ratio")
    print(f"{'exporter':38} " + " ".join(f"{c:>13}" for c in columns))
    for name, r in results.items():
        print(
            f"{name:38} {r['p50_ms']:13.2f} {r['p99_ms']:13.2f} {r['cpu_ms']:13.2f} {r['bytes']:13d}"
            f" {r['p99_ms'] / peer_result['p99_ms']:13.2f} {r['cpu_ms'] / peer_result['cpu_ms']:13.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

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


def measure(url: str, pid: int, scrapes: int) -> dict[str, float]:
    for _ in range(10):  # warm up: imports, first NVML/sysfs reads, connection setup
        urllib.request.urlopen(url).read()
    latencies = []
    cpu_before = cpu_seconds(pid)
    for _ in range(scrapes):
        start = time.perf_counter()
        with urllib.request.urlopen(url) as resp:
            size = len(resp.read())
        latencies.append(time.perf_counter() - start)
    cpu = (cpu_seconds(pid) - cpu_before) / scrapes
    latencies.sort()
    return {
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1e3,
        "cpu_ms": cpu * 1e3,
        "bytes": size,
    }


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

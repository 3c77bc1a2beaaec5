"""Scrape cost of the fleetlens exporter with 8 GPUs at the prices a real GPU charges, beside node_exporter.

The 8 GPUs are a real 8-GPU node's `nvidia-smi -q` (gpud's 8x H100, PROVENANCE.md section 6) replayed
through the real NVML path; every NVML call pays the H200's measured latency profile
(collectors/gpu/profiles), at its median and, in a second run, at its max: every call as slow as it was
ever seen. Scrapes are paced (default 10 per second) so that the pollers run their passes in between, as
they would under Prometheus. Reported per contender, from the same run: scrape latency p50 and p99 on
loopback; exporter CPU per scrape, all of it and less the pollers' background rate measured while idle;
the oldest value's age seen per cadence against its interval. For scale, the cost of reading the same 8
GPUs in the scrape, the way the exporter read NVML before its pollers, measured in-process.

    .venv/bin/python bench/gpu_scrape.py [--scrapes 300] [--rate 10] [--backend nvml]

`--backend nvml` runs the same contenders on this machine's real GPUs (no profile: NVML's own costs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.parser import text_string_to_metric_families

from bench.exporter import cpu_seconds, scrape_run, warm_up
from collectors.base import CollectorOptions
from collectors.gpu.latency import H200_PROFILE, Slowed, load_profile
from collectors.gpu.nvml import CADENCES, NvmlBackend
from collectors.gpu.replay import load_capture
from tests.conftest import fixtures_dir
from tests.support import ttar
from tests.support.peers import fleetlens_exporter, node_exporter, peer

CAPTURE = "gpud/nvidia-smi-query.535.161.08.out.0.valid"
AGES = "fleetlens_gpu_reading_age_seconds"
IDLE_S = 20.0
DEFAULTS = CollectorOptions()
GOAL_P99_MS, GOAL_CPU_MS = 5.0, 2.0  # per scrape, 8 GPUs (issue 41)


def paced_run(url: str, pid: int, scrapes: int, rate: float) -> dict[str, float]:
    """Warm up, measure the idle CPU rate, then `scrapes` paced scrapes; ages parsed off the clock."""
    warm_up(url, 5)
    idle_cpu = cpu_seconds(pid)
    time.sleep(IDLE_S)
    background = (cpu_seconds(pid) - idle_cpu) / IDLE_S
    run = scrape_run(url, pid, scrapes, rate)
    oldest: dict[str, float] = {}
    for body in run.bodies:
        for family in text_string_to_metric_families(body.decode()):
            for sample in (s for s in family.samples if s.name == AGES):
                cadence = sample.labels["cadence"]
                oldest[cadence] = max(oldest.get(cadence, 0.0), sample.value)
    return {
        **run.figures(),
        "scrape_cpu_ms": (run.cpu_s - background * run.elapsed_s) / scrapes * 1e3,
        "background_ms_per_s": background * 1e3,
        "oldest_polled_s": oldest.get("polled", float("nan")),
        "oldest_sampled_s": oldest.get("sampled", float("nan")),
    }


def _fresh(result: dict[str, float]) -> bool:
    """Whether no value was seen older than its cadence's interval."""
    return (
        result["oldest_polled_s"] <= DEFAULTS.gpu_poll_interval_s
        and result["oldest_sampled_s"] <= DEFAULTS.gpu_sample_interval_s
    )


def in_scrape_read_ms(capture: Path, pick: str, reads: int = 5) -> float:
    """Median wall time of one synchronous read of every GPU: what a scrape that called NVML waited."""
    nvml = Slowed(load_capture(capture), load_profile(H200_PROFILE).delays_s(pick))
    backend = NvmlBackend(nvml=nvml)
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        for index in range(len(backend.identities())):
            backend.read_device(index, CADENCES)
        times.append(time.perf_counter() - start)
    backend.close()
    return statistics.median(times) * 1e3


def contenders(sysfs: Path, capture: Path, backend: str) -> dict[str, tuple[list[str], str]]:
    gpu_only = ("--node", "bench", "--disable-collector", "infiniband", "--disable-collector", "netclass")
    gpus = ("--gpu-backend", "nvml") if backend == "nvml" else ("--gpu-backend", f"replay:{capture}")
    profile = ("--gpu-replay-latency", str(H200_PROFILE))
    found = {"node_exporter (infiniband+netclass)": node_exporter(sysfs)}
    if backend == "nvml":
        found["fleetlens gpu, real NVML"] = fleetlens_exporter(*gpus, *gpu_only)
        found["fleetlens all, real NVML"] = fleetlens_exporter(
            *gpus, "--sysfs-root", str(sysfs), "--node", "bench"
        )
        return found
    for pick in ("median", "max"):
        slowed = (*gpus, *profile, "--gpu-replay-latency-pick", pick)
        found[f"fleetlens gpu, 8 GPUs at {pick}"] = fleetlens_exporter(*slowed, *gpu_only)
        found[f"fleetlens all, 8 GPUs at {pick}"] = fleetlens_exporter(
            *slowed, "--sysfs-root", str(sysfs), "--node", "bench"
        )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=300)
    parser.add_argument("--rate", type=float, default=10.0, help="scrapes per second")
    parser.add_argument("--backend", choices=("replay", "nvml"), default="replay")
    args = parser.parse_args()
    capture = fixtures_dir() / CAPTURE

    with tempfile.TemporaryDirectory() as tmp:
        sysfs = ttar.extract(fixtures_dir() / "procfs" / "fixtures.ttar", tmp) / "fixtures" / "sys"
        results = {}
        for name, (command, url) in contenders(sysfs, capture, args.backend).items():
            with peer(command, url) as process:
                results[name] = paced_run(url, process.pid, args.scrapes, args.rate)

    peer_result = results["node_exporter (infiniband+netclass)"]
    goals: list[tuple[str, bool, bool, bool]] = []
    print(
        f"{args.scrapes} scrapes each at {args.rate:g}/s, loopback; GPUs: {args.backend}"
        f" ({CAPTURE} and {H200_PROFILE.name} where replayed); intervals: polled"
        f" {DEFAULTS.gpu_poll_interval_s:g} s, sampled {DEFAULTS.gpu_sample_interval_s:g} s"
    )
    columns = (
        "p50 ms",
        "p99 ms",
        "CPU ms",
        "scrape CPU",
        "idle ms/s",
        "oldest pol",
        "oldest smp",
        "p99 x",
        "CPU x",
    )
    print(f"{'exporter':36} " + " ".join(f"{c:>10}" for c in columns))
    for name, r in results.items():
        figures = (
            *(r[key] for key in ("p50_ms", "p99_ms", "cpu_ms", "scrape_cpu_ms", "background_ms_per_s")),
            *(r[key] for key in ("oldest_polled_s", "oldest_sampled_s")),
            r["p99_ms"] / peer_result["p99_ms"],
            r["cpu_ms"] / peer_result["cpu_ms"],
        )
        print(f"{name:36} " + " ".join(f"{figure:10.2f}" for figure in figures))
        if name.startswith("fleetlens gpu"):
            goals.append((name, r["p99_ms"] <= GOAL_P99_MS, r["scrape_cpu_ms"] <= GOAL_CPU_MS, _fresh(r)))
    for name, latency, cpu, fresh in goals:
        verdict = ", ".join(
            f"{what} {'met' if ok else 'MISSED'}"
            for what, ok in (
                ("p99 <= 5 ms", latency),
                ("scrape CPU <= 2 ms", cpu),
                ("ages <= interval", fresh),
            )
        )
        print(f"goal, {name}: {verdict}")
    if args.backend == "replay":
        for pick in ("median", "max"):
            waited = in_scrape_read_ms(capture, pick)
            print(f"reading the 8 GPUs in the scrape instead, at {pick}: {waited:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

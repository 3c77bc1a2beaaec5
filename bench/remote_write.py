"""Hub CPU per sample through Prometheus remote write, next to the same fleet scraped by the hub itself.

One simulated fleet (sim.fleet, real exporters on loopback) is ingested twice, one way after the other so
that the two do not share the cores: first `fleetlens hub --targets` scrapes it every second; then a
fresh hub takes no targets and Debian's Prometheus 2.42 scrapes the fleet every second and remote-writes
into it. Each phase measures, after a warm-up, the samples the hub stored per second and the CPU of the
hub (and of Prometheus, which now does the scraping).

    .venv/bin/python bench/remote_write.py [--nodes 48] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.exporter import cpu_seconds
from bench.ingest import own_metric
from sim.fleet import SimFleet
from tests.support.peers import free_port, peer

WARMUP_S = 15


@dataclass(frozen=True)
class Phase:
    samples_per_s: float
    hub_cores: float
    prometheus_cores: float = 0.0

    @property
    def hub_us_per_sample(self) -> float:
        return self.hub_cores / self.samples_per_s * 1e6


def hub_args(work: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "fleetlens.cli", "--log-level", "WARNING", "hub",
        "--store", f"chdb://{work / 'store'}", "--listen", f"127.0.0.1:{port}", "--interval-s", "1", *extra,
    ]  # fmt: skip


def measure(hub_pid: int, hub_base: str, counter: str, seconds: float, prometheus_pid: int | None) -> Phase:
    """Samples/s the hub counted in `counter` and the CPU of hub (and Prometheus) over `seconds`."""
    time.sleep(WARMUP_S)
    start, hub0 = time.monotonic(), cpu_seconds(hub_pid)
    prom0 = cpu_seconds(prometheus_pid) if prometheus_pid else 0.0
    samples0 = own_metric(hub_base, counter)
    time.sleep(seconds)
    window = time.monotonic() - start
    rate = (own_metric(hub_base, counter) - samples0) / window
    prom = (cpu_seconds(prometheus_pid) - prom0) / window if prometheus_pid else 0.0
    return Phase(rate, (cpu_seconds(hub_pid) - hub0) / window, prom)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument(
        "--max-samples-per-send",
        type=int,
        default=2000,
        help="Prometheus's queue_config (2.42's default: 500)",
    )
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("prometheus not installed (Debian package prometheus)")
        return 1
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir=shm) as trees:
        work = Path(tmp)
        targets = work / "targets.json"
        fleet = SimFleet(args.nodes, Path(trees), cache_s=30.0).start()
        try:
            fleet.write_file_sd(targets)
            scrape_dir, write_dir = work / "scrape", work / "write"
            scrape_dir.mkdir()
            write_dir.mkdir()
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            with peer(
                hub_args(scrape_dir, port, "--targets", str(targets)), f"{base}/healthz", cwd=scrape_dir
            ) as hub:
                scraped = measure(hub.pid, base, "fleetlens_hub_samples_total", args.seconds, None)
            port, prom_port = free_port(), free_port()
            base = f"http://127.0.0.1:{port}"
            config = {
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [{"job_name": "fleet", "file_sd_configs": [{"files": [str(targets)]}]}],
                "remote_write": [
                    {
                        "url": f"{base}/api/v1/write",
                        "queue_config": {
                            "max_samples_per_send": args.max_samples_per_send,
                            "batch_send_deadline": "1s",
                        },
                    }
                ],
            }
            (write_dir / "prometheus.yml").write_text(json.dumps(config))
            prom_args = [
                prometheus,
                "--enable-feature=agent",
                f"--config.file={write_dir / 'prometheus.yml'}",
                f"--storage.agent.path={write_dir / 'wal'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ]
            with (
                peer(hub_args(write_dir, port), f"{base}/healthz", cwd=write_dir) as hub,
                peer(prom_args, f"http://127.0.0.1:{prom_port}/-/ready") as prom,
            ):
                written = measure(
                    hub.pid, base, "fleetlens_hub_remote_write_samples_total", args.seconds, prom.pid
                )
        finally:
            fleet.stop()

    print(
        f"{args.nodes} nodes, 1 s interval, {args.seconds:.0f} s windows after {WARMUP_S} s warm-up each; "
        f"remote write max_samples_per_send {args.max_samples_per_send}"
    )
    print(f"{'':36} {'samples/s':>10} {'hub cores':>10} {'hub us/sample':>14} {'Prometheus':>11}")
    for name, phase in (("hub scraping the fleet", scraped), ("Prometheus agent -> remote write", written)):
        print(
            f"{name:36} {phase.samples_per_s:10.0f} {phase.hub_cores:10.2f} "
            f"{phase.hub_us_per_sample:14.2f} {phase.prometheus_cores:11.2f}"
        )
    ratio = written.hub_us_per_sample / scraped.hub_us_per_sample
    print(f"hub CPU per sample, remote write / scraping: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

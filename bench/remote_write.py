"""Hub CPU per sample through Prometheus remote write, next to a real Prometheus receiving the same stream.

One simulated fleet (sim.fleet, real exporters on loopback) is ingested three ways, one after the other
so that they do not share the cores:

  hub scraping       `fleetlens hub --targets` scrapes the fleet every second;
  -> hub             a Prometheus 2.42 agent scrapes it every second and remote-writes into a fresh hub;
  -> Prometheus      the same kind of agent remote-writes into Debian's Prometheus 2.42 started as a
                     receiver (--web.enable-remote-write-receiver, /api/v1/write): Prometheus's own CPU
                     per sample for remote write ingest, the peer the hub is held to.

Each phase measures, after a warm-up, the samples the receiver stored per second (the hub's
fleetlens_hub_*samples_total, Prometheus's prometheus_tsdb_head_samples_appended_total), the CPU of the
receiver and of the sender, and whether the receiver kept up: the sender's samples sent per second equal
to those its scrapes appended, its send lag (newest sample appended - newest sent) not growing, no
failed sample.

    .venv/bin/python bench/remote_write.py [--nodes 48] [--seconds 30] [--profile DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.error
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.exporter import cpu_seconds
from bench.ingest import hub_command, own_metric, profiled
from sim.fleet import SimFleet
from tests.support.peers import free_port, peer

WARMUP_S = 30  # Prometheus's queue reshards every 10 s, from the send latency it saw
SENT = "prometheus_remote_storage_samples_total"  # the sender's samples sent (2.42's name)
READ = "prometheus_remote_storage_samples_in_total"  # samples the sender's scrapes appended
PENDING = "prometheus_remote_storage_samples_pending"
NEWEST_IN = "prometheus_remote_storage_highest_timestamp_in_seconds"
NEWEST_SENT = "prometheus_remote_storage_queue_highest_sent_timestamp_seconds"
LAG_S = 10.0  # a send lag past this (or growing by more than 2 s) is not keeping up
FAILED = "prometheus_remote_storage_samples_failed_total"
SHARDS = "prometheus_remote_storage_shards"
HUB_RECEIVED = "fleetlens_hub_remote_write_samples_total"
BUSY_RETRIES = 50  # a busy server's 503s are asked again this many times, 0.2 s apart
PROM_RECEIVED = "prometheus_tsdb_head_samples_appended_total"


@dataclass(frozen=True)
class Phase:
    """One receiver's window: its stored samples/s and cores, the sender's cores and queue."""

    samples_per_s: float
    receiver_cores: float
    sender_cores: float = 0.0
    sent_per_s: float = 0.0
    read_per_s: float = 0.0
    pending: tuple[float, float] = (0.0, 0.0)  # at the window's start and end
    lag_s: tuple[float, float] = (0.0, 0.0)  # the sender's send lag, at the window's start and end
    failed: float = 0.0
    shards: float = 0.0

    @property
    def us_per_sample(self) -> float:
        return self.receiver_cores / self.samples_per_s * 1e6 if self.samples_per_s else float("nan")

    @property
    def kept_up(self) -> bool:
        """Whether the receiver took what the sender's scrapes appended: no failure, a send lag that does
        not grow, as many samples sent as appended."""
        growing = self.lag_s[1] > min(LAG_S, self.lag_s[0] + 2)
        return (
            not self.failed
            and not growing
            and self.sent_per_s > 0.95 * self.read_per_s  # the lag says the rest: rates over a window wobble
        )


def _lag(read: dict[str, float]) -> float:
    """The sender's send lag in seconds: its newest sample appended less its newest sample sent."""
    return read.get(NEWEST_IN, 0.0) - read.get(NEWEST_SENT, 0.0) if read.get(NEWEST_SENT) else 0.0


class Window:
    """Counters and CPU read at a window's start, and the phase they make at its end."""

    def __init__(self, receiver: tuple[int, str, str], sender: tuple[int, str] | None) -> None:
        self.receiver, self.sender = receiver, sender
        self.start = time.monotonic()
        self.first = self._read()

    def _read(self) -> dict[str, float]:
        pid, base, counter = self.receiver
        read = {"receiver_cpu": cpu_seconds(pid), "stored": _metric(base, counter)}
        if self.sender:
            pid, base = self.sender
            read["sender_cpu"] = cpu_seconds(pid)
            names = (SENT, READ, PENDING, FAILED, SHARDS, NEWEST_IN, NEWEST_SENT)
            read.update({name: _metric(base, name) for name in names})
        return read

    def end(self) -> Phase:
        last = self._read()
        span = time.monotonic() - self.start

        def rate(name: str) -> float:
            return (last.get(name, 0.0) - self.first.get(name, 0.0)) / span

        return Phase(
            rate("stored"),
            rate("receiver_cpu"),
            rate("sender_cpu"),
            rate(SENT),
            rate(READ),
            (self.first.get(PENDING, 0.0), last.get(PENDING, 0.0)),
            (_lag(self.first), _lag(last)),
            last.get(FAILED, 0.0) - self.first.get(FAILED, 0.0),
            last.get(SHARDS, 0.0),
        )


def _metric(base: str, name: str) -> float:
    """own_metric, asked again while the server answers 503: a hub that falls behind holds its
    connection cap (256) in remote write requests waiting for their group, and the reading is still due."""
    for _ in range(BUSY_RETRIES):
        try:
            return own_metric(base, name)
        except urllib.error.HTTPError as error:
            if error.code != HTTPStatus.SERVICE_UNAVAILABLE:
                raise
            time.sleep(0.2)
    return own_metric(base, name)


def measure(
    receiver: tuple[int, str, str],
    sender: tuple[int, str] | None,
    timing: argparse.Namespace,
    profile: str | None,
) -> Phase:
    """The receiver's phase over `timing.seconds` after `timing.warmup`; py-spy records it into
    `timing.profile` as `profile`.raw when both are given."""
    seconds = timing.seconds
    time.sleep(timing.warmup)
    window = Window(receiver, sender)
    with profiled({profile: receiver[0]} if profile else {}, timing.profile, seconds):
        time.sleep(seconds)
    return window.end()


def agent_args(
    prometheus: str, work: Path, targets: Path, write_url: str, per_send: int
) -> tuple[list[str], str]:
    """A Prometheus agent scraping `targets` every second and remote-writing to `write_url`, and its
    base URL."""
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "fleet", "file_sd_configs": [{"files": [str(targets)]}]}],
        "remote_write": [
            {
                "url": write_url,
                "queue_config": {"max_samples_per_send": per_send, "batch_send_deadline": "1s"},
            }
        ],
    }
    (work / "agent.yml").write_text(json.dumps(config))
    address = f"127.0.0.1:{free_port()}"
    return [
        prometheus,
        "--enable-feature=agent",
        f"--config.file={work / 'agent.yml'}",
        f"--storage.agent.path={work / 'wal'}",
        f"--web.listen-address={address}",
    ], f"http://{address}"


def receiver_args(prometheus: str, work: Path, port: int) -> list[str]:
    """Prometheus as a remote write receiver that scrapes nothing."""
    (work / "receiver.yml").write_text(json.dumps({"global": {"scrape_interval": "1m"}}))
    return [
        prometheus,
        "--web.enable-remote-write-receiver",
        f"--config.file={work / 'receiver.yml'}",
        f"--storage.tsdb.path={work / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]


def through_agent(
    receiver: tuple[list[str], str, str],
    agent: tuple[list[str], str],
    work: Path,
    timing: argparse.Namespace,
    profile: str | None,
) -> Phase:
    """Run a receiver (command, ready URL, samples counter) and an agent (command, base URL) writing into
    it; the receiver's phase."""
    receiver_cmd, ready, counter = receiver
    receiver_base = ready.rsplit("/", 2)[0] if ready.endswith("/-/ready") else ready.rsplit("/", 1)[0]
    with peer(receiver_cmd, ready, cwd=work) as receiving, peer(agent[0], f"{agent[1]}/-/ready") as sending:
        return measure((receiving.pid, receiver_base, counter), (sending.pid, agent[1]), timing, profile)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument(
        "--max-samples-per-send",
        type=int,
        default=2000,
        help="the agents' queue_config (2.42's default: 500)",
    )
    parser.add_argument("--profile", type=Path, help="directory for py-spy profiles of the hub's phases")
    parser.add_argument(
        "--detectors",
        default="none",
        help="the hubs' --detectors: none (default) compares ingest alone, as the Prometheus receiver "
        "evaluates no rules; all adds detection to the hub's CPU",
    )
    parser.add_argument(
        "--warmup", type=float, default=WARMUP_S, help="seconds before each window (the agents reshard)"
    )
    parser.add_argument("--skip-scrape", action="store_true", help="leave out the hub scraping phase")
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("prometheus not installed (Debian package prometheus)")
        return 1
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    phases: dict[str, Phase] = {}
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(dir=shm) as trees:
        work = Path(tmp)
        targets = work / "targets.json"
        fleet = SimFleet(args.nodes, Path(trees), cache_s=30.0).start()
        try:
            fleet.write_file_sd(targets)
            if not args.skip_scrape:
                (work / "scrape").mkdir()
                port = free_port()
                base = f"http://127.0.0.1:{port}"
                scrape = hub_command(
                    work / "scrape" / "store", port, "--targets", str(targets), detectors=args.detectors
                )
                with peer(scrape, f"{base}/healthz", cwd=work / "scrape") as hub:
                    counter = "fleetlens_hub_samples_total"
                    phases["hub scraping"] = measure((hub.pid, base, counter), None, args, "hub-scraping")
            for name in ("-> hub", "-> Prometheus"):
                phase_dir = work / name.strip("-> ")
                phase_dir.mkdir()
                port = free_port()
                base = f"http://127.0.0.1:{port}"
                per_send = args.max_samples_per_send
                agent = agent_args(prometheus, phase_dir, targets, f"{base}/api/v1/write", per_send)
                profile = None
                if name == "-> hub":
                    hub = hub_command(phase_dir / "store", port, detectors=args.detectors)
                    receiver = (hub, f"{base}/healthz", HUB_RECEIVED)
                    profile = "hub-remote-write"
                else:
                    receiver = (receiver_args(prometheus, phase_dir, port), f"{base}/-/ready", PROM_RECEIVED)
                phases[name] = through_agent(receiver, agent, phase_dir, args, profile)
        finally:
            fleet.stop()
    report(args, phases)
    return 0


def report(args: argparse.Namespace, phases: dict[str, Phase]) -> None:
    load = os.getloadavg()
    print(
        f"{args.nodes} nodes, 1 s interval, {args.seconds:.0f} s windows after {args.warmup:.0f} s warm-up "
        f"each; agents' max_samples_per_send {args.max_samples_per_send}; hub detectors {args.detectors}; "
        f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        f"{'receiver':16} {'samples/s':>10} {'cores':>6} {'us/sample':>10} {'sender cores':>13} "
        f"{'sender us/sample':>17} {'sent/s':>8} {'in/s':>8} {'pending':>13} {'lag s':>9} {'shards':>6} "
        f"{'failed':>6} kept up"
    )
    for name, phase in phases.items():
        sender = phase.sender_cores / phase.samples_per_s * 1e6 if phase.sender_cores else 0.0
        kept = "" if name == "hub scraping" else ("yes" if phase.kept_up else "NO")
        pending = f"{phase.pending[0]:.0f}->{phase.pending[1]:.0f}" if kept else ""
        lag = f"{phase.lag_s[0]:.1f}->{phase.lag_s[1]:.1f}" if kept else ""
        print(
            f"{name:16} {phase.samples_per_s:10.0f} {phase.receiver_cores:6.2f} {phase.us_per_sample:10.2f} "
            f"{phase.sender_cores:13.2f} {sender:17.2f} {phase.sent_per_s:8.0f} {phase.read_per_s:8.0f} "
            f"{pending:>13} {lag:>9} {phase.shards:6.0f} {phase.failed:6.0f} {kept}"
        )
    hub, prom = phases["-> hub"], phases["-> Prometheus"]
    print(
        f"hub receiver / Prometheus receiver, CPU per sample: {hub.us_per_sample / prom.us_per_sample:.2f}x"
    )
    if "hub scraping" in phases:
        scraped = phases["hub scraping"]
        print(
            f"hub receiver / hub scraping, CPU per sample: {hub.us_per_sample / scraped.us_per_sample:.2f}x"
        )


if __name__ == "__main__":
    sys.exit(main())

"""What every collector shares: its options, its contract and the counter for bad input it skipped."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client.metrics_core import Metric

from collectors.logtext import printable

log = logging.getLogger("fleetlens.collectors")

MAX_DISTINCT_PROBLEMS = 10_000  # past this, new problems go to DEBUG too: memory bounded on hostile input


@dataclass(frozen=True)
class CollectorOptions:
    """Every root a collector reads from, injectable so that tests point collectors at fixture trees."""

    sysfs_root: Path = Path("/sys")
    node: str = socket.gethostname()
    gpu_backend: str = "nvml"  # nvml | sim | none | replay:FILE[#N] (an nvidia-smi -q capture)
    gpu_sim_seed: int = 0
    gpu_sim_count: int = 8
    gpu_poll_interval_s: float = 5.0  # NVML's cheap calls, per GPU, off the scrape (collectors.gpu.poller)
    gpu_sample_interval_s: float = 10.0  # its sampling and slow calls (PCIe throughput, energy)
    gpu_replay_latency: Path | None = None  # a replay answers each call after its cost in this profile
    gpu_replay_latency_pick: str = "median"  # or "max": every call as slow as it was ever measured
    kernel_log: Path | None = None  # a dmesg/kmsg file to follow for NVRM Xid lines; None: no file
    nccl_logs: str | None = None  # glob of NCCL_DEBUG=INFO log files; None: collector idle
    netclass_ignored_devices: str = "^$"  # regex, as node_exporter's --collector.netclass.ignored-devices
    netclass_ignore_invalid_speed: bool = False  # as --collector.netclass.ignore-invalid-speed
    kubernetes: bool = False  # GPU series get the pod, namespace, container holding them (dcgm-exporter's -k)
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")  # the kubelet's


class Collector(Protocol):
    """A collector yields its metric families on every call: new ones, or the very same objects again
    while their values stand (collectors.textformat then reuses their text); a family yielded is never
    changed."""

    def collect(self) -> Iterable[Metric]: ...


class ReadErrors:
    """Counts the samples one collector skipped because of bad input, and logs each distinct problem once.

    A broken file is read on every scrape; logging it every second would drown the log, so repeats of
    the same (where, problem) go to DEBUG. The count is exported as fleetlens_exporter_read_errors_total.
    Paths and problems are logged with control characters escaped (a hostile file name cannot forge lines).
    """

    def __init__(self, collector: str) -> None:
        self.collector = collector
        self.count = 0
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def report(self, where: str, problem: str) -> None:
        """Record that the sample at `where` (a path, device or log line) was skipped because of `problem`."""
        with self._lock:
            self.count += 1
            first = (where, problem) not in self._seen and len(self._seen) < MAX_DISTINCT_PROBLEMS
            if first:
                self._seen.add((where, problem))
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "collector %s skipped %s: %s", self.collector, printable(where), printable(problem))

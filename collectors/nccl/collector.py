"""NCCL_DEBUG=INFO logs: which NET devices, transports and GPUDirect RDMA paths each rank really uses.

NCCL decides per channel whether the NIC reads GPU memory directly (GPUDirect RDMA, `/GDRDMA` at the end
of a connection line) or bounces every message through host memory. A missing nvidia-peermem module or a
GPU too far from its NIC costs inter-node bandwidth without any error, and the INFO log is the only place
that decision is written down. This module parses that log into typed records, folds them into one
verdict per rank with the lines that prove it, exports the verdicts (collector "nccl_log") and renders
them for people (`fleetlens nccl FILE...`).

Metrics, one series set per rank; a rank is a `host:pid [cudaDev]` line prefix, and labels the log lacks
(posters strip hostnames) are empty:

    fleetlens_nccl_gpudirect_rdma_status{log,host,pid,cuda_device,rank,status}   1 for the rank's status
        (yes, no, partial, unknown), 0 for the other three
    fleetlens_nccl_connections{log,host,pid,cuda_device,rank,transport,via}      connection lines logged
    fleetlens_nccl_net_device_info{log,host,pid,cuda_device,rank,net,index,device,port,transport}  1
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from collectors.base import CollectorOptions, ReadErrors
from collectors.follow import FollowedFile
from collectors.nccl.parse import parse_numbered
from collectors.nccl.records import NetDevice, Verdict
from collectors.nccl.verdict import LogSummary, RankSummary
from collectors.registry import register

READ_LIMIT = 2 << 20  # bytes per file and scrape (about a second of parsing); backlogs take several scrapes


@dataclass
class _FollowedLog:
    """One log file, followed, and what it said since the follower last started it over."""

    file: FollowedFile
    summary: LogSummary = field(default_factory=LogSummary)


class NcclLogCollector:
    """Follows the NCCL logs matching a glob and exports each rank's GPUDirect RDMA verdict.

    Not for concurrent scrapes: the exporter serialises them, and each file's read offset is shared state.
    """

    def __init__(self, pattern: str | None, errors: ReadErrors, read_limit: int = READ_LIMIT) -> None:
        self._pattern = pattern
        self._errors = errors
        self._read_limit = read_limit
        self._logs: dict[str, _FollowedLog] = {}

    def collect(self) -> Iterator[Metric]:
        if self._pattern is None:
            return
        paths = sorted(glob.glob(self._pattern))
        for gone in self._logs.keys() - set(paths):
            del self._logs[gone]
        families = _Families()
        for path in paths:
            if not os.path.isfile(path):
                self._skip(path, "not a regular file (a directory, a dangling link, a device)")
                continue
            try:
                summary = self._follow(path)
            except OSError as err:
                self._skip(path, f"cannot read: {err.strerror or err}")
                continue
            families.add(path, summary.ranks())
        yield from families.all()

    def _skip(self, path: str, problem: str) -> None:
        self._logs.pop(path, None)
        self._errors.report(path, problem)

    def _follow(self, path: str) -> LogSummary:
        """Parse what was appended to `path` since the last scrape; start over when it was replaced."""
        if path not in self._logs:
            # Each scrape opens the file afresh: a glob may match thousands of logs, too many to hold open.
            follower = FollowedFile(path, finish_rotated=False, read_limit=self._read_limit)
            self._logs[path] = _FollowedLog(follower)
        log = self._logs[path]
        lines = log.file.read_lines()
        if log.file.restarted:
            log.summary = LogSummary()
        parsed = parse_numbered(lines, source=path)
        for problem in parsed.malformed:
            self._errors.report(path, problem)
        for record in parsed.records:
            log.summary.add(record)
        return log.summary


class _Families:
    """The families of one scrape, built fresh each time."""

    _RANK_LABELS = ("log", "host", "pid", "cuda_device", "rank")

    def __init__(self) -> None:
        self.status = GaugeMetricFamily(
            "fleetlens_nccl_gpudirect_rdma_status",
            "1 for the rank's GPUDirect RDMA status in its NCCL log (yes, no, partial: some NET channels "
            "without GDRDMA, unknown: no inter-node connection seen), 0 for the other statuses.",
            labels=[*self._RANK_LABELS, "status"],
        )
        self.connections = GaugeMetricFamily(
            "fleetlens_nccl_connections",
            "Channel connections the rank logged, by transport (IB, RoCE, Socket, P2P, SHM) and path.",
            labels=[*self._RANK_LABELS, "transport", "via"],
        )
        self.devices = InfoMetricFamily(
            "fleetlens_nccl_net_device",
            "A network device NCCL announced for the rank's process, with its transport.",
            labels=list(self._RANK_LABELS),
        )

    def add(self, log: str, ranks: Iterable[RankSummary]) -> None:
        for rank in ranks:
            key = rank.key
            labels = [
                log,
                key.host or "",
                label_value(key.pid),
                label_value(key.device),
                ",".join(map(str, rank.ranks)),
            ]
            for status in Verdict:
                self.status.add_metric([*labels, status.value], float(rank.gdr is status))
            for connection in rank.connections:
                self.connections.add_metric(
                    [*labels, connection.transport, connection.via.text], connection.count
                )
            for device in rank.net_devices:
                self.devices.add_metric(labels, _device_labels(device))

    def all(self) -> list[Metric]:
        return [self.status, self.connections, self.devices]


def label_value(value: int | None) -> str:
    return "" if value is None else str(value)


def _device_labels(device: NetDevice) -> dict[str, str]:
    return {
        "net": device.net,
        "index": str(device.index),
        "device": device.name,
        "port": label_value(device.port),
        "transport": device.transport,
    }


@register("nccl_log")
def nccl_log_collector(options: CollectorOptions, errors: ReadErrors) -> NcclLogCollector:
    """Idle until CollectorOptions.nccl_logs names a glob of NCCL_DEBUG=INFO log files."""
    return NcclLogCollector(options.nccl_logs, errors)

"""NCCL_DEBUG=INFO logs: which NET devices, transports and GPUDirect RDMA paths each rank really uses.

NCCL decides per channel whether the NIC reads GPU memory directly (GPUDirect RDMA, `/GDRDMA` at the end
of a connection line) or bounces every message through host memory. A missing nvidia-peermem module or a
GPU too far from its NIC costs inter-node bandwidth without any error, and the INFO log is the only place
that decision is written down. This module parses that log into typed records, folds them into one
verdict per rank with the lines that prove it, exports the verdicts (collector "nccl_log") and renders
them for people (`main`, behind `fleetlens nccl FILE...`).

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
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from collectors.base import CollectorOptions, ReadErrors
from collectors.errors import LogParseError
from collectors.follow import FollowedFile, Line
from collectors.registry import register

# ---------------------------------------------------------------------------------------------------------
# What the log says


class Verdict(StrEnum):
    """Whether a rank's inter-node traffic moves between NIC and GPU memory without a host copy."""

    YES = "yes"
    NO = "no"
    PARTIAL = "partial"  # some NET channels use GDRDMA, some do not
    UNKNOWN = "unknown"  # no NET connection and no GDR-disabled line seen, e.g. an intra-node job


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a log, kept so that each verdict can point at the text that proves it."""

    source: str
    number: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.source}:{self.number}"


@dataclass(frozen=True, slots=True)
class RankKey:
    """The writer of a line, from NCCL's `host:pid:tid [cudaDev]` prefix; stripped parts are None.

    One process may drive several GPUs (one thread each), so the CUDA device is part of the key.
    """

    host: str | None
    pid: int | None
    device: int | None

    def sort_key(self) -> tuple[str, int, int]:
        return (
            self.host or "",
            -1 if self.pid is None else self.pid,
            -1 if self.device is None else self.device,
        )


@dataclass(frozen=True, slots=True)
class NetDevice:
    """A device a NET plugin announced: `[0]mlx5_0:1/RoCE` (IB verbs) or `[0]eth0:10.0.0.1<0>` (sockets)."""

    net: str  # the plugin that announced it: IB, Socket, ...
    index: int  # the number connection lines use, as in NET/IB/<index>
    name: str
    port: int | None  # the IB port; None for sockets
    transport: str  # the link layer of an IB device (IB or RoCE), else the plugin's name (Socket)


@dataclass(frozen=True, slots=True)
class Via:
    """The transport named after `via` in a connection line: `NET/IB/0/GDRDMA`, `P2P/IPC/read`, ..."""

    text: str
    net: str | None = None  # the NET plugin (IB, Socket, IBext_v8) of an inter-node connection
    net_device: int | None = None
    gdr: bool = False


@dataclass(frozen=True, slots=True)
class LogRecord:
    """What every parsed line carries: who wrote it and the line itself."""

    key: RankKey
    line: LogLine


@dataclass(frozen=True, slots=True)
class Connection(LogRecord):
    """`Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA`: one channel's link to a peer rank."""

    channel: int
    source_rank: int
    target_rank: int
    direction: str | None  # send or receive on NET connections; None on intra-node ones
    via: Via

    @property
    def local_rank(self) -> int:
        """NCCL logs a receive on the receiving rank and everything else on the sending rank."""
        return self.target_rank if self.direction == "receive" else self.source_rank


@dataclass(frozen=True, slots=True)
class NetAnnouncement(LogRecord):
    """`NET/IB : Using [0]mlx5_0:1/RoCE ...`, or `NET/IB : No device found` (no devices)."""

    net: str
    devices: tuple[NetDevice, ...]


@dataclass(frozen=True, slots=True)
class NetSelection(LogRecord):
    """`Using network IB`: the plugin NCCL chose for inter-node traffic."""

    net: str


@dataclass(frozen=True, slots=True)
class GdrCheck(LogRecord):
    """`GPU Direct RDMA Disabled for GPU 2[2] / HCA 0 (...)`, or `... for HCA 0 'mlx5_0'` (every GPU)."""

    enabled: bool
    gpu: str | None  # CUDA device or bus id as logged; None when the line is about the HCA alone
    hca: int


@dataclass(frozen=True, slots=True)
class RingGdrFlag(LogRecord):
    """`Connected all rings, use ring PXN 0 GDR 0`: whether the communicator allows GDR at all.

    NCCL prints it for intra-node communicators too, so it is evidence, never a verdict on its own.
    """

    gdr: bool


@dataclass(frozen=True, slots=True)
class CommRank(LogRecord):
    """`comm 0x... rank 3 nranks 16 cudaDev 3 ...`: the rank number of this device in a communicator."""

    rank: int


@dataclass(frozen=True, slots=True)
class ParsedLog:
    """What a stretch of log said, and the NCCL lines it could not read."""

    records: tuple[LogRecord, ...]
    malformed: tuple[str, ...]  # one LogParseError message, naming source and line, per skipped line


# ---------------------------------------------------------------------------------------------------------
# Parsing lines

# `host:pid:tid [dev] NCCL INFO msg`; hosts may be empty or redacted, `:tid` is absent in old versions,
# and posters strip everything up to `[dev]` or even `NCCL INFO`. Launchers such as `mpirun --tag-output`
# put their own prefix in front, so the writer is read backwards from the level, over a bounded stretch:
# a regex search over a whole garbage line would take quadratic time.
_LEVEL = re.compile(r"NCCL (?:INFO|WARN) ")
_WRITER = re.compile(r"(?:(?P<host>[^\s:]*):(?P<pid>\d+)(?::\d+)? )?(?:\[(?P<device>\d+)\] )?\Z")
_WRITER_CHARS = 300  # a host name (at most 253) and `:pid:tid [dev] `
# Ranks carry `[nvmlDev]` (or `[busId]` before 2.8, nothing in 2.4 rings); 2.19+ appends the communicator.
_CONNECTION = re.compile(
    r"(?:Channel|Ring) (?P<channel>\d+)(?:/\d+)? : (?P<source>\d+)(?:\[\w+\])? -> (?P<target>\d+)(?:\[\w+\])?"
    r"(?: \[(?P<direction>send|receive)\])?\s+via (?P<via>.+?)(?: comm 0x[0-9a-fA-F]+ nRanks \d+)?"
)
# NET/<plugin>/<device>, `(proxy rank)` with PXN, then flags such as /GDRDMA and /Shared.
_NET_VIA = re.compile(r"NET/(?P<net>[^/]+)/(?P<device>\d+)(?:\(\d+\))?(?P<flags>(?:/\w+)*)")
_NET_USING = re.compile(r"NET/(?P<net>[^\s:/]+) ?: Using\b(?P<devices>[^;]*)")
_NO_DEVICE = re.compile(r"NET/(?P<net>[^\s:/]+) ?: No device found")
# 2.21+ merges ports into virtual devices: `[0]={[0] mlx5_0:1/RoCE, [1] mlx5_1:1/RoCE}`.
_MERGED_DEVICE = re.compile(r"\[(?P<index>\d+)\]=\{(?P<members>[^}]*)\}")
_DEVICE = re.compile(r"\[(?P<index>\d+)\] ?(?P<name>[^\s:\[\]{},]+):(?P<detail>[^\s,{}\[\]]+)")
_IB_PORT = re.compile(r"(?P<port>\d+)/(?P<link>\w+)")
_DEVICE_FLAG = re.compile(r"\[[A-Z]+\]")  # [RO]: relaxed ordering
_GDR_CHECK = re.compile(
    r"GPU Direct RDMA (?P<state>Enabled|Disabled) for "
    r"(?:GPU (?P<gpu>[0-9a-fA-F]+)(?:\[\d+\])? / )?HCA (?P<hca>\d+)"
)
_RING_GDR = re.compile(r"use ring PXN \d+ GDR (?P<gdr>[01])\b")
_NET_SELECTION = re.compile(r"Using network (?P<net>\S+)")
# `nranks ... cudaDev` at Init START/COMPLETE; 2.19+ also logs `rank 3 nRanks 16 nNodes 2 ...`.
_COMM_RANK = re.compile(r"\bcomm 0x[0-9a-fA-F]+ rank (?P<rank>\d+) n[rR]anks \d+")
# One anchored match sorts a message into the kind this module reads, so other lines cost one regex.
_KIND = re.compile(
    r"(?P<connection>(?:Channel|Ring) \d.* -> )"  # not `Channel 00/02 : 0 1 2 3`, a ring's order
    r"|(?P<announcement>NET/[^\s:/]+ ?: (?:Using|No device found))"
    r"|(?P<gdr_check>(?:NET/[^\s:/]+ ?: )?GPU Direct RDMA (?:Enabled|Disabled) for)"
    r"|(?P<ring_gdr>Connected all rings, use ring PXN)"
    r"|(?P<net_selection>Using network )"
    r"|(?P<comm_rank>(?:\w+ )?comm 0x[0-9a-fA-F]+ rank \d+ n[rR]anks )"
)


def _malformed(line: LogLine, problem: str) -> LogParseError:
    return LogParseError(f"{line.where}: {problem}: {line.text[:200]!r}")


def _parse_via(text: str, line: LogLine) -> Via:
    if not text.startswith("NET/"):
        return Via(text)
    match = _NET_VIA.fullmatch(text)
    if match is None:
        raise _malformed(line, "NET transport is not NET/<plugin>/<device>[/GDRDMA]")
    return Via(text, match["net"], int(match["device"]), "GDRDMA" in match["flags"].split("/"))


def _parse_connection(message: str, key: RankKey, line: LogLine) -> Connection:
    match = _CONNECTION.fullmatch(message)
    if match is None:
        raise _malformed(line, "connection line is not 'Channel N : src -> dst [send|receive] via TRANSPORT'")
    return Connection(
        key,
        line,
        channel=int(match["channel"]),
        source_rank=int(match["source"]),
        target_rank=int(match["target"]),
        direction=match["direction"],
        via=_parse_via(match["via"], line),
    )


def _parse_devices(net: str, text: str, line: LogLine) -> tuple[NetDevice, ...]:
    found = [
        (int(m["index"]), d) for m in _MERGED_DEVICE.finditer(text) for d in _DEVICE.finditer(m["members"])
    ]
    plain = _MERGED_DEVICE.sub(" ", text)
    found += [(int(d["index"]), d) for d in _DEVICE.finditer(plain)]
    if not found or _DEVICE_FLAG.sub(" ", _DEVICE.sub(" ", plain)).strip():
        raise _malformed(line, "device list is not '[index]name:port/linklayer ...'")
    devices = []
    for index, match in found:
        ib_port = _IB_PORT.fullmatch(match["detail"])
        port, transport = (int(ib_port["port"]), ib_port["link"]) if ib_port else (None, net)
        devices.append(NetDevice(net, index, match["name"], port, transport))
    return tuple(devices)


def _parse_announcement(message: str, key: RankKey, line: LogLine) -> NetAnnouncement:
    if no_device := _NO_DEVICE.match(message):
        return NetAnnouncement(key, line, net=no_device["net"], devices=())
    using = _NET_USING.match(message)
    if using is None:
        raise _malformed(line, "'Using' is not followed by a device list")
    return NetAnnouncement(
        key, line, net=using["net"], devices=_parse_devices(using["net"], using["devices"], line)
    )


def _parse_gdr_check(message: str, key: RankKey, line: LogLine) -> GdrCheck:
    match = _GDR_CHECK.search(message)
    if match is None:
        raise _malformed(line, "GPU Direct RDMA line names no HCA")
    return GdrCheck(key, line, enabled=match["state"] == "Enabled", gpu=match["gpu"], hca=int(match["hca"]))


def _parse_ring_gdr(message: str, key: RankKey, line: LogLine) -> RingGdrFlag:
    match = _RING_GDR.search(message)
    if match is None:
        raise _malformed(line, "ring summary without 'GDR 0|1'")
    return RingGdrFlag(key, line, gdr=match["gdr"] == "1")


def _parse_net_selection(message: str, key: RankKey, line: LogLine) -> NetSelection:
    match = _NET_SELECTION.fullmatch(message)
    if match is None:
        raise _malformed(line, "'Using network' names no single plugin")
    return NetSelection(key, line, net=match["net"])


def _parse_comm_rank(message: str, key: RankKey, line: LogLine) -> CommRank:
    match = _COMM_RANK.search(message)
    if match is None:
        raise _malformed(line, "communicator line without 'rank N nranks M'")
    return CommRank(key, line, rank=int(match["rank"]))


# By _KIND's group name; each raises LogParseError for a malformed message of its kind.
_MESSAGE_PARSERS = {
    "connection": _parse_connection,
    "announcement": _parse_announcement,
    "gdr_check": _parse_gdr_check,
    "ring_gdr": _parse_ring_gdr,
    "net_selection": _parse_net_selection,
    "comm_rank": _parse_comm_rank,
}


def _optional_int(text: str | None) -> int | None:
    return None if text is None else int(text)


def parse_line(line: LogLine) -> LogRecord | None:
    """The record in `line`; None for other text. Raises LogParseError for a malformed NCCL line."""
    level = _LEVEL.search(line.text)
    if level is None:
        return None
    message = line.text[level.end() :].strip()
    kind = _KIND.match(message)
    if kind is None:
        return None
    writer = _WRITER.search(line.text, max(0, level.start() - _WRITER_CHARS), level.start())
    key = RankKey(writer["host"] or None, _optional_int(writer["pid"]), _optional_int(writer["device"]))
    return _MESSAGE_PARSERS[kind.lastgroup](message, key, line)


def parse_nccl_log(lines: Iterable[str], source: str = "<nccl log>") -> ParsedLog:
    """Parse lines numbered from 1; malformed NCCL lines are skipped and listed, never fatal."""
    return _parse_numbered(enumerate(lines, start=1), source)


def _parse_numbered(lines: Iterable[Line], source: str) -> ParsedLog:
    records, malformed = [], []
    for number, text in lines:
        try:
            record = parse_line(LogLine(source, number, text))
        except LogParseError as err:
            malformed.append(str(err))
            continue
        if record is not None:
            records.append(record)
    return ParsedLog(tuple(records), tuple(malformed))


# ---------------------------------------------------------------------------------------------------------
# One verdict per rank

EVIDENCE_PER_RANK = 16  # distinct proving lines kept per rank; repeats on other channels add nothing
_LEGACY_TRANSPORTS = {"direct shared memory": "SHM"}  # NCCL <= 2.5's name for the SHM transport


@dataclass(frozen=True, slots=True)
class ConnectionCount:
    """How many channel connections of one rank went over one path."""

    via: Via
    transport: str  # IB, RoCE or Socket for NET connections, else the family: P2P, SHM, ...
    count: int


@dataclass(frozen=True, slots=True)
class RankSummary:
    """What the log says about one rank: its GPUDirect RDMA verdict, why, and over which devices."""

    key: RankKey
    ranks: tuple[int, ...]  # one per communicator the device joined, when the log names them
    gdr: Verdict
    evidence: tuple[LogLine, ...]  # first line of each distinct fact behind the verdict, in log order
    network: str | None  # the NET plugin in use, when announced or selected
    net_devices: tuple[NetDevice, ...]
    transports: tuple[str, ...]  # of the rank's NET connections
    connections: tuple[ConnectionCount, ...]


@dataclass
class _RankState:
    ranks: set[int] = field(default_factory=set)
    gdr_channels: int = 0
    host_staged_channels: int = 0
    gdr_disabled: bool = False
    connections: Counter[Via] = field(default_factory=Counter)
    evidence: dict[object, LogLine] = field(default_factory=dict)

    def remember(self, fact: object, line: LogLine) -> None:
        if fact not in self.evidence and len(self.evidence) < EVIDENCE_PER_RANK:
            self.evidence[fact] = line

    def verdict(self) -> Verdict:
        """NET connections decide; without any, a GDR-disabled line still proves the rank cannot use it."""
        if self.gdr_channels and self.host_staged_channels:
            return Verdict.PARTIAL
        if self.gdr_channels:
            return Verdict.YES
        if self.host_staged_channels or self.gdr_disabled:
            return Verdict.NO
        return Verdict.UNKNOWN


@dataclass
class _ProcessState:
    """NCCL sets up its network once per process, whichever GPU thread happens to log it."""

    selected: str | None = None
    announced: str | None = None
    devices: tuple[NetDevice, ...] = ()  # the last announcement that found devices


def _transport(via: Via, devices: Sequence[NetDevice]) -> str:
    if via.net is None:
        return _LEGACY_TRANSPORTS.get(via.text, via.text.split("/")[0])
    # Plugins built on NET/IB (IBext, IBext_v8, ...) announce their devices as NET/IB.
    for device in devices:
        if device.index == via.net_device and via.net.startswith(device.net):
            return device.transport
    return via.net


class LogSummary:
    """Folds records into per-rank state that grows with the ranks and paths seen, not with the lines."""

    def __init__(self) -> None:
        self._ranks: defaultdict[RankKey, _RankState] = defaultdict(_RankState)
        self._processes: defaultdict[tuple[str | None, int | None], _ProcessState] = defaultdict(
            _ProcessState
        )

    def add(self, record: LogRecord) -> None:
        rank = self._ranks[record.key]
        process = self._processes[(record.key.host, record.key.pid)]
        match record:
            case Connection(via=via):
                rank.ranks.add(record.local_rank)
                rank.connections[via] += 1
                if via.net is not None:
                    if via.gdr:
                        rank.gdr_channels += 1
                    else:
                        rank.host_staged_channels += 1
                    rank.remember((record.direction, via), record.line)
            case CommRank(rank=number):
                rank.ranks.add(number)
            case NetSelection(net=net):
                process.selected = net
            case NetAnnouncement(devices=()):
                rank.remember(record.line.text, record.line)
            case NetAnnouncement(net=net, devices=devices):
                process.announced, process.devices = net, devices
            case GdrCheck(enabled=enabled):
                rank.gdr_disabled |= not enabled
                rank.remember(record.line.text, record.line)
            case RingGdrFlag():
                rank.remember(record.line.text, record.line)

    def ranks(self) -> list[RankSummary]:
        return [self._summary(key) for key in sorted(self._ranks, key=RankKey.sort_key)]

    def _summary(self, key: RankKey) -> RankSummary:
        rank, process = self._ranks[key], self._processes[(key.host, key.pid)]
        connections = tuple(
            ConnectionCount(via, _transport(via, process.devices), count)
            for via, count in sorted(rank.connections.items(), key=lambda item: item[0].text)
        )
        return RankSummary(
            key=key,
            ranks=tuple(sorted(rank.ranks)),
            gdr=rank.verdict(),
            evidence=tuple(rank.evidence.values()),
            network=process.selected or process.announced,
            net_devices=process.devices,
            transports=tuple(sorted({c.transport for c in connections if c.via.net is not None})),
            connections=connections,
        )


def summarize(records: Iterable[LogRecord]) -> list[RankSummary]:
    """One summary per rank, in host, pid, device order."""
    summary = LogSummary()
    for record in records:
        summary.add(record)
    return summary.ranks()


def overall_verdict(ranks: Iterable[RankSummary]) -> Verdict:
    """The job's verdict: ranks that could not tell are left out; disagreeing ranks make it partial."""
    known = {rank.gdr for rank in ranks} - {Verdict.UNKNOWN}
    if not known:
        return Verdict.UNKNOWN
    return known.pop() if len(known) == 1 else Verdict.PARTIAL


# ---------------------------------------------------------------------------------------------------------
# Collector

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
        parsed = _parse_numbered(lines, source=path)
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
                _label_value(key.pid),
                _label_value(key.device),
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


def _label_value(value: int | None) -> str:
    return "" if value is None else str(value)


def _device_labels(device: NetDevice) -> dict[str, str]:
    return {
        "net": device.net,
        "index": str(device.index),
        "device": device.name,
        "port": _label_value(device.port),
        "transport": device.transport,
    }


@register("nccl_log")
def nccl_log_collector(options: CollectorOptions, errors: ReadErrors) -> NcclLogCollector:
    """Idle until CollectorOptions.nccl_logs names a glob of NCCL_DEBUG=INFO log files."""
    return NcclLogCollector(options.nccl_logs, errors)


# ---------------------------------------------------------------------------------------------------------
# Human summary


def read_nccl_log(path: str | os.PathLike[str]) -> ParsedLog:
    """Parse a whole log file, its last line included even without a final newline."""
    text = Path(path).read_bytes().decode(errors="replace")  # bytes that are not UTF-8 become U+FFFD
    return parse_nccl_log(text.removesuffix("\n").split("\n"), source=str(path))


def _who(rank: RankSummary) -> str:
    key = rank.key
    parts = [key.host or "?", f"pid {_label_value(key.pid) or '?'}"]
    if key.device is not None:
        parts.append(f"cuda {key.device}")
    if rank.ranks:
        parts.append(f"rank {','.join(map(str, rank.ranks))}")
    return " ".join(parts)


def _describe_device(device: NetDevice) -> str:
    port = "" if device.port is None else f" port {device.port}"
    return f"[{device.index}] {device.name}{port} {device.transport}"


def render(source: str, parsed: ParsedLog) -> str:
    """A per-rank summary of one log: verdict, network devices, connections and the proving lines."""
    ranks = summarize(parsed.records)
    out = [f"{source}: GPUDirect RDMA {overall_verdict(ranks)}, ranks seen: {len(ranks)}"]
    out += [f"  skipped {problem}" for problem in parsed.malformed]
    for rank in ranks:
        out.append(f"  {_who(rank)}: GPUDirect RDMA {rank.gdr}")
        if rank.network:
            devices = ", ".join(map(_describe_device, rank.net_devices)) or "no devices"
            out.append(f"    network {rank.network}: {devices}")
        if rank.connections:
            counts = ", ".join(f"{c.count}x {c.via.text} ({c.transport})" for c in rank.connections)
            out.append(f"    connections: {counts}")
        out += [f"    line {line.number}: {line.text.strip()}" for line in rank.evidence]
    return "\n".join(out)


def main(argv: Sequence[str]) -> int:
    """`fleetlens nccl FILE...`: print each log's summary; 1 when a file could not be read, else 0."""
    status = 0
    for path in argv:
        try:
            parsed = read_nccl_log(path)
        except OSError as err:
            print(f"fleetlens nccl: cannot read {path}: {err.strerror or err}", file=sys.stderr)
            status = 1
            continue
        print(render(path, parsed))
    return status

"""One GPUDirect RDMA verdict per rank, with the log lines that prove it, folded from parsed records."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from collectors.nccl.records import (
    CommRank,
    Connection,
    GdrCheck,
    LogLine,
    LogRecord,
    NetAnnouncement,
    NetDevice,
    NetSelection,
    RankKey,
    RingGdrFlag,
    Verdict,
    Via,
)

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

"""What an NCCL_DEBUG=INFO log says, as typed records: ranks, NET devices, connections, GDR checks."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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

"""Parsing NCCL_DEBUG=INFO lines into records (collectors.nccl.records), line by line, bad lines named and
skipped: NCCL's formats vary by version and posters strip prefixes."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from collectors.errors import LogParseError
from collectors.follow import Line
from collectors.nccl.records import (
    CommRank,
    Connection,
    GdrCheck,
    LogLine,
    LogRecord,
    NetAnnouncement,
    NetDevice,
    NetSelection,
    ParsedLog,
    RankKey,
    RingGdrFlag,
    Via,
)

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
    return parse_numbered(enumerate(lines, start=1), source)


def parse_numbered(lines: Iterable[Line], source: str) -> ParsedLog:
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


def read_nccl_log(path: str | os.PathLike[str]) -> ParsedLog:
    """Parse a whole log file, its last line included even without a final newline."""
    text = Path(path).read_bytes().decode(errors="replace")  # bytes that are not UTF-8 become U+FFFD
    return parse_nccl_log(text.removesuffix("\n").split("\n"), source=str(path))

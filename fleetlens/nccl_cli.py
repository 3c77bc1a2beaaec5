"""`fleetlens nccl FILE...`: each NCCL log's per-rank GPUDirect RDMA verdict, for people, with the lines
that prove it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from collectors.nccl.collector import label_value
from collectors.nccl.parse import read_nccl_log
from collectors.nccl.records import NetDevice, ParsedLog
from collectors.nccl.verdict import RankSummary, overall_verdict, summarize


def _who(rank: RankSummary) -> str:
    key = rank.key
    parts = [key.host or "?", f"pid {label_value(key.pid) or '?'}"]
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


def cmd_nccl(args: argparse.Namespace) -> int:
    return main(args.files)

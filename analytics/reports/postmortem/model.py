"""What a postmortem report is made of, and how its parts read the store's times."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from analytics.store.records import Placement

SOURCES = ("target", "excursion", "anomaly", "alert", "action")  # the order of events at the same instant
IN_WINDOW = "ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}"
SECONDS = "toUnixTimestamp64Milli({column}) / 1000"


@dataclass(frozen=True)
class Event:
    """One line of the incident timeline; `end` is set for what lasts (an anomaly, a gap, an excursion)."""

    ts: float
    end: float | None
    source: str  # one of SOURCES
    node: str
    what: str  # short: "gpu_throttle gpu:3 opened"
    detail: str  # human text
    evidence: Mapping[str, Any]  # the numbers: anomaly evidence, alert labels, action reason, ...
    kind: str = ""  # what a filter groups by: the anomaly kind, alert name, action, "gap" or metric
    # what a straggler's anomaly says it costs its job (analytics.reports.straggler); None when it does not
    job_slowdown: float | None = None  # fraction of the job's step time due to the node
    lost_gpu_hours: float | None = None  # GPU-hours of the whole job lost to it, as last recorded


@dataclass(frozen=True)
class Excursion:
    """A series that left its baseline around an anomaly: from `start` to `end`, furthest at `peak`."""

    node: str
    metric: str
    labels: str  # the series within the node: 'gpu="3"', 'device="mlx5_0",port="1"', 'job="run-42"'
    unit: str
    start: float
    end: float
    peak: float
    baseline: float


@dataclass(frozen=True)
class SharedFault:
    """A fault of a shared layer open in the window above a node of the scope: `k` of the parent's `n`
    nodes anomalous, the per-node anomalies it explained ("link_flap mlx5_0:1 on vela-001") and what
    to check."""

    id: str
    start: float
    end: float | None
    layer: str
    parent: str
    n: int
    k: int
    p_corrected: float
    anomalous_children: tuple[str, ...]
    explained: tuple[str, ...]
    check: str


@dataclass(frozen=True)
class Report:
    """A node's or a job's incident in [start, end): its nodes and its timeline; the topology of its
    nodes as it was at `topology_at` (analytics.topology.view.node_views objects; none where the store
    held none), and the shared faults above them in the window. `placements` are what the schedulers
    say ran on the scope (the node's jobs, the job's nodes and GPUs) in the window; `nodes_from` says
    where a job's nodes came from: its step times, its placements, or both."""

    node: str | None
    job: str | None
    start: float
    end: float
    nodes: tuple[str, ...]
    events: tuple[Event, ...]
    excursions: tuple[Excursion, ...]
    gaps: tuple[Event, ...]
    topology_at: float = 0.0
    topology: tuple[Mapping[str, Any], ...] = ()
    shared_faults: tuple[SharedFault, ...] = ()
    placements: tuple[Placement, ...] = ()
    nodes_from: str = ""


def as_dict(item: Event | Excursion | SharedFault) -> dict[str, Any]:
    """An event's, excursion's or shared fault's fields by name, its evidence not copied: dataclasses.asdict
    copies every nested value, which cost a week-long job's timeline (thousands of events) a fifth of the
    page."""
    return {field.name: getattr(item, field.name) for field in fields(item)}


def utc(ts: float | None) -> str:
    if ts is None or not math.isfinite(ts):
        return "" if ts is None else str(ts)
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def number(value: float) -> str:
    return f"{value:,.6g}"


def change(excursion: Excursion) -> str:
    if excursion.baseline == 0:
        return f"{excursion.peak - excursion.baseline:+,.6g}"
    return f"{(excursion.peak - excursion.baseline) / abs(excursion.baseline):+.0%}"


def duration(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return " ".join(part for part in parts if part) or "0s"


def evidence_text(evidence: Mapping[str, Any]) -> str:
    """`name=value` pairs, numbers shortened and lists joined with commas."""

    def shown(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, int | float | list):
            return str(value)
        if isinstance(value, list):
            return ",".join(map(str, value))
        return number(value)

    return " ".join(f"{name}={shown(value)}" for name, value in evidence.items())

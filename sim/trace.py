"""The InfiniteHBD fault trace (stepfun-ai/InfiniteHBD-Trace): real faults of 400 GPU servers over 348 days.

`trace_spans` reads FLEETLENS_FIXTURES (default ../shared/fixtures)/infinitehbd/fault_trace.json, a JSON
list of events `{"node_id", "event_time" (days), "event_type" (fault_start | fault_end), "fault_type":
{"Level", "Class", "Desc"}}`, and pairs each fault_start with the next fault_end of the same node and
description. The file is outside input: an event that is not of that shape is a ScenarioError naming the
file, the event's index and the field; nothing is guessed or skipped. A fault_end with no open start is
the trace's (it began before the trace did) and is left out, as it has no start to place.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sim.errors import ScenarioError

DEFAULT_FIXTURES = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures"
TRACE_FILE = Path("infinitehbd") / "fault_trace.json"
EVENT_TYPES = ("fault_start", "fault_end")


@dataclass(frozen=True)
class TraceSpan:
    """One fault of the trace: its server, description, and span in trace days (`end_day` None: the trace
    never saw it end)."""

    node: str
    desc: str
    start_day: float
    end_day: float | None


def trace_path(fixtures: Path | None = None) -> Path:
    """Where the trace is: under `fixtures`, else $FLEETLENS_FIXTURES, else ../shared/fixtures."""
    root = fixtures or Path(os.environ.get("FLEETLENS_FIXTURES") or DEFAULT_FIXTURES)
    return root / TRACE_FILE


def trace_spans(fixtures: Path | None = None) -> list[TraceSpan]:
    """Every fault of the trace: those that ended in the order of their ends, then those that never did
    in the order their server and description first opened one."""
    path = trace_path(fixtures)
    try:
        events = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"the InfiniteHBD trace at {path} (set FLEETLENS_FIXTURES): {exc}") from None
    if not isinstance(events, list):
        raise ScenarioError(f"{path}: want a list of events, got {type(events).__name__}")
    parsed = [_event(path, at, event) for at, event in enumerate(events)]
    open_starts: dict[tuple[str, str], list[float]] = {}
    spans: list[TraceSpan] = []
    for node, desc, day, kind in sorted(parsed, key=lambda event: event[2]):
        if kind == "fault_start":
            open_starts.setdefault((node, desc), []).append(day)
        elif open_starts.get((node, desc)):
            spans.append(TraceSpan(node, desc, open_starts[(node, desc)].pop(0), day))
    spans += [TraceSpan(node, desc, day, None) for (node, desc), days in open_starts.items() for day in days]
    return spans


def _event(path: Path, at: int, event: object) -> tuple[str, str, float, str]:
    """(node, description, day, event type) of the trace's event number `at`, or ScenarioError."""
    where = f"{path}: event {at}"
    if not isinstance(event, Mapping):
        raise ScenarioError(f"{where}: want an object, got {type(event).__name__}")
    fault_type = event.get("fault_type")
    fields = {
        "node_id": event.get("node_id"),
        "event_type": event.get("event_type"),
        "fault_type.Desc": fault_type.get("Desc") if isinstance(fault_type, Mapping) else None,
    }
    for name, value in fields.items():
        if not isinstance(value, str) or not value:
            raise ScenarioError(f"{where}: {name}: want a non-empty string, got {value!r}")
    if fields["event_type"] not in EVENT_TYPES:
        raise ScenarioError(f"{where}: event_type: {fields['event_type']!r} is not one of {EVENT_TYPES}")
    day = event.get("event_time")
    if isinstance(day, bool) or not isinstance(day, int | float) or not math.isfinite(day) or day < 0:
        raise ScenarioError(f"{where}: event_time: want a finite number of days >= 0, got {day!r}")
    return fields["node_id"], fields["fault_type.Desc"], float(day), fields["event_type"]

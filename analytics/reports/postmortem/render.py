"""A postmortem report as people read it: Markdown, JSON and CSV, and the summary the UI shows."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from analytics.reports.postmortem.excursions import REL_CHANGE
from analytics.reports.postmortem.model import (
    Event,
    Report,
    as_dict,
    change,
    number,
    utc,
)
from analytics.reports.straggler import gpu_hours, percent
from analytics.reports.topology import VIEW_COLUMNS

# -- rendering ----------------------------------------------------------------------------------------------


def summarize(report: Report) -> dict[str, Any]:
    """The report's headline: anomalies by kind, the nodes that had events, alerts fired, drains, gaps,
    and the stragglers with the GPU-hours lost to them (each anomaly open in the window counted once,
    at the cost it last recorded, whole even when it began before the window)."""
    opened = [
        event for event in report.events if event.source == "anomaly" and event.what.endswith(" opened")
    ]
    stragglers = [event for event in opened if event.lost_gpu_hours is not None]
    return {
        "anomalies_by_kind": dict(Counter(event.kind for event in opened).most_common()),
        "nodes_involved": sorted({event.node for event in report.events if event.node}),
        "alerts_fired": sorted(
            {e.kind for e in report.events if e.source == "alert" and e.what.endswith("firing")}
        ),
        "drains": [
            {
                "node": event.node,
                "outcome": event.evidence["outcome"],
                "mode": event.evidence["mode"],
                "at": _iso(event.ts),
            }
            for event in report.events
            if event.source == "action" and event.kind == "drain"
        ],
        "target_gaps": len(report.gaps),
        "failed_scrapes": sum(gap.evidence["failed_scrapes"] for gap in report.gaps),
        "stragglers": [
            {
                "node": event.node,
                "job_slowdown": event.job_slowdown,
                "lost_gpu_hours": event.lost_gpu_hours,
                "from": _iso(event.ts),
            }
            for event in stragglers
        ],
        "gpu_hours_lost_to_stragglers": sum(event.lost_gpu_hours or 0.0 for event in stragglers),
    }


def to_markdown(report: Report) -> str:
    """Title (scope, window), summary, timeline, excursions and gaps; times "YYYY-MM-DD HH:MM:SS UTC"."""
    summary = summarize(report)
    kinds = ", ".join(f"{kind} {count}" for kind, count in summary["anomalies_by_kind"].items())
    drains = ", ".join(f"{d['node']} {d['outcome']} ({d['mode']})" for d in summary["drains"])
    stragglers = "; ".join(
        f"{s['node']}: {gpu_hours(s['lost_gpu_hours'])}, slowing its job by {percent(s['job_slowdown'])}"
        for s in summary["stragglers"]
    )
    lost = f"{gpu_hours(summary['gpu_hours_lost_to_stragglers'])} ({stragglers})" if stragglers else "none"
    lines = [
        f"# Postmortem: {_scope(report)}",
        "",
        f"From {utc(report.start)} to {utc(report.end)}; every time below is UTC.",
        *_placed_only_note(report),
        "",
        "## Summary",
        "",
        f"- Nodes in scope: {', '.join(report.nodes)}"
        + (f" (from its {report.nodes_from})" if report.nodes_from else ""),
        f"- Nodes with events: {', '.join(summary['nodes_involved']) or 'none'}",
        f"- Anomalies: {sum(summary['anomalies_by_kind'].values())}{f' ({kinds})' if kinds else ''}",
        f"- Alerts fired: {', '.join(summary['alerts_fired']) or 'none'}",
        f"- Drains: {drains or 'none'}",
        f"- Target gaps: {summary['target_gaps']} ({summary['failed_scrapes']} failed scrapes)",
        f"- GPU-hours lost to stragglers: {lost}",
        "",
        "## Placements",
        "",
        *_table(
            ("job", "user", "node", "GPUs", "from (UTC)", "until (UTC)", "source"),
            (
                (
                    p.job,
                    p.user,
                    p.node,
                    _gpus(p.gpus),
                    utc(p.since),
                    utc(p.until) or "still running",
                    p.source,
                )
                for p in report.placements
            ),
            "No scheduler placed a job on the scope in the window.",
        ),
        "",
        "## Timeline",
        "",
        *_table(
            ("time (UTC)", "until (UTC)", "source", "node", "what", "detail"),
            ((utc(e.ts), utc(e.end), e.source, e.node, e.what, e.detail) for e in report.events),
            "No events in the window.",
        ),
        "",
        "## Metric excursions",
        "",
        *_table(
            ("node", "series", "from (UTC)", "to (UTC)", "baseline", "peak", "change", "unit"),
            (
                (
                    x.node,
                    f"{x.metric}{{{x.labels}}}",
                    utc(x.start),
                    utc(x.end),
                    number(x.baseline),
                    number(x.peak),
                    change(x),
                    x.unit,
                )
                for x in report.excursions
            ),
            f"No series left its baseline by {REL_CHANGE:.0%} or more.",
        ),
        "",
        *_layers_markdown(report),
        "",
        "## Target gaps",
        "",
        *_table(
            ("from (UTC)", "last failed (UTC)", "node", "target", "failed scrapes", "errors"),
            (
                (
                    utc(g.ts),
                    utc(g.end),
                    g.node,
                    g.evidence["target"],
                    g.evidence["failed_scrapes"],
                    "; ".join(g.evidence["errors"]),
                )
                for g in report.gaps
            ),
            "Every scrape of the scope's targets succeeded.",
        ),
    ]
    return "\n".join(lines) + "\n"


def to_json(report: Report) -> dict[str, Any]:
    """The report as plain objects (times ISO 8601 UTC), the summary included."""
    return {
        "scope": {"node": report.node, "job": report.job},
        "start": _iso(report.start),
        "end": _iso(report.end),
        "nodes": list(report.nodes),
        "nodes_from": report.nodes_from or None,
        "placements": [
            {
                "source": str(p.source),
                "job": p.job,
                "user": p.user,
                "node": p.node,
                "gpus": list(p.gpus),
                "from": _iso(p.since),
                "until": _iso(p.until),
            }
            for p in report.placements
        ],
        "summary": summarize(report),
        "events": [_event_json(event) for event in report.events],
        "excursions": [{**as_dict(x), "start": _iso(x.start), "end": _iso(x.end)} for x in report.excursions],
        "gaps": [_event_json(event) for event in report.gaps],
        "topology": {"at": _iso(report.topology_at), "nodes": [dict(view) for view in report.topology]},
        "shared_faults": [
            {**as_dict(fault), "start": _iso(fault.start), "end": _iso(fault.end)}
            for fault in report.shared_faults
        ],
    }


CSV_COLUMNS = (
    "ts", "end", "source", "kind", "node", "what", "detail", "job_slowdown", "lost_gpu_hours", "evidence",
)  # fmt: skip


def to_csv(report: Report) -> str:
    """The timeline, one row per event: times ISO 8601 UTC, evidence as a JSON object, a straggler's cost
    in its own columns (empty for other events)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for event in map(_event_json, report.events):
        writer.writerow({**event, "evidence": json.dumps(event["evidence"], default=str)})
    return out.getvalue()


def _layers_markdown(report: Report) -> list[str]:
    """The topology of the scope's nodes as it was, and the shared faults above them."""
    return [
        f"## Topology as it was at {utc(report.topology_at)}",
        "",
        *_table(
            VIEW_COLUMNS,
            (
                [
                    ", ".join(cell) if isinstance(cell, list) else cell
                    for cell in (view.get(column, "") for column in VIEW_COLUMNS)
                ]
                for view in report.topology
            ),
            "The store held no topology of these nodes then (docs/topology.md says how to add one).",
        ),
        "",
        "## Shared faults",
        "",
        *_table(
            ("from (UTC)", "until (UTC)", "layer", "parent", "anomalous nodes", "explained", "check"),
            (
                (
                    utc(f.start),
                    utc(f.end),
                    f.layer,
                    f.parent,
                    f"{f.k} of {f.n} ({', '.join(f.anomalous_children)}; p {f.p_corrected:.2g})",
                    "; ".join(f.explained) or "nothing yet",
                    f.check,
                )
                for f in report.shared_faults
            ),
            "No shared fault above these nodes in the window.",
        ),
    ]


def _placed_only_note(report: Report) -> list[str]:
    """The line that says a job's nodes and span are its schedulers' word, where it sent no step times."""
    if report.nodes_from != "placements":
        return []
    sources = ", ".join(sorted({str(p.source) for p in report.placements}))
    return [
        "",
        f"The job sent no step times: its nodes and span come from its placements ({sources}).",
    ]


def _gpus(gpus: Sequence[int]) -> str:
    return ", ".join(map(str, gpus)) or "not said"


def _event_json(event: Event) -> dict[str, Any]:
    return {**as_dict(event), "ts": _iso(event.ts), "end": _iso(event.end), "evidence": dict(event.evidence)}


def _scope(report: Report) -> str:
    return f"node {report.node}" if report.node else f"job {report.job} on {len(report.nodes)} node(s)"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], empty: str) -> list[str]:
    """A Markdown table, or `empty` when there are no rows."""
    body = ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    if not body:
        return [empty]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *body]


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")

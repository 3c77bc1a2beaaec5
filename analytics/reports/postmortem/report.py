"""Postmortem reports: what happened to a node or a job in a time window, for the people who look back.

    report = build_report(source, node="vela-002", start=t0, end=t1)    # or job="run-42"
    print(to_markdown(report))                                            # or to_json / to_csv

A report reads only the stable views and tables (docs/schema.md), through a Store or a hub's query API,
and lays out one timeline, oldest first:

- anomalies on the scope's nodes that were open in the window: when each opened (even before the window)
  and, when within it, closed, with the detector's evidence and, for a straggler, what it costs its job
  (job_slowdown, lost_gpu_hours: analytics.reports.straggler);
- alert state changes (`alerts` rows labelled with one of the nodes) and the drain controller's decisions
  and people's requests about them (`actions`; the circuit breaker's too, since it holds every drain);
- target gaps: consecutive failed scrapes of one target merged into one event, with their errors;
- the shared faults above the scope's nodes open in the window (on the timeline as anomalies of their
  parent, and listed with what each explained), and the nodes' topology as it was (layers.py);
- metric excursions that mattered: for each anomaly, the series that show its kind (KIND_SERIES, on the
  anomaly's GPU or port, or the node's step times in its job) compared with their own baseline, the
  median of the window before the anomaly (at least BASELINE_MIN_S and at most BASELINE_MAX_S of it, so
  that a week-long window costs no more than an hour's). A series left its baseline when it moved by
  REL_CHANGE of it and by its own floor (SeriesSpec.min_change) at least; the report keeps the
  MAX_EXCURSIONS biggest moves relative to the baseline, from the MAX_PROBED_ANOMALIES most severe
  anomalies.

A job's nodes are those with step rows of the job in the window and those its placements (the
schedulers' word: analytics.store.placements) put it on; a job that sent no step times is reported over
the part of the window its placements span, and the report says its nodes came from them. A series is
read in at most MAX_POINTS buckets of its min, max and mean, from the 1-minute rollup (metrics_1m) when
its span (baseline to the anomaly's end) is over RAW_SPAN_MAX_S; a bucket's departure is its extreme
farthest from the baseline, so a short spike is not averaged away.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from analytics import evidence as typed_evidence
from analytics.detectors.base import Window
from analytics.errors import PostmortemError
from analytics.reports.postmortem.excursions import find_excursions
from analytics.reports.postmortem.layers import read_layers
from analytics.reports.postmortem.model import (
    IN_WINDOW,
    SECONDS,
    SOURCES,
    Event,
    Excursion,
    Report,
    as_dict,
    change,
    duration,
    evidence_text,
    number,
    utc,
)
from analytics.reports.straggler import cost_text, gpu_hours, straggler_cost
from analytics.store.placements import placements_between
from analytics.store.protocols import Reader
from analytics.store.records import Placement, QueryResult

EVENT_ROWS = 10_000  # rows each kind of event may fill


# -- queries ------------------------------------------------------------------------------------------------


KNOWN_NODE_SQL = """
SELECT count() FROM (
    (SELECT node FROM targets WHERE node = {node:String} LIMIT 1)
    UNION ALL (SELECT node FROM steps WHERE node = {node:String} LIMIT 1)
    UNION ALL (SELECT node FROM anomalies WHERE node = {node:String} LIMIT 1)
)
"""
JOB_NODES_SQL = f"SELECT DISTINCT node FROM steps WHERE job = {{job:String}} AND {IN_WINDOW} ORDER BY node"
ANOMALIES_SQL = f"""
SELECT {SECONDS.format(column="start")} AS start_s, {SECONDS.format(column="end")} AS end_s,
    kind, node, component, job, severity, score, evidence
FROM anomalies FINAL
WHERE node IN {{nodes:Array(String)}} AND start < {{end:DateTime64(3)}}
    AND (end IS NULL OR end >= {{start:DateTime64(3)}})
ORDER BY start_s, node, kind, component
"""
ALERTS_SQL = f"""
SELECT {SECONDS.format(column="ts")} AS ts_s, fingerprint, alertname, state, labels, annotations
FROM alerts
WHERE labels['node'] IN {{nodes:Array(String)}} AND {IN_WINDOW}
ORDER BY ts_s, alertname
"""
ACTIONS_SQL = f"""
SELECT {SECONDS.format(column="ts")} AS ts_s, action, node, job, reason, mode, outcome, decision_id
FROM actions
WHERE {IN_WINDOW} AND (
    node IN {{nodes:Array(String)}} OR action = 'breaker' OR (job != '' AND job = {{job:String}})
    OR decision_id IN (
        SELECT decision_id FROM actions WHERE node IN {{nodes:Array(String)}} AND decision_id != ''
    )
)
ORDER BY ts_s, action
"""
# Failed scrapes of one target with no success between them share a run number: one gap per run. Only
# targets that failed are read in full.
GAPS_SQL = f"""
SELECT target, node, {SECONDS.format(column="min(ts)")} AS first_s,
    {SECONDS.format(column="max(ts)")} AS last_s, count() AS failed, topK(3)(error) AS errors
FROM (
    SELECT target, node, ts, up, error, sum(up) OVER (PARTITION BY target ORDER BY ts) AS run
    FROM targets
    WHERE node IN {{nodes:Array(String)}} AND {IN_WINDOW} AND target IN (
        SELECT target FROM targets WHERE node IN {{nodes:Array(String)}} AND {IN_WINDOW} AND up = 0
    )
)
WHERE up = 0
GROUP BY target, node, run
ORDER BY first_s, target
"""


# -- the report ---------------------------------------------------------------------------------------------


def build_report(
    source: Reader, *, node: str | None = None, job: str | None = None, start: float, end: float
) -> Report:
    """The incident report of `node` or `job` over [start, end) (unix seconds); PostmortemError when the
    scope is not one node or one job the store knows, or the window is empty."""
    window = _window(start, end)
    scope = _scope(source, node, job, window)
    window, nodes = scope.window, scope.nodes
    parameters = {**window.parameters, "nodes": list(nodes), "job": job or ""}

    def rows(sql: str) -> list[dict[str, Any]]:
        return _rows(source.query(sql, parameters=parameters, max_rows=EVENT_ROWS))

    anomalies = [
        {**row, "evidence": typed_evidence.stored(row["kind"], row["evidence"])}
        for row in rows(ANOMALIES_SQL)
    ]
    gaps = [_gap_event(row) for row in rows(GAPS_SQL)]
    excursions = find_excursions(source, anomalies, window)
    layers = read_layers(source, nodes, window, rows)
    events = [
        *(event for row in [*anomalies, *layers.rows] for event in _anomaly_events(row, window)),
        *map(_alert_event, rows(ALERTS_SQL)),
        *map(_action_event, rows(ACTIONS_SQL)),
        *gaps,
        *map(_excursion_event, excursions),
    ]
    events.sort(key=lambda event: (event.ts, SOURCES.index(event.source), event.node, event.what))
    return Report(
        node,
        job,
        window.start,
        window.end,
        nodes,
        tuple(events),
        tuple(excursions),
        tuple(gaps),
        layers.at,
        layers.topology,
        layers.faults,
        scope.placements,
        scope.nodes_from,
    )


def _window(start: float, end: float) -> Window:
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise PostmortemError(f"the window must end after it starts: from {utc(start)} to {utc(end)}")
    return Window(start, end)


@dataclass(frozen=True)
class _Scope:
    """What a report covers: its window, nodes, the placements of the scope and where a job's nodes came
    from ("steps", "placements" or "steps and placements"; "" for a node)."""

    window: Window
    nodes: tuple[str, ...]
    placements: tuple[Placement, ...]
    nodes_from: str


def _scope(source: Reader, node: str | None, job: str | None, window: Window) -> _Scope:
    """`node` and the jobs placed on it; or the nodes that ran steps of `job` in the window together
    with those its placements name, over the span of its placements when it sent no step times.
    PostmortemError when the scope is not one known node or one job with steps or placements."""
    if bool(node) == bool(job):
        given = f"node {node!r} and job {job!r}" if node else "neither"
        raise PostmortemError(f"a postmortem is about one node or one job; given {given}")
    if node:
        placed = tuple(placements_between(source, window.start, window.end, node=node))
        [(seen,)] = source.query(KNOWN_NODE_SQL, parameters={"node": node}).rows
        if not seen and not placed:
            raise PostmortemError(
                f"node {node!r} is unknown to the store: no scrapes, steps, anomalies or placements of it"
            )
        return _Scope(window, (node,), placed, "")
    parameters = {**window.parameters, "job": job}
    stepped = {row[0] for row in source.query(JOB_NODES_SQL, parameters=parameters).rows}
    placed = tuple(placements_between(source, window.start, window.end, job=job))
    if not stepped and not placed:
        raise PostmortemError(
            f"job {job!r} has no steps and no placements from {utc(window.start)} to {utc(window.end)}:"
            " no node to report on"
        )
    nodes = tuple(sorted(stepped | {placement.node for placement in placed}))
    if stepped:
        return _Scope(window, nodes, placed, "steps and placements" if placed else "steps")
    span = Window(
        max(window.start, min(placement.since for placement in placed)),
        min(window.end, max(placement.until or window.end for placement in placed)),
    )
    return _Scope(span if span.end > span.start else window, nodes, placed, "placements")


def _rows(result: QueryResult) -> list[dict[str, Any]]:
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


# -- events -------------------------------------------------------------------------------------------------


def _anomaly_events(row: Mapping[str, Any], window: Window) -> list[Event]:
    """The anomaly's opening, and its closing when that falls in the window; both carry what a straggler
    costs its job when its evidence says, and state it in their detail."""
    evidence = typed_evidence.as_dict(row["evidence"])
    cost = straggler_cost(row["evidence"])
    where = " ".join(part for part in (row["kind"], row["component"]) if part)
    job = f", job {row['job']}" if row["job"] else ""
    costs = f"; {cost_text(cost)}" if cost.known else ""
    opened = Event(
        row["start_s"],
        row["end_s"],
        "anomaly",
        row["node"],
        f"{where} opened",
        f"{row['severity']}, score {number(row['score'])}{job}{costs}: {evidence_text(evidence)}",
        evidence,
        row["kind"],
        cost.job_slowdown,
        cost.lost_gpu_hours,
    )
    if row["end_s"] is None or row["end_s"] > window.end:
        return [opened]
    lasted = f"after {duration(row['end_s'] - row['start_s'])}"
    if cost.lost_gpu_hours is not None:
        lasted += f", {gpu_hours(cost.lost_gpu_hours)} GPU-hours of its job lost"
    closed = replace(opened, ts=row["end_s"], end=None, what=f"{where} closed", detail=lasted)
    return [opened, closed]


def _alert_event(row: Mapping[str, Any]) -> Event:
    labels = dict(row["labels"])
    summary = dict(row["annotations"]).get("summary", "")
    return Event(
        row["ts_s"],
        None,
        "alert",
        labels.get("node", ""),
        f"{row['alertname']} {row['state']}",
        summary or evidence_text(labels),
        {**labels, "fingerprint": row["fingerprint"]},
        row["alertname"],
    )


def _action_event(row: Mapping[str, Any]) -> Event:
    subject = row["node"] or row["decision_id"]
    what = f"{row['action']} {subject}: {row['outcome']}" if subject else f"{row['action']} {row['outcome']}"
    context = ", ".join(
        f"{name} {row[name]}" for name in ("mode", "job", "decision_id") if row[name] and row[name] != subject
    )
    evidence = {name: row[name] for name in ("outcome", "mode", "reason", "decision_id", "job")}
    detail = f"{row['reason']} ({context})" if context else row["reason"]
    return Event(row["ts_s"], None, "action", row["node"], what, detail, evidence, row["action"])


def _gap_event(row: Mapping[str, Any]) -> Event:
    errors = [error for error in row["errors"] if error]
    scrapes = f"{row['failed']} failed scrape{'s' if row['failed'] > 1 else ''}"
    span = f" over {duration(row['last_s'] - row['first_s'])}" if row["last_s"] > row["first_s"] else ""
    return Event(
        row["first_s"],
        row["last_s"],
        "target",
        row["node"],
        f"{row['target']} unreachable",
        f"{scrapes}{span}: {'; '.join(errors) or 'no error recorded'}",
        {"target": row["target"], "failed_scrapes": row["failed"], "errors": errors},
        "gap",
    )


def _excursion_event(excursion: Excursion) -> Event:
    direction = "fell" if excursion.peak < excursion.baseline else "rose"
    return Event(
        excursion.start,
        excursion.end,
        "excursion",
        excursion.node,
        f"{excursion.metric}{{{excursion.labels}}} {direction} to {number(excursion.peak)} {excursion.unit}",
        f"baseline {number(excursion.baseline)} {excursion.unit}, peak {number(excursion.peak)} "
        f"{excursion.unit} ({change(excursion)})",
        {key: value for key, value in as_dict(excursion).items() if key not in ("node", "start", "end")},
        excursion.metric,
    )

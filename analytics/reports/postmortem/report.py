"""Postmortem reports: what happened to a node or a job in a time window, for the people who look back.

    report = build_report(source, node="vela-002", start=t0, end=t1)    # or job="run-42"
    print(to_markdown(report))                                            # or to_json / to_csv

A report reads only the stable views and tables (docs/schema.md), through a Store or a hub's query API,
and lays out one timeline, oldest first:

- anomalies on the scope's nodes that were open in the window: when each opened (even before the window)
  and, when within it, closed, with the detector's evidence;
- alert state changes (`alerts` rows labelled with one of the nodes) and the drain controller's decisions
  and people's requests about them (`actions`; the circuit breaker's too, since it holds every drain);
- target gaps: consecutive failed scrapes of one target merged into one event, with their errors;
- metric excursions that mattered: for each anomaly, the series that show its kind (KIND_SERIES, on the
  anomaly's GPU or port, or the node's step times in its job) compared with their own baseline, the
  median of the window before the anomaly (at least BASELINE_MIN_S and at most BASELINE_MAX_S of it, so
  that a week-long window costs no more than an hour's). A series left its baseline when it moved by
  REL_CHANGE of it and by its own floor (SeriesSpec.min_change) at least; the report keeps the
  MAX_EXCURSIONS biggest moves relative to the baseline, from the MAX_PROBED_ANOMALIES most severe
  anomalies.

A job's nodes are those with step rows of the job in the window. A series is read in at most MAX_POINTS
buckets of its min, max and mean, from the 1-minute rollup (metrics_1m) when its span (baseline to the
anomaly's end) is over RAW_SPAN_MAX_S; a bucket's departure is its extreme farthest from the baseline, so
a short spike is not averaged away.

The SQL box of the UI's Postmortem page runs here too: SAVED_QUERIES for the usual questions and run_sql,
which refuses writes and explains syntax errors in words.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd

from analytics.detectors.base import SEVERITIES, QuerySource, Window, frame
from analytics.errors import AnalyticsError, QueryError
from analytics.store.records import QueryResult

SOURCES = ("target", "excursion", "anomaly", "alert", "action")  # the order of events at the same instant
EVENT_ROWS = 10_000  # rows each kind of event may fill
RAW_SPAN_MAX_S = 2 * 3600.0
MAX_POINTS = 720
MIN_BUCKET_S = 10
BASELINE_MIN_S = 600.0
BASELINE_MAX_S = 3600.0
SETTLE_S = 60.0  # a series may take a detection window or so to come back after its anomaly closed
REL_CHANGE = 0.10
MAX_EXCURSIONS = 10
MAX_PROBED_ANOMALIES = 12  # the most severe, highest-scoring anomalies whose series are read
SERIES_ROWS = 100_000


class PostmortemError(AnalyticsError, ValueError):
    """The report's scope cannot be reported on: neither or both of node and job, a window that ends
    before it starts, or a node or job the store knows nothing of."""


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
class Report:
    """A node's or a job's incident in [start, end): its nodes and its timeline."""

    node: str | None
    job: str | None
    start: float
    end: float
    nodes: tuple[str, ...]
    events: tuple[Event, ...]
    excursions: tuple[Excursion, ...]
    gaps: tuple[Event, ...]


# -- the series that show each anomaly kind ---------------------------------------------------------------


@dataclass(frozen=True)
class SeriesSpec:
    """A series that shows an anomaly kind, and the least move from its baseline that counts.

    `part` says which series of the node: the anomaly's GPU ("gpu"), its port ("port"), or the node's
    step times in the anomaly's job ("job", from the `steps` table)."""

    metric: str
    unit: str
    part: str
    min_change: float  # in `unit`
    rate: bool = False  # a counter: its per-second increase is what moves

    @property
    def from_steps(self) -> bool:
        return self.part == "job"


STEP_COLUMNS = ("duration_s", "compute_s")
LINK_SERIES = (
    SeriesSpec("node_infiniband_state_id", "state (4 = active)", "port", 1),
    SeriesSpec("node_infiniband_link_downed_total", "link downs", "port", 1),
)
KIND_SERIES: Mapping[str, tuple[SeriesSpec, ...]] = {
    "gpu_throttle": (
        SeriesSpec("DCGM_FI_DEV_SM_CLOCK", "MHz", "gpu", 50),
        SeriesSpec("DCGM_FI_DEV_GPU_TEMP", "°C", "gpu", 5),
    ),
    "gpu_fault": (
        SeriesSpec("fleetlens_gpu_up", "up (1 = on the bus)", "gpu", 1),
        SeriesSpec("DCGM_FI_DEV_XID_ERRORS", "last Xid", "gpu", 1),
    ),
    "link_flap": LINK_SERIES,
    "link_down": LINK_SERIES,
    "dma_degraded": (
        SeriesSpec("node_infiniband_port_data_received_bytes_total", "B/s", "port", 1e6, rate=True),
        SeriesSpec("node_infiniband_port_data_transmitted_bytes_total", "B/s", "port", 1e6, rate=True),
    ),
    "congestion": (SeriesSpec("node_infiniband_np_cnp_packets_sent_total", "CNP/s", "port", 10, rate=True),),
    "slow_node": tuple(SeriesSpec(f"steps.{column}", "s", "job", 0.01) for column in STEP_COLUMNS),
}
COMPONENTS = {  # the anomaly components each part applies to, and their labels in the store
    "gpu": re.compile(r"gpu:(?P<gpu>\d+)"),
    "port": re.compile(r"(?!gpu:)(?P<device>[^:|]+):(?P<port>\d+)"),
}


# -- queries ------------------------------------------------------------------------------------------------

IN_WINDOW = "ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}"
SECONDS = "toUnixTimestamp64Milli({column}) / 1000"

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
BUCKET = "intDiv(toUnixTimestamp(ts), {bucket_s:UInt32}) * {bucket_s:UInt32}"
METRIC_SERIES_SQL = """
SELECT concat(node, '|', metric, '|', if(labels['gpu'] != '', concat('gpu:', labels['gpu']),
        concat(labels['device'], ':', labels['port']))) AS series_key,
    {bucket} AS t, {low} AS low, {high} AS high, {mean} AS mean, {closing} AS closing
FROM {table}
WHERE metric IN {{metrics:Array(String)}} AND node IN {{nodes:Array(String)}} AND {in_window}
    AND series_key IN {{series:Array(String)}}
GROUP BY series_key, t
ORDER BY series_key, t
"""
RESOLUTIONS = {  # raw samples, or the 1-minute rollup for long windows
    "raw": {
        "table": "metrics",
        "low": "min(value)",
        "high": "max(value)",
        "mean": "avg(value)",
        "closing": "argMax(value, ts)",
    },
    "1m": {
        "table": "metrics_1m",
        "low": "min(min)",
        "high": "max(max)",
        "mean": "sum(sum) / sum(count)",
        "closing": "argMax(last, ts)",
    },
}
STEP_SERIES_SQL = f"""
SELECT concat(node, '|', metric, '|', job) AS series_key, {BUCKET} AS t,
    min(value) AS low, max(value) AS high, avg(value) AS mean, argMax(value, ts) AS closing
FROM steps
ARRAY JOIN [{", ".join(f"'steps.{column}'" for column in STEP_COLUMNS)}] AS metric,
    [{", ".join(STEP_COLUMNS)}] AS value
WHERE node IN {{nodes:Array(String)}} AND {IN_WINDOW} AND value IS NOT NULL
    AND series_key IN {{series:Array(String)}}
GROUP BY series_key, t
ORDER BY series_key, t
"""


# -- the report ---------------------------------------------------------------------------------------------


def build_report(
    source: QuerySource, *, node: str | None = None, job: str | None = None, start: float, end: float
) -> Report:
    """The incident report of `node` or `job` over [start, end) (unix seconds); PostmortemError when the
    scope is not one node or one job the store knows, or the window is empty."""
    window = _window(start, end)
    nodes = _scope_nodes(source, node, job, window)
    parameters = {**window.parameters, "nodes": list(nodes), "job": job or ""}

    def rows(sql: str) -> list[dict[str, Any]]:
        return _rows(source.query(sql, parameters=parameters, max_rows=EVENT_ROWS))

    anomalies = rows(ANOMALIES_SQL)
    gaps = [_gap_event(row) for row in rows(GAPS_SQL)]
    excursions = _find_excursions(source, anomalies, window)
    events = [
        *(event for row in anomalies for event in _anomaly_events(row, window)),
        *map(_alert_event, rows(ALERTS_SQL)),
        *map(_action_event, rows(ACTIONS_SQL)),
        *gaps,
        *map(_excursion_event, excursions),
    ]
    events.sort(key=lambda event: (event.ts, SOURCES.index(event.source), event.node, event.what))
    return Report(node, job, start, end, nodes, tuple(events), tuple(excursions), tuple(gaps))


def _window(start: float, end: float) -> Window:
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise PostmortemError(f"the window must end after it starts: from {_utc(start)} to {_utc(end)}")
    return Window(start, end)


def _scope_nodes(source: QuerySource, node: str | None, job: str | None, window: Window) -> tuple[str, ...]:
    """The nodes the report is about: `node`, or the nodes that ran steps of `job` in the window."""
    if bool(node) == bool(job):
        given = f"node {node!r} and job {job!r}" if node else "neither"
        raise PostmortemError(f"a postmortem is about one node or one job; given {given}")
    if node:
        [(seen,)] = source.query(KNOWN_NODE_SQL, parameters={"node": node}).rows
        if not seen:
            raise PostmortemError(
                f"node {node!r} is unknown to the store: no scrapes, steps or anomalies of it"
            )
        return (node,)
    parameters = {**window.parameters, "job": job}
    nodes = tuple(row[0] for row in source.query(JOB_NODES_SQL, parameters=parameters).rows)
    if not nodes:
        raise PostmortemError(
            f"job {job!r} has no steps from {_utc(window.start)} to {_utc(window.end)}: no node to report on"
        )
    return nodes


def _rows(result: QueryResult) -> list[dict[str, Any]]:
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


# -- events -------------------------------------------------------------------------------------------------


def _anomaly_events(row: Mapping[str, Any], window: Window) -> list[Event]:
    """The anomaly's opening, and its closing when that falls in the window."""
    evidence = json.loads(row["evidence"])
    where = " ".join(part for part in (row["kind"], row["component"]) if part)
    job = f", job {row['job']}" if row["job"] else ""
    opened = Event(
        row["start_s"],
        row["end_s"],
        "anomaly",
        row["node"],
        f"{where} opened",
        f"{row['severity']}, score {_number(row['score'])}{job}: {_evidence_text(evidence)}",
        evidence,
        row["kind"],
    )
    if row["end_s"] is None or row["end_s"] > window.end:
        return [opened]
    lasted = f"after {_duration(row['end_s'] - row['start_s'])}"
    return [
        opened,
        Event(row["end_s"], None, "anomaly", row["node"], f"{where} closed", lasted, evidence, row["kind"]),
    ]


def _alert_event(row: Mapping[str, Any]) -> Event:
    labels = dict(row["labels"])
    summary = dict(row["annotations"]).get("summary", "")
    return Event(
        row["ts_s"],
        None,
        "alert",
        labels.get("node", ""),
        f"{row['alertname']} {row['state']}",
        summary or _evidence_text(labels),
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
    span = f" over {_duration(row['last_s'] - row['first_s'])}" if row["last_s"] > row["first_s"] else ""
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
        f"{excursion.metric}{{{excursion.labels}}} {direction} to {_number(excursion.peak)} {excursion.unit}",
        f"baseline {_number(excursion.baseline)} {excursion.unit}, peak {_number(excursion.peak)} "
        f"{excursion.unit} ({_change(excursion)})",
        {key: value for key, value in asdict(excursion).items() if key not in ("node", "start", "end")},
        excursion.metric,
    )


# -- excursions ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Probe:
    """One series to compare with its baseline around one anomaly."""

    node: str
    spec: SeriesSpec
    key: str  # the GPU or port component, or the job for step series
    labels: str
    onset: float  # the anomaly's start: the baseline lies before it
    until: float
    baseline_from: float

    @property
    def series(self) -> str:
        """The series' key in query results: node, metric and component (or job)."""
        return f"{self.node}|{self.spec.metric}|{self.key}"


def _find_excursions(
    source: QuerySource, anomalies: Sequence[Mapping[str, Any]], window: Window
) -> list[Excursion]:
    """The biggest departures from baseline (at most MAX_EXCURSIONS, biggest first) of the series that show
    `anomalies` (rows with start_s, end_s, kind, node, component, job, severity, score)."""
    found: dict[tuple[str, str, str, float], tuple[float, Excursion]] = {}
    for group in _overlapping(_probes(anomalies, window)):
        points, bucket_s = _series_points(source, group)
        for probe in group:
            moved = (
                _excursion(probe, points[probe.series], bucket_s, window) if probe.series in points else None
            )
            if moved is None:
                continue
            key = (probe.node, probe.spec.metric, probe.labels, moved[1].start)
            if key not in found or moved[0] > found[key][0]:
                found[key] = moved
    ranked = sorted(found.values(), key=lambda pair: -pair[0])
    return [excursion for _, excursion in ranked[:MAX_EXCURSIONS]]


def _probes(anomalies: Sequence[Mapping[str, Any]], window: Window) -> list[_Probe]:
    """The series to compare for the most severe, highest-scoring anomalies."""
    ranked = sorted(
        anomalies, key=lambda row: (SEVERITIES.index(row["severity"]), row["score"]), reverse=True
    )
    probes = []
    for row in ranked[:MAX_PROBED_ANOMALIES]:
        onset = row["start_s"]
        lookback = min(max(onset - window.start, BASELINE_MIN_S), BASELINE_MAX_S)
        until = min(window.end, (window.end if row["end_s"] is None else row["end_s"]) + SETTLE_S)
        for spec in KIND_SERIES.get(row["kind"], ()):
            labels = _series_labels(spec.part, row["component"], row["job"])
            if labels is not None:
                key = row["job"] if spec.from_steps else row["component"]
                probes.append(_Probe(row["node"], spec, key, labels, onset, until, onset - lookback))
    return probes


def _overlapping(probes: Sequence[_Probe]) -> list[list[_Probe]]:
    """The probes in groups whose spans overlap, so that each group is read in one pass of its span."""
    groups: list[list[_Probe]] = []
    for probe in sorted(probes, key=lambda probe: probe.baseline_from):
        if groups and probe.baseline_from < max(member.until for member in groups[-1]):
            groups[-1].append(probe)
        else:
            groups.append([probe])
    return groups


def _series_labels(part: str, component: str, job: str) -> str | None:
    """The labels of the `part` series of an anomaly on `component` in `job`; None when it has none."""
    if part == "job":
        return f'job="{job}"' if job else None
    found = COMPONENTS[part].fullmatch(component)
    return ",".join(f'{name}="{value}"' for name, value in found.groupdict().items()) if found else None


def _series_points(source: QuerySource, probes: Sequence[_Probe]) -> tuple[dict[str, pd.DataFrame], int]:
    """Every probed series over the span the probes need, as (t, low, high, mean) per bucket, counters
    as rates; and the bucket length in seconds."""
    first = min(probe.baseline_from for probe in probes)
    last = max(probe.until for probe in probes)
    resolution, bucket_s = _resolution(last - first)
    parameters = {
        **Window(first - bucket_s, last).parameters,  # one bucket more, for the first rate
        "bucket_s": bucket_s,
        "nodes": sorted({probe.node for probe in probes}),
        "metrics": sorted({probe.spec.metric for probe in probes}),
    }
    metric_sql = METRIC_SERIES_SQL.format(bucket=BUCKET, in_window=IN_WINDOW, **RESOLUTIONS[resolution])
    frames = []
    for sql, from_steps in ((metric_sql, False), (STEP_SERIES_SQL, True)):
        series = sorted({probe.series for probe in probes if probe.spec.from_steps == from_steps})
        if series:
            result = source.query(sql, parameters={**parameters, "series": series}, max_rows=SERIES_ROWS)
            if result.rows:  # an empty result may come back without its column names
                frames.append(frame(result))
    if not frames:
        return {}, bucket_s
    rates = {probe.series for probe in probes if probe.spec.rate}
    return {
        key: _as_rate(group) if key in rates else group.reset_index(drop=True)
        for key, group in pd.concat(frames, ignore_index=True).groupby("series_key", sort=False)
    }, bucket_s


def _resolution(span_s: float) -> tuple[str, int]:
    """Raw samples or the 1-minute rollup, and the bucket length that keeps a series to MAX_POINTS."""
    bucket_s = max(MIN_BUCKET_S, math.ceil(span_s / MAX_POINTS))
    if span_s <= RAW_SPAN_MAX_S:
        return "raw", bucket_s
    return "1m", math.ceil(bucket_s / 60) * 60


def _as_rate(points: pd.DataFrame) -> pd.DataFrame:
    """A counter's buckets as its per-second increase; a decrease (a counter reset) is left out."""
    rate = points["closing"].diff() / points["t"].diff()
    rated = points.assign(low=rate, high=rate, mean=rate)
    return rated[rate >= 0].reset_index(drop=True)


def _excursion(
    probe: _Probe, points: pd.DataFrame, bucket_s: int, window: Window
) -> tuple[float, Excursion] | None:
    """How far the series went from its baseline after the anomaly's onset, if far enough to matter:
    (the move relative to the baseline, the excursion)."""
    bucket_end = points["t"] + bucket_s
    before = points[(points["t"] >= probe.baseline_from) & (bucket_end <= probe.onset)]
    baseline = float(before["mean"].median()) if not before.empty else math.nan
    during = points[(bucket_end > probe.onset) & (points["t"] <= probe.until)]
    if math.isnan(baseline) or during.empty:
        return None
    low_is_farther = (during["low"] - baseline).abs() > (during["high"] - baseline).abs()
    extreme = during["low"].where(low_is_farther, during["high"]).astype(float)
    departure = (extreme - baseline).abs()
    beyond = during["t"][departure >= max(REL_CHANGE * abs(baseline), probe.spec.min_change)]
    if beyond.empty:
        return None
    excursion = Excursion(
        probe.node,
        probe.spec.metric,
        probe.labels,
        probe.spec.unit,
        start=max(float(beyond.iloc[0]), probe.onset),
        end=min(float(beyond.iloc[-1]) + bucket_s, window.end),
        peak=float(extreme[departure.idxmax()]),
        baseline=baseline,
    )
    return float(departure.max()) / max(abs(baseline), probe.spec.min_change), excursion


# -- rendering ----------------------------------------------------------------------------------------------


def summarize(report: Report) -> dict[str, Any]:
    """The report's headline: anomalies by kind, the nodes that had events, alerts fired, drains, gaps."""
    opened = [
        event for event in report.events if event.source == "anomaly" and event.what.endswith(" opened")
    ]
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
    }


def to_markdown(report: Report) -> str:
    """Title (scope, window), summary, timeline, excursions and gaps; times "YYYY-MM-DD HH:MM:SS UTC"."""
    summary = summarize(report)
    kinds = ", ".join(f"{kind} {count}" for kind, count in summary["anomalies_by_kind"].items())
    drains = ", ".join(f"{d['node']} {d['outcome']} ({d['mode']})" for d in summary["drains"])
    lines = [
        f"# Postmortem: {_scope(report)}",
        "",
        f"From {_utc(report.start)} to {_utc(report.end)}; every time below is UTC.",
        "",
        "## Summary",
        "",
        f"- Nodes in scope: {', '.join(report.nodes)}",
        f"- Nodes with events: {', '.join(summary['nodes_involved']) or 'none'}",
        f"- Anomalies: {sum(summary['anomalies_by_kind'].values())}{f' ({kinds})' if kinds else ''}",
        f"- Alerts fired: {', '.join(summary['alerts_fired']) or 'none'}",
        f"- Drains: {drains or 'none'}",
        f"- Target gaps: {summary['target_gaps']} ({summary['failed_scrapes']} failed scrapes)",
        "",
        "## Timeline",
        "",
        *_table(
            ("time (UTC)", "until (UTC)", "source", "node", "what", "detail"),
            ((_utc(e.ts), _utc(e.end), e.source, e.node, e.what, e.detail) for e in report.events),
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
                    _utc(x.start),
                    _utc(x.end),
                    _number(x.baseline),
                    _number(x.peak),
                    _change(x),
                    x.unit,
                )
                for x in report.excursions
            ),
            f"No series left its baseline by {REL_CHANGE:.0%} or more.",
        ),
        "",
        "## Target gaps",
        "",
        *_table(
            ("from (UTC)", "last failed (UTC)", "node", "target", "failed scrapes", "errors"),
            (
                (
                    _utc(g.ts),
                    _utc(g.end),
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
        "summary": summarize(report),
        "events": [_event_json(event) for event in report.events],
        "excursions": [{**asdict(x), "start": _iso(x.start), "end": _iso(x.end)} for x in report.excursions],
        "gaps": [_event_json(event) for event in report.gaps],
    }


CSV_COLUMNS = ("ts", "end", "source", "kind", "node", "what", "detail", "evidence")


def to_csv(report: Report) -> str:
    """The timeline, one row per event: times ISO 8601 UTC, evidence as a JSON object."""
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for event in map(_event_json, report.events):
        writer.writerow({**event, "evidence": json.dumps(event["evidence"], default=str)})
    return out.getvalue()


def _event_json(event: Event) -> dict[str, Any]:
    return {**asdict(event), "ts": _iso(event.ts), "end": _iso(event.end), "evidence": dict(event.evidence)}


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


def _utc(ts: float | None) -> str:
    if ts is None or not math.isfinite(ts):
        return "" if ts is None else str(ts)
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


def _number(value: float) -> str:
    return f"{value:,.6g}"


def _change(excursion: Excursion) -> str:
    if excursion.baseline == 0:
        return f"{excursion.peak - excursion.baseline:+,.6g}"
    return f"{(excursion.peak - excursion.baseline) / abs(excursion.baseline):+.0%}"


def _duration(seconds: float) -> str:
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return " ".join(part for part in parts if part) or "0s"


def _evidence_text(evidence: Mapping[str, Any]) -> str:
    """`name=value` pairs, numbers shortened and lists joined with commas."""

    def shown(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, int | float | list):
            return str(value)
        if isinstance(value, list):
            return ",".join(map(str, value))
        return _number(value)

    return " ".join(f"{name}={shown(value)}" for name, value in evidence.items())


# -- the SQL box --------------------------------------------------------------------------------------------

SAVED_QUERIES: dict[str, str] = {
    "Anomalies on the node": """
SELECT start, end, kind, component, job, severity, round(score, 3) AS score, evidence, detector
FROM anomalies FINAL
WHERE node = {node:String} AND start < {end:DateTime64(3)}
    AND (end IS NULL OR end >= {start:DateTime64(3)})
ORDER BY start""",
    "Alert changes on the node": f"""
SELECT ts, alertname, state, labels['component'] AS component, annotations['summary'] AS summary, fingerprint
FROM alerts
WHERE labels['node'] = {{node:String}} AND {IN_WINDOW}
ORDER BY ts""",
    "Drain decisions on the node": f"""
SELECT ts, action, outcome, mode, reason, decision_id
FROM actions
WHERE node = {{node:String}} AND {IN_WINDOW}
ORDER BY ts""",
    "Failed scrapes of the node": f"""
SELECT ts, target, error
FROM targets
WHERE node = {{node:String}} AND up = 0 AND {IN_WINDOW}
ORDER BY ts""",
    "Lowest SM clock and hottest temperature per GPU": f"""
SELECT labels['gpu'] AS gpu,
    minIf(value, metric = 'DCGM_FI_DEV_SM_CLOCK') AS min_sm_clock_mhz,
    medianIf(value, metric = 'DCGM_FI_DEV_SM_CLOCK') AS median_sm_clock_mhz,
    maxIf(value, metric = 'DCGM_FI_DEV_GPU_TEMP') AS max_temp_c
FROM metrics
WHERE metric IN ('DCGM_FI_DEV_SM_CLOCK', 'DCGM_FI_DEV_GPU_TEMP')
    AND node = {{node:String}} AND {IN_WINDOW}
GROUP BY gpu
ORDER BY toUInt32OrZero(gpu)""",
    "Xid errors per GPU": f"""
SELECT labels['gpu'] AS gpu, labels['xid'] AS xid, max(value) - min(value) AS new_errors
FROM metrics
WHERE metric = 'fleetlens_gpu_xid_errors_total' AND node = {{node:String}} AND {IN_WINDOW}
GROUP BY gpu, xid
HAVING new_errors > 0
ORDER BY new_errors DESC""",
    "RoCE ports: worst state, link downs, traffic": f"""
SELECT labels['device'] AS device, labels['port'] AS port,
    minIf(value, metric = 'node_infiniband_state_id') AS worst_state_id,
    maxIf(value, metric = 'node_infiniband_link_downed_total')
        - minIf(value, metric = 'node_infiniband_link_downed_total') AS link_downs,
    (maxIf(value, metric = 'node_infiniband_port_data_received_bytes_total')
        - minIf(value, metric = 'node_infiniband_port_data_received_bytes_total'))
        / greatest(1, dateDiff('second', min(ts), max(ts))) AS rx_bytes_per_s,
    maxIf(value, metric = 'node_infiniband_np_cnp_packets_sent_total')
        - minIf(value, metric = 'node_infiniband_np_cnp_packets_sent_total') AS cnp_sent
FROM metrics
WHERE metric IN ('node_infiniband_state_id', 'node_infiniband_link_downed_total',
        'node_infiniband_port_data_received_bytes_total', 'node_infiniband_np_cnp_packets_sent_total')
    AND node = {{node:String}} AND {IN_WINDOW}
GROUP BY device, port
ORDER BY device, port""",
    "Step time of the node against its jobs' median": f"""
SELECT job, node, count() AS steps, round(avg(duration_s), 4) AS mean_step_s,
    round(avg(compute_s), 4) AS mean_compute_s
FROM steps
WHERE job IN (SELECT DISTINCT job FROM steps WHERE node = {{node:String}} AND {IN_WINDOW})
    AND {IN_WINDOW}
GROUP BY job, node
ORDER BY job, mean_step_s DESC""",
    "Anomalies across the fleet by kind": """
SELECT kind, severity, count() AS anomalies, uniqExact(node) AS nodes, min(start) AS first, max(start) AS last
FROM anomalies FINAL
WHERE start < {end:DateTime64(3)} AND (end IS NULL OR end >= {start:DateTime64(3)})
GROUP BY kind, severity
ORDER BY anomalies DESC""",
}
_PLACEHOLDER = re.compile(r"\{(\w+):")
_SYNTAX_ERROR = re.compile(r"Syntax error: failed at position (\d+)")


def run_sql(
    source: QuerySource, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = 10_000
) -> QueryResult:
    """Run the SQL box's statement read-only: at most `max_rows` rows (`truncated` says when more matched).

    Only the `parameters` the statement names as {name:Type} are sent, so a statement without any (one
    with `LIKE 'vela%'`, say) is sent as written. Bad input (a write, a syntax error, an unknown column,
    a limit exceeded) raises QueryError saying what is wrong and where; nothing else does."""
    if max_rows < 1:
        raise QueryError(f"the SQL box needs a row limit of at least 1, not {max_rows}")
    named = set(_PLACEHOLDER.findall(sql))
    used = {name: value for name, value in (parameters or {}).items() if name in named}
    try:
        return source.query(sql, parameters=used or None, max_rows=max_rows)
    except QueryError as error:
        raise QueryError(_explained(str(error), sql)) from error


def _explained(message: str, sql: str) -> str:
    """The store's refusal in the SQL box's words: where a syntax error is, in the user's own text."""
    found = _SYNTAX_ERROR.search(message)
    if not found:
        return f"query refused: {message}"
    statement = sql.rstrip().removesuffix(";").rstrip()
    position = int(found.group(1)) - 1  # ClickHouse counts from 1 in the text as written
    if position >= len(statement):
        return (
            f"syntax error: the statement ends too early, after `{' '.join(statement.split())[-40:]}`; "
            "is a clause, an operand or a closing parenthesis missing?"
        )
    line = statement.count("\n", 0, position) + 1
    column = position - statement.rfind("\n", 0, position)
    near = " ".join(statement[position:].split())[:30]
    return f"syntax error at line {line}, column {column}, near `{near}`"

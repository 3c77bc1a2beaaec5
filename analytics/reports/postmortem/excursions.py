"""Metric excursions that mattered around each anomaly: the series that show its kind, compared with their
own baseline (the median of the window before the anomaly, at least BASELINE_MIN_S and at most
BASELINE_MAX_S of it, so that a week-long window costs no more than an hour's). A series left its baseline
when it moved by REL_CHANGE of it and by its own floor (SeriesSpec.min_change) at least; the report keeps
the MAX_EXCURSIONS biggest moves relative to the baseline, from the MAX_PROBED_ANOMALIES most severe
anomalies. A series is read in at most MAX_POINTS buckets of its min, max and mean, from the 1-minute
rollup (metrics_1m) when its span (baseline to the anomaly's end) is over RAW_SPAN_MAX_S; a bucket's
departure is its extreme farthest from the baseline, so a short spike is not averaged away.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analytics.detectors.base import SEVERITIES, Window, frame
from analytics.reports.postmortem.model import IN_WINDOW, Excursion
from analytics.store.protocols import Reader

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
LAST_XID_SERIES = SeriesSpec("DCGM_FI_DEV_XID_ERRORS", "last Xid", "gpu", 1)
KIND_SERIES: Mapping[str, tuple[SeriesSpec, ...]] = {
    "gpu_throttle": (
        SeriesSpec("DCGM_FI_DEV_SM_CLOCK", "MHz", "gpu", 50),
        SeriesSpec("DCGM_FI_DEV_GPU_TEMP", "°C", "gpu", 5),
    ),
    "gpu_fault": (SeriesSpec("fleetlens_gpu_up", "up (1 = on the bus)", "gpu", 1), LAST_XID_SERIES),
    "gpu_app_error": (LAST_XID_SERIES,),
    "link_flap": LINK_SERIES,
    "link_down": LINK_SERIES,
    "dma_degraded": (
        SeriesSpec("node_infiniband_port_data_received_bytes_total", "B/s", "port", 1e6, rate=True),
        SeriesSpec("node_infiniband_port_data_transmitted_bytes_total", "B/s", "port", 1e6, rate=True),
    ),
    "congestion": (SeriesSpec("node_infiniband_np_cnp_packets_sent_total", "CNP/s", "port", 10, rate=True),),
    "port_errors": (
        SeriesSpec("node_infiniband_symbol_error_total", "symbol errors/s", "port", 0.1, rate=True),
        SeriesSpec("node_infiniband_port_errors_received_total", "receive errors/s", "port", 0.1, rate=True),
    ),
    "slow_node": tuple(SeriesSpec(f"steps.{column}", "s", "job", 0.01) for column in STEP_COLUMNS),
}
COMPONENTS = {  # the anomaly components each part applies to, and their labels in the store
    "gpu": re.compile(r"gpu:(?P<gpu>\d+)"),
    "port": re.compile(r"(?!gpu:)(?P<device>[^:|]+):(?P<port>\d+)"),
}


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


def find_excursions(
    source: Reader, anomalies: Sequence[Mapping[str, Any]], window: Window
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


def _series_points(source: Reader, probes: Sequence[_Probe]) -> tuple[dict[str, pd.DataFrame], int]:
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

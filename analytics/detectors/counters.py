"""What the rule detectors share: per-series summaries of a time range in ClickHouse SQL (counter increases
and rates that survive resets and scrape gaps, the points a gauge took), and findings made of
independent signals.

Each series is read as `inside`, its samples in the range [since, end) in time order (t in unix
seconds, value), and `points`, the same led by the last sample before the range (within a lookback),
and as `steps`, the pairs of consecutive points. The first step therefore starts before the range, so
nothing that happened between two scrapes is lost, however long the gap between them (up to the
lookback), and no step is counted twice by consecutive windows. A step that goes down is a counter
reset (an exporter restart, a driver reload): INCREASE counts the value after it, as Prometheus's
increase() does, for counters whose every unit is an event (Xids, ECC errors); STEADY_INCREASE and
STEADY_SECONDS leave such steps out, for rates (a reset says nothing about bytes per second) and for
counters whose value after a reset is not new events.

    sql = series_sql(f"{STEADY_INCREASE} AS flaps")   # one row per series: metric, node, labels, flaps
    rows = source.query(sql, parameters=series_parameters(["node_infiniband_link_downed_total"], ...))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd

from analytics.detectors.base import Finding, as_tuples
from analytics.evidence import Evidence as TypedEvidence

LOOKBACK_S = 60.0  # how far before a range to look for its first step: bridges scrape gaps this long
MAX_CANDIDATES = 1_000_000  # rows a detector's feature query may return: every GPU and port of a fleet

INCREASE = "arraySum(step -> if(step.2.2 >= step.1.2, step.2.2 - step.1.2, step.2.2), steps)"


def steady_increase(steps: str = "steps") -> str:
    """The increase over `steps` (an array of point pairs) with the steps that go down left out."""
    return f"arraySum(step -> if(step.2.2 >= step.1.2, step.2.2 - step.1.2, 0), {steps})"


STEADY_INCREASE = steady_increase()
STEADY_SECONDS = "arraySum(step -> if(step.2.2 >= step.1.2, step.2.1 - step.1.1, 0), steps)"
STEADY_RATE = f"if({STEADY_SECONDS} > 0, {STEADY_INCREASE} / {STEADY_SECONDS}, 0)"  # 0 without a steady step
LAST = "points[-1].2"  # the latest value; `inside` tells whether it is in the range
INSIDE_MIN = "arrayMin(point -> point.2, inside)"
INSIDE_MAX = "arrayMax(point -> point.2, inside)"


def series_sql(*columns: str, lookback_aggregates: Sequence[str] = ()) -> str:
    """A subquery with one row per series of the metrics in {metrics:Array(String)} sampled in
    [{lookback}, {end}): metric, node, labels and `columns`, SQL expressions over `inside`, `points`,
    `steps` (see the module doc) and `lookback_aggregates`, aggregate expressions over every sample
    since the lookback, as `t` and `value` (for what needs more history than the last sample).

    It reads the tables behind the `metrics` view, grouping samples by series id and joining each
    series' labels once: grouping the view's rows by their labels map costs twice as much."""
    aggregates = "".join(f",\n                {aggregate}" for aggregate in lookback_aggregates)
    return f"""
    SELECT metric, node, labels, {", ".join(columns)}
    FROM (
        SELECT CAST(grouped.metric, 'String') AS metric, CAST(grouped.node, 'String') AS node,
            known.labels AS labels, grouped.* EXCEPT (metric, node),
            if(before_t > 0, arrayPushFront(inside, (before_t, before_value)), inside) AS points,
            arrayZip(arrayPopBack(points), arrayPopFront(points)) AS steps
        FROM (
            SELECT metric, node, series_id,
                arraySort(point -> point.1, groupArrayIf((t, value), t >= {{since_s:Float64}})) AS inside,
                maxIf(t, t < {{since_s:Float64}}) AS before_t,
                argMaxIf(value, t, t < {{since_s:Float64}}) AS before_value{aggregates}
            FROM (
                SELECT metric, node, series_id, toUnixTimestamp64Milli(ts) / 1000 AS t, value
                FROM samples
                WHERE metric IN {{metrics:Array(String)}}
                    AND ts >= {{lookback:DateTime64(3)}} AND ts < {{end:DateTime64(3)}}
            )
            GROUP BY metric, node, series_id
        ) AS grouped
        ANY LEFT JOIN (
            SELECT series_id, CAST(labels, 'Map(String, String)') AS labels
            FROM series
            WHERE metric IN {{metrics:Array(String)}}
        ) AS known ON grouped.series_id = known.series_id
    )"""


def series_parameters(
    metrics: Sequence[str], since: float, end: float, lookback_s: float = LOOKBACK_S
) -> dict[str, Any]:
    """The parameters of series_sql for the range [since, end) in unix seconds."""
    return {
        "metrics": list(metrics),
        "since_s": since,
        "lookback": datetime.fromtimestamp(since - lookback_s, UTC),
        "end": datetime.fromtimestamp(end, UTC),
    }


def evidence_number(value: Any) -> float | None:
    """A number of a query result as evidence takes it: a plain float, rounded for people; None for
    NULL or NaN (an aggregate over no samples) and for an infinite value (a sample that said +Inf),
    which JSON cannot carry."""
    if value is None or pd.isna(value) or not math.isfinite(float(value)):
        return None
    return round(float(value), 3)


Signals = Callable[[pd.DataFrame], Mapping[str, pd.Series]]  # per signal name, True per row where it fired
Evidence = Callable[[Any], dict[str, Any]]  # a row (itertuples) -> the evidence fields of one signal


def signal_count(signals: Mapping[str, pd.Series]) -> np.ndarray:
    """How many signals fired on each row: the score of a detector whose signals are independent."""
    return np.sum([signal.to_numpy(dtype=bool) for signal in signals.values()], axis=0).astype(float)


def signal_findings(
    kind: str,
    severity: str,
    features: pd.DataFrame,
    scores: np.ndarray,
    signals: Signals,
    evidence: Mapping[str, Evidence],
    build: Callable[..., TypedEvidence],
) -> list[Finding]:
    """A finding for each row on which a signal fired, its evidence (`build`, an analytics.evidence class)
    naming the signals that fired and holding the numbers of each."""
    fired_somewhere = scores >= 1
    reported = features[fired_somewhere]
    fired = signals(reported)
    found = []
    for position, (row, score) in enumerate(zip(as_tuples(reported), scores[fired_somewhere], strict=True)):
        names = sorted(name for name, signal in fired.items() if signal.iloc[position])
        details: dict[str, Any] = {}
        for name in names:
            details.update(evidence[name](row))
        found.append(Finding.at(row, kind, score, severity, build(signals=tuple(names), **details)))
    return found

"""A selector's samples from the store in two SELECTs: its series (from the `series` table, matched on
metric, node and labels), then their samples (from `samples`, read as numpy columns, by series ids,
metrics and nodes, so that the table's key (metric, node, series_id, ts) narrows the read). Label names
and values travel as query parameters, never in the SQL text.

Training step records (the `steps` table) are series too: each of STEP_METRICS is a gauge with a sample
per record that has its column (NULL ones skipped) at the record's ts, labelled `job`, `rank`, `node` and
`dp_rank`, `pp_stage`, `tp_rank` where the record has them. A step series is one (metric, job, rank,
node), its id their cityHash64; the series SELECT finds them by grouping the records of the read's window,
the samples SELECT reads them from `steps`.

A series' PromQL labels are its stored labels, `__name__` (the metric) and `node` (the hub's node column,
from a `node` label, Hostname or instance; see hub.remote_write). A matcher on a label a series lacks
sees the empty string, as in Prometheus. Regular expressions are RE2 (ClickHouse's match), anchored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hub.promql.plan import Selector

Labels = tuple[tuple[str, str], ...]  # sorted by name, no empty values
Read = Callable[[str, Mapping[str, Any]], Sequence[tuple]]  # SQL, parameters -> rows
ReadNumbers = Callable[[str, Mapping[str, Any]], Mapping[str, np.ndarray]]  # SQL, parameters -> columns
NUMBERS = {"series_id": np.uint64, "t": np.int64, "value": np.float64}  # what read_series's samples read
COLUMNS = {"__name__": "metric", "node": "node"}  # PromQL labels held in columns of their own
COMPARE = {"=": "{column} = {value}", "!=": "{column} != {value}"}
MATCH = {"=~": "match({column}, {value})", "!~": "NOT match({column}, {value})"}
WINDOW = (  # a read's samples or records: from {since} to {until}, both included, in milliseconds
    "ts >= fromUnixTimestamp64Milli({since:Int64}, 'UTC')",
    "ts <= fromUnixTimestamp64Milli({until:Int64}, 'UTC')",
)
STEP_METRICS = {  # the PromQL metric of each steps column read as a series
    "fleetlens_step_duration_seconds": "duration_s",
    "fleetlens_step_compute_seconds": "compute_s",
    "fleetlens_step_comm_seconds": "comm_s",
    "fleetlens_step_data_seconds": "data_s",
}
# Each step record once per metric, as (step_metric, step_value); STEP_ID is the series id of a pair.
STEP_ROWS = (
    "FROM steps ARRAY JOIN "
    + f"[{', '.join(repr(metric) for metric in STEP_METRICS)}] AS step_metric, "
    + f"[{', '.join(STEP_METRICS.values())}] AS step_value"
)
STEP_ID = "cityHash64(step_metric, job, rank, node)"
STEP_LABELS = """CAST(mapFilter((name, text) -> text != '', map(
        'job', CAST(job, 'String'), 'rank', toString(rank), 'dp_rank', ifNull(toString(any(dp_rank)), ''),
        'pp_stage', ifNull(toString(any(pp_stage)), ''), 'tp_rank', ifNull(toString(any(tp_rank)), '')
    )), 'Map(String, String)')"""


@dataclass
class Series:
    """One series' samples in time order: timestamps in milliseconds (int64) and values (float64)."""

    labels: Labels
    times: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    values: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))


@dataclass(frozen=True)
class Grid:
    """Evaluation times base + k * step, each reaching `reach_ms` back: a read of them needs only the
    samples within reach of one (when reach < step, a fraction of the samples from first to last)."""

    base_ms: int
    step_ms: int
    reach_ms: int


def matcher_conditions(selector: Selector, parameters: dict[str, Any]) -> list[str]:
    """SQL conditions on a series' `metric`, `node` and `labels` columns for `selector`'s matchers, their
    names and values added to `parameters` (never into the text)."""
    conditions = []
    for index, (name, op, value) in enumerate(selector.matchers):
        if name in COLUMNS:
            column = COLUMNS[name]
        else:
            parameters[f"name{index}"] = name
            column = f"labels[{{name{index}:String}}]"
        parameters[f"value{index}"] = value if op in COMPARE else f"^(?:{value})$"
        template = COMPARE.get(op) or MATCH[op]
        conditions.append(template.format(column=column, value=f"{{value{index}:String}}"))
    return conditions


def selector_where(selector: Selector, since_ms: int, until_ms: int) -> tuple[str, dict[str, Any]]:
    """The WHERE condition on the `metrics` view of `selector`'s samples stamped from `since_ms` to
    `until_ms` (both included), and its parameters."""
    parameters: dict[str, Any] = {"since": since_ms, "until": until_ms}
    return " AND ".join([*WINDOW, *matcher_conditions(selector, parameters)]), parameters


def may_match_steps(selector: Selector) -> bool:
    """Whether `selector` may match a step series: no `__name__="..."` naming another metric (so that
    queries of other metrics never read the steps table)."""
    return all(
        name != "__name__" or op != "=" or value in STEP_METRICS for name, op, value in selector.matchers
    )


def step_series_sql(selector: Selector, parameters: dict[str, Any]) -> str:
    """The SELECT of the step series `selector` matches with a record from {since} to {until} (series_id,
    metric, node, labels), its matchers' parameters added to `parameters`."""
    where = " AND ".join(matcher_conditions(selector, parameters)) or "1"
    return (
        f"SELECT series_id, metric, node, labels FROM (SELECT {STEP_ID} AS series_id,"
        f" step_metric AS metric, node, {STEP_LABELS} AS labels {STEP_ROWS}"
        f" WHERE {' AND '.join(WINDOW)} AND step_value IS NOT NULL GROUP BY step_metric, job, rank, node)"
        f" WHERE {where}"
    )


def series_sql(selector: Selector, since_ms: int, until_ms: int) -> tuple[str, dict[str, Any]]:
    """The SELECT of the series `selector` matches (series_id, metric, node, labels, whether a step
    series): those stored and the step series with a record from `since_ms` to `until_ms`; and its
    parameters."""
    parameters: dict[str, Any] = {"since": since_ms, "until": until_ms}
    where = " AND ".join(matcher_conditions(selector, parameters)) or "1"
    sql = (
        "SELECT series_id, any(metric), any(node), any(labels), false FROM series WHERE "
        + where
        + " GROUP BY series_id"
    )
    if may_match_steps(selector):
        sql += f" UNION ALL SELECT *, true FROM ({step_series_sql(selector, parameters)})"
    return sql, parameters


def samples_sql(
    stored: Mapping[int, tuple[str, str]],
    steps: Mapping[int, tuple[str, str, str]],
    since_ms: int,
    until_ms: int,
    grid: Grid | None,
) -> tuple[str, dict[str, Any]]:
    """The SELECT of the samples of the `stored` series (id -> metric, node) and of the `steps` series
    (id -> metric, node, job) from `since_ms` to `until_ms` (both included), only those within reach of
    `grid`'s times when it is given, ordered by series and time; and its parameters."""
    parameters: dict[str, Any] = {"since": since_ms, "until": until_ms}
    window = list(WINDOW)
    if grid is not None and grid.reach_ms < grid.step_ms:
        parameters |= {"base": grid.base_ms - grid.reach_ms, "step": grid.step_ms, "reach": grid.reach_ms}
        window.append("(toUnixTimestamp64Milli(ts) - {base:Int64}) % {step:Int64} <= {reach:Int64}")
    parts = []
    if stored:
        parameters |= {
            "ids": sorted(stored),
            "metrics": sorted({metric for metric, _ in stored.values()}),
            "nodes": sorted({node for _, node in stored.values()}),
        }
        conditions = ["metric IN {metrics:Array(String)}", "node IN {nodes:Array(String)}"]
        parts.append(
            "SELECT series_id, toUnixTimestamp64Milli(ts) AS t, value FROM samples WHERE "
            + " AND ".join([*conditions, "series_id IN {ids:Array(UInt64)}", *window])
        )
    if steps:
        parameters |= {
            "step_ids": sorted(steps),
            "step_metrics": sorted({metric for metric, _, _ in steps.values()}),
            "step_nodes": sorted({node for _, node, _ in steps.values()}),
            "step_jobs": sorted({job for _, _, job in steps.values()}),
        }
        conditions = [
            "job IN {step_jobs:Array(String)}",
            "node IN {step_nodes:Array(String)}",
            "step_metric IN {step_metrics:Array(String)}",
            "step_value IS NOT NULL",
            f"{STEP_ID} IN {{step_ids:Array(UInt64)}}",
        ]
        parts.append(
            f"SELECT {STEP_ID} AS series_id, toUnixTimestamp64Milli(ts) AS t,"
            f" assumeNotNull(step_value) AS value {STEP_ROWS} WHERE " + " AND ".join([*conditions, *window])
        )
    union = " UNION ALL ".join(parts)
    return (union if len(parts) == 1 else f"SELECT * FROM ({union})") + " ORDER BY series_id, t", parameters


def read_series(
    read: Read, read_numbers: ReadNumbers, selector: Selector, since_ms: int, until_ms: int, grid: Grid | None
) -> list[Series]:
    """`selector`'s series, stored and step series, with their samples from `since_ms` to `until_ms`
    (only those within reach of `grid`'s times when given), each in time order; series without a sample
    there are left out. Ordered by label set, as Prometheus's storage returns series: the order in
    which topk, bottomk and the rest meet equal values decides which they keep."""
    rows = read(*series_sql(selector, since_ms, until_ms))
    if not rows:
        return []
    found = {int(row[0]): series_labels(*row[1:4]) for row in rows}
    stored = {int(series_id): (metric, node) for series_id, metric, node, _, is_step in rows if not is_step}
    steps = {
        int(series_id): (metric, node, labels.get("job", ""))
        for series_id, metric, node, labels, is_step in rows
        if is_step
    }
    columns = read_numbers(*samples_sql(stored, steps, since_ms, until_ms, grid))
    ids, times, values = columns["series_id"], columns["t"], columns["value"]
    edges = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    every = [
        Series(found[int(part_ids[0])], part_times, part_values)
        for part_ids, part_times, part_values in zip(
            np.split(ids, edges), np.split(times, edges), np.split(values, edges), strict=True
        )
        if len(part_ids)
    ]
    return sorted(every, key=lambda series: series.labels)


def series_labels(metric: str, node: str, labels: Mapping[str, str]) -> Labels:
    """A stored series' PromQL labels: its labels, __name__ and node, without empty values."""
    every = {**labels, "__name__": metric, "node": node}
    return tuple(sorted((name, value) for name, value in every.items() if value))

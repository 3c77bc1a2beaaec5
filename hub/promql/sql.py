"""A selector's samples from the store in two SELECTs: its series (from the `series` table, matched on
metric, node and labels), then their samples (from `samples`, read as numpy columns, by series ids,
metrics and nodes, so that the table's key (metric, node, series_id, ts) narrows the read). Label names
and values travel as query parameters, never in the SQL text.

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
    conditions = [
        "ts >= fromUnixTimestamp64Milli({since:Int64}, 'UTC')",
        "ts <= fromUnixTimestamp64Milli({until:Int64}, 'UTC')",
        *matcher_conditions(selector, parameters),
    ]
    return " AND ".join(conditions), parameters


def series_sql(selector: Selector) -> tuple[str, dict[str, Any]]:
    """The SELECT of the series `selector` matches (series_id, metric, node, labels), and its parameters."""
    parameters: dict[str, Any] = {}
    where = " AND ".join(matcher_conditions(selector, parameters)) or "1"
    sql = (
        "SELECT series_id, any(metric), any(node), any(labels) FROM series WHERE "
        + where
        + " GROUP BY series_id"
    )
    return sql, parameters


def samples_sql(
    series: Mapping[int, tuple[str, str]], since_ms: int, until_ms: int, grid: Grid | None
) -> tuple[str, dict[str, Any]]:
    """The SELECT of the samples of `series` (id -> metric, node) from `since_ms` to `until_ms` (both
    included), only those within reach of `grid`'s times when it is given, ordered by series and time;
    and its parameters."""
    parameters: dict[str, Any] = {
        "ids": sorted(series),
        "metrics": sorted({metric for metric, _ in series.values()}),
        "nodes": sorted({node for _, node in series.values()}),
        "since": since_ms,
        "until": until_ms,
    }
    conditions = [
        "metric IN {metrics:Array(String)}",
        "node IN {nodes:Array(String)}",
        "series_id IN {ids:Array(UInt64)}",
        "ts >= fromUnixTimestamp64Milli({since:Int64}, 'UTC')",
        "ts <= fromUnixTimestamp64Milli({until:Int64}, 'UTC')",
    ]
    if grid is not None and grid.reach_ms < grid.step_ms:
        parameters |= {"base": grid.base_ms - grid.reach_ms, "step": grid.step_ms, "reach": grid.reach_ms}
        conditions.append("(toUnixTimestamp64Milli(ts) - {base:Int64}) % {step:Int64} <= {reach:Int64}")
    sql = (
        "SELECT series_id, toUnixTimestamp64Milli(ts) AS t, value FROM samples WHERE "
        + " AND ".join(conditions)
        + " ORDER BY series_id, t"
    )
    return sql, parameters


def read_series(
    read: Read, read_numbers: ReadNumbers, selector: Selector, since_ms: int, until_ms: int, grid: Grid | None
) -> list[Series]:
    """`selector`'s series with their samples from `since_ms` to `until_ms` (only those within reach of
    `grid`'s times when given), each in time order; series without a sample there are left out."""
    rows = read(*series_sql(selector))
    if not rows:
        return []
    found = {int(series_id): series_labels(metric, node, labels) for series_id, metric, node, labels in rows}
    where = {int(series_id): (metric, node) for series_id, metric, node, _ in rows}
    columns = read_numbers(*samples_sql(where, since_ms, until_ms, grid))
    ids, times, values = columns["series_id"], columns["t"], columns["value"]
    edges = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    return [
        Series(found[int(part_ids[0])], part_times, part_values)
        for part_ids, part_times, part_values in zip(
            np.split(ids, edges), np.split(times, edges), np.split(values, edges), strict=True
        )
        if len(part_ids)
    ]


def series_labels(metric: str, node: str, labels: Mapping[str, str]) -> Labels:
    """A stored series' PromQL labels: its labels, __name__ and node, without empty values."""
    every = {**labels, "__name__": metric, "node": node}
    return tuple(sorted((name, value) for name, value in every.items() if value))

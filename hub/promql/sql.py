"""A selector's samples from the store: one SELECT over the `metrics` view whose label names and values
travel as query parameters, never in the SQL text, and the rows grouped into series.

A series' PromQL labels are its stored labels, `__name__` (the metric) and `node` (the hub's node column,
from a `node` label, Hostname or instance; see hub.remote_write). A matcher on a label a series lacks
sees the empty string, as in Prometheus. Regular expressions are RE2 (ClickHouse's match), anchored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hub.promql.plan import Selector

Labels = tuple[tuple[str, str], ...]  # sorted by name, no empty values
Read = Callable[[str, Mapping[str, Any]], Sequence[tuple]]  # SQL, parameters -> rows
COLUMNS = {"__name__": "metric", "node": "node"}  # PromQL labels held in columns of their own
COMPARE = {"=": "{column} = {value}", "!=": "{column} != {value}"}
MATCH = {"=~": "match({column}, {value})", "!~": "NOT match({column}, {value})"}


@dataclass
class Series:
    """One series' samples in time order: timestamps in milliseconds and values."""

    labels: Labels
    times: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def selector_sql(selector: Selector, since_ms: int, until_ms: int) -> tuple[str, dict[str, Any]]:
    """The SELECT of `selector`'s samples stamped from `since_ms` to `until_ms` (both included), and its
    parameters."""
    where, parameters = selector_where(selector, since_ms, until_ms)
    sql = (
        "SELECT metric, node, labels, toUnixTimestamp64Milli(ts) AS t, value FROM metrics WHERE "
        + where
        + " ORDER BY metric, node, t"
    )
    return sql, parameters


def selector_where(selector: Selector, since_ms: int, until_ms: int) -> tuple[str, dict[str, Any]]:
    """The WHERE condition on the `metrics` view of `selector`'s samples stamped from `since_ms` to
    `until_ms` (both included), and its parameters."""
    parameters: dict[str, Any] = {"since": since_ms, "until": until_ms}
    conditions = [
        "ts >= fromUnixTimestamp64Milli({since:Int64}, 'UTC')",
        "ts <= fromUnixTimestamp64Milli({until:Int64}, 'UTC')",
    ]
    for index, (name, op, value) in enumerate(selector.matchers):
        if name in COLUMNS:
            column = COLUMNS[name]
        else:
            parameters[f"name{index}"] = name
            column = f"labels[{{name{index}:String}}]"
        parameters[f"value{index}"] = value if op in COMPARE else f"^(?:{value})$"
        template = COMPARE.get(op) or MATCH[op]
        conditions.append(template.format(column=column, value=f"{{value{index}:String}}"))
    return " AND ".join(conditions), parameters


def read_series(read: Read, selector: Selector, since_ms: int, until_ms: int) -> list[Series]:
    """`selector`'s series with their samples from `since_ms` to `until_ms`, each in time order (the rows
    come ordered by time within a metric and node)."""
    sql, parameters = selector_sql(selector, since_ms, until_ms)
    found: dict[Labels, Series] = {}
    for metric, node, labels, ts_ms, value in read(sql, parameters):
        key = series_labels(metric, node, labels)
        series = found.get(key)
        if series is None:
            series = found[key] = Series(key)
        series.times.append(int(ts_ms))
        series.values.append(float(value))
    return list(found.values())


def series_labels(metric: str, node: str, labels: Mapping[str, str]) -> Labels:
    """A stored series' PromQL labels: its labels, __name__ and node, without empty values."""
    every = {**labels, "__name__": metric, "node": node}
    return tuple(sorted((name, value) for name, value in every.items() if value))

"""A selector's samples from the store in two SELECTs: its series (from the `series` table, matched on
metric, node and labels), then their samples (from `samples`, read as numpy columns, by series ids,
metrics and nodes, so that the table's key (metric, node, series_id, ts) narrows the read). Label names
and values travel as query parameters, never in the SQL text.

Some tables' rows are series too (VirtualSource, SOURCES): each of a source's metrics is a gauge with a
sample per row that has its column (NULLs skipped) at the row's ts; the series SELECT finds its series by
grouping the rows of the read's window, the samples SELECT reads them from the table. Training step
records (`steps`) are fleetlens_step_{duration,compute,comm,data}_seconds, labelled `job`, `rank`, `node`
and `dp_rank`, `pp_stage`, `tp_rank` where the record has them; scrape outcomes (`targets`) are `up`,
`scrape_duration_seconds` and `scrape_samples_scraped`, labelled `instance` (the target) and `node`.

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


@dataclass(frozen=True)
class VirtualSource:
    """A table whose rows are PromQL series: each of `metrics` (PromQL metric -> column) a gauge with a
    sample per row that has its column (NULLs skipped) at the row's ts. A series is one (metric, *`key`),
    its id their cityHash64, its labels `labels` (a Map(String, String) over the series' rows) with
    `__name__` and the table's `node` column. `narrow` names the columns of the table's order key with the
    PromQL label that holds their value, so that a samples read names them."""

    table: str
    metrics: Mapping[str, str]
    key: tuple[str, ...]
    labels: str
    narrow: Mapping[str, str]

    @property
    def rows(self) -> str:
        """The FROM clause giving each row once per metric, as (source_metric, source_value)."""
        return (
            f"FROM {self.table} ARRAY JOIN [{', '.join(repr(metric) for metric in self.metrics)}]"
            f" AS source_metric, [{', '.join(self.metrics.values())}] AS source_value"
        )

    @property
    def series_id(self) -> str:
        """The SQL of a (source_metric, source_value) row's series id."""
        return f"cityHash64(source_metric, {', '.join(self.key)})"


STEP_SOURCE = VirtualSource(  # training step records (hub.steps), one series per (metric, job, rank, node)
    table="steps",
    metrics={
        "fleetlens_step_duration_seconds": "duration_s",
        "fleetlens_step_compute_seconds": "compute_s",
        "fleetlens_step_comm_seconds": "comm_s",
        "fleetlens_step_data_seconds": "data_s",
    },
    key=("job", "rank", "node"),
    labels="""CAST(mapFilter((name, text) -> text != '', map(
        'job', CAST(job, 'String'), 'rank', toString(rank), 'dp_rank', ifNull(toString(any(dp_rank)), ''),
        'pp_stage', ifNull(toString(any(pp_stage)), ''), 'tp_rank', ifNull(toString(any(tp_rank)), '')
    )), 'Map(String, String)')""",
    narrow={"job": "job", "node": "node"},
)
TARGET_SOURCE = VirtualSource(  # scrape outcomes (hub scraper, remote write's `up`), named as in Prometheus
    table="targets",
    metrics={"up": "up", "scrape_duration_seconds": "duration_s", "scrape_samples_scraped": "samples"},
    key=("target", "node"),
    labels="map('instance', CAST(target, 'String'))",
    narrow={"target": "instance", "node": "node"},
)
SOURCES = {source.table: source for source in (STEP_SOURCE, TARGET_SOURCE)}


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


def may_match(source: VirtualSource, selector: Selector) -> bool:
    """Whether `selector` may match a series of `source`: no `__name__="..."` naming another metric (so
    that queries of other metrics never read its table)."""
    return all(
        name != "__name__" or op != "=" or value in source.metrics for name, op, value in selector.matchers
    )


def virtual_series_sql(source: VirtualSource, selector: Selector, parameters: dict[str, Any]) -> str:
    """The SELECT of the series of `source` that `selector` matches with a row from {since} to {until}
    (series_id, metric, node, labels), its matchers' parameters added to `parameters`."""
    where = " AND ".join(matcher_conditions(selector, parameters)) or "1"
    return (
        f"SELECT series_id, metric, node, labels FROM (SELECT {source.series_id} AS series_id,"
        f" source_metric AS metric, node, {source.labels} AS labels {source.rows}"
        f" WHERE {' AND '.join(WINDOW)} AND source_value IS NOT NULL"
        f" GROUP BY source_metric, {', '.join(source.key)}) WHERE {where}"
    )


def series_sql(selector: Selector, since_ms: int, until_ms: int) -> tuple[str, dict[str, Any]]:
    """The SELECT of the series `selector` matches (series_id, metric, node, labels, the table of a
    virtual source or '' for a stored series): those stored and those of SOURCES with a row from
    `since_ms` to `until_ms`; and its parameters."""
    parameters: dict[str, Any] = {"since": since_ms, "until": until_ms}
    where = " AND ".join(matcher_conditions(selector, parameters)) or "1"
    sql = (
        "SELECT series_id, any(metric), any(node), any(labels), '' FROM series WHERE "
        + where
        + " GROUP BY series_id"
    )
    for table, source in SOURCES.items():
        if may_match(source, selector):
            sql += f" UNION ALL SELECT *, '{table}' FROM ({virtual_series_sql(source, selector, parameters)})"
    return sql, parameters


def samples_sql(
    stored: Mapping[int, tuple[str, str]],
    virtual: Mapping[str, Mapping[int, Mapping[str, str]]],
    since_ms: int,
    until_ms: int,
    grid: Grid | None,
) -> tuple[str, dict[str, Any]]:
    """The SELECT of the samples of the `stored` series (id -> metric, node) and of the `virtual` ones
    (table of SOURCES -> id -> PromQL labels) from `since_ms` to `until_ms` (both included), only those
    within reach of `grid`'s times when it is given, ordered by series and time; and its parameters."""
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
    for table, series in virtual.items():
        if series:
            parts.append(_virtual_samples_sql(SOURCES[table], series, parameters, window))
    union = " UNION ALL ".join(parts)
    return (union if len(parts) == 1 else f"SELECT * FROM ({union})") + " ORDER BY series_id, t", parameters


def _virtual_samples_sql(
    source: VirtualSource,
    series: Mapping[int, Mapping[str, str]],
    parameters: dict[str, Any],
    window: list[str],
) -> str:
    """The SELECT of the samples of `source`'s `series` (id -> PromQL labels) within `window`, narrowed
    by metric and `source.narrow`'s columns; its parameters (named after the table) added to `parameters`."""
    prefix = source.table
    parameters[f"{prefix}_ids"] = sorted(series)
    parameters[f"{prefix}_metrics"] = sorted({labels["__name__"] for labels in series.values()})
    conditions = []
    for column, label in source.narrow.items():
        parameters[f"{prefix}_{column}"] = sorted({labels.get(label, "") for labels in series.values()})
        conditions.append(f"{column} IN {{{prefix}_{column}:Array(String)}}")
    conditions += [
        f"source_metric IN {{{prefix}_metrics:Array(String)}}",
        "source_value IS NOT NULL",
        f"{source.series_id} IN {{{prefix}_ids:Array(UInt64)}}",
    ]
    return (
        f"SELECT {source.series_id} AS series_id, toUnixTimestamp64Milli(ts) AS t,"
        f" assumeNotNull(source_value) AS value {source.rows} WHERE " + " AND ".join([*conditions, *window])
    )


def read_series(
    read: Read, read_numbers: ReadNumbers, selector: Selector, since_ms: int, until_ms: int, grid: Grid | None
) -> list[Series]:
    """`selector`'s series, stored and virtual (SOURCES), with their samples from `since_ms` to
    `until_ms` (only those within reach of `grid`'s times when given), each in time order; series without
    a sample there are left out. Ordered by label set, as Prometheus's storage returns series: the order
    in which topk, bottomk and the rest meet equal values decides which they keep."""
    rows = read(*series_sql(selector, since_ms, until_ms))
    if not rows:
        return []
    found = {int(row[0]): series_labels(*row[1:4]) for row in rows}
    stored = {int(series_id): (metric, node) for series_id, metric, node, _, table in rows if not table}
    virtual: dict[str, dict[int, Mapping[str, str]]] = {}
    for series_id, *_, table in rows:
        if table:
            virtual.setdefault(table, {})[int(series_id)] = dict(found[int(series_id)])
    columns = read_numbers(*samples_sql(stored, virtual, since_ms, until_ms, grid))
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

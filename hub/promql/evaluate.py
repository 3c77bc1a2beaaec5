"""A plan evaluated at one time over the series read for its selectors, with the rules of Prometheus 2
(promql/engine.go and functions.go), which Debian's Prometheus applies:

- an instant selector takes each series' newest sample in [t - 5m, t] (t, or its `@` time, moved back
  by `offset`);
- a range selector [d] takes the samples in [t - d, t]; a subquery [d:s] evaluates its expression at each
  multiple of s in [t - d, t];
- rate and increase add back counter resets and extrapolate to the range's ends (extrapolated_rate),
  delta extrapolates alike without resets;
- a parameter (topk's k, quantile's φ, quantile_over_time's φ) is evaluated at each step;
- timestamp() of a selector gives its samples' own times, of any other vector the evaluation time;
- functions drop __name__, but last_over_time, label_replace and label_join (hub.promql.functions);
  binary operators as hub.promql.binary says.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np

from hub.promql import functions
from hub.promql.answer import number_text
from hub.promql.binary import Vector, binary
from hub.promql.functions import Points, drop_name
from hub.promql.limits import Limits
from hub.promql.plan import (
    Absent,
    Aggregation,
    Function,
    Node,
    Number,
    RangeFunction,
    Selector,
    Subquery,
    children,
)
from hub.promql.sql import Labels, Series

LOOKBACK_MS = 5 * 60 * 1000
Window = tuple[int, int]  # since, until (ms), both included


def read_windows(
    node: Node, first_ms: int, last_ms: int, found: dict[Selector, Window] | None = None
) -> dict[Selector, Window]:
    """The samples each selector in `node` needs when `node` is evaluated at times from `first_ms` to
    `last_ms`: from the earliest any evaluation reaches back (through `@`, offsets, ranges, subqueries and
    the lookback) to the latest."""
    found = {} if found is None else found
    if isinstance(node, Selector | Subquery) and isinstance(node.at, int):
        first_ms = last_ms = node.at
    if isinstance(node, Selector):
        since = first_ms - node.offset_ms - (node.range_ms or LOOKBACK_MS)
        until = last_ms - node.offset_ms
        known = found.get(node, (since, until))
        found[node] = (min(since, known[0]), max(until, known[1]))
    elif isinstance(node, Subquery):
        read_windows(node.expr, first_ms - node.offset_ms - node.range_ms, last_ms - node.offset_ms, found)
    else:
        for child in children(node):
            read_windows(child, first_ms, last_ms, found)
    return found


class Samples(dict[Selector, list[Series]]):
    """What a query is evaluated over: each selector's series, in `at_steps` the values some nodes take
    at every step of a range query, computed for all steps at once (hub.promql.grid), which evaluate
    looks up instead of computing them step by step; and the query's `limits`."""

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__()
        self.at_steps: dict[Node, Steps] = {}
        self.limits = limits or Limits()


class Steps(Protocol):
    def at(self, t: int) -> Vector | None:
        """The vector at `t`, None when `t` is not one of the steps."""


def evaluate(node: Node, t: int, data: Samples) -> Vector | float:
    """`node`'s value at `t` (ms): a scalar, or an instant vector by label set."""
    if node in data.at_steps:
        found = data.at_steps[node].at(t)
        if found is not None:
            return found
    if isinstance(node, Number):
        return node.value
    if isinstance(node, Selector):
        return _instant(data[node], _at(node, t) - node.offset_ms)
    if isinstance(node, RangeFunction):
        return _range_function(node, t, data)
    if isinstance(node, Aggregation):
        vector = evaluate(node.expr, t, data)
        assert isinstance(vector, dict)
        if isinstance(node.parameter, str | None):
            return _aggregate(node, vector, node.parameter)
        return _aggregate(node, vector, _scalar(node.parameter, t, data))
    if isinstance(node, Function):
        return _function(node, t, data)
    if isinstance(node, Absent):
        return {} if evaluate(node.expr, t, data) else {node.labels: 1.0}
    assert not isinstance(node, Subquery), "a subquery is evaluated by range_points"
    return binary(node, evaluate(node.lhs, t, data), evaluate(node.rhs, t, data))


def _scalar(node: Node, t: int, data: Samples) -> float:
    value = evaluate(node, t, data)
    assert isinstance(value, float)
    return value


def _function(node: Function, t: int, data: Samples) -> Vector | float:
    """A function's value; timestamp() of a selector gives its samples' own times, as Prometheus's."""
    first = node.args[0] if node.args else None
    if node.name == "timestamp" and isinstance(first, Selector):
        at = _at(first, t) - first.offset_ms
        newest = ((series, _newest(series, at)) for series in data[first])
        return functions.collect(
            (drop_name(series.labels), float(series.times[index]) / 1000)
            for series, index in newest
            if index is not None
        )
    args = [arg if isinstance(arg, str) else evaluate(arg, t, data) for arg in node.args]
    return functions.call(node.name, args, t)


def range_points(
    source: Selector | Subquery, t: int, data: Samples
) -> tuple[int, int, Iterator[tuple[Labels, Points]]]:
    """A range selector's or subquery's window at `t` (start and end, ms) and each series' points in it:
    the samples of a selector, the values of a subquery's expression at its steps."""
    end = _at(source, t) - source.offset_ms
    start = end - source.range_ms
    if isinstance(source, Selector):
        return start, end, _samples_within(data[source], start, end)
    series: dict[Labels, tuple[list[int], list[float]]] = {}
    first = -(-start // source.step_ms) * source.step_ms  # the first multiple of the step in the window
    held = 0
    for step_t in range(first, end + 1, source.step_ms):
        data.limits.check_time()
        value = evaluate(source.expr, step_t, data)
        assert isinstance(value, dict)
        held += len(value)
        data.limits.check_room(held)
        for labels, number in value.items():
            times, values = series.setdefault(labels, ([], []))
            times.append(step_t)
            values.append(number)
    return start, end, iter(series.items())


def _samples_within(every: list[Series], start: int, end: int) -> Iterator[tuple[Labels, Points]]:
    for series in every:
        low = int(np.searchsorted(series.times, start, "left"))
        high = int(np.searchsorted(series.times, end, "right"))
        if low < high:
            yield series.labels, (series.times[low:high].tolist(), series.values[low:high].tolist())


def _at(node: Selector | Subquery, t: int) -> int:
    """The time `node` is evaluated at: its `@` time (pinned by plan.pin_at), else `t`."""
    assert not isinstance(node.at, str), "pin_at fixes @ start() and @ end() before evaluation"
    return t if node.at is None else node.at


def _instant(every: list[Series], at: int) -> Vector:
    result = {}
    for series in every:
        index = _newest(series, at)
        if index is not None:
            result[series.labels] = float(series.values[index])
    return result


def _newest(series: Series, at: int) -> int | None:
    """The index of `series`' newest sample in [at - 5m, at], None without one."""
    index = int(np.searchsorted(series.times, at, "right")) - 1
    return index if index >= 0 and series.times[index] >= at - LOOKBACK_MS else None


def _range_function(node: RangeFunction, t: int, data: Samples) -> Vector:
    start, end, every = range_points(node.source, t, data)
    parameter = None if node.parameter is None else _scalar(node.parameter, t, data)
    function = range_call(node, parameter)
    values = ((range_labels(node, labels), function(points, start, end)) for labels, points in every)
    return functions.collect((labels, value) for labels, value in values if value is not None)


def range_call(node: RangeFunction, parameter: float | None) -> RangeCall:
    """`node`'s function over one window's points, its parameter (quantile_over_time's φ) bound."""
    function = RANGE_FUNCTIONS[node.name]
    if parameter is None:
        return function
    return lambda points, start, end: function(points, start, end, parameter)


def range_labels(node: RangeFunction, labels: Labels) -> Labels:
    """The labels of `node`'s value for a series: without __name__ but for last_over_time."""
    return labels if node.name == "last_over_time" else drop_name(labels)


def extrapolated_rate(points: Points, start: int, end: int, is_counter: bool, is_rate: bool) -> float | None:
    """Prometheus's extrapolatedRate: the increase over the samples, counter resets added back, stretched
    to the range's ends where the samples come close to them (within 1.1 average intervals), else by half
    an interval, and not below zero for a counter; per second of the range for a rate. None below two
    samples, or when all share one time (step records of one millisecond), which Prometheus cannot hold."""
    times, values = points
    if len(values) < 2 or times[-1] == times[0]:
        return None
    result = values[-1] - values[0]
    if is_counter:
        last = 0.0
        for value in values:
            if value < last:
                result += last
            last = value
    to_start, to_end = (times[0] - start) / 1000, (end - times[-1]) / 1000
    sampled = (times[-1] - times[0]) / 1000
    average = sampled / (len(values) - 1)
    if is_counter and result > 0 and values[0] >= 0:
        to_start = min(to_start, sampled * (values[0] / result))
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    factor = interval / sampled
    if is_rate:
        factor /= (end - start) / 1000
    return result * factor


def _irate(points: Points, start: int, end: int) -> float | None:
    """Prometheus's instantValue for irate: the last two samples' rate, a reset counting from zero."""
    times, values = points
    if len(values) < 2:
        return None
    last, previous = values[-1], values[-2]
    change = last if last < previous else last - previous
    interval = times[-1] - times[-2]
    return None if interval == 0 else change / (interval / 1000)


def _over_time(aggregate: Callable[[Sequence[float]], float]) -> Callable[[Points, int, int], float]:
    return lambda points, start, end: aggregate(points[1])


RangeCall = Callable[[Points, int, int], float | None]
RANGE_FUNCTIONS: dict[str, Callable[..., float | None]] = {
    "rate": lambda points, start, end: extrapolated_rate(points, start, end, True, True),
    "increase": lambda points, start, end: extrapolated_rate(points, start, end, True, False),
    "irate": _irate,
    "avg_over_time": _over_time(functions.mean_over_time),
    "min_over_time": _over_time(lambda values: _least(values, operator.lt)),
    "max_over_time": _over_time(lambda values: _least(values, operator.gt)),
    "sum_over_time": _over_time(functions.kahan_sum),
    "count_over_time": _over_time(lambda values: float(len(values))),
    "last_over_time": _over_time(lambda values: values[-1]),
    "delta": lambda points, start, end: extrapolated_rate(points, start, end, False, False),
    "deriv": functions.deriv,
    "quantile_over_time": lambda points, start, end, q: functions.quantile(q, points[1]),
    "stdvar_over_time": functions.variance_over_time,
    "stddev_over_time": lambda points, start, end: math.sqrt(
        functions.variance_over_time(points, start, end)
    ),
    "present_over_time": _over_time(lambda values: 1.0),
    "changes": functions.CHANGES,
    "resets": functions.RESETS,
}


def _aggregate(node: Aggregation, vector: Vector, parameter: float | str | None) -> Vector:
    """`node`'s aggregation of `vector` by group; topk and bottomk keep their samples' own labels,
    count_values counts each group's values under the label `parameter` names."""
    samples = list(vector.items())
    if node.op == "count_values":
        assert isinstance(parameter, str)
        samples = [
            (functions.with_label(labels, parameter, number_text(float(value))), value)
            for labels, value in samples
        ]
    groups: dict[Labels, list[tuple[Labels, float]]] = {}
    extra = {parameter} if node.op == "count_values" and not node.without else set()
    chosen = frozenset(node.labels) | extra
    for labels, value in samples:
        groups.setdefault(functions.group_of(labels, chosen, node.without), []).append((labels, value))
    if node.op in ("topk", "bottomk"):
        assert isinstance(parameter, float)
        return dict(
            sample
            for members in groups.values()
            for sample in functions.top(members, parameter, node.op == "topk")
        )
    values = {key: [value for _, value in members] for key, members in groups.items()}
    if node.op == "quantile":
        assert isinstance(parameter, float)
        return {key: functions.quantile(parameter, members) for key, members in values.items()}
    return {key: AGGREGATE[node.op](members) for key, members in values.items()}


def _least(values: Sequence[float], before: Callable[[float, float], bool]) -> float:
    """The first value in `before`'s order, NaN only when every value is NaN (as Prometheus's min/max)."""
    best = math.nan
    for value in values:
        if before(value, best) or math.isnan(best):
            best = value
    return best


AGGREGATE: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "avg": functions.mean,
    "min": lambda values: _least(values, operator.lt),
    "max": lambda values: _least(values, operator.gt),
    "count": lambda values: float(len(values)),
    "count_values": lambda values: float(len(values)),
    "group": lambda values: 1.0,
    "stdvar": functions.variance,
    "stddev": lambda values: math.sqrt(functions.variance(values)),
}

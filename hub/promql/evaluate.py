"""A plan evaluated at one time over the series read for its selectors, with the rules of Prometheus 2
(promql/engine.go and functions.go), which Debian's Prometheus applies:

- an instant selector takes each series' newest sample in [t - 5m, t] (t moved back by `offset`);
- a range selector [d] takes the samples in [t - d, t];
- rate and increase add back counter resets and extrapolate to the range's ends (extrapolated_rate);
- functions, arithmetic and `bool` comparisons drop __name__; filtering comparisons and last_over_time
  keep it; a comparison keeps the vector's value whichever side the vector is on.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from hub.promql.plan import COMPARISONS, Aggregation, Binary, Node, Number, RangeFunction, Selector
from hub.promql.sql import Labels, Series

LOOKBACK_MS = 5 * 60 * 1000
Vector = dict[Labels, float]
Points = tuple[Sequence[int], Sequence[float]]  # times (ms) and values of one series within a range

COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


def window(node: Selector) -> tuple[int, int]:
    """How far before and after an evaluation time `node` reads: (since, until) offsets in ms."""
    reach = node.range_ms or LOOKBACK_MS
    return -node.offset_ms - reach, -node.offset_ms


class Samples(dict[Selector, list[Series]]):
    """What a query is evaluated over: each selector's series, and in `at_steps` the values some nodes
    take at every step of a range query, computed for all steps at once (hub.promql.grid), which
    evaluate looks up instead of computing them step by step."""

    def __init__(self) -> None:
        super().__init__()
        self.at_steps: dict[Node, Steps] = {}


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
        return _instant(data[node], t - node.offset_ms)
    if isinstance(node, RangeFunction):
        return _range_function(node, t, data[node.selector])
    if isinstance(node, Aggregation):
        vector = evaluate(node.expr, t, data)
        assert isinstance(vector, dict)
        return _aggregate(node, vector)
    return _binary(node, evaluate(node.lhs, t, data), evaluate(node.rhs, t, data))


def _instant(every: list[Series], at: int) -> Vector:
    result = {}
    for series in every:
        index = int(np.searchsorted(series.times, at, "right")) - 1
        if index >= 0 and series.times[index] >= at - LOOKBACK_MS:
            result[series.labels] = float(series.values[index])
    return result


def _range_function(node: RangeFunction, t: int, every: list[Series]) -> Vector:
    end = t - node.selector.offset_ms
    start = end - node.selector.range_ms
    function = RANGE_FUNCTIONS[node.name]
    result = {}
    for series in every:
        low = int(np.searchsorted(series.times, start, "left"))
        high = int(np.searchsorted(series.times, end, "right"))
        if low == high:
            continue
        points = (series.times[low:high].tolist(), series.values[low:high].tolist())
        value = function(points, start, end)
        if value is not None:
            result[range_labels(node, series.labels)] = value
    return result


def range_labels(node: RangeFunction, labels: Labels) -> Labels:
    """The labels of `node`'s value for a series: without __name__ but for last_over_time."""
    return labels if node.name == "last_over_time" else drop_name(labels)


def extrapolated_rate(points: Points, start: int, end: int, is_counter: bool, is_rate: bool) -> float | None:
    """Prometheus's extrapolatedRate: the increase over the samples, counter resets added back, stretched
    to the range's ends where the samples come close to them (within 1.1 average intervals), else by half
    an interval, and not below zero for a counter; per second of the range for a rate."""
    times, values = points
    if len(values) < 2:
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
    result *= interval / sampled
    return result / ((end - start) / 1000) if is_rate else result


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


RANGE_FUNCTIONS: dict[str, Callable[[Points, int, int], float | None]] = {
    "rate": lambda points, start, end: extrapolated_rate(points, start, end, True, True),
    "increase": lambda points, start, end: extrapolated_rate(points, start, end, True, False),
    "irate": _irate,
    "avg_over_time": _over_time(lambda values: sum(values) / len(values)),
    "min_over_time": _over_time(lambda values: _least(values, operator.lt)),
    "max_over_time": _over_time(lambda values: _least(values, operator.gt)),
    "sum_over_time": _over_time(sum),
    "count_over_time": _over_time(lambda values: float(len(values))),
    "last_over_time": _over_time(lambda values: values[-1]),
}


def _aggregate(node: Aggregation, vector: Vector) -> Vector:
    groups: dict[Labels, list[float]] = {}
    chosen = set(node.labels)
    for labels, value in vector.items():
        if node.without:
            key = tuple((k, v) for k, v in labels if k not in chosen and k != "__name__")
        else:
            key = tuple((k, v) for k, v in labels if k in chosen)
        groups.setdefault(key, []).append(value)
    return {key: AGGREGATE[node.op](values) for key, values in groups.items()}


def _least(values: Sequence[float], before: Callable[[float, float], bool]) -> float:
    """The first value in `before`'s order, NaN only when every value is NaN (as Prometheus's min/max)."""
    best = math.nan
    for value in values:
        if before(value, best) or math.isnan(best):
            best = value
    return best


AGGREGATE: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "avg": lambda values: sum(values) / len(values),
    "min": lambda values: _least(values, operator.lt),
    "max": lambda values: _least(values, operator.gt),
    "count": lambda values: float(len(values)),
}


def _binary(node: Binary, lhs: Vector | float, rhs: Vector | float) -> Vector | float:
    if isinstance(lhs, float) and isinstance(rhs, float):
        if node.op in COMPARISONS:
            return float(COMPARE[node.op](lhs, rhs))
        return arithmetic(node.op, lhs, rhs)
    vector_on_left = isinstance(lhs, dict)
    vector, scalar = (lhs, rhs) if vector_on_left else (rhs, lhs)
    assert isinstance(vector, dict) and isinstance(scalar, float)
    result = {}
    for labels, value in vector.items():
        left, right = (value, scalar) if vector_on_left else (scalar, value)
        if node.op not in COMPARISONS:
            result[drop_name(labels)] = arithmetic(node.op, left, right)
        elif node.return_bool:
            result[drop_name(labels)] = float(COMPARE[node.op](left, right))
        elif COMPARE[node.op](left, right):
            result[labels] = value
    return result


def arithmetic(op: str, left: float, right: float) -> float:
    """`left op right` as Go's float64 arithmetic: division by zero is ±Inf or NaN, never an error."""
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        return (
            math.nan
            if left == 0 or math.isnan(left)
            else math.copysign(math.inf, left) * math.copysign(1, right)
        )
    return left / right


def drop_name(labels: Labels) -> Labels:
    return tuple(pair for pair in labels if pair[0] != "__name__")

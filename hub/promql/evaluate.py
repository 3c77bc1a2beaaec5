"""A plan evaluated at one time over the series read for its selectors, with the rules of Prometheus 2
(promql/engine.go and functions.go), which Debian's Prometheus applies:

- an instant selector takes each series' newest sample in [t - 5m, t] (t moved back by `offset`);
- a range selector [d] takes the samples in [t - d, t];
- rate and increase add back counter resets and extrapolate to the range's ends (extrapolated_rate),
  delta extrapolates alike without resets;
- a parameter (topk's k, quantile's φ, quantile_over_time's φ) is evaluated at each step;
- timestamp() of a selector gives its samples' own times, of any other vector the evaluation time;
- functions, arithmetic and `bool` comparisons drop __name__; filtering comparisons and last_over_time
  keep it; a comparison keeps the vector's value whichever side the vector is on.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable, Mapping, Sequence

from hub.promql import functions
from hub.promql.answer import number_text
from hub.promql.functions import drop_name
from hub.promql.plan import (
    COMPARISONS,
    Absent,
    Aggregation,
    Binary,
    Function,
    Node,
    Number,
    RangeFunction,
    Selector,
)
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


def evaluate(node: Node, t: int, data: Mapping[Selector, list[Series]]) -> Vector | float:
    """`node`'s value at `t` (ms): a scalar, or an instant vector by label set."""
    if isinstance(node, Number):
        return node.value
    if isinstance(node, Selector):
        return _instant(data[node], t - node.offset_ms)
    if isinstance(node, RangeFunction):
        function = RANGE_FUNCTIONS[node.name]
        if node.parameter is not None:
            function = _with_parameter(function, _scalar(node.parameter, t, data))
        return _range_function(node, t, data[node.selector], function)
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
    return _binary(node, evaluate(node.lhs, t, data), evaluate(node.rhs, t, data))


def _scalar(node: Node, t: int, data: Mapping[Selector, list[Series]]) -> float:
    value = evaluate(node, t, data)
    assert isinstance(value, float)
    return value


def _function(node: Function, t: int, data: Mapping[Selector, list[Series]]) -> Vector | float:
    """A function's value; timestamp() of a selector gives its samples' own times, as Prometheus's."""
    first = node.args[0] if node.args else None
    if node.name == "timestamp" and isinstance(first, Selector):
        at = t - first.offset_ms
        newest = ((series, _newest(series, at)) for series in data[first])
        return functions.collect(
            (drop_name(series.labels), float(series.times[index] / 1000))
            for series, index in newest
            if index is not None
        )
    args = [arg if isinstance(arg, str) else evaluate(arg, t, data) for arg in node.args]
    return functions.call(node.name, args, t)


def _with_parameter(function: Callable[..., float | None], parameter: float) -> RangeCall:
    return lambda points, start, end: function(points, start, end, parameter)


def _instant(every: list[Series], at: int) -> Vector:
    result = {}
    for series in every:
        index = _newest(series, at)
        if index is not None:
            result[series.labels] = series.values[index]
    return result


def _newest(series: Series, at: int) -> int | None:
    """The index of `series`' newest sample in [at - 5m, at], None without one."""
    index = bisect.bisect_right(series.times, at) - 1
    return index if index >= 0 and series.times[index] >= at - LOOKBACK_MS else None


def _range_function(node: RangeFunction, t: int, every: list[Series], function: RangeCall) -> Vector:
    end = t - node.selector.offset_ms
    start = end - node.selector.range_ms
    result = {}
    for series in every:
        low, high = bisect.bisect_left(series.times, start), bisect.bisect_right(series.times, end)
        if low == high:
            continue
        value = function((series.times[low:high], series.values[low:high]), start, end)
        if value is not None:
            labels = series.labels if node.name == "last_over_time" else drop_name(series.labels)
            result[labels] = value
    return result


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


RangeCall = Callable[[Points, int, int], float | None]
RANGE_FUNCTIONS: dict[str, Callable[..., float | None]] = {
    "rate": lambda points, start, end: extrapolated_rate(points, start, end, True, True),
    "increase": lambda points, start, end: extrapolated_rate(points, start, end, True, False),
    "irate": _irate,
    "avg_over_time": _over_time(lambda values: sum(values) / len(values)),
    "min_over_time": _over_time(lambda values: _least(values, operator.lt)),
    "max_over_time": _over_time(lambda values: _least(values, operator.gt)),
    "sum_over_time": _over_time(sum),
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
    chosen = set(node.labels) | ({parameter} if node.op == "count_values" and not node.without else set())
    for labels, value in samples:
        if node.without:
            key = tuple((k, v) for k, v in labels if k not in chosen and k != "__name__")
        else:
            key = tuple((k, v) for k, v in labels if k in chosen)
        groups.setdefault(key, []).append((labels, value))
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
    "avg": lambda values: sum(values) / len(values),
    "min": lambda values: _least(values, operator.lt),
    "max": lambda values: _least(values, operator.gt),
    "count": lambda values: float(len(values)),
    "count_values": lambda values: float(len(values)),
    "group": lambda values: 1.0,
    "stdvar": functions.variance,
    "stddev": lambda values: math.sqrt(functions.variance(values)),
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

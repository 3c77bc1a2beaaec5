"""A range query's selectors, range functions and simple aggregations evaluated at every step at once.

Stepping through a week at a time, evaluate would search each series once per step and per node; here
one numpy.searchsorted per series finds every step's window. An instant selector's value is then its
newest sample within the lookback, taken for all steps by indexing. rate and increase over a window
without a counter reset are computed on arrays with extrapolated_rate's operations, in its order (the
same floats); min, max, count and last over time on arrays too, where they are exact; every other
window goes through evaluate's own function on that window's samples. The aggregations of FOLDS over a
table fold its rows in evaluate's order with evaluate's operations. A value here is the one a
step-by-step evaluation gives (tests/hub/test_promql_properties.py holds both to Prometheus).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from hub.errors import PromQLError
from hub.promql.evaluate import LOOKBACK_MS, Samples, Vector, range_call, range_labels
from hub.promql.functions import group_of
from hub.promql.plan import Aggregation, Node, Number, RangeFunction, Selector, Subquery, children
from hub.promql.sql import Labels, Series

RATES = {"rate": True, "increase": False}  # range functions computed on arrays -> whether per second
# min and max over windows without NaN; a zero goes step by step, as numpy may not keep the first of
# equal values (0 and -0) as Prometheus does
EXTREMES = {"min_over_time": np.minimum, "max_over_time": np.maximum}
ENDS = {  # functions of a window's count or last sample: values of windows [low, high)
    "count_over_time": lambda values, low, high: (high - low).astype(np.float64),
    "last_over_time": lambda values, low, high: values[np.maximum(high - 1, 0)],
    "present_over_time": lambda values, low, high: np.ones(len(low)),
}


@dataclass(frozen=True)
class StepTable:
    """Values at the times start_ms + k * step_ms (k < count), one row per series: `present` says where
    a value is."""

    start_ms: int
    step_ms: int
    count: int
    labels: list[Labels]
    values: np.ndarray  # (series, steps) float64
    present: np.ndarray  # (series, steps) bool

    def at(self, t: int) -> Vector | None:
        """The vector at `t`, None when `t` is not one of the steps."""
        index, rest = divmod(t - self.start_ms, self.step_ms)
        if rest or not 0 <= index < self.count:
            return None
        present, values = self.present[:, index].tolist(), self.values[:, index].tolist()
        return {
            labels: value for labels, here, value in zip(self.labels, present, values, strict=True) if here
        }

    def points(self) -> dict[Labels, tuple[list[int], list[float]]]:
        """Each row's times and values where it has a value: a range query's answer."""
        times = np.arange(self.count, dtype=np.int64) * self.step_ms + self.start_ms
        found = {}
        for labels, values, present in zip(self.labels, self.values, self.present, strict=True):
            if present.any():
                found[labels] = (times[present].tolist(), values[present].tolist())
        return found


def tabulate(root: Node, times: range, data: Samples) -> None:
    """Put into `data.at_steps` the table, over `times`, of every node of `root` that _stepped yields,
    then of every aggregation in FOLDS over a tabulated node, from the leaves up."""
    steps = np.arange(times.start, times.stop, times.step, dtype=np.int64)
    for node in _stepped(root):
        source = node if isinstance(node, Selector) else node.source
        assert isinstance(source, Selector)
        every = data[source]
        data.limits.check_time()
        data.limits.hold(len(every) * len(steps))
        if isinstance(node, Selector):
            built = [_selector_row(series, steps - node.offset_ms) for series in every]
            labels = [series.labels for series in every]
        else:
            built = [_range_row(node, series, steps - source.offset_ms) for series in every]
            labels = [range_labels(node, series.labels) for series in every]
        values = np.array([row[0] for row in built]).reshape(len(built), len(steps))
        present = np.array([row[1] for row in built], dtype=bool).reshape(len(built), len(steps))
        if isinstance(node, RangeFunction):
            _refuse_shared_label_sets(labels, present)
        data.at_steps[node] = StepTable(times.start, times.step, len(steps), labels, values, present)
    _tabulate_aggregations(root, data)


def _tabulate_aggregations(node: Node, data: Samples) -> None:
    """Tabulate, children first, each aggregation in FOLDS whose argument has a table."""
    if isinstance(node, Subquery) or node in data.at_steps:
        return
    for child in children(node):
        _tabulate_aggregations(child, data)
    if isinstance(node, Aggregation) and node.op in FOLDS and node.parameter is None:
        table = data.at_steps.get(node.expr)
        if isinstance(table, StepTable):
            data.limits.check_time()
            data.at_steps[node] = _aggregated(node, table)
            data.limits.hold(data.at_steps[node].values.size)


def _aggregated(node: Aggregation, table: StepTable) -> StepTable:
    """`node` over `table` at every step: its rows grouped as evaluate groups a vector's series and
    folded in the table's order with the operations evaluate's AGGREGATE makes in its order."""
    groups: dict[Labels, list[int]] = {}
    chosen = frozenset(node.labels)
    for index, labels in enumerate(table.labels):
        groups.setdefault(group_of(labels, chosen, node.without), []).append(index)
    with np.errstate(all="ignore"):  # NaN and infinite values make NaN and Inf, as in Go
        folded = [FOLDS[node.op](table.values[rows], table.present[rows]) for rows in groups.values()]
    values = np.array([value for value, _ in folded]).reshape(len(folded), table.count)
    present = np.array([here for _, here in folded], dtype=bool).reshape(len(folded), table.count)
    return StepTable(table.start_ms, table.step_ms, table.count, list(groups), values, present)


def _sum(values: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Python's sum of each step's values, row after row from 0."""
    total = np.zeros(values.shape[1])
    for row, here in zip(values, present, strict=True):
        total = np.where(here, total + row, total)
    return total, present.any(axis=0)


def _extreme(before: np.ufunc) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """evaluate._least on arrays: the first value in `before`'s order, NaN only when all are NaN."""

    def fold(values: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        best = np.full(values.shape[1], np.nan)
        for row, here in zip(values, present, strict=True):
            best = np.where(here & (before(row, best) | np.isnan(best)), row, best)
        return best, present.any(axis=0)

    return fold


def _mean(values: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """functions.mean on arrays: the first value, then value / count - mean / count added unless an
    infinite mean stays as it is."""
    mean, count = np.full(values.shape[1], np.nan), np.zeros(values.shape[1])
    for row, here in zip(values, present, strict=True):
        later = here & (count > 0)
        mean = np.where(here & (count == 0), row, mean)
        count = np.where(here, count + 1, count)
        keeps = np.isinf(mean) & np.where(np.isinf(row), (mean > 0) == (row > 0), ~np.isnan(row))
        mean = np.where(later & ~keeps, mean + (row / count - mean / count), mean)
    return mean, present.any(axis=0)


FOLDS: dict[str, Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]] = {
    "sum": _sum,
    "avg": _mean,
    "min": _extreme(np.less),
    "max": _extreme(np.greater),
    "count": lambda values, present: (present.sum(axis=0).astype(np.float64), present.any(axis=0)),
    "group": lambda values, present: (np.ones(values.shape[1]), present.any(axis=0)),
}


def _refuse_shared_label_sets(labels: list[Labels], present: np.ndarray) -> None:
    """Prometheus's execution error when two rows with one label set (series told apart only by the
    __name__ a function dropped) both have a value in the query's range (its check is on the matrix)."""
    rows: dict[Labels, list[int]] = {}
    for index, row_labels in enumerate(labels):
        rows.setdefault(row_labels, []).append(index)
    for shared in (indices for indices in rows.values() if len(indices) > 1):
        if present[shared].any(axis=1).sum() > 1:
            raise PromQLError("vector cannot contain metrics with the same labelset", "execution", 422)


def stepped_only(root: Node) -> set[Selector]:
    """The selectors of `root` evaluated only at the query's own steps (every occurrence is _stepped):
    those whose reads may keep to the samples within reach of a step."""
    stepped = Counter(node if isinstance(node, Selector) else node.source for node in _stepped(root))
    return {selector for selector, count in Counter(_selectors(root)).items() if stepped[selector] == count}


def _stepped(node: Node) -> Iterator[Selector | RangeFunction]:
    """The instant selectors, and range functions of a range selector, that `node` evaluates at the
    query's own steps: neither inside a subquery nor fixed in time by `@`."""
    if isinstance(node, Subquery):
        return
    if isinstance(node, Selector):
        if node.at is None:
            yield node
        return
    if isinstance(node, RangeFunction) and isinstance(node.source, Selector) and node.source.at is None:
        if isinstance(node.parameter, Number | None):
            yield node
        else:  # a parameter that changes from step to step: the function is evaluated step by step
            yield from _stepped(node.parameter)
        return
    for child in children(node):
        yield from _stepped(child)


def _selectors(node: Node) -> Iterator[Selector]:
    if isinstance(node, Selector):
        yield node
    for child in children(node):
        yield from _selectors(child)


def _selector_row(series: Series, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each end's newest sample at or before it, present when within the lookback."""
    index = np.searchsorted(series.times, ends, "right") - 1
    taken = np.maximum(index, 0)
    present = (index >= 0) & (series.times[taken] >= ends - LOOKBACK_MS)
    return series.values[taken], present


def _range_row(node: RangeFunction, series: Series, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`node`'s function over each window [end - range, end] of `series`."""
    starts = ends - node.source.range_ms
    low = np.searchsorted(series.times, starts, "left")
    high = np.searchsorted(series.times, ends, "right")
    values = np.full(len(ends), np.nan)
    present = np.zeros(len(ends), dtype=bool)
    by_step = high - low > 0
    if node.name in RATES:
        resets = np.concatenate(([0], np.cumsum(series.values[1:] < series.values[:-1])))
        last = np.maximum(high - 1, 0)
        spans_time = series.times[last] > series.times[np.minimum(low, last)]  # else extrapolated_rate's None
        plain = (high - low >= 2) & spans_time & (resets[last] == resets[np.minimum(low, last)])
        values[plain] = _rates(series, low[plain], high[plain], starts[plain], ends[plain], RATES[node.name])
        present |= plain
        by_step &= ~plain
    elif node.name in EXTREMES and not np.isnan(series.values).any():
        bounds = np.stack((low, high), axis=1).ravel()  # reduceat: [low, high) at even positions
        padded = np.append(series.values, 0.0)
        extremes = EXTREMES[node.name].reduceat(padded, bounds)[::2]
        exact = by_step & (extremes != 0)
        values[exact] = extremes[exact]
        present |= exact
        by_step &= ~exact
    elif node.name in ENDS:
        values[by_step] = ENDS[node.name](series.values, low, high)[by_step]
        present |= by_step
        by_step[:] = False
    if not by_step.any():  # every window done on arrays: no list of the series' samples to build
        return values, present
    times, samples = series.times.tolist(), series.values.tolist()
    function = range_call(node, node.parameter.value if isinstance(node.parameter, Number) else None)
    for index in np.flatnonzero(by_step).tolist():
        first, after = int(low[index]), int(high[index])
        start, end = int(starts[index]), int(ends[index])
        value = function((times[first:after], samples[first:after]), start, end)
        if value is not None:
            values[index], present[index] = value, True
    return values, present


def _rates(
    series: Series, low: np.ndarray, high: np.ndarray, starts: np.ndarray, ends: np.ndarray, per_second: bool
) -> np.ndarray:
    """extrapolated_rate of counter windows [low, high) (at least two samples, no reset) on arrays."""
    with np.errstate(all="ignore"):  # NaN and infinite samples make NaN and Inf, as in Go
        first_t, last_t = series.times[low], series.times[high - 1]
        first, result = series.values[low], series.values[high - 1] - series.values[low]
        to_start, to_end = (first_t - starts) / 1000, (ends - last_t) / 1000
        sampled = (last_t - first_t) / 1000
        average = sampled / (high - low - 1)
        zero_at = sampled * (first / np.where(result == 0, 1.0, result))
        closer = (result > 0) & (first >= 0) & (zero_at < to_start)  # Python's min(to_start, zero_at)
        to_start = np.where(closer, zero_at, to_start)
        threshold = average * 1.1
        interval = sampled + np.where(to_start < threshold, to_start, average / 2)
        interval = interval + np.where(to_end < threshold, to_end, average / 2)
        factor = interval / sampled
        if per_second:
            factor = factor / ((ends - starts) / 1000)
        return result * factor

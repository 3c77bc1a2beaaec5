"""PromQL on the hub's store: /api/v1/query and /api/v1/query_range as Prometheus's HTTP API answers them.

    request (parameters) ─▶ plan (promql_parser's tree, checked) ─▶ sql (each selector's samples, once)
        ─▶ grid (selectors and range functions at every step at once, for a range query)
        ─▶ evaluate (at each step, Prometheus's rules) ─▶ answer (Prometheus's JSON envelope)

Each selector's samples are read once for the whole query, as numpy arrays, from the earliest time any
evaluation reaches back to the latest; of a range query whose step is longer than a selector's reach,
only the samples within reach of a step. Errors are PromQLError, answered by the hub in Prometheus's
error envelope.
"""

from __future__ import annotations

from hub.errors import PromQLError
from hub.promql import answer
from hub.promql.evaluate import LOOKBACK_MS, Samples, evaluate, range_points, read_windows
from hub.promql.grid import StepTable, stepped_only, tabulate
from hub.promql.limits import Limits
from hub.promql.plan import Selector, Subquery, is_range_vector, pin_at, plan
from hub.promql.request import read_request
from hub.promql.sql import Grid, Labels, Read, ReadNumbers, read_series

__all__ = ["Limits", "answer_query"]


def answer_query(
    is_range: bool,
    method: str,
    query_string: str,
    content_type: str | None,
    body: bytes,
    read: Read,
    read_numbers: ReadNumbers,
    now: float,
    limits: Limits,
) -> bytes:
    """The JSON answer of an instant (`is_range` False) or range query whose series `read` finds and
    whose samples `read_numbers` fetches, evaluated within `limits`; PromQLError for a request that is
    refused."""
    request = read_request(is_range, method, query_string, content_type, body, now)
    node = pin_at(plan(request.query), request.start_ms, request.end_ms)
    if request.is_range and is_range_vector(node):
        raise PromQLError(
            'invalid expression type "range vector" for range query, must be Scalar or instant Vector'
        )
    gridded = stepped_only(node) if request.is_range else set()
    data = Samples(limits)
    for selector, (since, until) in read_windows(node, request.start_ms, request.end_ms).items():
        grid = None
        if selector in gridded:
            reach = selector.range_ms or LOOKBACK_MS
            grid = Grid(request.start_ms - selector.offset_ms, request.step_ms, reach)
        data[selector] = read_series(read, read_numbers, selector, since, until, grid)
    if is_range_vector(node):
        assert isinstance(node, Selector | Subquery)
        _, _, every = range_points(node, request.start_ms, data)
        return answer.matrix({labels: (list(times), list(values)) for labels, (times, values) in every})
    if not request.is_range:
        value = evaluate(node, request.start_ms, data)
        if isinstance(value, float):
            return answer.scalar(value, request.start_ms)
        return answer.vector(value, request.start_ms)
    tabulate(node, request.times(), data)
    table = data.at_steps.get(node)
    if isinstance(table, StepTable):
        limits.hold(int(table.present.sum()))
        return answer.matrix(table.points())
    series: dict[Labels, answer.Points] = {}
    for t in request.times():
        limits.check_time()
        value = evaluate(node, t, data)
        limits.hold(1 if isinstance(value, float) else len(value))
        for labels, number in ({(): value} if isinstance(value, float) else value).items():
            times, values = series.setdefault(labels, ([], []))
            times.append(t)
            values.append(number)
    return answer.matrix(series)

"""PromQL on the hub's store: /api/v1/query and /api/v1/query_range as Prometheus's HTTP API answers them.

    request (parameters) ─▶ plan (promql_parser's tree, checked) ─▶ sql (each selector's samples, once)
        ─▶ grid (selectors and range functions at every step at once, for a range query)
        ─▶ evaluate (at each step, Prometheus's rules) ─▶ answer (Prometheus's JSON envelope)

Each selector's samples are read once for the whole query, from the earliest time any step reaches back
to the latest (of a range query whose step is longer than that reach, only the samples within reach of
a step), as numpy arrays. Errors are PromQLError, answered by the hub in Prometheus's error envelope.
"""

from __future__ import annotations

from collections.abc import Iterator

from hub.promql import answer
from hub.promql.evaluate import Samples, evaluate, window
from hub.promql.grid import tabulate
from hub.promql.plan import Node, Selector, children, plan
from hub.promql.request import read_request
from hub.promql.sql import Grid, Labels, Read, ReadNumbers, read_series

__all__ = ["answer_query"]


def answer_query(
    is_range: bool,
    method: str,
    query_string: str,
    content_type: str | None,
    body: bytes,
    read: Read,
    read_numbers: ReadNumbers,
    now: float,
) -> bytes:
    """The JSON answer of an instant (`is_range` False) or range query whose series `read` finds and
    whose samples `read_numbers` fetches; PromQLError for a request that is refused."""
    request = read_request(is_range, method, query_string, content_type, body, now)
    node = plan(request.query)
    data = Samples()
    for selector in _selectors(node):
        before, after = window(selector)
        grid = Grid(request.start_ms - selector.offset_ms, request.step_ms, -before - selector.offset_ms)
        data[selector] = read_series(
            read,
            read_numbers,
            selector,
            request.start_ms + before,
            request.end_ms + after,
            grid if request.is_range else None,
        )
    if not request.is_range:
        value = evaluate(node, request.start_ms, data)
        if isinstance(value, float):
            return answer.scalar(value, request.start_ms)
        return answer.vector(value, request.start_ms)
    tabulate(node, request.times(), data)
    series: dict[Labels, list[answer.Point]] = {}
    for t in request.times():
        value = evaluate(node, t, data)
        for labels, number in ({(): value} if isinstance(value, float) else value).items():
            series.setdefault(labels, []).append((t, number))
    return answer.matrix(series)


def _selectors(node: Node) -> Iterator[Selector]:
    if isinstance(node, Selector):
        yield node
    for child in children(node):
        yield from _selectors(child)

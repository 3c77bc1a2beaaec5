"""Queries hypothesis composes from the PromQL the hub supports (selectors, range functions, aggregations,
functions, operators between vectors and with scalars, subqueries, nested) answer as Prometheus 2.42
answers them on the same samples: the same series and values, or the same kind of error. Asked as an
instant query and as range queries whose steps fall short of and past the selectors' reach, so that the
step grid (hub/promql/grid.py) and the samples it leaves unread are checked against Prometheus too."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from hub.promql.plan import RANGE_FUNCTIONS as PLANNED_RANGE_FUNCTIONS
from tests.support import remote_write
from tests.support.promqlpeers import assert_same, comparable, get, hub_and_prometheus

pytestmark = pytest.mark.integration

START_MS = (int(time.time()) - 2 * 3600) // 60 * 60_000  # inside both stores' windows, on a whole minute
PEERS = ("hub", "prometheus")
EXAMPLES = int(os.environ.get("FLEETLENS_PROMQL_EXAMPLES", "150"))  # more for a longer hunt


def at(minute: float) -> int:
    return START_MS + round(minute * 60_000)


def series() -> list[remote_write.Series]:
    """Two nodes' counters (one restarting, one sampled every 30 s) and gauges (one silent for 10
    minutes, one with -0.0, 0.0 and equal values, one with NaN and infinities), an hour of them."""
    found: list[remote_write.Series] = []
    for node, every_s, restart in (("n1", 15, 120), ("n2", 30, None)):
        value, samples = 0.0, []
        for index in range(3600 // every_s):
            value = 1.0 if index == restart else value + 2 + index % 5 * 0.5
            samples.append((at(index * every_s / 60), value))
        found.append(({"__name__": "fl_ops_total", "node": node, "job": "train"}, samples))
    for node, gpu, shift in (("n1", "0", 0.0), ("n1", "1", 7.5), ("n2", "0", -3.0)):
        samples = [
            (at(index / 4), shift + 40 + (index * 13 % 17) - (index % 4 == 0) * 0.5)
            for index in range(240)
            if node != "n1" or gpu != "1" or not 80 <= index < 120
        ]
        found.append(({"__name__": "fl_temp", "node": node, "gpu": gpu, "job": "train"}, samples))
    zeros = [(at(index / 4), (0.0, -0.0, 3.0, 3.0)[index % 4]) for index in range(240)]
    found.append(({"__name__": "fl_temp", "node": "n2", "gpu": "1", "job": "train"}, zeros))
    odd = [
        (at(index / 4), (50.0, math.nan, 51.0, math.inf, 49.0, -math.inf)[index % 6]) for index in range(240)
    ]
    found.append(({"__name__": "fl_temp", "node": "n3", "gpu": "0", "job": "train"}, odd))
    return found


PLAIN = st.sampled_from(
    [
        "fl_ops_total",
        'fl_ops_total{node="n1"}',
        "fl_temp",
        'fl_temp{gpu!="1"}',
        'fl_temp{node=~"n.*", gpu=~"0|1"}',
    ]
)
MODIFIERS = st.sampled_from(["", " offset 3m", " @ start()", " @ end() offset 1m"])
RANGES = st.sampled_from(["1m", "2m", "5m", "10m"])
RANGE_FUNCTIONS = st.sampled_from(sorted(PLANNED_RANGE_FUNCTIONS - {"quantile_over_time"}))  # all, φ aside
AGGREGATIONS = st.sampled_from(["sum", "avg", "min", "max", "count", "stddev", "group"])
GROUPINGS = st.sampled_from(["", " by (node)", " without (gpu)", " by (job, node)"])
FUNCTIONS = st.sampled_from(
    [
        "abs({})",
        "ceil({})",
        "clamp_min({}, 41)",
        "round({}, 0.5)",
        "-({})",
        "sgn({})",
        "timestamp({})",
        "absent({})",
        'label_replace({}, "n", "$1", "node", "n(.*)")',
        "quantile(0.9, {})",
        'count_values("v", round({}))',
        'label_join({}, "both", "-", "node", "job")',
        "clamp({}, 40, 50)",
        "vector(time()) - scalar(sum({}))",
    ]
)  # not topk or bottomk: of equal values, Prometheus's range queries keep whichever its map order gives
OPERATORS = st.sampled_from(["+", "-", "*", "/", "%", "^", ">", ">= bool", "<", "== bool"])
SET_OPERATORS = st.sampled_from(["and", "or", "unless"])
MATCHINGS = st.sampled_from(
    ["", " on (node, gpu)", " ignoring (job)", " on (node) group_left", " ignoring (gpu) group_right"]
)


def range_call(draw: st.DrawFn) -> str:
    return f"{draw(RANGE_FUNCTIONS)}({draw(PLAIN)}[{draw(RANGES)}]{draw(MODIFIERS)})"


@st.composite
def vectors(draw: st.DrawFn, depth: int = 2) -> str:
    """An instant-vector expression, at most `depth` levels above its selectors."""
    if depth == 0:
        return draw(PLAIN) + draw(MODIFIERS) if draw(st.booleans()) else range_call(draw)
    inner = draw(vectors(depth - 1))
    kind = draw(st.sampled_from(["leaf", "aggregate", "function", "scalar", "vectors", "subquery"]))
    if kind == "leaf":
        return inner
    if kind == "aggregate":
        return f"{draw(AGGREGATIONS)}{draw(GROUPINGS)} ({inner})"
    if kind == "function":
        return draw(FUNCTIONS).format(inner)
    if kind == "scalar":
        number = draw(st.sampled_from(["2", "0", "45", "0.5"]))
        return (
            f"({inner}) {draw(OPERATORS)} {number}"
            if draw(st.booleans())
            else f"{number} {draw(OPERATORS)} ({inner})"
        )
    if kind == "vectors":
        other = draw(vectors(depth - 1))
        operator = draw(OPERATORS | SET_OPERATORS)
        return f"({inner}) {operator}{draw(MATCHINGS)} ({other})"
    window = draw(st.sampled_from(["[10m:1m]", "[5m:30s]", "[15m:]"]))
    return (
        f"{draw(st.sampled_from(['max_over_time', 'avg_over_time', 'count_over_time']))}(({inner}){window})"
    )


@pytest.fixture(scope="module")
def peers(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with hub_and_prometheus(series(), chdb_dir, tmp_path_factory.mktemp("promql_properties")) as both:
        yield both


def assert_same_answer(peers: dict[str, Any], path: str, parameters: dict[str, str], what: str) -> None:
    """Both peers answer alike: success with the same series and values, or the same error type."""
    (ours_status, ours), (their_status, theirs) = (get(peers[side], path, parameters) for side in PEERS)
    outcome = "data" if theirs["status"] == "success" and theirs["data"]["result"] else theirs["status"]
    event(f"{path}: {'empty' if outcome == 'success' else outcome}")
    if theirs["status"] != "success":
        assert (ours_status, ours.get("errorType")) == (their_status, theirs["errorType"]), (
            what,
            ours,
            theirs,
        )
        return
    assert ours_status == 200, (what, ours)
    assert_same(comparable(ours["data"]["result"]), comparable(theirs["data"]["result"]), what)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    query=vectors(),
    minute=st.sampled_from([4.0, 25.0, 33.5, 59.75]),
    step=st.sampled_from(["15s", "45s", "7m", "11m"]),
)
def test_composed_queries_answer_as_prometheus_does(peers, query, minute, step):
    instant = {"query": query, "time": str(at(minute) / 1000)}
    assert_same_answer(peers, "/api/v1/query", instant, f"{query} at minute {minute}")
    ranged = {"query": query, "start": str(at(-3) / 1000), "end": str(at(64) / 1000), "step": step}
    assert_same_answer(peers, "/api/v1/query_range", ranged, f"{query} every {step}")


@pytest.mark.parametrize(
    "query",
    ["rate(fl_ops_total[1m])", "increase(fl_ops_total[2m])", "delta(fl_temp[5m])", "irate(fl_ops_total[1m])"],
)
def test_extrapolated_rates_are_prometheus_floats_to_the_last_bit(peers, query):
    """The same operations in the same order as Prometheus's extrapolatedRate (its factor, then the
    product): values written identically, not merely close; both on the step grid and step by step."""
    ranged = {"query": query, "start": str(at(-3) / 1000), "end": str(at(64) / 1000), "step": "15s"}
    instant = [{"query": query, "time": str(at(minute) / 1000)} for minute in (0.25, 0.5, 4, 31.25)]
    for path, parameters in [("/api/v1/query_range", ranged)] + [("/api/v1/query", one) for one in instant]:
        ours, theirs = (get(peers[side], path, parameters)[1]["data"]["result"] for side in PEERS)
        assert sorted(map(exact, ours)) == sorted(map(exact, theirs)), (path, parameters)


def exact(series: dict[str, Any]) -> tuple:
    """A result series as (labels, value texts), its times as numbers."""
    points = series.get("values") or [series["value"]]
    return tuple(sorted(series["metric"].items())), [(float(t), text) for t, text in points]

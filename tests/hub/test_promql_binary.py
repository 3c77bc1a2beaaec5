"""Binary operators between vectors, set operators, `@` and subqueries on the hub answer as Prometheus's
own: the same samples remote-written to the hub and to Debian's Prometheus, the same queries asked of both
through `promtool query instant|range`, the same label sets and values. The samples hold several metrics
sharing node and gpu labels, a node-info metric for one-to-many matching, a series missing on one side,
and two capacity series of one node that make its match group ambiguous."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import remote_write
from tests.support.promqlpeers import compare_instant, compare_range, get, hub_and_prometheus

pytestmark = pytest.mark.integration

MINUTE_MS = 60_000
T0_MS = (int(time.time()) - 2 * 3600) // 60 * MINUTE_MS  # inside both stores' windows, on a whole minute


def minutes(m: float) -> int:
    return T0_MS + round(m * MINUTE_MS)


def every_15s(value: Any, skip: tuple[float, float] = (0.0, 0.0)) -> list[tuple[int, float]]:
    """An hour of samples every 15 s, value(index) each, none from minute skip[0] to skip[1]."""
    return [
        (minutes(index / 4), float(value(index)))
        for index in range(240)
        if not skip[0] * 4 < index < skip[1] * 4
    ]


def gpu(name: str, node: str, number: str, **extra: str) -> dict[str, str]:
    return {"__name__": name, "node": node, "gpu": number, "job": "dcgm", **extra}


def requests_counter(index: int) -> float:
    """A counter that restarts at minute 30."""
    return 5.0 + index % 120 * 3 + (index % 120) ** 2 * 0.05


SERIES: list[remote_write.Series] = [
    (gpu("fl_gpu_util", "n1", "0"), every_15s(lambda i: 20 + i * 7 % 61)),
    (gpu("fl_gpu_util", "n1", "1"), every_15s(lambda i: 90 - i * 3 % 47)),
    (gpu("fl_gpu_util", "n2", "0"), every_15s(lambda i: 35 + i * 11 % 29, skip=(20, 30))),
    (gpu("fl_gpu_power_watts", "n1", "0", sensor="board"), every_15s(lambda i: 150 + i * 13 % 97)),
    (gpu("fl_gpu_power_watts", "n1", "1", sensor="board"), every_15s(lambda i: 300 - i * 5 % 71)),
    (gpu("fl_gpu_delta", "n1", "0"), every_15s(lambda i: i % 9 - 4)),  # negative, zero and positive
    (gpu("fl_gpu_delta", "n2", "0"), every_15s(lambda i: (i % 5 - 2) * 2.5)),
    ({"__name__": "fl_node_info", "node": "n1", "rack": "a", "os": "linux"}, every_15s(lambda i: 1)),
    ({"__name__": "fl_node_info", "node": "n2", "rack": "b"}, every_15s(lambda i: 1)),
    ({"__name__": "fl_node_capacity", "node": "n1", "source": "bmc"}, every_15s(lambda i: 8)),
    ({"__name__": "fl_node_capacity", "node": "n1", "source": "dmi"}, every_15s(lambda i: 8)),
    ({"__name__": "fl_node_capacity", "node": "n2", "source": "bmc"}, every_15s(lambda i: 4)),
    ({"__name__": "fl_requests_total", "node": "n1", "job": "api"}, every_15s(requests_counter)),
    ({"__name__": "fl_requests_total", "node": "n2", "job": "api"}, every_15s(lambda i: 100 + i * 4)),
    (gpu("fl_fan_speed", "n1", "0"), every_15s(lambda i: 40 + i % 30)),
    (gpu("fl_fan_target", "n1", "0"), every_15s(lambda i: 55, skip=(20, 61))),  # as fl_fan_speed's
]
AT_S = minutes(30) // 1000  # a fixed time for `@`, in unix seconds

VECTOR_MATCHING = [
    "fl_gpu_util + fl_gpu_delta",
    "fl_gpu_util - ignoring(sensor) fl_gpu_power_watts",
    "fl_gpu_power_watts / on(node, gpu) fl_gpu_util",
    "fl_gpu_util * on(node) group_left(rack, os) fl_node_info",
    "fl_node_info * on(node) group_right(rack) fl_gpu_util",
    "fl_gpu_util > on(node) group_left(rack) fl_node_info",
    "fl_gpu_util > ignoring(sensor) fl_gpu_power_watts / 4",
    "fl_gpu_util <= bool ignoring(sensor) fl_gpu_power_watts / 4",
    "fl_gpu_delta != bool fl_gpu_util",
    "fl_gpu_util % fl_gpu_delta",
    "fl_gpu_delta ^ fl_gpu_util",
    "fl_gpu_util atan2 fl_gpu_delta",
    "fl_gpu_util % 7",
    "fl_gpu_delta % 3",
    "fl_gpu_delta ^ 0.5",
    "fl_gpu_delta ^ -1",
    "2 ^ fl_gpu_delta",
    "fl_gpu_delta atan2 1",
    "-7 % 3",
    "2 ^ 0.5",
    "1 atan2 -2",
]
SET_OPERATIONS = [
    "fl_gpu_util and fl_gpu_delta",
    'fl_gpu_util and on(node) fl_node_info{rack="b"}',
    "fl_gpu_power_watts or on(node, gpu) fl_gpu_util",
    "fl_gpu_util or fl_node_info",
    "fl_gpu_util unless fl_gpu_delta",
    'fl_gpu_util unless on(node) fl_node_capacity{node="n2"}',
    "fl_gpu_util > 50 and ignoring(sensor) fl_gpu_power_watts > 200",
]
AT_AND_SUBQUERIES = [
    f"fl_gpu_util @ {AT_S}",
    f"fl_gpu_util @ {AT_S} offset 2m",
    "fl_gpu_util @ start()",
    "fl_gpu_util offset 3m @ end()",
    "fl_gpu_util - fl_gpu_util @ start()",
    f"rate(fl_requests_total[5m] @ {AT_S})",
    "max_over_time(fl_gpu_util[10m] @ end())",
    "max_over_time(rate(fl_requests_total[5m])[30m:1m])",
    "min_over_time(rate(fl_requests_total[3m])[20m:2m] offset 3m)",
    f"max_over_time(rate(fl_requests_total[5m])[30m:1m] @ {AT_S})",
    "avg_over_time(fl_gpu_util[10m:])",
    "rate(fl_requests_total[20m:30s])",
    "last_over_time(sum(fl_gpu_util)[7m:45s])",
    "count_over_time((fl_gpu_util > 60)[15m:1m])",
    "sum_over_time((fl_gpu_util * on(node) group_left(rack) fl_node_info)[5m:1m] @ start())",
]
RANGE_VECTORS = [
    "fl_gpu_util[2m]",
    "fl_gpu_util[3m] offset 2m",
    f"fl_gpu_util[1m] @ {AT_S}",
    "rate(fl_requests_total[5m])[5m:1m]",
    "(fl_gpu_delta)[2m:30s]",
]
INSTANT_TIMES = (minutes(10), minutes(25), minutes(32.5), minutes(59.75), minutes(63))
AMBIGUOUS = [
    "fl_gpu_util * on(node) group_left fl_node_capacity",
    "fl_node_capacity * on(node) group_right fl_gpu_util",
    "fl_gpu_util + on(node) fl_node_info",
    '{__name__=~"fl_gpu_util|fl_gpu_delta"} * on(node, gpu) group_left fl_gpu_power_watts',
]


@pytest.fixture(scope="module")
def peers(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with hub_and_prometheus(SERIES, chdb_dir, tmp_path_factory.mktemp("promql_binary")) as both:
        yield both


@pytest.mark.parametrize("query", VECTOR_MATCHING + SET_OPERATIONS + AT_AND_SUBQUERIES)
def test_instant_queries_answer_as_prometheus_does(peers, query):
    assert compare_instant(peers, query, INSTANT_TIMES), f"{query}: no data at any time, nothing compared"


@pytest.mark.parametrize("query", VECTOR_MATCHING + SET_OPERATIONS + AT_AND_SUBQUERIES)
def test_range_queries_answer_as_prometheus_does(peers, query):
    assert compare_range(peers, query, minutes(4), minutes(66), "45s"), f"{query}: no data, nothing compared"


LONG_STEP_MIXES = [  # a selector both at the query's steps and inside a subquery or at an @ time
    "fl_gpu_util - max_over_time(fl_gpu_util[20m:1m])",
    "rate(fl_requests_total[5m]) / rate(fl_requests_total[5m] @ start())",
    "fl_gpu_util - fl_gpu_util @ start()",
]


@pytest.mark.parametrize("query", AT_AND_SUBQUERIES + LONG_STEP_MIXES)
def test_range_queries_with_steps_past_a_selectors_reach_answer_as_prometheus_does(peers, query):
    """Steps of 11 minutes: the selectors evaluated only at the query's steps read just the samples
    within their reach, the others (inside subqueries, at an @ time) every sample they need."""
    assert compare_range(peers, query, minutes(4), minutes(66), "11m"), f"{query}: no data, nothing compared"


@pytest.mark.parametrize("query", RANGE_VECTORS)
def test_an_instant_range_vector_answers_its_samples_as_prometheus_does(peers, query):
    assert compare_instant(peers, query, INSTANT_TIMES), f"{query}: no data at any time, nothing compared"


def prometheus_and_hub(peers: dict[str, Any], path: str, parameters: dict[str, str]) -> list[tuple]:
    """Each peer's status, status text, error type and error message up to its first series."""
    answers = []
    for side in ("prometheus", "hub"):
        status, answer = get(peers[side], path, parameters)
        answers.append((status, answer["status"], answer.get("errorType"), answer.get("error", "")[:50]))
    return answers


@pytest.mark.parametrize("query", RANGE_VECTORS[:2])
def test_a_range_query_of_a_range_vector_is_refused_as_prometheus_refuses_it(peers, query):
    parameters = {
        "query": query,
        "start": str(minutes(10) / 1000),
        "end": str(minutes(20) / 1000),
        "step": "60",
    }
    theirs, ours = prometheus_and_hub(peers, "/api/v1/query_range", parameters)
    assert theirs[:3] == (400, "error", "bad_data")
    assert ours == theirs


@pytest.mark.parametrize("query", AMBIGUOUS)
def test_ambiguous_matches_answer_the_execution_error_prometheus_answers(peers, query):
    theirs, ours = prometheus_and_hub(
        peers, "/api/v1/query", {"query": query, "time": str(minutes(40) / 1000)}
    )
    assert theirs[:3] == (422, "error", "execution")
    assert ours == theirs


FANS = '{__name__=~"fl_fan_.*"}'  # two series told apart by __name__ alone, both present until minute 20
NAME_DROPPING = [
    f"{FANS} * 2",
    f"2 - {FANS}",
    f"{FANS} / 4",
    f"{FANS} > bool 50",
    f"50 >= bool {FANS}",
    f"-{FANS}",
]
NAME_DROPPING_WINDOWS = [  # (start, end) minutes and a step; an instant query where start is end
    (10, 10, "1m"),
    (40, 40, "1m"),
    (4, 66, "45s"),
    (30, 66, "45s"),
    (4, 66, "7m"),
    (24, 66, "7m"),
]


@pytest.mark.parametrize("query", NAME_DROPPING)
def test_dropping_names_that_alone_tell_series_apart_answers_as_prometheus_does(peers, query):
    """Prometheus's execution error where the series that became one label set share a step, the same
    values where they do not, for every operator that drops __name__, instant and range."""
    for start, end, step in NAME_DROPPING_WINDOWS:
        if start == end:
            path, parameters = "/api/v1/query", {"query": query, "time": str(minutes(start) / 1000)}
        else:
            window = {"start": str(minutes(start) / 1000), "end": str(minutes(end) / 1000), "step": step}
            path, parameters = "/api/v1/query_range", {"query": query, **window}
        theirs, ours = prometheus_and_hub(peers, path, parameters)
        assert ours == theirs, (start, end, step)
        if theirs[0] == 200 and start == end:
            assert compare_instant(peers, query, [minutes(start)])
        elif theirs[0] == 200:
            assert compare_range(peers, query, minutes(start), minutes(end), step)

"""PromQL on the hub equals Prometheus's own: the same samples remote-written to the hub and to Debian's
Prometheus (--web.enable-remote-write-receiver), the same queries asked of both through `promtool query
instant|range` as the client, the same label sets and values (1e-9 relative). Unsupported constructs,
bad parameters and arbitrary query text answer bad_data in Prometheus's envelope, never a 500; SQL
sent to /api/v1/query is told where it moved."""

from __future__ import annotations

import io
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.app import Hub
from hub.auth import Tokens
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.support import remote_write
from tests.support.promqlpeers import comparable, compare_instant, compare_range, get, hub_and_prometheus

pytestmark = pytest.mark.integration

MINUTE_MS = 60_000
T0_MS = (int(time.time()) - 2 * 3600) // 60 * MINUTE_MS  # inside both stores' windows, on a whole minute
HOSTILE = "a\"b\\c'; DROP TABLE samples; --"  # a label value a query must match as text, never run


def minutes(m: float) -> int:
    return T0_MS + round(m * MINUTE_MS)


def counter_with_reset() -> list[tuple[int, float]]:
    """A counter every 15 s for an hour that restarts at minute 30 (from 5 again)."""
    samples, value = [], 0.0
    for index in range(240):
        value = 5.0 if index == 120 else value + 3 + index % 7 * 0.25
        samples.append((minutes(index / 4), value))
    return samples


def gauge_with_gap(shift: float) -> list[tuple[int, float]]:
    """A gauge every 15 s for an hour, silent from minute 20 to 30 (longer than the 5-minute lookback)."""
    return [
        (minutes(index / 4), shift + 30 + (index * 7 % 23) - index % 3 * 0.5)
        for index in range(240)
        if not 80 < index < 120
    ]


SERIES: list[remote_write.Series] = [
    (
        {"__name__": "fl_requests_total", "node": "n1", "instance": "n1:9100", "job": "api", "code": "200"},
        counter_with_reset(),
    ),
    (
        {"__name__": "fl_requests_total", "node": "n2", "instance": "n2:9100", "job": "api", "code": "500"},
        [(minutes(index / 4), 1000.0 + index * 2) for index in range(240)],
    ),
    (
        {"__name__": "fl_requests_total", "node": "n2", "instance": "n2:9100", "job": "batch", "code": "200"},
        [(minutes(index / 2), 50.0 + index * index * 0.5) for index in range(100)],
    ),
    (
        {
            "__name__": "fl_temperature_celsius",
            "node": "n1",
            "instance": "n1:9400",
            "job": "dcgm",
            "gpu": "0",
        },
        gauge_with_gap(0.0),
    ),
    (
        {
            "__name__": "fl_temperature_celsius",
            "node": "n1",
            "instance": "n1:9400",
            "job": "dcgm",
            "gpu": "1",
        },
        gauge_with_gap(12.5),
    ),
    (
        {
            "__name__": "fl_temperature_celsius",
            "node": "n2",
            "instance": "n2:9400",
            "job": "dcgm",
            "gpu": "0",
            "model": HOSTILE,
        },
        [(minutes(index / 2), 55.0 - index * 0.125) for index in range(0, 120, 3)],
    ),
]

QUERIES = [
    "fl_temperature_celsius",
    'fl_temperature_celsius{gpu="0"}',
    'fl_temperature_celsius{gpu!="0"}',
    'fl_requests_total{code=~"2.."}',
    'fl_requests_total{code!~"2.."}',
    'fl_requests_total{job=~"api|batch", code="200"}',
    '{__name__=~"fl_.*", node="n2"}',
    'fl_temperature_celsius{model="a\\"b\\\\c\'; DROP TABLE samples; --"}',
    'fl_temperature_celsius{model=~".*DROP TABLE.*"}',
    "fl_temperature_celsius offset 7m",
    "rate(fl_requests_total[5m])",
    "increase(fl_requests_total[10m])",
    "rate(fl_requests_total[3m] offset 1m)",
    "irate(fl_requests_total[1m])",
    "avg_over_time(fl_temperature_celsius[10m])",
    "min_over_time(fl_temperature_celsius[10m])",
    "max_over_time(fl_temperature_celsius[10m])",
    "sum_over_time(fl_temperature_celsius[10m])",
    "count_over_time(fl_temperature_celsius[15m])",
    "last_over_time(fl_temperature_celsius[15m])",
    "sum(rate(fl_requests_total[5m]))",
    "sum by (job) (rate(fl_requests_total[5m] offset 2m))",
    "avg without (gpu) (fl_temperature_celsius)",
    "min by (node) (fl_temperature_celsius)",
    "max(fl_temperature_celsius)",
    "count by (job, code) (fl_requests_total)",
    "fl_temperature_celsius * 2 + 1",
    "100 - fl_temperature_celsius",
    "fl_temperature_celsius / 0",
    "-fl_temperature_celsius",
    "fl_temperature_celsius > 40",
    "40 < fl_temperature_celsius",
    "fl_temperature_celsius >= bool 40",
    "sum(fl_requests_total) != 0",
    "2 * 3 + 4",
    "1 > bool 2",
]
INSTANT_TIMES = (minutes(25), minutes(32.5), minutes(59.75), minutes(63))  # in the gap, past the reset, end
UNSUPPORTED = {
    "predict_linear(fl_temperature_celsius[5m], 60)": "function predict_linear is not supported",
    "sort(fl_temperature_celsius)": "function sort is not supported",
    "fl_temperature_celsius @ 1e20": "the @ modifier's time is out of range",
    "max_over_time(fl_temperature_celsius[1d:1s])": "a subquery's range holds more than 11000 steps",
    "sum(": "unclosed left parenthesis",
}


@pytest.fixture(scope="module")
def peers(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with hub_and_prometheus(SERIES, chdb_dir, tmp_path_factory.mktemp("promql")) as both:
        yield both


@pytest.mark.parametrize("query", QUERIES)
def test_instant_queries_answer_as_prometheus_does(peers, query):
    assert compare_instant(peers, query, INSTANT_TIMES), (
        f"{query}: no data at any time, so nothing was compared"
    )


@pytest.mark.parametrize("query", QUERIES)
def test_range_queries_answer_as_prometheus_does(peers, query):
    assert compare_range(peers, query, minutes(-2), minutes(66), "45s"), f"{query}: no data, nothing compared"


@pytest.mark.parametrize("query", QUERIES)
def test_range_queries_with_steps_past_their_reach_answer_as_prometheus_does(peers, query):
    """A step longer than a selector's reach (the 5-minute lookback, [5m], [10m]): the hub reads only
    the samples within reach of a step, and still answers as Prometheus does."""
    assert compare_range(peers, query, minutes(-3), minutes(70), "11m"), f"{query}: no data, nothing compared"


@pytest.mark.parametrize(("query", "reason"), sorted(UNSUPPORTED.items()))
def test_unsupported_constructs_answer_bad_data_naming_them(peers, query, reason):
    status, answer = get(peers["hub"], "/api/v1/query", {"query": query, "time": str(minutes(30) / 1000)})
    assert status == 400
    assert answer["status"] == "error" and answer["errorType"] == "bad_data"
    assert reason in answer["error"]


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        ({"query": "1", "start": "10", "end": "5", "step": "1"}, "end timestamp must not be before start"),
        ({"query": "1", "start": "0", "end": "5", "step": "0"}, "zero or negative query resolution step"),
        ({"query": "1", "start": "0", "end": "100000", "step": "1"}, "exceeded maximum resolution of 11,000"),
        ({"query": "1", "start": "yesterday", "end": "5", "step": "1"}, 'invalid parameter "start"'),
        ({"query": "1", "start": "0", "end": "5", "step": "1x"}, 'invalid parameter "step"'),
        ({"query": "1", "start": "0", "end": "5"}, 'invalid parameter "step": missing'),
    ],
)
def test_bad_range_parameters_answer_bad_data_naming_them(peers, parameters, reason):
    status, answer = get(peers["hub"], "/api/v1/query_range", parameters)
    assert (status, answer["errorType"]) == (400, "bad_data")
    assert reason in answer["error"]


@pytest.mark.parametrize("end", ["11000", "11000.999", "11001"])
def test_range_queries_hold_at_most_11000_steps_after_the_start_as_in_prometheus(peers, end):
    """Prometheus refuses a range only when (end - start) / step, in whole steps, exceeds 11,000."""
    parameters = {"query": "1", "start": "0", "end": end, "step": "1"}
    (status, ours), (their_status, theirs) = (
        get(peers[side], "/api/v1/query_range", parameters) for side in ("hub", "prometheus")
    )
    assert (status, ours.get("errorType")) == (their_status, theirs.get("errorType")), ours
    if their_status == 200:
        assert comparable(ours["data"]["result"]) == comparable(theirs["data"]["result"])


def test_range_parameters_take_rfc3339_times_and_durations(peers):
    parameters = {"query": "2", "start": "2024-01-01T00:00:00Z", "end": "2024-01-01T00:01:00Z", "step": "30s"}
    status, answer = get(peers["hub"], "/api/v1/query_range", parameters)
    assert status == 200
    assert answer["data"] == {
        "resultType": "matrix",
        "result": [{"metric": {}, "values": [[1704067200, "2"], [1704067230, "2"], [1704067260, "2"]]}],
    }


def test_sql_sent_to_the_promql_path_is_told_where_it_moved(peers):
    request = urllib.request.Request(
        f"{peers['hub']}/api/v1/query",
        data=json.dumps({"sql": "SELECT 1"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    answer = json.load(refused.value)
    assert refused.value.code == 400 and answer["errorType"] == "bad_data"
    assert "SQL moved to POST /api/v1/sql" in answer["error"]


FRAGMENTS = st.sampled_from(
    [
        "fl_temperature_celsius",
        "{",
        "}",
        "(",
        ")",
        "[5m]",
        "=~",
        '"',
        "\\",
        "'",
        "sum",
        "rate",
        " by ",
        "@",
        "-",
    ]
)


@settings(max_examples=150, deadline=None)
@given(query=st.text(max_size=40) | st.lists(FRAGMENTS, max_size=8).map("".join))
def test_any_query_text_answers_success_or_bad_data(peers, query):
    """Whatever the text, the answer is Prometheus's envelope: success, or bad_data with a 400."""
    body = urllib.parse.urlencode({"query": query, "time": str(minutes(30) / 1000)}).encode()
    statuses: list[int] = []
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/api/v1/query",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_TYPE": "application/x-www-form-urlencoded",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
    }
    answer = json.loads(
        b"".join(peers["hub_app"].app(environ, lambda status, _: statuses.append(int(status[:3]))))
    )
    if statuses[0] == 200:
        assert answer["status"] == "success"
    else:
        assert (statuses[0], answer["status"], answer["errorType"]) == (400, "error", "bad_data"), answer


def ask_wsgi(hub: Hub, method: str, path: str, query: str, authorization: str = "") -> tuple[int, dict]:
    """The status and JSON answer of `hub.app` to a request without a body from a remote address."""
    statuses: list[int] = []
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "REMOTE_ADDR": "10.0.0.7",
        "HTTP_AUTHORIZATION": authorization,
        "wsgi.input": io.BytesIO(b""),
    }
    answer = b"".join(hub.app(environ, lambda status, _: statuses.append(int(status[:3]))))
    return statuses[0], json.loads(answer)


def test_promql_needs_a_read_token_and_takes_get_or_post(peers, tmp_path):
    store = peers["hub_app"].store
    tokens = Tokens({"reader": frozenset({"read"}), "writer": frozenset({"write"})})
    hub = Hub(store, Writer(store, Spool(tmp_path / "spool", 1 << 20)), OtlpStepReceiver(), tokens=tokens)
    query = urllib.parse.urlencode({"query": "max(fl_temperature_celsius)", "time": str(minutes(40) / 1000)})
    status, answer = ask_wsgi(hub, "GET", "/api/v1/query", query, "Bearer reader")
    assert status == 200 and answer["data"]["result"][0]["value"][1] == "58"
    assert ask_wsgi(hub, "GET", "/api/v1/query", query, "Bearer writer")[0] == 403
    assert ask_wsgi(hub, "GET", "/api/v1/query_range", query, "")[0] == 401
    assert ask_wsgi(hub, "DELETE", "/api/v1/query", query, "Bearer reader")[0] == 405


PRINTABLE = st.characters(blacklist_categories=("Cc", "Cs"))


@settings(max_examples=60, deadline=None)
@given(
    value=st.text(PRINTABLE, min_size=1, max_size=30)
    | st.sampled_from([HOSTILE, "'", "\\", "%", "{value0:String}"])
)
def test_label_values_are_matched_as_text_whatever_they_hold(peers, value):
    """A label value in a matcher (quoted as PromQL quotes it) selects the series holding exactly it (the
    empty value, which also matches series without the label, aside)."""
    query = f"fl_temperature_celsius{{model={json.dumps(value, ensure_ascii=False)}}}"
    status, answer = get(peers["hub"], "/api/v1/query", {"query": query, "time": str(minutes(30) / 1000)})
    assert status == 200, answer
    assert [series["metric"].get("model") for series in answer["data"]["result"]] == (
        [HOSTILE] if value == HOSTILE else []
    )


def limited_hub(peers: dict[str, Any], tmp_path: Path, **limits: Any) -> Hub:
    """A hub on the peers' store with a read token ("reader") and the given query limits."""
    store = peers["hub_app"].store
    spool = Spool(tmp_path / "spool", 1 << 20)
    tokens = Tokens({"reader": frozenset({"read"})})
    return Hub(store, Writer(store, spool), OtlpStepReceiver(), tokens=tokens, **limits)


def ask_range(hub: Hub, query: str, end_minute: float, step: str = "60") -> tuple[int, dict]:
    window = {"start": minutes(0) / 1000, "end": minutes(end_minute) / 1000, "step": step}
    parameters = urllib.parse.urlencode({"query": query, **window})
    return ask_wsgi(hub, "GET", "/api/v1/query_range", parameters, "Bearer reader")


def test_a_query_reading_more_samples_than_the_limit_answers_execution_naming_it(peers, tmp_path):
    hub = limited_hub(peers, tmp_path, promql_max_samples=100)
    assert ask_range(hub, 'fl_requests_total{job="batch"}', 20)[0] == 200
    status, answer = ask_range(hub, "rate(fl_requests_total[5m])", 60)
    assert (status, answer["errorType"]) == (422, "execution")
    assert "more than 100 samples (hub.promql_max_samples)" in answer["error"]
    status, answer = ask_range(hub, 'fl_requests_total{job="batch"} + fl_requests_total{code="500"}', 60)
    assert status == 422, "two reads under the limit each, over it together"


def test_a_query_holding_more_points_than_the_limit_answers_as_prometheus_does(peers, tmp_path):
    """440 samples read, but a table of 3 series at 3,601 steps: Prometheus's --query.max-samples error."""
    hub = limited_hub(peers, tmp_path, promql_max_samples=1000)
    status, answer = ask_range(hub, "fl_temperature_celsius", 60, step="1")
    assert (status, answer["errorType"]) == (422, "execution")
    assert "too many samples into memory" in answer["error"]


def test_a_subquery_holding_more_points_than_the_limit_answers_as_prometheus_does(peers, tmp_path):
    """An instant query whose subquery holds some thousands of points (3 series, 3,600 steps)."""
    hub = limited_hub(peers, tmp_path, promql_max_samples=1000)
    query = urllib.parse.urlencode(
        {"query": "max_over_time(fl_temperature_celsius[1h:1s])", "time": str(minutes(60) / 1000)}
    )
    status, answer = ask_wsgi(hub, "GET", "/api/v1/query", query, "Bearer reader")
    assert (status, answer["errorType"]) == (422, "execution")
    assert "too many samples into memory" in answer["error"]


def test_a_query_evaluating_past_its_time_answers_timeout(peers, tmp_path):
    hub = limited_hub(peers, tmp_path, query_max_seconds=1)
    status, answer = ask_range(hub, "max_over_time(max_over_time(fl_temperature_celsius[1h:1s])[1h:1s])", 60)
    assert (status, answer["errorType"]) == (503, "timeout")
    assert "hub.query_max_seconds" in answer["error"]


@pytest.mark.parametrize("query", ["x+" * 5000 + "x", "(" * 5000 + "x" + ")" * 5000, "-" * 300 + "1"])
def test_a_query_nested_beyond_the_bound_answers_bad_data_before_it_is_parsed(peers, query):
    status, answer = get(peers["hub"], "/api/v1/query", {"query": query, "time": str(minutes(30) / 1000)})
    assert (status, answer["errorType"]) == (400, "bad_data")
    assert "more than 200 operators and brackets" in answer["error"]


def test_a_query_of_many_operators_within_the_bound_answers_as_prometheus_does(peers):
    query = "fl_temperature_celsius" + " + 1" * 150
    assert compare_instant(peers, query, INSTANT_TIMES)

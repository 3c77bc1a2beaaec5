"""Prometheus remote read from the hub: a real Prometheus with no data of its own, reading the hub
(`remote_read` with read_recent), answers PromQL as the hub's own /api/v1/query does; the hub's answer
is a snappy SAMPLES ReadResponse holding what was written; hostile bodies (any bytes, bad matchers,
queries over the row limit) answer 400 (413 for one that inflates past the body limit), never 500;
reading needs a read token."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.app import Hub
from hub.auth import Tokens
from hub.otlp import OtlpStepReceiver
from hub.prompb import Label, ReadRequest, ReadResponse
from hub.spool import Spool
from hub.writer import Writer
from tests.support import remote_write
from tests.support.peers import peer, prometheus
from tests.support.promqlpeers import compare_instant, compare_range, hub_and_prometheus
from tests.support.wsgi import wsgi_post

pytestmark = pytest.mark.integration

MINUTE_MS = 60_000
T0_MS = (int(time.time()) - 2 * 3600) // 60 * MINUTE_MS  # inside both stores' windows
EQ, NEQ, RE, NRE = range(4)  # LabelMatcher.Type


def every(seconds: int, minutes: int, value: Any) -> list[tuple[int, float]]:
    return [(T0_MS + index * seconds * 1000, value(index)) for index in range(minutes * 60 // seconds)]


SERIES: list[remote_write.Series] = [
    (
        {"__name__": "fl_requests_total", "node": "n1", "instance": "n1:9100", "job": "api"},
        every(15, 60, lambda i: 10.0 + 3 * i),
    ),
    (
        {"__name__": "fl_requests_total", "node": "n2", "instance": "n2:9100", "job": "batch"},
        every(30, 40, lambda i: 5.0 + i * i),
    ),
    (
        {
            "__name__": "fl_temperature_celsius",
            "node": "n1",
            "instance": "n1:9400",
            "job": "dcgm",
            "gpu": "0",
        },
        every(15, 60, lambda i: 40 + i % 11 - 0.5 * (i % 3)),
    ),
]
QUERIES = [
    "fl_temperature_celsius",
    'fl_requests_total{job=~"api|batch"}',
    'fl_requests_total{job!="api"}',
    "rate(fl_requests_total[5m])",
    "sum by (job) (increase(fl_requests_total[10m]))",
    "max_over_time(fl_temperature_celsius[7m])",
]


@pytest.fixture(scope="module")
def peers(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The hub holding SERIES, and ("prometheus") a Prometheus with no data that reads the hub."""
    with hub_and_prometheus(SERIES, chdb_dir, tmp_path_factory.mktemp("written")) as written:
        work = tmp_path_factory.mktemp("reader")
        (work / "prometheus.yml").write_text(
            f"remote_read:\n  - url: {written['hub']}/api/v1/read\n    read_recent: true\n"
        )
        args, url = prometheus(work)
        with peer(args, f"{url}/-/ready"):
            yield {**written, "prometheus": url}


@pytest.mark.parametrize("query", QUERIES)
def test_prometheus_reading_the_hub_answers_as_the_hub_does(peers, query):
    times = [T0_MS + minutes * MINUTE_MS for minutes in (3, 30, 45, 59)]
    assert compare_instant(peers, query, times), f"{query}: nothing compared"
    assert compare_range(peers, query, T0_MS, T0_MS + 70 * MINUTE_MS, "1m"), f"{query}: nothing compared"


def read_request(*queries: tuple[int, int, list[tuple[int, str, str]]]) -> bytes:
    """A snappy ReadRequest of (start ms, end ms, [(type, name, value)]) queries."""
    request = ReadRequest()
    for start_ms, end_ms, matchers in queries:
        query = request.queries.add(start_timestamp_ms=start_ms, end_timestamp_ms=end_ms)
        for kind, name, value in matchers:
            query.matchers.add(type=kind, name=name, value=value)
    return remote_write.snappy(request.SerializeToString())


def test_the_answer_is_a_snappy_samples_response_of_what_was_written(peers):
    body = read_request(
        (T0_MS, T0_MS + 10 * MINUTE_MS, [(EQ, "__name__", "fl_requests_total"), (RE, "job", "b.*")]),
        (T0_MS - MINUTE_MS, T0_MS + 90 * MINUTE_MS, [(NRE, "__name__", "fl_req.*"), (NEQ, "gpu", "1")]),
    )
    request = urllib.request.Request(
        f"{peers['hub']}/api/v1/read", data=body, headers={"Content-Type": "application/x-protobuf"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.headers["Content-Type"] == "application/x-protobuf"
        assert answer.headers["Content-Encoding"] == "snappy"
        response = ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(answer.read())))
    batch, temperature = (
        [
            (
                dict((label.name, label.value) for label in map(Label.FromString, series.labels)),
                [(sample.timestamp, sample.value) for sample in series.samples],
            )
            for series in result.timeseries
        ]
        for result in response.results
    )
    assert batch == [(dict(SERIES[1][0]), [s for s in SERIES[1][1] if s[0] <= T0_MS + 10 * MINUTE_MS])]
    assert temperature == [(dict(SERIES[2][0]), SERIES[2][1])]


@pytest.fixture(scope="module")
def small_hub(peers, tmp_path_factory: pytest.TempPathFactory) -> Hub:
    """A hub on the same store whose queries hold at most 50 samples, and that wants a read token."""
    store = peers["hub_app"].store
    spool = Spool(tmp_path_factory.mktemp("small") / "spool", 1 << 20)
    tokens = Tokens({"reader": frozenset({"read"}), "writer": frozenset({"write"})})
    return Hub(store, Writer(store, spool), OtlpStepReceiver(), tokens=tokens, promql_max_samples=50)


def post(hub: Hub, body: bytes, token: str = "Bearer reader") -> tuple[int, bytes]:
    remote = {"REMOTE_ADDR": "10.0.0.7", "HTTP_AUTHORIZATION": token}
    return wsgi_post(hub, "/api/v1/read", body, "application/x-protobuf", environ=remote)


EVERY_REQUEST = [(RE, "__name__", "fl_.*")]
REFUSED = {
    "not snappy": (b"\xff\xff\xff\xff\xff\x01not snappy", "body is not snappy"),
    "not protobuf": (remote_write.snappy(b"\x0a\xff\xff"), "not a remote read ReadRequest"),
    "no query": (read_request(), "0 queries in one request"),
    "no matcher": (read_request((T0_MS, T0_MS + MINUTE_MS, [])), "queries[0]: 0 matchers"),
    "bad type": (read_request((0, 1, [(7, "job", "api")])), "queries[0].matchers[0]: type 7"),
    "end first": (read_request((T0_MS, T0_MS - 1, EVERY_REQUEST)), "end_timestamp_ms is before"),
    "bad regex": (read_request((T0_MS, T0_MS + MINUTE_MS, [(RE, "job", "(")])), ""),
    "over the rows": (read_request((0, T0_MS + 90 * MINUTE_MS, EVERY_REQUEST)), "more than 50 samples"),
    "over the rows together": (
        read_request(*[(T0_MS, T0_MS + 4 * MINUTE_MS, [(EQ, "__name__", "fl_requests_total")])] * 2),
        "queries[0..1]: the query reads more than 50 samples",  # 26 each
    ),
    "chunks only": (remote_write.snappy(b"\x10\x01"), "answers SAMPLES (0) only"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_hostile_requests_answer_400_naming_the_problem(small_hub, case):
    body, reason = REFUSED[case]
    status, answer = post(small_hub, body)
    assert status == 400 and reason.encode() in answer, answer


def test_reading_needs_a_read_token(small_hub):
    body = read_request((T0_MS, T0_MS + MINUTE_MS, EVERY_REQUEST))
    assert post(small_hub, body)[0] == 200
    assert post(small_hub, body, "Bearer writer")[0] == 403
    assert post(small_hub, body, "")[0] == 401


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300))
def test_arbitrary_bytes_are_refused(small_hub, body):
    """Refused as a bad request, or as too large when the snappy header declares more than the body limit."""
    assert post(small_hub, body)[0] in (400, 413)


@settings(max_examples=200, deadline=None)
@given(message=st.binary(max_size=300))
def test_arbitrary_messages_never_fail_the_hub(small_hub, message):
    """Any bytes as the snappy-compressed message: refused with 400, or (by chance a valid ReadRequest)
    answered."""
    assert post(small_hub, remote_write.snappy(message))[0] in (200, 400)


def test_a_body_that_inflates_past_the_limit_is_refused_before_inflating(small_hub):
    status, answer = post(small_hub, b"\x80\x80\x80\x80\x0f")  # snappy's header: 4 GiB follow
    assert status == 413 and b"over the limit" in answer

"""One rule for names on every path into the store (collectors.steprecord.check_value): a job or node name
holding a control character (C0, DEL, C1) or a lone surrogate (bytes that were not UTF-8) is refused with
a 400 naming the record and the field, nothing of the request stored; any other text is stored as sent
and read back unchanged. The paths: step JSON lines (/api/v1/steps), OTLP (/v1/metrics, JSON and
protobuf), the step SDK, and remote write's node labels (/api/v1/write), each through a real hub and
chDB store."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from collectors.steprecord import read_step_records
from collectors.steps import StepTracker
from hub.app import Hub
from hub.otlp import PROTOBUF, OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.support import remote_write
from tests.support.clock import FakeClock
from tests.support.otlp import export, histogram, step_point
from tests.support.wsgi import wsgi_post

CONTROLS = [chr(code) for code in (*range(0x20), *range(0x7F, 0xA0))]
SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
PRINTABLE = st.characters(exclude_categories=("Cs",), exclude_characters=CONTROLS)
NAMES = st.text(PRINTABLE, min_size=1, max_size=24)
NOT_NAMES = st.tuples(
    st.text(PRINTABLE, max_size=8), st.sampled_from(CONTROLS) | SURROGATES, st.text(PRINTABLE, max_size=8)
).map("".join)
EXAMPLES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
RANKS = itertools.count(1)  # each example's records under a rank of their own: found again by it alone
JSON_MEDIA = "application/json"


@pytest.fixture
def hub(store, tmp_path: Path) -> Iterator[Hub]:
    served = Hub(store, Writer(store, Spool(tmp_path / "spool", 64 << 20)), OtlpStepReceiver())
    yield served
    served.writer.close()


def post(hub: Hub, path: str, body: bytes, content_type: str) -> tuple[int, bytes]:
    """(status, answer) of one POST from loopback, remote write's headers on its path."""
    headers = (
        {"HTTP_CONTENT_ENCODING": "snappy", "HTTP_X_PROMETHEUS_REMOTE_WRITE_VERSION": remote_write.VERSION}
        if path == "/api/v1/write"
        else {}
    )
    return wsgi_post(hub, path, body, content_type, environ=headers)


def stored_steps(hub: Hub, rank: int) -> list[tuple]:
    sql = "SELECT job, node FROM steps WHERE rank = {rank:UInt32}"
    return hub.store.query(sql, parameters={"rank": rank}).rows


def step_line(job: str, node: str, rank: int) -> str:
    record = {"ts": time.time(), "job": job, "rank": rank, "node": node, "step": 1, "duration_s": 0.5}
    return json.dumps(record) + "\n"


def otlp_body(job: str, node: str, rank: int, media: str) -> bytes:
    """An export of one rank's steps; in JSON the names go in as JSON escapes them (lone surrogates too)."""
    names = {"job": job, "node": node} if media == PROTOBUF else {"job": "JOB-NAME", "node": "NODE-NAME"}
    request = export(histogram(step_point(3, 1.5, start_ns=time.time_ns(), rank=rank, **names)))
    if media == PROTOBUF:
        return request.SerializeToString()
    text = json.dumps(json_format.MessageToDict(request))
    return text.replace('"JOB-NAME"', json.dumps(job)).replace('"NODE-NAME"', json.dumps(node)).encode()


def otlp_error(answer: bytes, media: str) -> str:
    """The message of an OTLP failure response: a google.rpc.Status, encoded as the request was."""
    return json.loads(answer)["message"] if media == JSON_MEDIA else Status.FromString(answer).message


@EXAMPLES
@given(name=NOT_NAMES, field=st.sampled_from(["job", "node"]))
def test_step_lines_with_a_control_character_in_a_name_are_refused_naming_line_and_field(hub, name, field):
    rank = next(RANKS)
    names = {"job": "job-a", "node": "vela-001", field: name}
    body = step_line("job-a", "vela-001", rank) + step_line(**names, rank=rank + 1_000_000)
    status, answer = post(hub, "/api/v1/steps", body.encode(), "application/x-ndjson")
    assert status == 400
    assert json.loads(answer)["error"].startswith(f"line 2: '{field}' must be printable Unicode: U+")
    assert stored_steps(hub, rank) == []  # the good line before it went with it


@EXAMPLES
@given(job=NAMES, node=NAMES)
def test_step_lines_with_printable_names_are_stored_as_sent(hub, job, node):
    rank = next(RANKS)
    status, answer = post(hub, "/api/v1/steps", step_line(job, node, rank).encode(), "application/x-ndjson")
    assert status == 200, answer
    assert stored_steps(hub, rank) == [(job, node)]


@EXAMPLES
@given(name=NOT_NAMES, field=st.sampled_from(["job", "node"]), media=st.sampled_from([PROTOBUF, JSON_MEDIA]))
def test_otlp_with_a_control_character_in_a_name_is_refused_whole_naming_the_attribute(
    hub, name, field, media
):
    assume(media == JSON_MEDIA or not any(0xD800 <= ord(c) <= 0xDFFF for c in name))  # protobuf: below
    rank = next(RANKS)
    names = {"job": "job-a", "node": "vela-001", field: name}
    status, answer = post(hub, "/v1/metrics", otlp_body(**names, rank=rank, media=media), media)
    assert status == 400
    attribute = ["job", "rank", "node"].index(field)
    assert f"histogram.data_points[0].attributes[{attribute}]" in otlp_error(answer, media)
    assert stored_steps(hub, rank) == []


@pytest.mark.parametrize("field", ["job", "node"])
def test_otlp_protobuf_strings_that_are_not_utf8_are_refused_not_rewritten(hub, field):
    rank = next(RANKS)
    names = {"job": "job-a", "node": "vela-001", field: "PLACEHOLDER"}
    body = otlp_body(**names, rank=rank, media=PROTOBUF).replace(b"PLACEHOLDER", b"PLACE\xed\xa0\x80\xffER")
    status, answer = post(hub, "/v1/metrics", body, PROTOBUF)
    assert status == 400
    assert "bad UTF-8" in otlp_error(answer, PROTOBUF)
    assert stored_steps(hub, rank) == []


@EXAMPLES
@given(job=NAMES, node=NAMES, media=st.sampled_from([PROTOBUF, JSON_MEDIA]))
def test_otlp_with_printable_names_is_stored_as_sent(hub, job, node, media):
    rank = next(RANKS)
    status, answer = post(hub, "/v1/metrics", otlp_body(job, node, rank, media), media)
    assert status == 200, answer
    assert stored_steps(hub, rank) == [(job, node)]


@EXAMPLES
@given(name=NOT_NAMES, field=st.sampled_from(["job", "node"]))
def test_the_step_sdk_refuses_a_control_character_in_a_name_when_it_starts(name, field):
    names = {"job": "job-a", "node": "vela-001", field: name}
    with pytest.raises(ValueError, match=f"^'{field}' must be printable Unicode: U"):
        StepTracker(**names, rank=0, environ={})


@EXAMPLES
@given(job=NAMES, node=NAMES)
def test_the_step_sdk_writes_printable_names_as_given(tmp_path_factory, job, node):
    path = tmp_path_factory.mktemp("sdk") / "steps.jsonl"
    clock = FakeClock()
    tracker = StepTracker(job=job, node=node, rank=0, clock=clock, environ={}, jsonl_path=path)
    with tracker.step():
        clock.advance(0.5)
    tracker.close()
    assert [(record.job, record.node) for record in read_step_records(path)] == [(job, node)]


def remote_write_body(labels: dict[str, str]) -> bytes:
    return remote_write.snappy(remote_write.encode([(labels, [(int(time.time() * 1000), 1.0)])]))


def stored_sample_nodes(hub: Hub, metric: str) -> list[tuple]:
    sql = "SELECT node FROM samples WHERE metric = {metric:String}"
    return hub.store.query(sql, parameters={"metric": metric}).rows


@EXAMPLES
@given(name=NOT_NAMES, label=st.sampled_from(["node", "Hostname", "instance"]))
def test_remote_write_with_a_control_character_in_a_node_label_is_refused_naming_the_series(hub, name, label):
    assume(not any(0xD800 <= ord(c) <= 0xDFFF for c in name))  # protobuf cannot carry them: below
    metric = f"names_test_{next(RANKS)}"
    good = {"__name__": metric, "node": "vela-001"}
    body = remote_write.encode([(good, [(int(time.time() * 1000), 1.0)])])
    body += remote_write.encode([({"__name__": metric, label: name}, [(int(time.time() * 1000), 1.0)])])
    status, answer = post(hub, "/api/v1/write", remote_write.snappy(body), remote_write.CONTENT_TYPE)
    assert status == 400
    assert json.loads(answer)["error"].startswith(f"timeseries[1]: label {label}, a node's name: ")
    assert stored_sample_nodes(hub, metric) == []


def test_remote_write_labels_that_are_not_utf8_are_refused(hub):
    metric = f"names_test_{next(RANKS)}"
    body = remote_write.encode([({"__name__": metric, "node": "PLACEHOLDER"}, [(1, 1.0)])])
    body = body.replace(b"PLACEHOLDER", b"PLACE\xed\xa0\x80\xffER")
    status, answer = post(hub, "/api/v1/write", remote_write.snappy(body), remote_write.CONTENT_TYPE)
    assert status == 400
    assert json.loads(answer)["error"].startswith("timeseries[0]: a label is not a valid Label")
    assert stored_sample_nodes(hub, metric) == []


@EXAMPLES
@given(node=NAMES)
def test_remote_write_with_a_printable_node_label_is_stored_as_sent(hub, node):
    metric = f"names_test_{next(RANKS)}"
    body = remote_write_body({"__name__": metric, "node": node})
    status, answer = post(hub, "/api/v1/write", body, remote_write.CONTENT_TYPE)
    assert status == 204, answer
    assert stored_sample_nodes(hub, metric) == [(node,)]

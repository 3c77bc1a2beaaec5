"""Property-based fuzzing of every POST endpoint of a real hub (real chDB store, writer and spool): whatever
the body, headers, content type and encoding, the answer is never a 5xx, and what it stores stays valid.

Bounded for `make test` (FUZZ_EXAMPLES per endpoint); set FLEETLENS_FUZZ_EXAMPLES for a longer run.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.app import Hub
from hub.bodies import ReceiverLimits
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.support import escapes
from tests.support.otlp import export, histogram, step_point
from tests.support.strategies import JSON_VALUES
from tests.support.wsgi import wsgi_post

FUZZ_EXAMPLES = int(os.environ.get("FLEETLENS_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MEDIA = ["application/json", "application/x-protobuf", "application/x-ndjson", "text/plain", "", "a/b;c=d"]
ENCODINGS = [None, "gzip", "identity", "br", "gzip, gzip", "\x00"]
# Words SQL is made of, and of the attacks on it, for statements near enough to SQL to reach the parser.
SQL_WORDS = [
    "SELECT",
    "FROM",
    "WHERE",
    "WITH",
    "AS",
    "UNION",
    "ALL",
    "INSERT",
    "INTO",
    "DROP",
    "TABLE",
    "SETTINGS",
    "FORMAT",
    "OUTFILE",
    "EXPLAIN",
    "samples",
    "steps",
    "metrics",
    "system.tables",
    "numbers",
    "file",
    "url",
    "remote",
    "sleep",
    "getSetting",
    "count",
    "(",
    ")",
    ",",
    ";",
    "*",
    "=",
    "'",
    '"',
    "`",
    "$$",
    "--",
    "/*",
    "*/",
    "\n",
    "1",
    "1e400",
    "-1",
    "NULL",
    "{x:String}",
    "{t:Identifier}",
]
json_values = JSON_VALUES
sql_texts = st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(SQL_WORDS), max_size=14).map(" ".join),
    st.sampled_from([sql for _, sql in escapes.attempts("/tmp/fuzz-canary", "127.0.0.1:9")]),
)


@pytest.fixture
def hub(store, tmp_path: Path) -> Iterator[Hub]:
    limits = ReceiverLimits(max_body_bytes=64 << 10, max_rows=1000)
    served = Hub(
        store,
        Writer(store, Spool(tmp_path / "spool", 64 << 20)),
        OtlpStepReceiver(limits),
        max_body_bytes=64 << 10,
        query_max_rows=1000,
        query_max_seconds=5,
    )
    yield served
    served.writer.close()


def call(
    hub: Hub,
    path: str,
    body: bytes,
    content_type: str = "",
    encoding: str | None = None,
    length: str | None = None,
) -> int:
    """The status of one POST, through the hub's WSGI app as its server calls it, from loopback."""
    headers = {} if encoding is None else {"HTTP_CONTENT_ENCODING": encoding}
    return wsgi_post(hub, path, body, content_type, environ=headers, length=length)[0]


def encoded(body: bytes, encoding: str | None) -> bytes:
    return gzip.compress(body) if encoding == "gzip" else body


PATHS = [
    "/v1/metrics",
    "/api/v1/steps",
    "/api/v1/sql",
    "/api/v1/silences",
    "/api/v1/actions",
    "/api/v1/topology",
    "/api/v1/checks",
]


@FUZZ
@given(
    path=st.sampled_from(PATHS),
    body=st.binary(max_size=512),
    content_type=st.sampled_from(MEDIA) | st.text(max_size=12),
    encoding=st.sampled_from(ENCODINGS),
    length=st.none() | st.sampled_from(["", "-1", "x", "1e3", "99999999999", "0"]),
)
def test_arbitrary_bytes_never_get_a_5xx(hub, path, body, content_type, encoding, length):
    assert call(hub, path, body, content_type, encoding, length) < 500


@FUZZ
@given(
    path=st.sampled_from(PATHS),
    value=json_values,
    content_type=st.sampled_from(MEDIA),
    encoding=st.sampled_from([None, "gzip"]),
)
def test_arbitrary_json_never_gets_a_5xx(hub, path, value, content_type, encoding):
    body = json.dumps(value).encode()
    assert call(hub, path, encoded(body, encoding), content_type, encoding) < 500


@FUZZ
@given(
    sql=sql_texts | json_values,
    max_rows=st.none() | json_values | st.integers(min_value=-2, max_value=10**20) | st.just(1e400),
    parameters=st.none() | st.dictionaries(st.text(max_size=6), json_values, max_size=3) | json_values,
)
def test_query_requests_never_get_a_5xx_and_refusals_say_why(hub, sql, max_rows, parameters):
    request = {"sql": sql}
    if max_rows is not None:
        request["max_rows"] = max_rows
    if parameters is not None:
        request["parameters"] = parameters
    body = json.dumps(request).encode()
    statuses = []
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/api/v1/sql",
        "REMOTE_ADDR": "127.0.0.1",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body),
    }
    answer = b"".join(hub.app(environ, lambda status, headers: statuses.append(int(status.split()[0]))))
    assert statuses[0] in (200, 400), answer
    if statuses[0] == 400:
        assert json.loads(answer)["error"].strip()


YAML_WORDS = [
    "nodes",
    "hosts",
    "leaves",
    "racks",
    "host",
    "rails",
    ":",
    "{",
    "}",
    "[",
    "]",
    "-",
    ",",
    "&a",
    "*a",
    "!!str",
    "!x",
    "\n",
    "\n  ",
    '"',
    "'",
    "#",
    "?",
    "|",
    ">",
    "001",
    "~",
    "\t",
    "\x00",
    "\u2028",
]


@FUZZ
@given(
    text=st.lists(st.sampled_from(YAML_WORDS), max_size=40).map(" ".join) | st.text(max_size=200),
    fields=st.dictionaries(st.sampled_from(["file", "reporter", "format", "x"]), json_values, max_size=2),
)
def test_topology_requests_never_get_a_5xx_and_refusals_say_why(hub, text, fields):
    body = json.dumps({"format": "inventory", "text": text, **fields}).encode()
    status, answer = wsgi_post(hub, "/api/v1/topology", body, "application/json")
    assert status in (200, 400), answer
    if status == 400:
        assert json.loads(answer)["error"].strip()


ROW_FIELDS = {
    "/api/v1/silences": ["id", "matchers", "starts_at", "ends_at", "created_by", "comment", "updated_at"],
    "/api/v1/actions": ["ts", "action", "node", "job", "reason", "mode", "outcome", "decision_id"],
}


@FUZZ
@given(
    path=st.sampled_from(sorted(ROW_FIELDS)),
    token=json_values,
    values=st.lists(st.lists(json_values, min_size=8, max_size=8), max_size=3),
    matchers=st.lists(
        st.tuples(st.text(max_size=6), st.sampled_from(["=", "!=", "=~", "!~", "=="]), st.text(max_size=8))
    ),
)
def test_silence_and_request_rows_never_get_a_5xx(hub, path, token, values, matchers):
    rows = []
    for row_values in values:
        row = dict(zip(ROW_FIELDS[path], row_values, strict=False))
        if path == "/api/v1/silences":
            row["matchers"] = json.dumps([list(matcher) for matcher in matchers])
        rows.append(row)
    body = json.dumps({"token": token, "rows": rows}).encode()
    assert call(hub, path, body, "application/json") < 500


@FUZZ
@given(data=st.data())
def test_mutated_otlp_exports_never_get_a_5xx(hub, data):
    good = bytearray(export(histogram(step_point(5, 2.5), step_point(5, 2.0, rank=4))).SerializeToString())
    for _ in range(data.draw(st.integers(min_value=1, max_value=6))):
        index = data.draw(st.integers(min_value=0, max_value=len(good) - 1))
        good[index] = data.draw(st.integers(min_value=0, max_value=255))
    encoding = data.draw(st.sampled_from([None, "gzip"]))
    assert call(hub, "/v1/metrics", encoded(bytes(good), encoding), "application/x-protobuf", encoding) < 500

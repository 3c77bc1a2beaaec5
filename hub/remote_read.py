"""Prometheus remote read from the hub's store, so that a Prometheus can use fleetlens as long-term storage:

    remote_read: [{url: http://hub:9464/api/v1/read, read_recent: true}]

A request is a snappy-compressed (block format) protobuf ReadRequest (prometheus/prompb); each of its
queries (matchers, start and end in milliseconds) is read with the same SQL as a PromQL selector
(hub.promql.sql) and answered in a SAMPLES ReadResponse, snappy-compressed too. The messages are
hub.prompb's, with remote write's.
A request the hub will never answer (not snappy, not a ReadRequest, no or too many queries, a bad matcher, a
response type other than SAMPLES only) is PayloadError 400 naming what is wrong.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import cramjam
from google.protobuf.message import DecodeError

from hub.errors import PayloadError, PromQLError
from hub.prompb import Label, ReadRequest, ReadResponse
from hub.promql.limits import Limits
from hub.promql.plan import Selector
from hub.promql.sql import Read, ReadNumbers, read_series
from hub.remote_write import unsnappy

CONTENT_TYPE = "application/x-protobuf"
MAX_QUERIES = 64  # queries in one request (Prometheus sends one per selector)
MAX_MATCHERS = 64  # matchers in one query
SAMPLES = 0  # ReadRequest.ResponseType SAMPLES; 1 is STREAMED_XOR_CHUNKS, not served
MATCH_TYPES = ("=", "!=", "=~", "!~")  # LabelMatcher.Type EQ, NEQ, RE, NRE


def answer_read(
    body: bytes, max_body_bytes: int, limits: Limits, read: Read, read_numbers: ReadNumbers
) -> bytes:
    """The snappy-compressed ReadResponse of a request whose series `read` finds and whose samples
    `read_numbers` fetches (hub.promql.sql.read_series), built within `limits`' time; PayloadError (400)
    naming what is wrong with a request that is refused or whose queries read more samples together
    than `read_numbers` allows, 413 when it inflates past `max_body_bytes`."""
    queries = [_selector(index, query) for index, query in enumerate(_request(body, max_body_bytes))]
    response = ReadResponse()
    for index, (selector, start_ms, end_ms) in enumerate(queries):
        result = response.results.add()
        try:
            found = read_series(read, read_numbers, selector, start_ms, end_ms, None)
        except PromQLError as error:
            if error.status != 422:
                raise
            raise _bad(f"queries[0..{index}]: {error}") from None
        for series in found:
            limits.check_time()
            encoded = result.timeseries.add()
            encoded.labels.extend(
                Label(name=name, value=value).SerializeToString() for name, value in series.labels
            )
            for ts_ms, value in zip(series.times.tolist(), series.values.tolist(), strict=True):
                encoded.samples.add(timestamp=ts_ms, value=value)
    return bytes(cramjam.snappy.compress_raw(response.SerializeToString()))


def _request(body: bytes, max_body_bytes: int) -> list[Any]:
    """The queries of a ReadRequest that asks for SAMPLES, 1 to MAX_QUERIES of them."""
    try:
        request = ReadRequest.FromString(unsnappy(body, max_body_bytes))
    except DecodeError as error:
        raise _bad(f"body is not a remote read ReadRequest (protobuf): {error}") from None
    accepted = list(request.accepted_response_types)
    if accepted and SAMPLES not in accepted:
        raise _bad(f"accepted_response_types {accepted}: this hub answers SAMPLES ({SAMPLES}) only")
    if not 0 < len(request.queries) <= MAX_QUERIES:
        raise _bad(f"{len(request.queries)} queries in one request; 1 to {MAX_QUERIES} are taken")
    return list(request.queries)


def _selector(index: int, query: Any) -> tuple[Selector, int, int]:
    """The selector and time range of queries[index]; PayloadError naming a matcher that is wrong."""
    matchers = list(query.matchers)
    if not matchers or len(matchers) > MAX_MATCHERS:
        raise _bad(f"queries[{index}]: {len(matchers)} matchers; 1 to {MAX_MATCHERS} are taken")
    for number, matcher in enumerate(matchers):
        if not 0 <= matcher.type < len(MATCH_TYPES) or not matcher.name:
            raise _bad(f"queries[{index}].matchers[{number}]: type {matcher.type} on label {matcher.name!r}")
    if query.end_timestamp_ms < query.start_timestamp_ms:
        raise _bad(f"queries[{index}]: end_timestamp_ms is before start_timestamp_ms")
    selector = Selector(tuple((m.name, MATCH_TYPES[m.type], m.value) for m in matchers), 0)
    return selector, query.start_timestamp_ms, query.end_timestamp_ms


def _bad(message: str) -> PayloadError:
    return PayloadError(HTTPStatus.BAD_REQUEST, message)

"""The scraper's HTTP reader against real loopback targets that frame their answers every way HTTP allows,
and some ways it does not: chunked bodies, bodies in tiny writes, a target closing mid-body, a flood of
headers, an oversized chunk, a bad status line, an idle keep-alive connection dropped. Each broken answer
fails only its own target, with an error naming what was wrong. And the hub's reader of request bodies
(RequestBody) on the chunked decoder they share: every split of a chunked body decodes to the body, and a
body refused past its limit is still read to its end to be discarded. (The hub's answers to such
requests over a real socket: tests/hub/test_security.py.)"""

from __future__ import annotations

import gzip
import io
import itertools
import re
import socket
import time
from collections.abc import Callable
from http import HTTPStatus

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.hostile_targets import TargetServer, body_server, serving
from hub.errors import BodyTooLarge, PayloadError, ScrapeError
from hub.httpread import MAX_HEAD_BYTES, MAX_HEADERS, ChunkedDecoder, RequestBody, ResponseReader
from hub.scraper import Scraper
from hub.targets import Target
from hub.targetsession import ScrapeLimits

BODY = b'# TYPE t gauge\nt{gpu="0"} 1\nt{gpu="1"} 2\n'
DEFAULT_LIMITS = ScrapeLimits()
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"


def answering(*parts: bytes, pause_s: float = 0.0, then_close: bool = True) -> Callable:
    """A target that answers each request with `parts`, each sent on its own (after `pause_s`)."""

    def handle(server: TargetServer, connection: socket.socket) -> None:
        while server.read_request(connection):
            for part in parts:
                connection.sendall(part)
                time.sleep(pause_s)
            if then_close:
                return

    return handle


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


def scrape(handler: Callable, limits: ScrapeLimits = DEFAULT_LIMITS, rounds: int = 1) -> list:
    """The statuses (and batch values) of `rounds` rounds of one target served by `handler`."""
    with (
        serving(handler) as server,
        Scraper(lambda: [Target(server.address)], timeout_s=1, limits=limits) as s,
    ):
        results = []
        for _ in range(rounds):
            batches, (status,) = s.scrape_once()
            results.append((status, [batch.values for batch in batches]))
        return results


def test_a_chunked_body_with_extensions_and_trailers_is_read_whole() -> None:
    body = chunked(BODY, 7).replace(b"\r\n", b";ext=1\r\n", 1)[: -len(b"\r\n")] + b"X-Trailer: 1\r\n\r\n"
    handler = answering(OK + b"Transfer-Encoding: chunked\r\n\r\n" + body, then_close=False)
    for status, values in scrape(handler, rounds=2):
        assert status.up, status.error
        assert values == [[1.0, 2.0]]


def test_a_gzipped_body_split_into_one_byte_writes_is_read_whole() -> None:
    payload = gzip.compress(BODY)
    head = OK + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(payload)
    whole = head + payload
    handler = answering(*(whole[i : i + 1] for i in range(len(whole))), pause_s=0.001)
    ((status, values),) = scrape(handler)
    assert status.up, status.error
    assert values == [[1.0, 2.0]]


def test_a_body_read_until_the_target_closes() -> None:
    ((status, values),) = scrape(answering(b"HTTP/1.0 200 OK\r\n\r\n", BODY))
    assert status.up and values == [[1.0, 2.0]]


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (
            OK + b"Content-Length: 1000\r\n\r\n" + BODY,
            f"connection closed while reading the body ({len(BODY)} bytes read)",
        ),
        (
            OK + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(BODY, 7)[:30],
            "connection closed while reading the body (17 bytes read)",
        ),
        (OK + b"X-Many: 1\r\n" * (MAX_HEADERS + 1) + b"\r\n", f"over {MAX_HEADERS} response headers"),
        (
            OK + b"X-Long: " + b"x" * MAX_HEAD_BYTES + b"\r\n\r\n",
            f"response head over {MAX_HEAD_BYTES} bytes",
        ),
        (
            OK + b"Transfer-Encoding: chunked\r\n\r\nffffffffffff\r\n",
            "body over max_body_bytes=4096 (a chunk of 281474976710655 bytes)",
        ),
        (OK + b"Transfer-Encoding: chunked\r\n\r\n-5\r\n", "bad chunk size line b'-5'"),
        (OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n", "chunk data not followed by CRLF: b'cd'"),
        (OK + b"Transfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding 'gzip'"),
        (OK + b"Content-Length: 5000\r\n\r\n", "body over max_body_bytes=4096"),
        (OK + b"Content-Length: -1\r\n\r\n", "bad Content-Length '-1'"),
        (OK + b"Content-Length: 3\r\nContent-Length: 4\r\n\r\n", "conflicting content-length headers"),
        (OK + b"Bad Header: 1\r\n\r\n", "bad header line b'Bad Header: 1'"),
        (b"ICY 200 OK\r\n\r\n", "bad status line b'ICY 200 OK'"),
        (b"HTTP/1.1 404 Not Found\r\n\r\n", "HTTP 404 Not Found"),
        (b"HTTP/1.1 200 OK\r\n", "connection closed before the end of the response head"),
    ],
)
def test_a_broken_answer_fails_its_scrape_naming_what_was_wrong(answer: bytes, error: str) -> None:
    ((status, values),) = scrape(answering(answer), ScrapeLimits(max_body_bytes=4096))
    assert (status.up, status.error, values) == (False, error, [])


def test_a_body_over_the_limit_read_until_close_is_stopped_while_reading() -> None:
    ((status, _),) = scrape(
        answering(b"HTTP/1.0 200 OK\r\n\r\n", b"x" * 5000), ScrapeLimits(max_body_bytes=4096)
    )
    assert status.error == "body over max_body_bytes=4096"


def test_an_idle_keep_alive_connection_the_target_dropped_is_retried_once_on_a_fresh_one() -> None:
    """The target answers one request per connection but says nothing of closing it, as a server whose
    idle timeout is shorter than the interval does: every round after the first is retried, and up."""

    def one_per_connection(server: TargetServer, connection: socket.socket) -> None:
        body_server(BODY)(server, _OneRequest(connection))

    results = scrape(one_per_connection, rounds=3)
    assert [status.error for status, _ in results] == ["", "", ""]
    assert all(values == [[1.0, 2.0]] for _, values in results)


class _OneRequest:
    """A connection that reads as closed after its first request has been answered."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection, self._answered = connection, False

    def recv(self, size: int) -> bytes:
        if self._answered:
            return b""
        return self._connection.recv(size)

    def sendall(self, data: bytes) -> None:
        self._connection.sendall(data)
        self._answered = data.endswith(b"\n")


def test_a_host_name_is_looked_up_and_scraped() -> None:
    with (
        serving(body_server(BODY)) as server,
        Scraper(lambda: [Target(server.address.replace("127.0.0.1", "localhost"))]) as s,
    ):
        batches, (status,) = s.scrape_once()
    assert status.up, status.error
    assert batches[0].values == [1.0, 2.0]


def test_the_reader_refuses_bytes_past_the_end_of_a_response() -> None:
    reader = ResponseReader(max_body_bytes=100)
    with pytest.raises(ScrapeError, match="bytes after the end of the response"):
        reader.feed(OK + b"Content-Length: 2\r\n\r\nabc")


def chunked_in(body: bytes, sizes: list[int]) -> bytes:
    """`body` in chunks of the given sizes (the last one takes the rest), with an extension and a trailer."""
    pieces, start = [], 0
    for size in [*sizes, len(body)]:
        if start < len(body):
            pieces.append(body[start : start + max(size, 1)])
            start += max(size, 1)
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    return chunks + b"0\r\nX-Trailer: 1\r\n\r\n"


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@given(
    body=st.binary(max_size=300),
    sizes=st.lists(st.integers(1, 64), max_size=8),
    cuts=st.lists(st.integers(0, 10_000), max_size=12),
)
def test_every_split_of_a_chunked_body_decodes_to_the_body(body, sizes, cuts):
    decoder = ChunkedDecoder(max_bytes=len(body))
    decoded = b"".join(part for piece in split(chunked_in(body, sizes), cuts) for part in decoder.feed(piece))
    assert decoder.done and decoded == body and decoder.size == len(body)


def test_a_chunk_past_the_limit_is_refused_before_its_data_and_the_decoder_can_read_on():
    decoder = ChunkedDecoder(max_bytes=10)
    raw = chunked_in(b"a" * 8 + b"b" * 20, [8])
    with pytest.raises(BodyTooLarge, match=r"body over max_body_bytes=10 \(a chunk of 20 bytes\)"):
        decoder.feed(raw)
    decoder.max_bytes = 1 << 20
    assert decoder.feed(b"") == [b"b" * 20] and decoder.done


def request(raw: bytes, **headers: str) -> tuple[RequestBody, io.BytesIO]:
    stream = io.BytesIO(raw)
    return RequestBody({"wsgi.input": stream, **headers}, max_bytes=10), stream


@given(body=st.binary(min_size=11, max_size=200), sizes=st.lists(st.integers(1, 64), max_size=4))
def test_a_request_body_over_the_limit_is_a_413_and_then_read_to_its_end(body, sizes):
    for framing in ("chunked", "length"):
        if framing == "chunked":
            raw = chunked_in(body, sizes)
            reader, stream = request(raw, HTTP_TRANSFER_ENCODING="chunked")
        else:
            raw = body
            reader, stream = request(raw, CONTENT_LENGTH=str(len(body)))
        with pytest.raises(PayloadError, match="max_body_bytes=10") as refused:
            reader.read()
        assert refused.value.status == HTTPStatus.REQUEST_ENTITY_TOO_LARGE
        reader.discard()
        assert stream.tell() == len(raw)  # all of it read: the client's last bytes were taken


@pytest.mark.parametrize(
    ("raw", "headers", "status", "problem"),
    [
        (b"abc", {"CONTENT_LENGTH": "5"}, 400, "the body ended after 3 of the 5 bytes"),
        (b"", {"CONTENT_LENGTH": "-1"}, 400, "Content-Length b'-1' is not a non-negative number"),
        (b"", {"CONTENT_LENGTH": "\u0661"}, 400, "is not a non-negative number"),  # a digit, but not ASCII
        (b"3\r\nabc\r\n", {"HTTP_TRANSFER_ENCODING": "chunked"}, 400, "closed inside the chunked body"),
        (b"3\r\nabcd\r\n", {"HTTP_TRANSFER_ENCODING": "chunked"}, 400, "chunk data not followed by CRLF"),
        (b"0\r\n\r\nPOST", {"HTTP_TRANSFER_ENCODING": "chunked"}, 400, "bytes after the end"),
        (b"", {"HTTP_TRANSFER_ENCODING": "chunked, chunked"}, 501, "is not supported"),
        (b"", {"HTTP_TRANSFER_ENCODING": "chunked", "CONTENT_LENGTH": "0"}, 400, "both"),
    ],
)
def test_a_request_body_framed_wrongly_is_refused_naming_how(raw, headers, status, problem):
    reader, _ = request(raw, **headers)
    with pytest.raises(PayloadError, match=re.escape(problem)) as refused:
        reader.read()
    assert refused.value.status == status

"""Strict readers of HTTP/1.x bodies from hostile peers: the scraper's responses and the hub's requests.

ResponseReader reads one response for the scraper's non-blocking sockets: the scraper feeds it whatever
bytes a target sent, as they arrive; it never does I/O itself. The head (status line and headers) is
bounded in size and header count, the body is refused as soon as its declared or received size passes
`max_body_bytes` (a Content-Length, a chunk size, or bytes read until the target closes), and every
malformed part (status line, header line, Content-Length, chunk size, chunk end) raises ScrapeError or
FramingError naming it. Bodies come framed by Content-Length, by chunked transfer coding, or by the target
closing the connection; only the first two leave the connection reusable, and only on HTTP/1.1 without
`Connection: close`.

RequestBody reads the body of one request to the hub's WSGI app, framed by Content-Length or chunked
(which the WSGI server leaves to the app), and refuses it with the status to answer (PayloadError): 413
once it declares or reaches more than the limit, 400 for broken framing. A refused or unread body is then
discarded, up to DISCARD_MAX_BYTES, after the answer is sent (`discard`, from the response's close), so
that a client still sending reads the answer instead of a connection reset.

ChunkedDecoder is the chunked transfer coding (RFC 9112 section 7.1) both read through.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from hub.errors import BodyTooLarge, FramingError, PayloadError, ScrapeError

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
_MAX_CHUNK_LINE = 1024
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: ([\x20-\x7e\x80-\xff\t]*))?")
_HEADER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\r\n\x00]*?)[ \t]*")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?")


def _shown(data: bytes) -> str:
    return repr(data[:80]) + ("..." if len(data) > 80 else "")


class ResponseReader:
    """Reads one response: `feed` the bytes received, `closed` when the target hangs up.

    Once `status` is set the status line has been read; `head_done` once all headers have. `feed`
    returns True when the response is complete; then `body` holds it (still encoded as
    `content_encoding` says) and `reusable` says whether the connection may carry the next request.
    `started` is whether any byte arrived (a reused connection that closes before one was dropped
    while idle, and is worth one retry).
    """

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.started = False
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.reusable = False
        self.body = b""
        self._buffer = bytearray()
        self._version = 1
        self._parts: list[bytes] = []
        self._size = 0
        self._length: int | None = None  # bytes of a Content-Length body still to come
        self._chunks: ChunkedDecoder | None = None
        self._done = False

    @property
    def content_encoding(self) -> str:
        return self.headers.get("content-encoding", "").strip().lower()

    def feed(self, data: bytes) -> bool:
        """Take the next bytes; True once the response is complete (later bytes are an error)."""
        if self._done:
            if data:
                raise ScrapeError("bytes after the end of the response")
            return True
        if data:
            self.started = True
        if not self.head_done:
            self._buffer += data
            if not self._read_head():
                return False
            data, self._buffer = bytes(self._buffer), bytearray()
        if self._chunks is not None:
            for part in self._chunks.feed(data):
                self._add(part)
            if self._chunks.done:
                self._finish()
        elif self._length is not None:
            self._add(data[: self._length])
            if len(data) > self._length:
                raise ScrapeError("bytes after the end of the response")
            self._length -= len(data)
            if self._length == 0:
                self._finish()
        else:
            self._add(data)
        return self._done

    def closed(self) -> None:
        """The target closed the connection: the end of a read-to-close body, else a cut-off response."""
        if self._done:
            return
        if self.head_done and self._chunks is None and self._length is None:
            self._finish()
            return
        if not self.head_done:
            raise ScrapeError("connection closed before the end of the response head")
        raise ScrapeError(f"connection closed while reading the body ({self._size} bytes read)")

    def _read_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise ScrapeError(f"response head over {MAX_HEAD_BYTES} bytes")
            if not self.status and b"\r\n" in self._buffer:
                self._status_line(bytes(self._buffer[: self._buffer.find(b"\r\n")]))
            return False
        if end > MAX_HEAD_BYTES:
            raise ScrapeError(f"response head over {MAX_HEAD_BYTES} bytes")
        lines = bytes(self._buffer[:end]).split(b"\r\n")
        del self._buffer[: end + 4]
        if not self.status:
            self._status_line(lines[0])
        if len(lines) - 1 > MAX_HEADERS:
            raise ScrapeError(f"over {MAX_HEADERS} response headers")
        for line in lines[1:]:
            self._header(line)
        self.head_done = True
        self._frame()
        return True

    def _status_line(self, line: bytes) -> None:
        match = _STATUS_LINE.fullmatch(line)
        if match is None:
            raise ScrapeError(f"bad status line {_shown(line)}")
        self._version, self.status = int(match[1]), int(match[2])
        self.reason = (match[3] or b"").decode("latin-1")
        if self.status != 200:
            raise ScrapeError(f"HTTP {self.status} {self.reason}".rstrip())

    def _header(self, line: bytes) -> None:
        match = _HEADER_LINE.fullmatch(line)
        if match is None:
            raise ScrapeError(f"bad header line {_shown(line)}")
        name, value = match[1].decode("ascii").lower(), match[2].decode("latin-1")
        framing = name in ("content-length", "transfer-encoding", "content-encoding")
        if framing and self.headers.get(name, value) != value:
            raise ScrapeError(f"conflicting {name} headers")
        self.headers[name] = value

    def _frame(self) -> None:
        """How the body ends, from the headers (RFC 9112 section 6.3)."""
        encoding = self.headers.get("transfer-encoding")
        length = self.headers.get("content-length")
        keep_alive = self._version == 1 and "close" not in self.headers.get("connection", "").lower()
        if encoding is not None:
            if encoding.strip().lower() != "chunked":
                raise ScrapeError(f"unsupported Transfer-Encoding {encoding!r}")
            self._chunks = ChunkedDecoder(self.max_body_bytes)
            self.reusable = keep_alive and length is None
        elif length is not None:
            if not length.isdigit() or len(length) > 16:
                raise ScrapeError(f"bad Content-Length {length[:40]!r}")
            self._length, self.reusable = int(length), keep_alive
            if self._length > self.max_body_bytes:
                raise ScrapeError(f"body over max_body_bytes={self.max_body_bytes}")
            if self._length == 0:
                self._finish()

    def _add(self, data: bytes) -> None:
        if not data:
            return
        self._size += len(data)
        if self._size > self.max_body_bytes:
            raise ScrapeError(f"body over max_body_bytes={self.max_body_bytes}")
        self._parts.append(data)

    def _finish(self) -> None:
        self.body = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts = []
        self._done = True


class ChunkedDecoder:
    """Decodes a chunked body fed in pieces of any size; `done` once its last chunk and trailers are read.

    Chunk extensions and trailers are read and dropped, each line bounded. FramingError names a malformed
    line, or bytes after the body's end; BodyTooLarge a chunk whose declared size would take the body past
    `max_bytes`, before any of its data is read. After BodyTooLarge the decoder stands where that chunk's
    data begins, so that with a larger `max_bytes` it can read on (to discard the rest).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0  # body bytes decoded so far
        self.done = False
        self._buffer = bytearray()
        self._length = 0  # bytes of the current chunk still to come
        self._state = "size"  # size, data, crlf, trailers
        self._trailers = 0

    def feed(self, data: bytes) -> list[bytes]:
        """The body bytes decoded from `data` and from what earlier pieces left undecoded."""
        if self.done:
            if data:
                raise FramingError("bytes after the end of the chunked body")
            return []
        buffer = self._buffer
        buffer += data
        parts = []
        while buffer and not self.done:
            if self._state == "data":
                take = bytes(buffer[: self._length])
                parts.append(take)
                del buffer[: len(take)]
                self.size += len(take)
                self._length -= len(take)
                if self._length == 0:
                    self._state = "crlf"
                continue
            end = buffer.find(b"\r\n")
            limit = MAX_HEAD_BYTES if self._state == "trailers" else _MAX_CHUNK_LINE
            if end < 0:
                if len(buffer) > limit:
                    raise FramingError(f"chunk {self._state} line over {limit} bytes")
                break
            line = bytes(buffer[:end])
            del buffer[: end + 2]
            if self._state == "crlf":
                if line:
                    raise FramingError(f"chunk data not followed by CRLF: {_shown(line)}")
                self._state = "size"
            elif self._state == "size":
                self._chunk_size(line)
            elif not line:  # the empty line after the trailers
                if buffer:
                    raise FramingError("bytes after the end of the chunked body")
                self.done = True
            else:
                self._trailers += 1
                if self._trailers > MAX_HEADERS:
                    raise FramingError(f"over {MAX_HEADERS} trailer lines")
        return parts

    def _chunk_size(self, line: bytes) -> None:
        match = _CHUNK_SIZE.fullmatch(line)
        if match is None:
            raise FramingError(f"bad chunk size line {_shown(line)}")
        size = int(match[1], 16)
        self._length = size
        self._state = "data" if size else "trailers"
        if self.size + size > self.max_bytes:
            raise BodyTooLarge(f"body over max_body_bytes={self.max_bytes} (a chunk of {size} bytes)")


DISCARD_MAX_BYTES = 64 << 20
"""Bytes of a refused or unread request body read and dropped after the answer is sent, so that a client
that sends its whole body before it reads gets the answer. Past it the connection is closed at once, and
such a client may see a reset instead."""
DISCARD_MAX_S = 30.0  # and for at most this long (each read also ends at the server's socket timeout)
_READ_SIZE = 1 << 16


class RequestBody:
    """The body of one request to a WSGI app, from `environ` as wsgiref's server gives it.

    Framed by Content-Length, or by `Transfer-Encoding: chunked` (the only coding taken; 501 for others).
    Both at once is a 400: ambiguous framing is how requests are smuggled past proxies. Nothing is read
    until `read` or `discard` is called, so a request refused on its headers reads none of its body.
    """

    def __init__(self, environ: Mapping[str, Any], max_bytes: int) -> None:
        self._input = environ.get("wsgi.input")
        self._max_bytes = max_bytes
        self._content_length = environ.get("CONTENT_LENGTH") or ""
        self._coding = environ.get("HTTP_TRANSFER_ENCODING")
        self._left = 0  # bytes of a Content-Length body not read yet
        self._chunks: ChunkedDecoder | None = None  # a chunked body's decoder
        self._framed = False

    def read(self) -> bytes:
        """The whole body; PayloadError with the status to answer when it is refused."""
        self._frame()
        try:
            return self._read_length() if self._chunks is None else self._read_chunked(self._chunks)
        except TimeoutError:
            raise PayloadError(HTTPStatus.REQUEST_TIMEOUT, "the body did not arrive in time") from None
        except OSError as error:
            raise PayloadError(HTTPStatus.BAD_REQUEST, f"the body could not be read: {error}") from None

    def discard(self) -> None:
        """Read and drop what is left of the body, up to DISCARD_MAX_BYTES and DISCARD_MAX_S; stop quietly
        at the first error (broken framing, a client gone or silent): the connection closes after it."""
        try:
            self._frame()
        except PayloadError:
            return  # no framing to follow
        chunks = self._chunks
        if chunks is None and not 0 < self._left <= DISCARD_MAX_BYTES:
            return  # all read, or more than the budget: reading part of it helps no client
        if chunks is not None:
            chunks.max_bytes = sys.maxsize  # every piece is dropped: only the budget counts
        deadline = time.monotonic() + DISCARD_MAX_S
        budget = DISCARD_MAX_BYTES
        data = b""
        try:
            while True:
                if chunks is not None:
                    chunks.feed(data)  # the first time, what the last read left undecoded
                    if chunks.done:
                        return
                elif not self._left:
                    return
                if budget <= 0 or time.monotonic() > deadline:
                    return
                data = self._input.read1(min(_READ_SIZE, budget, self._left or budget))
                if not data:
                    return
                budget -= len(data)
                if chunks is None:
                    self._left -= len(data)
        except (OSError, FramingError):
            return

    def _frame(self) -> None:
        """How the body ends, from the headers (RFC 9112 section 6.3); PayloadError if it cannot be told."""
        if self._framed:
            return
        if self._coding is not None:
            if self._content_length:
                raise PayloadError(
                    HTTPStatus.BAD_REQUEST,
                    "both Transfer-Encoding and Content-Length: send one, to say where the body ends",
                )
            if self._coding.strip().lower() != "chunked":
                raise PayloadError(
                    HTTPStatus.NOT_IMPLEMENTED,
                    f"Transfer-Encoding {_quoted(self._coding)} is not supported; send chunked or a "
                    "Content-Length",
                )
            self._chunks = ChunkedDecoder(self._max_bytes)
        else:
            text = self._content_length or "0"
            if not (text.isascii() and text.isdigit()) or len(text) > 18:
                raise PayloadError(
                    HTTPStatus.BAD_REQUEST, f"Content-Length {_quoted(text)} is not a non-negative number"
                )
            self._left = int(text)
        self._framed = True

    def _read_length(self) -> bytes:
        declared = self._left
        if declared > self._max_bytes:
            raise PayloadError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"body of {declared} bytes is over the limit of max_body_bytes={self._max_bytes}",
            )
        body = self._input.read(declared) if declared else b""
        self._left = declared - len(body)
        if self._left:
            raise PayloadError(
                HTTPStatus.BAD_REQUEST,
                f"the body ended after {len(body)} of the {declared} bytes its Content-Length declared",
            )
        return body

    def _read_chunked(self, chunks: ChunkedDecoder) -> bytes:
        parts: list[bytes] = []
        try:
            while not chunks.done:
                data = self._input.read1(_READ_SIZE)
                if not data:
                    raise PayloadError(
                        HTTPStatus.BAD_REQUEST,
                        f"the connection closed inside the chunked body ({chunks.size} bytes read)",
                    )
                parts += chunks.feed(data)
        except BodyTooLarge as error:
            raise PayloadError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(error)) from None
        except FramingError as error:
            raise PayloadError(HTTPStatus.BAD_REQUEST, str(error)) from None
        return b"".join(parts)


def _quoted(header: str) -> str:
    """A header's value for a message: at most 80 characters, control characters escaped."""
    return _shown(header.encode("latin-1", errors="replace"))

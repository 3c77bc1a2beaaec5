"""A strict, incremental reader of one HTTP/1.x response, for the scraper's non-blocking sockets.

The scraper feeds it whatever bytes a target sent, as they arrive; it never does I/O itself. The bytes
are treated as hostile: the head (status line and headers) is bounded in size and header count, the
body is refused as soon as its declared or received size passes `max_body_bytes` (a Content-Length, a
chunk size, or bytes read until the target closes), and every malformed part (status line, header line,
Content-Length, chunk size, chunk end) raises ScrapeError naming it. Bodies come framed by
Content-Length, by chunked transfer coding, or by the target closing the connection; only the first two
leave the connection reusable, and only on HTTP/1.1 without `Connection: close`.
"""

from __future__ import annotations

import re

from hub.errors import ScrapeError

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
        self._length: int | None = None  # bytes of body (or of the current chunk) still to come
        self._chunked = False
        self._chunk_state = "size"  # size, data, crlf, trailers
        self._trailers = 0
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
        if self._chunked:
            self._buffer += data
            self._read_chunks()
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
        if self.head_done and not self._chunked and self._length is None:
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
            self._chunked, self.reusable = True, keep_alive and length is None
        elif length is not None:
            if not length.isdigit() or len(length) > 16:
                raise ScrapeError(f"bad Content-Length {length[:40]!r}")
            self._length, self.reusable = int(length), keep_alive
            if self._length > self.max_body_bytes:
                raise ScrapeError(f"body over max_body_bytes={self.max_body_bytes}")
            if self._length == 0:
                self._finish()

    def _read_chunks(self) -> None:
        buffer = self._buffer
        while buffer and not self._done:
            if self._chunk_state == "data":
                take = buffer[: self._length]
                self._add(bytes(take))
                del buffer[: len(take)]
                self._length -= len(take)
                if self._length == 0:
                    self._chunk_state = "crlf"
                continue
            end = buffer.find(b"\r\n")
            limit = MAX_HEAD_BYTES if self._chunk_state == "trailers" else _MAX_CHUNK_LINE
            if end < 0:
                if len(buffer) > limit:
                    raise ScrapeError(f"chunk {self._chunk_state} line over {limit} bytes")
                return
            line = bytes(buffer[:end])
            del buffer[: end + 2]
            if self._chunk_state == "crlf":
                if line:
                    raise ScrapeError(f"chunk data not followed by CRLF: {_shown(line)}")
                self._chunk_state = "size"
            elif self._chunk_state == "size":
                self._chunk_size(line)
            elif not line:  # the empty line after the trailers
                if buffer:
                    raise ScrapeError("bytes after the end of the response")
                self._finish()
            else:
                self._trailers += 1
                if self._trailers > MAX_HEADERS:
                    raise ScrapeError(f"over {MAX_HEADERS} trailer lines")

    def _chunk_size(self, line: bytes) -> None:
        match = _CHUNK_SIZE.fullmatch(line)
        if match is None:
            raise ScrapeError(f"bad chunk size line {_shown(line)}")
        size = int(match[1], 16)
        if self._size + size > self.max_body_bytes:
            raise ScrapeError(f"body over max_body_bytes={self.max_body_bytes} (a chunk of {size} bytes)")
        self._length = size
        self._chunk_state = "data" if size else "trailers"

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

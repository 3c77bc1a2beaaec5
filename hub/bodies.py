"""What every request body the hub takes goes through: its media type, its size before and after gzip
(as the OTLP specification asks: a small gzip bomb must not inflate into gigabytes; MAX_GZIP_MEMBERS
bounds the members of one body), UTF-8, and the one error that refuses it whole.

PayloadError carries the HTTP status to answer (400 bad data, 413 too large, 415 unsupported
Content-Type or Content-Encoding) and a message naming the problem and where.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from http import HTTPStatus

from hub.errors import PayloadError

JSON = "application/json"

MAX_GZIP_MEMBERS = 64
"""Members one gzip body may have. Real senders send one; each further member costs a new inflater, so
a body of many tiny members is refused rather than inflated member by member."""
_GZIP_CHUNK = 1 << 16  # bytes fed to an inflater at a time: what it copies at a member's end is this much


@dataclass(frozen=True)
class ReceiverLimits:
    """What one request may hold; the defaults are the hub config's (OTLP recommends 20 MiB bodies)."""

    max_body_bytes: int = 16 << 20  # also after decompression
    max_label_length: int = 4096  # characters of one attribute value (job, node, ...)
    max_rows: int = 100_000  # step rows (OTLP: step series points) in one request


DEFAULT_LIMITS = ReceiverLimits()


def media_type(content_type: str | None) -> str:
    """The media type of a Content-Type header, without parameters such as charset."""
    return (content_type or "").partition(";")[0].strip().lower()


def unsupported_media(content_type: str | None, accepted: tuple[str, ...]) -> PayloadError:
    return PayloadError(
        HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
        f"Content-Type {content_type!r} is not accepted here; send one of {', '.join(accepted)}",
    )


def decompressed(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """The body as sent before any Content-Encoding; PayloadError when it is, or inflates, over `limit`."""
    if len(body) > limit:
        raise PayloadError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {len(body)} bytes exceeds the limit of {limit}"
        )
    coding = (content_encoding or "identity").strip().lower()
    if coding == "identity":
        return body
    if coding not in ("gzip", "x-gzip"):
        raise PayloadError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Encoding {content_encoding!r} is not supported; send gzip or no encoding",
        )
    return gunzip(body, limit)


def gunzip(body: bytes, limit: int) -> bytes:
    """Inflate every gzip member of `body` (at most MAX_GZIP_MEMBERS), stopping as soon as the output
    passes `limit` bytes."""
    inflated = bytearray()
    view = memoryview(body)
    start = members = 0
    while start < len(body):
        if members == MAX_GZIP_MEMBERS:
            raise PayloadError(
                HTTPStatus.BAD_REQUEST,
                f"gzip body has more than {MAX_GZIP_MEMBERS} members (the next at byte {start}); "
                "send one gzip stream",
            )
        start = _inflate_member(view, start, inflated, limit)
        members += 1
    return bytes(inflated)


def _inflate_member(view: memoryview, start: int, inflated: bytearray, limit: int) -> int:
    """Append the gzip member at byte `start` of `view` to `inflated`; the offset of the byte after it.

    The input goes in in chunks: an inflater copies whatever follows its member's end (unused_data), and
    a whole body's rest per member would make many members cost quadratic time.
    """
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    offset = start
    while not inflater.eof:
        if offset == len(view):
            raise PayloadError(HTTPStatus.BAD_REQUEST, "gzip body is truncated")
        chunk = view[offset : offset + _GZIP_CHUNK]
        offset += len(chunk)
        try:  # output capped at limit + 1 bytes: reaching the cap is refused below, so no input waits
            inflated += inflater.decompress(chunk, limit + 1 - len(inflated))
        except zlib.error as error:
            raise PayloadError(
                HTTPStatus.BAD_REQUEST, f"gzip body is corrupt (member at byte {start}): {error}"
            ) from None
        if len(inflated) > limit:
            raise PayloadError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"gzip body of {len(view)} bytes inflates past the limit of {limit} bytes",
            )
    return offset - len(inflater.unused_data)


def utf8_text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        line = body.count(b"\n", 0, error.start) + 1
        raise PayloadError(
            HTTPStatus.BAD_REQUEST, f"line {line}: byte {error.start} of the body is not UTF-8"
        ) from None


def label_too_long(where: str, length: int, limits: ReceiverLimits) -> PayloadError:
    return PayloadError(
        HTTPStatus.BAD_REQUEST,
        f"{where}: value of {length} characters is longer than the limit of {limits.max_label_length}",
    )

"""The errors the hub raises, as one tree.

    HubError
    ├── ExpositionError     a scraped body breaks the text format or a limit (expfmt)
    │   └── DeadlineExceeded    parsing used up the CPU time a scrape's parse may take
    ├── ScraperConfigError  a targets file, shard or scrape setting is unusable (targets, scraper)
    ├── ScrapeError         a target answered, but not with a usable body (targetsession, httpread)
    ├── FramingError        an HTTP body's framing is broken: a chunk line, its end (httpread)
    │   └── BodyTooLarge        the body declares or grows past its limit
    ├── PayloadError        a request body refused whole, with the HTTP status to answer (bodies)
    ├── TokenFileError      the token file cannot be read or has a bad line (auth)
    ├── SlotsBusy           no query slot came free for a client in time (queryslots)
    ├── SpoolEntryError     a spool file, or a batch to spool, not one whole entry of its format (spool)
    ├── SettingError        a hub part built with a setting out of its range (queryslots, spool, otlp)
    ├── HttpError           an API answer other than 200/204, with its status and body (app, apirequests)
    ├── PromQLError         a PromQL request refused, with Prometheus's error type and status (promql)
    ├── PollFailed          a scheduler could not be asked what runs where: its placements stay (placements)
    └── UnknownRecordType   rows of a type no store insert takes, handed to the writer (a bug; writer)

A failed scrape or a refused body costs only itself: the scraper records `up 0` with the message, the
API answers the status with it (HttpError). Each message names the target, line, field or file it is
about. SpoolEntryError and SettingError are ValueErrors too, as bad values are in Python.
UnknownRecordType is a bug in the hub, never bad input: it propagates to whoever wrote the rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from http import HTTPStatus


class HubError(Exception):
    """Base of every error the hub raises."""


class ExpositionError(HubError):
    """A scrape body is not valid Prometheus text format, or exceeds a limit; the message says where."""


class DeadlineExceeded(ExpositionError):
    """Parsing used up its CPU time; `lineno` is the line it had reached."""

    def __init__(self, lineno: int) -> None:
        super().__init__(f"parsing used up its CPU time (line {lineno})")
        self.lineno = lineno


class ScraperConfigError(HubError):
    """A targets file, shard or scrape setting is invalid; the message names which one and why."""


class ScrapeError(HubError):
    """A target answered, but not with a usable body (HTTP status, size limit, encoding)."""


class FramingError(HubError):
    """An HTTP body's framing (chunk size line, chunk end, trailers) is malformed; the message quotes it."""


class BodyTooLarge(FramingError):
    """An HTTP body declares or reaches more bytes than its reader's limit."""


class PayloadError(HubError):
    """A request body refused as a whole; `status` is the HTTP status to answer it with."""

    def __init__(self, status: HTTPStatus, problem: str) -> None:
        super().__init__(problem)
        self.status = status


class TokenFileError(HubError):
    """The token file cannot be read or has a bad line; the message names the file and line, never a token."""


class SlotsBusy(HubError):
    """No query slot came free for a client in time; `retry_after_s` is when one will have, at the latest."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SpoolEntryError(HubError, ValueError):
    """Bytes that are not one whole spool entry (torn, not inflating, not the format), or a batch the
    format cannot hold; the message says which."""


class SettingError(HubError, ValueError):
    """A hub part built with a setting out of its range; the message names the setting and the range."""


class HttpError(HubError):
    """An API answer other than 200/204: by default a JSON {"error": message}, or the given body, with
    `headers` besides Content-Type (429's Retry-After)."""

    def __init__(
        self,
        status: int,
        message: str,
        body: bytes | None = None,
        content_type: str = "application/json",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = json.dumps({"error": message}).encode() if body is None else body
        self.content_type = content_type
        self.headers = list(headers)


class PromQLError(HubError):
    """A PromQL request refused or failed: the HTTP status and Prometheus's `errorType` (bad_data,
    execution, unavailable, timeout), answered in Prometheus's error envelope."""

    def __init__(self, message: str, error_type: str = "bad_data", status: int = 400) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.status = status


class UnknownRecordType(HubError):
    """Rows of a type the writer has no store insert for: a bug in the caller, never bad input."""


class PollFailed(HubError):
    """A scheduler (squeue, the API server) could not be asked what runs where; the message says why."""

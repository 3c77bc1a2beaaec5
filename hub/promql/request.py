"""The parameters of a PromQL request as Prometheus's HTTP API takes them: the query string of a GET, or
the form body of a POST (its values first, then the query string's), read into a Request.

`time`, `start` and `end` are unix seconds or RFC 3339; `step` is seconds or a duration (`15s`, `1m30s`);
`timeout` is accepted and ignored. A missing `time` is now. Anything else is PromQLError (bad_data) naming
the parameter, its outside text escaped and cut short.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from dataclasses import dataclass
from datetime import datetime

import promql_parser

from collectors.logtext import printable
from hub.bodies import media_type
from hub.errors import PromQLError

FORM = "application/x-www-form-urlencoded"
MAX_POINTS = 11_000  # steps after the start a range query may hold, as Prometheus limits them
MAX_TIMESTAMP_MS = 2**62 // 1000  # far beyond any stored sample, well inside what the arithmetic holds


@dataclass(frozen=True)
class Request:
    """One query: its PromQL text and the evaluation times, start to end every step (milliseconds)."""

    query: str
    start_ms: int
    end_ms: int
    step_ms: int
    is_range: bool

    def times(self) -> range:
        return range(self.start_ms, self.end_ms + 1, self.step_ms)


def read_request(
    is_range: bool, method: str, query_string: str, content_type: str | None, body: bytes, now: float
) -> Request:
    """The Request of an instant (`is_range` False) or range query; PromQLError naming what is wrong."""
    values = _parameters(method, query_string, content_type, body)
    query = values.get("query", "")
    if not is_range:
        at = time_ms("time", values["time"]) if "time" in values else round(now * 1000)
        return Request(query, at, at, 1, False)
    for name in ("start", "end", "step"):
        if name not in values:
            raise PromQLError(f'invalid parameter "{name}": missing')
    start, end = time_ms("start", values["start"]), time_ms("end", values["end"])
    step = _duration_ms("step", values["step"])
    if end < start:
        raise PromQLError('invalid parameter "end": end timestamp must not be before start time')
    if step <= 0:
        raise PromQLError(
            'invalid parameter "step": zero or negative query resolution step widths are not accepted. '
            "Try a positive integer"
        )
    if (end - start) // step > MAX_POINTS:
        raise PromQLError(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query "
            "resolution (?step=XX)"
        )
    return Request(query, start, end, step, True)


def _parameters(method: str, query_string: str, content_type: str | None, body: bytes) -> dict[str, str]:
    """Each parameter's first value: a POST's form values before the query string's, as Go's FormValue."""
    values: dict[str, str] = {}
    for name, value in form_pairs(method, query_string, content_type, body):
        values.setdefault(name, value)
    return values


def form_pairs(
    method: str, query_string: str, content_type: str | None, body: bytes
) -> list[tuple[str, str]]:
    """Every (name, value) of a request: a POST's form values before the query string's, as Go's Form."""
    texts = [query_string]
    if method == "POST" and body:
        kind = media_type(content_type)
        if kind == "application/json":
            raise PromQLError(_json_refusal(body))
        if kind != FORM:
            raise PromQLError(f"a POST's body must be {FORM}, not {printable(kind or 'none')[:100]!r}")
        texts.insert(0, _text(body))
    pairs: list[tuple[str, str]] = []
    for text in texts:
        try:
            pairs += urllib.parse.parse_qsl(text, keep_blank_values=True, errors="strict")
        except (ValueError, UnicodeDecodeError):
            raise PromQLError("the parameters are not valid URL-encoded UTF-8") from None
    return pairs


def _json_refusal(body: bytes) -> str:
    """Why a JSON body is refused: SQL, which has a path of its own now, or not a PromQL request at all."""
    try:
        holds_sql = isinstance(request := json.loads(body), dict) and "sql" in request
    except (ValueError, RecursionError):
        holds_sql = False
    if holds_sql:
        return "SQL moved to POST /api/v1/sql; /api/v1/query answers PromQL (query=..., time=...)"
    return f"a POST's body must be {FORM} (query=..., time=...), not JSON"


def _text(body: bytes) -> str:
    try:
        return body.decode("ascii")
    except UnicodeDecodeError:
        raise PromQLError("a form body is URL-encoded ASCII") from None


def time_ms(name: str, text: str) -> int:
    """Unix seconds (a float) or RFC 3339, as milliseconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = _rfc3339_seconds(text)
    if not math.isfinite(seconds) or abs(seconds * 1000) > MAX_TIMESTAMP_MS:
        raise PromQLError(
            f'invalid parameter "{name}": cannot parse {printable(text)[:100]!r} to a valid timestamp'
        )
    return round(seconds * 1000)


def _rfc3339_seconds(text: str) -> float:
    """Unix seconds of an RFC 3339 time (with its zone, as RFC 3339 requires); NaN when it is none."""
    try:
        moment = datetime.fromisoformat(text) if "T" in text.upper() else None
    except ValueError:
        return math.nan
    if moment is None or moment.tzinfo is None:
        return math.nan
    try:
        return moment.timestamp()
    except (OverflowError, OSError):
        return math.nan


def _duration_ms(name: str, text: str) -> int:
    """Seconds (a float) or a Prometheus duration, as milliseconds."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = promql_parser.parse_duration(text).total_seconds()
        except (ValueError, OverflowError):
            seconds = math.nan
    if not math.isfinite(seconds) or abs(seconds * 1000) > MAX_TIMESTAMP_MS:
        raise PromQLError(
            f'invalid parameter "{name}": cannot parse {printable(text)[:100]!r} to a valid duration'
        )
    return round(seconds * 1000)

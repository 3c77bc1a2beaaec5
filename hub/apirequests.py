"""The hub API's request bodies and query strings read into what its handlers take.

Each reader takes a request whole or raises HttpError(400) naming the field, row or parameter that does
not fit, its outside text escaped and cut short; nothing of a refused request is used. JSON bodies are
objects nested at most MAX_JSON_DEPTH deep.
"""

from __future__ import annotations

import json
import math
import urllib.parse
from dataclasses import dataclass, fields
from typing import Any

from analytics.store.retention import check_keep_days
from collectors.logtext import printable
from hub.errors import HttpError

MAX_JSON_DEPTH = 32  # nesting of the API's JSON bodies, far more than any of them needs


def keep_days_parameter(query: str) -> int | None:
    """?keep_days=N of /api/v1/steps (1 to KEEP_DAYS_MAX), None without it; 400 naming the parameter."""
    try:
        parameters = urllib.parse.parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise HttpError(400, f"query string {printable(query)[:200]!r}: expected keep_days=N") from None
    if unknown := sorted(set(parameters) - {"keep_days"}):
        shown = printable(", ".join(unknown))[:200]
        raise HttpError(400, f"unknown query parameter(s) {shown}: /api/v1/steps takes only keep_days")
    values = parameters.get("keep_days")
    if values is None:
        return None
    if len(values) > 1:
        raise HttpError(400, "keep_days: given more than once")
    try:
        return check_keep_days(values[0])
    except ValueError as exc:
        raise HttpError(400, printable(str(exc))[:300]) from None


def json_object(body: bytes, shape: str) -> dict:
    """The body as a JSON object, at most MAX_JSON_DEPTH deep; 400 naming the expected `shape` if not."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        raise HttpError(400, f"expected a JSON object {shape}") from None
    if not isinstance(value, dict):
        raise HttpError(400, f"expected a JSON object {shape}, got {_json_type(value)}")
    if _depth(value) > MAX_JSON_DEPTH:
        raise HttpError(400, f"JSON nested more than {MAX_JSON_DEPTH} deep")
    return value


def _depth(value: Any, limit: int = MAX_JSON_DEPTH + 1) -> int:
    """How deep `value` nests, counted up to `limit`."""
    if limit <= 0 or not isinstance(value, dict | list):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(item, limit - 1) for item in items), default=0)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "an array", str: "a string", type(None): "null"}.get(
        type(value), "a number"
    )


def query_request(body: bytes, max_rows_limit: int) -> tuple[str, int, dict[str, Any]]:
    """sql, max_rows (at most the limit) and parameters of a query request; 400 naming a bad field."""
    request = json_object(body, '{"sql": "...", "max_rows"?: int, "parameters"?: {name: value}}')
    if unknown := sorted(set(request) - {"sql", "max_rows", "parameters"}):
        raise HttpError(
            400, f"unknown field(s) {printable(', '.join(unknown))[:200]}: send sql, max_rows, parameters"
        )
    sql = request.get("sql")
    if not isinstance(sql, str):
        raise HttpError(400, f"sql: expected a string, got {_json_type(sql)}")
    max_rows = request.get("max_rows", max_rows_limit)
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise HttpError(400, f"max_rows: expected a positive integer, got {_json_type(max_rows)}")
    parameters = request.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise HttpError(
            400, f"parameters: expected an object of names and values, got {_json_type(parameters)}"
        )
    for name, value in parameters.items():
        if not _parameter_value(value):
            shown = printable(name)[:64]
            raise HttpError(400, f"parameters.{shown}: expected a string, number, boolean or a list of them")
    return sql, min(max_rows, max_rows_limit), parameters


def _parameter_value(value: Any) -> bool:
    """A query parameter a {name:Type} placeholder can take: text, a finite number, a boolean, or a list."""
    if isinstance(value, list):
        return all(_parameter_value(item) for item in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str | int | bool)


def record_rows(body: bytes, record: type) -> tuple[list, str]:
    """{"token": str, "rows": [{column: value}]} as records; 400 naming the row and field that do not fit."""
    shape = '{"token": "...", "rows": [{...}]}'
    request = json_object(body, shape)
    token, entries = request.get("token"), request.get("rows")
    if not isinstance(token, str) or not token or not isinstance(entries, list):
        raise HttpError(400, f"expected a JSON object {shape} with a non-empty token")
    types = {f.name: f.type for f in fields(record)}
    rows = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != set(types):
            raise HttpError(400, f"rows[{index}]: expected exactly the columns {', '.join(types)}")
        for name, kind in types.items():
            if not _fits(entry[name], kind):
                raise HttpError(400, f"rows[{index}].{name}: expected {kind}, got {_json_type(entry[name])}")
        rows.append(record(**entry))
    return rows, token


def _fits(value: Any, kind: str) -> bool:
    """Whether a JSON value fits a record field of annotated type `kind` (str, float, or bool)."""
    if kind == "str":
        return isinstance(value, str)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return kind == "bool" and isinstance(value, bool)


@dataclass(frozen=True)
class TopologyRequest:
    """POST /api/v1/topology: `text` in `format`, from `file` (named in errors), said by `reporter`."""

    format: str
    text: str
    file: str
    reporter: str


def topology_request(body: bytes) -> TopologyRequest:
    """{"format", "text", "file"?, "reporter"?}, every field a string; 400 naming a bad field."""
    shape = '{"format": "inventory", "text": "...", "file"?: "...", "reporter"?: "..."}'
    request = json_object(body, shape)
    if unknown := sorted(set(request) - {"format", "text", "file", "reporter"}):
        raise HttpError(
            400, f"unknown field(s) {printable(', '.join(unknown))[:200]}: send format, text, file, reporter"
        )
    if not isinstance(request.get("format"), str) or not isinstance(request.get("text"), str):
        raise HttpError(400, f"expected a JSON object {shape} with format and text strings")
    for name in ("file", "reporter"):
        if not isinstance(request.get(name, ""), str):
            raise HttpError(400, f"{name}: expected a string, got {_json_type(request[name])}")
    file = printable(request.get("file") or "the request")[:200]
    return TopologyRequest(request["format"], request["text"], file, request.get("reporter", ""))

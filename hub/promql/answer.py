"""Results and errors in Prometheus's JSON envelope: {"status": "success", "data": {"resultType": ...,
"result": ...}} or {"status": "error", "errorType": ..., "error": ...}; each value a [unix seconds,
"text"] pair, the text as Go's strconv.FormatFloat(v, 'f', -1, 64) writes it (NaN, +Inf, -Inf)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from decimal import Decimal

from hub.promql.sql import Labels

Points = tuple[list[int], list[float]]  # one series' times (ms) and values, in time order


def number_text(value: float) -> str:
    """The shortest text that reads back as `value`, without an exponent, as Prometheus writes values."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)  # the shortest digits that read back, as Go's; an exponent from 1e16 or below 1e-4
    if "e" in text:
        text = format(Decimal(text), "f")
    return text.removesuffix(".0") if "." in text else text


def point(t_ms: int, value: float) -> list:
    return [t_ms / 1000, number_text(value)]


def success(result_type: str, result: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": result_type, "result": result}}).encode()


def error(error_type: str, message: str) -> bytes:
    return json.dumps({"status": "error", "errorType": error_type, "error": message}).encode()


def vector(values: dict[Labels, float], t_ms: int) -> bytes:
    result = [
        {"metric": dict(labels), "value": point(t_ms, value)} for labels, value in sorted(values.items())
    ]
    return success("vector", result)


def matrix(series: dict[Labels, Points]) -> bytes:
    """A matrix written as text piece by piece: a long range answer holds a million points, and a list
    per point for json.dumps cost more than the query. A value's text is digits, a sign, a point, NaN or
    Inf, which need no escaping; a time in seconds is Python's float text, valid JSON, written once per
    time whatever the number of series."""
    stamps: dict[int, str] = {}
    parts = []
    for labels, (times, values) in sorted(series.items()):
        for t in times:
            if t not in stamps:
                stamps[t] = repr(t / 1000)
        pairs = zip(map(stamps.__getitem__, times), number_texts(values), strict=True)
        text = ",".join(f'[{stamp},"{value}"]' for stamp, value in pairs)
        parts.append(f'{{"metric":{json.dumps(dict(labels))},"values":[{text}]}}')
    return ('{"status":"success","data":{"resultType":"matrix","result":[' + ",".join(parts) + "]}}").encode()


def number_texts(values: Sequence[float]) -> list[str]:
    """number_text of each value: repr at C speed, number_text only for an exponent, NaN or Inf."""
    return [
        number_text(value) if "e" in text or "n" in text else text.removesuffix(".0")
        for text, value in zip(map(repr, values), values, strict=True)
    ]


def scalar(value: float, t_ms: int) -> bytes:
    return success("scalar", point(t_ms, value))

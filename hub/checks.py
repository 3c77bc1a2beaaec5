"""POST /api/v1/checks: active checks' verdicts (`fleetlens checks run --hub`) read into records.CheckRow.

The body is a JSON array of result objects, or JSON lines of them, each with exactly the fields of
collectors.checks.result.CheckResult (evidence optional). Every field is judged by an allowlist: node and
target names as topology names (analytics.topology.names), check names and units short identifiers,
status one of PASS|WARN|FAIL|ERROR, numbers finite, evidence a small JSON object. One bad result refuses
the request whole: HttpError(400) naming its index and field, outside text escaped and cut short.

LatestChecks reads the last stored result of each node, check and target of the past LATEST_WINDOW_S from
the checks table at each scrape, for the hub's /metrics gauge in IBM Autopilot's shape
(autopilot-daemon/pkg/utils/prometheus.go): a restarted hub shows what its store holds.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from analytics.errors import StoreError, TopologyError
from analytics.store.checks import latest_checks
from analytics.store.records import CHECK_STATUSES, CheckRow
from analytics.store.topology import Reader
from analytics.topology.names import checked_name
from collectors.logtext import printable
from hub.errors import HttpError

MAX_RESULTS = 10_000  # results in one request: a node's checks are a few hundred at most
MAX_EVIDENCE_CHARS = 16_384  # a result's evidence, as JSON
MAX_DURATION_S = 86_400.0
LATEST_START = 4_102_444_800.0  # 2100-01-01: a start past it is a broken clock, not a check
_CHECK_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
_UNIT = re.compile(r"[A-Za-z0-9_/%.]{0,32}\Z")
_TARGET_KIND = re.compile(r"[a-z]{1,16}\Z")
_REQUIRED = ("node", "check", "target", "status", "value", "unit", "threshold", "started", "duration_s")
_FIELDS = frozenset((*_REQUIRED, "evidence"))


def check_rows(body: bytes) -> list[CheckRow]:
    """The results a request's body holds, each checked (module doc); HttpError(400) for any that is not."""
    entries = _entries(body)
    if len(entries) > MAX_RESULTS:
        raise HttpError(400, f"{len(entries)} results in one request, over {MAX_RESULTS}")
    return [_row(index, entry) for index, entry in enumerate(entries)]


def _entries(body: bytes) -> list[Any]:
    """The JSON values of an array body or of a JSON-lines body."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HttpError(400, "the body is not UTF-8") from None
    try:
        if text.lstrip().startswith("["):
            return json.loads(text)
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except (ValueError, RecursionError):
        raise HttpError(400, "expected a JSON array of check results, or JSON lines of them") from None


def _row(index: int, entry: Any) -> CheckRow:
    where = f"checks[{index}]"
    if not isinstance(entry, dict):
        raise HttpError(400, f"{where}: expected an object with the fields {', '.join(_REQUIRED)}")
    if unknown := sorted(set(entry) - _FIELDS):
        raise HttpError(400, f"{where}: unknown field(s) {printable(', '.join(unknown))[:200]}")
    if missing := [name for name in _REQUIRED if name not in entry]:
        raise HttpError(400, f"{where}: missing field(s) {', '.join(missing)}")
    return CheckRow(
        node=_name(entry["node"], f"{where}.node"),
        check=_matching(entry["check"], _CHECK_NAME, f"{where}.check", "a lower-case identifier"),
        target=_target(entry["target"], f"{where}.target"),
        status=_status(entry["status"], f"{where}.status"),
        value=_optional_number(entry["value"], f"{where}.value"),
        unit=_matching(entry["unit"], _UNIT, f"{where}.unit", "up to 32 letters, digits, _ / % ."),
        threshold=_optional_number(entry["threshold"], f"{where}.threshold"),
        evidence=_evidence(entry.get("evidence", {}), f"{where}.evidence"),
        started=_bounded(entry["started"], f"{where}.started", LATEST_START),
        duration_s=_bounded(entry["duration_s"], f"{where}.duration_s", MAX_DURATION_S),
    )


def _name(value: Any, where: str) -> str:
    try:
        return checked_name(value, source="request", where=where)
    except TopologyError as exc:
        raise HttpError(400, str(exc)[:500]) from None


def _target(value: Any, where: str) -> str:
    """ "" (the whole node) or KIND:NAME, e.g. gpu:3, nic:mlx5_2, peer:vela-007."""
    if value == "":
        return value
    if not isinstance(value, str) or not _TARGET_KIND.match(value.partition(":")[0]) or ":" not in value:
        raise HttpError(400, f'{where}: expected "" or KIND:NAME (gpu:3, peer:vela-007)')
    kind, _, name = value.partition(":")
    return f"{kind}:{_name(name, where)}"


def _matching(value: Any, pattern: re.Pattern[str], where: str, expected: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        shown = printable(value)[:80] if isinstance(value, str) else type(value).__name__
        raise HttpError(400, f"{where}: expected {expected}, got {shown!r}")
    return value


def _status(value: Any, where: str) -> str:
    if value not in CHECK_STATUSES or not isinstance(value, str):
        raise HttpError(400, f"{where}: expected one of {', '.join(CHECK_STATUSES)}")
    return value


def _optional_number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise HttpError(400, f"{where}: expected a finite number or null")
    return float(value)


def _bounded(value: Any, where: str, most: float) -> float:
    number = _optional_number(value, where)
    if number is None or not 0 <= number <= most:
        raise HttpError(400, f"{where}: expected a number from 0 to {most:g}")
    return number


def _evidence(value: Any, where: str) -> str:
    if not isinstance(value, dict):
        raise HttpError(400, f"{where}: expected a JSON object")
    try:
        text = json.dumps(value, allow_nan=False)
    except (ValueError, RecursionError):
        raise HttpError(400, f"{where}: holds a number that is not finite, or nests too deep") from None
    if len(text) > MAX_EVIDENCE_CHARS:
        raise HttpError(400, f"{where}: {len(text)} characters of JSON, over {MAX_EVIDENCE_CHARS}")
    return text


LATEST_WINDOW_S = 86_400.0  # a result older than a day is no longer the node's health
UNHEALTHY = frozenset({"FAIL", "ERROR"})


class LatestChecks:
    """The last stored result of each (node, check, target) started in the past LATEST_WINDOW_S, as
    Autopilot's gauge `autopilot_health_checks{health, node, deviceid}`: health is the check, deviceid the
    GPU index for a gpu:N target, else the target itself (empty for the whole node); the value is the
    measured value where the check has one, else 0 for PASS or WARN and 1 for FAIL or ERROR (Autopilot's
    0 pass, 1 fail). A store that cannot answer leaves the gauge out of that scrape, never stale."""

    def __init__(self, reader: Reader, clock: Callable[[], float] = time.time) -> None:
        self._reader = reader
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._clock()
        try:
            rows = latest_checks(self._reader, now - LATEST_WINDOW_S, now + 1.0)
        except StoreError:
            return
        gauge = GaugeMetricFamily(
            "autopilot_health_checks",
            "The last result of each health check on each node and device in the past day (fleetlens "
            "checks run): the measured value, or 0 for PASS/WARN and 1 for FAIL/ERROR.",
            labels=["health", "node", "deviceid"],
        )
        for row in rows:
            kind, _, name = row.target.partition(":")
            value = float(row.status in UNHEALTHY) if row.value is None else row.value
            gauge.add_metric([row.check, row.node, name if kind == "gpu" else row.target], value)
        yield gauge

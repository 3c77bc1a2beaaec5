"""POST /v1/metrics: the step SDK's OTLP/HTTP histograms (protobuf or JSON) turned into step records.

    OtlpStepReceiver.receive(body, content_type, content_encoding) -> OtlpResult

A request is taken whole or refused whole: PayloadError (hub.bodies) names the problem and its field path,
such as resource_metrics[0].scope_metrics[0].metrics[2], and a refused request leaves the receiver's
state as it was. Every row must fit the store's `steps` columns (collectors.steprecord: UINT32_MAX,
UINT64_MAX, TS_RANGE_S): a value that cannot be stored is a 400 naming it, never a 200 for rows the store
then refuses. Unknown fields are ignored, as the OTLP specification requires of receivers.

A job or node attribute that is no name (collectors.steprecord.check_value: a control character, a lone
surrogate) refuses the whole request with a 400 naming the point and attribute, as any malformed
attribute does, rather than a partial success: the OTLP specification leaves that choice to the receiver,
and a whole refusal is what the sender's log shows. Invalid UTF-8 in a protobuf string is refused by the
protobuf parser itself (a 400, "malformed protobuf"); nothing is rewritten.

Points older than the steps retention cutoff (`cutoff`, from the hub) would be dropped by the store's TTL:
they are rejected as an OTLP partial success (rejected_data_points, with the cutoff in error_message), the
rest of the request stored. A rejected point leaves its series where it was, so with cumulative
temporality the next export that is not too old carries its steps.
"""

from __future__ import annotations

import collections
import json
import math
import reprlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, HistogramDataPoint, Metric

from analytics.store.retention import Cutoff
from collectors.steprecord import (
    NAME_KEYS,
    PHASE_DURATION,
    PHASES,
    STEP_DURATION,
    TS_RANGE_S,
    TS_RANGE_TEXT,
    UINT32_MAX,
    StepRecord,
    check_value,
)
from hub.bodies import (
    DEFAULT_LIMITS,
    JSON,
    ReceiverLimits,
    decompressed,
    label_too_long,
    media_type,
    unsupported_media,
    utf8_text,
)
from hub.errors import PayloadError, SettingError

PROTOBUF = "application/x-protobuf"

# The step SDK's metrics, and the attributes that every point of each must have.
_STEP_METRICS = {
    STEP_DURATION: ("job", "rank", "node"),
    PHASE_DURATION: ("job", "rank", "node", "phase"),
}
_TOPOLOGY = ("dp_rank", "pp_stage", "tp_rank")
_ATTRIBUTE_KINDS = {
    "job": "string_value",
    "node": "string_value",
    "phase": "string_value",
    "rank": "int_value",
    **dict.fromkeys(_TOPOLOGY, "int_value"),
}
_CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
_INT64_LIMIT = 1 << 63  # counts at or above it are negative int64 values sent as unsigned
_TS_RANGE_NS = tuple(int(bound) * 10**9 for bound in TS_RANGE_S)
_PROBLEMS_SHOWN = 5


@dataclass(frozen=True, slots=True)
class OtlpResponse:
    """What to answer an OTLP/HTTP request with: encoded like the request, as the specification requires."""

    status: HTTPStatus
    content_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class OtlpResult:
    """The rows of one accepted export, its response, and the data points that gave no row.

    `ignored_points` belong to other metrics than the step SDK's; `rejected_points` are step points this
    receiver cannot use (reported to the sender as a partial success), among them points older than the
    retention cutoff, of which `expired_rows` would have been rows.
    """

    rows: list[StepRecord]
    response: OtlpResponse
    ignored_points: int
    rejected_points: int
    expired_rows: int = 0


def otlp_error_response(error: PayloadError, content_type: str | None) -> OtlpResponse:
    """The OTLP failure response for a refused request: a google.rpc.Status with the error's message."""
    media = JSON if media_type(content_type) == JSON else PROTOBUF
    return _encoded(Status(message=str(error)), media, error.status)


SeriesKey = tuple[str, int, str, str | None]  # job, rank, node, phase (None: the step histogram itself)


@dataclass(frozen=True, slots=True)
class _StepPoint:
    """One validated histogram point of the step SDK's metrics, and its field path in the request."""

    path: str
    key: SeriesKey
    topology: dict[str, int]
    cumulative: bool
    start_ns: int
    time_ns: int
    count: int
    sum: float


@dataclass(slots=True)
class _Cumulative:
    """What a series had reached at its last export, and when (wall clock) this receiver saw it."""

    start_ns: int
    count: int
    sum: float
    seen_at: float


@dataclass(slots=True)
class _Delta:
    """What a series added in one request; `total` is its cumulative count after it."""

    steps: int
    seconds: float
    total: int
    point: _StepPoint


@dataclass
class _Triage:
    """The usable step points of one request, and the count of everything else in it."""

    points: list[_StepPoint] = field(default_factory=list)
    ignored: int = 0
    rejected: int = 0
    expired_rows: int = 0
    problems: list[str] = field(default_factory=list)

    def reject(self, points: int, problem: str) -> None:
        self.rejected += points
        self.problems.append(problem)

    def expire(self, cutoff: Cutoff) -> None:
        """Reject the points older than `cutoff`, in one problem that names it."""
        old = [point for point in self.points if point.time_ns / 1e9 < cutoff.at]
        if not old:
            return
        self.points = [point for point in self.points if point.time_ns / 1e9 >= cutoff.at]
        self.expired_rows = sum(1 for point in old if point.key[3] is None)
        first = old[0].path
        self.reject(len(old), f"{len(old)} data points (the first {first}) {cutoff.describe()}, not stored")


class OtlpStepReceiver:
    """Turns the step SDK's histograms into one StepRecord per series (job, rank, node) and export.

    Per series and per phase it keeps the last cumulative count and sum; each export then yields
    steps = count delta, duration_s = sum delta / steps, compute_s (comm_s, data_s) = that phase's sum
    delta / steps (per step like duration_s, so that x * steps is the interval's total; None when no step
    entered the phase), and step = cumulative count - 1 (the last step's number, from 0 since the
    exporting process started; the trainer's own numbering only travels in JSON lines). A new
    start_time_unix_nano, or a count or sum going down, is a restarted process: its cumulative values
    are the delta. Delta temporality is taken as sent; its step numbers count from the first export
    this receiver saw.

    The state is in memory only. A series first seen with a start time before this receiver was created
    (the hub restarted under a running job) only sets the baseline: a hub restart loses one export
    interval of every rank (this assumes the ranks' clocks and the hub's agree, as NTP keeps them).
    Series silent for `forget_after_s` (finished jobs) are forgotten, and the same rule then covers one
    that comes back. At most `max_series` series are kept (a rank has up to four: its steps and three
    phases, so the default holds 25,000 ranks): past it the least recently seen are forgotten first, by
    the same rule, and counted in `forgotten_series`; a fleet that keeps it climbing needs a larger
    bound, as each of its ranks then loses an export interval whenever it comes back. One receiver
    serves all of the hub's request threads.

    Counters for the hub to export: `forgotten_series` (series dropped to stay within max_series, a
    counter) and `series` (series held now, a gauge).
    """

    def __init__(
        self,
        limits: ReceiverLimits = DEFAULT_LIMITS,
        *,
        forget_after_s: float = 3600.0,
        max_series: int = 100_000,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if max_series < 1:
            raise SettingError(f"max_series must be at least 1, got {max_series}")
        self.limits = limits
        self.forgotten_series = 0
        self._forget_after_s = forget_after_s
        self._max_series = max_series
        self._wall_clock = wall_clock
        self._complete_since_ns = int(wall_clock() * 1e9)  # every export since then has been seen
        self._series: collections.OrderedDict[SeriesKey, _Cumulative] = collections.OrderedDict()
        self._lock = threading.Lock()

    @property
    def series(self) -> int:
        """Series (job, rank, node, phase) held now."""
        return len(self._series)

    def receive(
        self,
        body: bytes,
        content_type: str | None,
        content_encoding: str | None = None,
        *,
        cutoff: Cutoff | None = None,
    ) -> OtlpResult:
        """The rows of one `POST /v1/metrics` body; PayloadError (and no change) when it is refused.
        Points older than `cutoff` are rejected (a partial success), the others taken."""
        media = media_type(content_type)
        if media not in (PROTOBUF, JSON):
            raise unsupported_media(content_type, (PROTOBUF, JSON))
        request = _decode_request(decompressed(body, content_encoding, self.limits.max_body_bytes), media)
        triage = _triage(request, self.limits)
        if cutoff is not None:
            triage.expire(cutoff)
        step_points = sum(1 for point in triage.points if point.key[3] is None)
        if step_points > self.limits.max_rows:
            raise PayloadError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{step_points} step series points in one request, more than the limit of "
                f"{self.limits.max_rows}; export more often or from fewer ranks per exporter",
            )
        with self._lock:
            rows = self._advance(triage.points)
        return OtlpResult(
            rows, _success_response(triage, media), triage.ignored, triage.rejected, triage.expired_rows
        )

    def _advance(self, points: Iterable[_StepPoint]) -> list[StepRecord]:
        """The rows of `points`; their series move to them only once every row fits the store."""
        now = self._wall_clock()
        moved: dict[SeriesKey, _Cumulative] = {}
        deltas: dict[SeriesKey, _Delta] = {}
        for point in points:
            last = moved[point.key] if point.key in moved else self._series.get(point.key)
            steps, seconds, moved[point.key] = self._step_forward(last, point, now)
            if earlier := deltas.get(point.key):
                steps, seconds = steps + earlier.steps, seconds + earlier.seconds
            deltas[point.key] = _Delta(steps, seconds, moved[point.key].count, point)
        rows = _rows(deltas)
        for key, state in moved.items():
            self._series.pop(key, None)
            self._series[key] = state  # to the end: the dict stays ordered by when each was last seen
        self._forget(now)
        return rows

    def _step_forward(
        self, last: _Cumulative | None, point: _StepPoint, now: float
    ) -> tuple[int, float, _Cumulative]:
        """(steps, seconds) that `point` adds to its series, whose state was `last`, and its new state."""
        if not point.cumulative:
            count, total_seconds = (last.count, last.sum) if last else (0, 0.0)
            state = _Cumulative(point.start_ns, count + point.count, total_seconds + point.sum, now)
            return point.count, point.sum, state
        state = _Cumulative(point.start_ns, point.count, point.sum, now)
        if last is None and point.start_ns < self._complete_since_ns:
            return 0, 0.0, state  # earlier exports of it may have been stored: a baseline only
        restarted = last is None or (
            point.start_ns != last.start_ns or point.count < last.count or point.sum < last.sum
        )
        if restarted:
            return point.count, point.sum, state
        return point.count - last.count, point.sum - last.sum, state

    def _forget(self, now: float) -> None:
        """Drop the series not heard from in forget_after_s, then the least recently seen ones past
        max_series; the least recently seen are first in the ordered dict.

        Whatever began before a forgotten series was last seen might be that series coming back, so
        only what began later counts as wholly new.
        """
        horizon = now - self._forget_after_s
        while self._series:
            key, oldest = next(iter(self._series.items()))
            silent = oldest.seen_at < horizon
            if not silent and len(self._series) <= self._max_series:
                return
            del self._series[key]
            if not silent:
                self.forgotten_series += 1
            self._complete_since_ns = max(self._complete_since_ns, int(oldest.seen_at * 1e9))


def _decode_request(body: bytes, media: str) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    if media == PROTOBUF:
        try:
            request.ParseFromString(body)
        except DecodeError as error:
            raise PayloadError(
                HTTPStatus.BAD_REQUEST,
                f"malformed protobuf: the {len(body)}-byte body is not an ExportMetricsServiceRequest "
                f"({error})",
            ) from None
        return request
    try:
        _json_to_message(json.loads(utf8_text(body)), request, "")
    except json.JSONDecodeError as error:
        raise PayloadError(
            HTTPStatus.BAD_REQUEST,
            f"malformed or truncated JSON at line {error.lineno} column {error.colno}: {error.msg}",
        ) from None
    except RecursionError:
        raise PayloadError(HTTPStatus.BAD_REQUEST, "JSON nested too deeply") from None
    return request


def _json_to_message(value: Any, message: Message, path: str) -> None:
    """Fill `message` from its OTLP/JSON form; PayloadError naming the field path of what is wrong.

    json_format alone is too lenient for untrusted bodies (it reads a string where an object belongs as
    an empty message) and names no index in most of its errors, so messages are walked here and only
    their scalar fields are left to json_format (int64 as strings, "NaN", enums as integers). Keys are
    lowerCamelCase as the OTLP specification says; snake_case is read too, as the OpenTelemetry
    Collector does; unknown keys are ignored, as the specification requires. traceId and spanId (hex in
    OTLP/JSON, base64 in proto3 JSON) only occur in exemplars, which no row is made from.
    """
    where = path or "body"
    if not isinstance(value, dict):
        raise PayloadError(
            HTTPStatus.BAD_REQUEST, f"{where}: expected a JSON object, got {_json_type(value)}"
        )
    descriptor = message.DESCRIPTOR
    scalars: dict[str, Any] = {}
    oneofs_set: set[str] = set()
    for key, item in value.items():
        known = descriptor.fields_by_camelcase_name.get(key) or descriptor.fields_by_name.get(key)
        if known is None or item is None:
            continue
        field_path = f"{path}.{known.name}" if path else known.name
        if oneof := known.containing_oneof:
            if oneof.name in oneofs_set:
                raise PayloadError(
                    HTTPStatus.BAD_REQUEST, f"{where}: more than one field of oneof {oneof.name}"
                )
            oneofs_set.add(oneof.name)
        if known.message_type is None:
            scalars[known.name] = item
        elif known.is_repeated:
            if not isinstance(item, list):
                raise PayloadError(
                    HTTPStatus.BAD_REQUEST, f"{field_path}: expected a JSON array, got {_json_type(item)}"
                )
            for index, element in enumerate(item):
                _json_to_message(element, getattr(message, known.name).add(), f"{field_path}[{index}]")
        else:
            child = getattr(message, known.name)
            child.SetInParent()
            _json_to_message(item, child, field_path)
    try:
        json_format.ParseDict(scalars, message)
    except (json_format.ParseError, OverflowError) as error:  # overflow: an integer past a double's range
        raise PayloadError(HTTPStatus.BAD_REQUEST, f"{where}: {error}") from None


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, int | float) else "null"
    )


def _metrics(request: ExportMetricsServiceRequest) -> Iterator[tuple[str, Metric]]:
    """Every metric of the request with its field path."""
    for r, resource_metrics in enumerate(request.resource_metrics):
        for s, scope_metrics in enumerate(resource_metrics.scope_metrics):
            for m, metric in enumerate(scope_metrics.metrics):
                yield f"resource_metrics[{r}].scope_metrics[{s}].metrics[{m}]", metric


def _triage(request: ExportMetricsServiceRequest, limits: ReceiverLimits) -> _Triage:
    """Validate the step SDK's points; PayloadError for malformed ones, rejections for unusable ones."""
    triage = _Triage()
    for path, metric in _metrics(request):
        kind = metric.WhichOneof("data")
        points = getattr(metric, kind).data_points if kind else ()
        described = f"{path} ({metric.name})"
        if metric.name not in _STEP_METRICS:
            triage.ignored += len(points)
        elif kind != "histogram":
            triage.reject(len(points), f"{described} is a {kind or 'metric without data'}, not a histogram")
        elif metric.histogram.aggregation_temporality not in (_CUMULATIVE, _DELTA):
            triage.reject(
                len(points),
                f"{described} has aggregation temporality {metric.histogram.aggregation_temporality}, "
                "neither delta (1) nor cumulative (2)",
            )
        else:
            cumulative = metric.histogram.aggregation_temporality == _CUMULATIVE
            for index, point in enumerate(metric.histogram.data_points):
                point_path = f"{path}.histogram.data_points[{index}]"
                attributes = _step_attributes(point, point_path, _STEP_METRICS[metric.name], limits)
                phase = attributes.get("phase") if metric.name == PHASE_DURATION else None
                if phase is not None and phase not in PHASES:
                    triage.reject(1, f"{point_path}: unknown phase {phase!r}; phases are {', '.join(PHASES)}")
                    continue
                triage.points.append(_step_point(point, point_path, attributes, phase, cumulative))
    return triage


def _step_attributes(
    point: HistogramDataPoint, path: str, required: tuple[str, ...], limits: ReceiverLimits
) -> dict[str, str | int]:
    """The identity and topology attributes of a point, type-checked; PayloadError naming a bad one."""
    found: dict[str, str | int] = {}
    for index, attribute in enumerate(point.attributes):
        kind = attribute.value.WhichOneof("value")
        value = getattr(attribute.value, kind) if kind else None
        too_long = isinstance(value, str | bytes) and len(value) > limits.max_label_length
        expected = _ATTRIBUTE_KINDS.get(attribute.key)
        mistyped = expected is not None and (
            kind != expected or (kind == "int_value" and not 0 <= value <= UINT32_MAX)
        )
        if too_long or mistyped:  # the message is only built for the rare bad attribute
            where = f"{path}.attributes[{index}] ({reprlib.repr(attribute.key)})"
            if too_long:
                raise label_too_long(where, len(value), limits)
            wanted = f"an int_value from 0 to {UINT32_MAX}" if expected == "int_value" else "a string_value"
            raise PayloadError(
                HTTPStatus.BAD_REQUEST,
                f"{where}: must be {wanted}, got {kind or 'no value'} {reprlib.repr(value)}",
            )
        if attribute.key in NAME_KEYS:
            try:
                check_value(attribute.key, value)
            except ValueError as error:
                raise PayloadError(HTTPStatus.BAD_REQUEST, f"{path}.attributes[{index}]: {error}") from None
        if expected is not None:
            found[attribute.key] = value
    if missing := [name for name in required if name not in found]:
        raise PayloadError(HTTPStatus.BAD_REQUEST, f"{path}: missing attribute(s) {', '.join(missing)}")
    return found


def _step_point(
    point: HistogramDataPoint, path: str, attributes: dict[str, Any], phase: str | None, cumulative: bool
) -> _StepPoint:
    """The point's numbers, checked; PayloadError naming the field that no step could have produced."""
    if point.count >= _INT64_LIMIT:
        raise PayloadError(
            HTTPStatus.BAD_REQUEST, f"{path}.count: {point.count} is a negative int64 sent as unsigned"
        )
    if point.count and not point.HasField("sum"):
        raise PayloadError(HTTPStatus.BAD_REQUEST, f"{path}.sum: missing; a mean duration needs it")
    if not (math.isfinite(point.sum) and point.sum >= 0):
        raise PayloadError(
            HTTPStatus.BAD_REQUEST,
            f"{path}.sum: {point.sum!r} is not a finite non-negative number of seconds",
        )
    if not point.time_unix_nano:
        raise PayloadError(HTTPStatus.BAD_REQUEST, f"{path}.time_unix_nano: missing")
    if not _TS_RANGE_NS[0] <= point.time_unix_nano <= _TS_RANGE_NS[1]:
        raise PayloadError(
            HTTPStatus.BAD_REQUEST,
            f"{path}.time_unix_nano: {point.time_unix_nano} is not a time the store holds: "
            f"unix seconds from {TS_RANGE_TEXT}",
        )
    return _StepPoint(
        path=path,
        key=(attributes["job"], attributes["rank"], attributes["node"], phase),
        topology={name: attributes[name] for name in _TOPOLOGY if name in attributes},
        cumulative=cumulative,
        start_ns=point.start_time_unix_nano,
        time_ns=point.time_unix_nano,
        count=point.count,
        sum=point.sum,
    )


def _per_step(phase: _Delta | None, steps: int) -> float | None:
    """A phase's seconds per step of the interval (a step that skipped it counts as 0); None if none."""
    return phase.seconds / steps if phase and phase.steps else None


def _rows(deltas: dict[SeriesKey, _Delta]) -> list[StepRecord]:
    """One row per step series that advanced, with the means of its phases over the same export;
    PayloadError naming the point whose row the store's `steps` columns could not hold."""
    for delta in deltas.values():
        if not math.isfinite(delta.seconds):
            raise _unstorable(
                delta, "sum", "the seconds of its series in this request exceed a float's range"
            )
    rows = []
    for (job, rank, node, phase), delta in deltas.items():
        if phase is not None or not delta.steps:
            continue
        # step (UInt64) needs no check: a count is below 2**63, and each request adds at most UINT32_MAX
        if delta.steps > UINT32_MAX:
            raise _unstorable(
                delta, "count", f"{delta.steps} steps in one export, more than the {UINT32_MAX} a row holds"
            )
        phase_means = {
            f"{name}_s": _per_step(deltas.get((job, rank, node, name)), delta.steps) for name in PHASES
        }
        rows.append(
            StepRecord(
                ts=delta.point.time_ns / 1e9,
                job=job,
                rank=rank,
                node=node,
                step=delta.total - 1,
                duration_s=delta.seconds / delta.steps,
                **phase_means,
                **delta.point.topology,
                steps=delta.steps,
                source="otlp",
            )
        )
    return rows


def _unstorable(delta: _Delta, field_name: str, problem: str) -> PayloadError:
    return PayloadError(HTTPStatus.BAD_REQUEST, f"{delta.point.path}.{field_name}: {problem}")


def _success_response(triage: _Triage, media: str) -> OtlpResponse:
    """ExportMetricsServiceResponse; partial_success set only when some points were rejected."""
    response = ExportMetricsServiceResponse()
    if triage.problems:
        shown = triage.problems[:_PROBLEMS_SHOWN]
        more = len(triage.problems) - len(shown)
        response.partial_success.rejected_data_points = triage.rejected
        response.partial_success.error_message = "; ".join(shown) + (f"; and {more} more" if more else "")
    return _encoded(response, media, HTTPStatus.OK)


def _encoded(message: Message, media: str, status: HTTPStatus) -> OtlpResponse:
    body = (
        json.dumps(json_format.MessageToDict(message)).encode()
        if media == JSON
        else message.SerializeToString()
    )
    return OtlpResponse(status, media, body)

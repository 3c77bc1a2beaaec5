"""Step-time receivers: a real OpenTelemetry SDK exporter and step JSON lines in, StepRows out; bad input
refused whole, with the HTTP status and a message naming where."""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from http import HTTPStatus
from pathlib import Path

import pytest
from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    Gauge,
    Metric,
)

from collectors.steprecord import (
    PHASE_DURATION,
    PHASES,
    STEP_DURATION,
    TS_RANGE_S,
    UINT32_MAX,
    UINT64_MAX,
    StepRecord,
    read_step_records,
)
from collectors.steps import StepTracker
from hub.bodies import JSON, MAX_GZIP_MEMBERS, ReceiverLimits
from hub.errors import PayloadError
from hub.otlp import PROTOBUF, OtlpStepReceiver, otlp_error_response
from hub.steplines import parse_steps_jsonl
from tests.support.clock import FakeClock
from tests.support.loopback import LoopbackPostServer
from tests.support.otlp import IDENTITY, START_NS, export, histogram, step_point
from tests.support.strategies import JSON_VALUES

DELTA = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
MIB = 1 << 20


def since_epoch() -> FakeClock:
    """A receiver clock at 1970: every series began after the receiver did, so none is a mere baseline."""
    return FakeClock(0.0)


@dataclass
class LoopbackHub:
    """A loopback HTTP server that feeds each POST body to a receiver and answers as the hub will."""

    receiver: OtlpStepReceiver
    rows: list[StepRecord] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)  # as sent, decompressed
    encodings: set[str | None] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._server = LoopbackPostServer(self._receive)

    def _receive(self, body: bytes, headers: Message) -> tuple[int, str, bytes]:
        content_type, encoding = headers["Content-Type"], headers["Content-Encoding"]
        try:
            result = self.receiver.receive(body, content_type, encoding)
        except PayloadError as error:
            response = otlp_error_response(error, content_type)
        else:
            response = result.response
            self.rows.extend(result.rows)
            self.bodies.append(gzip.decompress(body) if encoding == "gzip" else body)
            self.encodings.add(encoding)
        return response.status, response.content_type, response.body

    @property
    def url(self) -> str:
        return self._server.url

    def rows_of(self, rank: int) -> list[StepRecord]:
        return [row for row in self.rows if row.rank == rank]

    def __enter__(self) -> LoopbackHub:
        self._server.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.__exit__(*exc_info)


@pytest.fixture
def hub() -> Iterator[LoopbackHub]:
    with LoopbackHub(OtlpStepReceiver()) as hub:
        yield hub


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@dataclass(frozen=True)
class Rank:
    """What one simulated rank did: its identity, and the phase times of each of its steps."""

    tracker: StepTracker
    clock: FakeClock
    phase_seconds: list[dict[str, float]]

    @property
    def durations(self) -> list[float]:
        return [sum(phases.values()) for phases in self.phase_seconds]

    def run(self, steps: range) -> None:
        for number in steps:
            with self.tracker.step():
                for phase, seconds in self.phase_seconds[number].items():
                    with self.tracker.phase(phase):
                        self.clock.advance(seconds)


def start_rank(endpoint: str, rank: int, node: str, steps: int, **topology: int) -> Rank:
    """A tracker exporting every 50 ms whose steps take known times; every third skips the data phase."""
    clock = FakeClock()
    tracker = StepTracker(
        "job-a",
        rank=rank,
        node=node,
        otlp_endpoint=endpoint,
        export_interval_s=0.05,
        clock=clock,
        environ={},
        **topology,
    )
    phase_seconds = [
        {"compute": 0.1 + 0.01 * number + 0.1 * rank, "comm": 0.05, **({"data": 0.02} if number % 3 else {})}
        for number in range(steps)
    ]
    return Rank(tracker, clock, phase_seconds)


def run_two_ranks(hub: LoopbackHub, steps: int = 9) -> dict[int, Rank]:
    """Two ranks on two nodes, each exporting at least twice: once mid-run, and when it closes."""
    ranks = {
        0: start_rank(hub.url, 0, "node-a", steps, dp_rank=0, pp_stage=1, tp_rank=2),
        1: start_rank(hub.url, 1, "node-b", steps, dp_rank=1, pp_stage=1, tp_rank=2),
    }
    half = steps // 2
    for number, rank in ranks.items():
        rank.run(range(half))
        wait_for(lambda number=number: hub.rows_of(number), f"a mid-run export of rank {number}")
    for rank in ranks.values():
        rank.run(range(half, steps))
        rank.tracker.close()
    return ranks


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_real_sdk_export_becomes_rows_per_rank_with_means_and_phases(
    hub: LoopbackHub, compression: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if compression:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", compression)
    ranks = run_two_ranks(hub)

    assert hub.encodings == {compression}
    for number, rank in ranks.items():
        rows = hub.rows_of(number)
        assert len(rows) >= 2, "expected a mid-run export and a last one"
        assert sum(row.steps for row in rows) == len(rank.durations)
        assert [row.step for row in rows] == [
            sum(row.steps for row in rows[: index + 1]) - 1 for index in range(len(rows))
        ], "step must be the number of each export's last step"
        weighted_mean = sum(row.duration_s * row.steps for row in rows) / len(rank.durations)
        assert weighted_mean == pytest.approx(sum(rank.durations) / len(rank.durations), abs=1e-9)
        for phase in PHASES:
            total = sum((getattr(row, f"{phase}_s") or 0.0) * row.steps for row in rows)  # None: not entered
            expected = sum(seconds.get(phase, 0.0) for seconds in rank.phase_seconds)
            assert total == pytest.approx(expected, abs=1e-9), phase
        assert {(row.job, row.node, row.dp_rank, row.pp_stage, row.tp_rank, row.source) for row in rows} == {
            ("job-a", f"node-{'ab'[number]}", number, 1, 2, "otlp")
        }
        assert all(abs(row.ts - time.time()) < 60 for row in rows)


def test_otlp_json_encoding_gives_the_same_rows_as_protobuf(hub: LoopbackHub) -> None:
    run_two_ranks(hub, steps=4)
    receiver = OtlpStepReceiver(wall_clock=since_epoch())
    rows = []
    for body in hub.bodies:
        request = ExportMetricsServiceRequest.FromString(body)
        as_json = json_format.MessageToJson(request, use_integers_for_enums=True)  # int64 as strings
        assert '"aggregationTemporality": 2' in as_json and '"timeUnixNano": "' in as_json
        result = receiver.receive(as_json.encode(), "application/json; charset=utf-8")
        assert (result.response.content_type, json.loads(result.response.body)) == (JSON, {})
        rows.extend(result.rows)
    assert rows == hub.rows


def test_restarted_trainer_starts_its_series_over(hub: LoopbackHub) -> None:
    durations = {"first run": [1.0, 2.0, 3.0], "after restart": [5.0, 7.0]}
    for step_durations in durations.values():
        clock = FakeClock()
        tracker = StepTracker(
            **IDENTITY, otlp_endpoint=hub.url, export_interval_s=60, clock=clock, environ={}
        )
        for seconds in step_durations:
            with tracker.step():
                clock.advance(seconds)
        tracker.close()
    first, second = hub.rows
    assert (first.steps, first.step, first.duration_s) == (3, 2, 2.0)
    assert (second.steps, second.step, second.duration_s) == (2, 1, 6.0)
    assert second.compute_s is None, "no phase was entered"


def steps(count: int, seconds: float, **options: object) -> bytes:
    """An export of the IDENTITY rank's step histogram, as protobuf."""
    return export(histogram(step_point(count, seconds, **options))).SerializeToString()


def receive(receiver: OtlpStepReceiver, body: bytes) -> list[StepRecord]:
    return receiver.receive(body, PROTOBUF).rows


@pytest.mark.parametrize(
    ("count", "seconds", "restart"),
    [(20, 40.0, {"start_ns": START_NS + 10**12}), (3, 30.0, {}), (15, 15.0, {})],
    ids=["new-start-time", "count-goes-down-with-the-same-start", "sum-goes-down-with-the-same-start"],
)
def test_restart_of_the_exporting_process_counts_its_values_whole(
    count: int, seconds: float, restart: dict[str, int]
) -> None:
    receiver = OtlpStepReceiver(wall_clock=since_epoch())
    assert [(row.steps, row.duration_s) for row in receive(receiver, steps(10, 10.0))] == [(10, 1.0)]
    assert [(row.steps, row.duration_s) for row in receive(receiver, steps(14, 18.0))] == [(4, 2.0)]
    (row,) = receive(receiver, steps(count, seconds, **restart))
    assert (row.steps, row.step, row.duration_s) == (count, count - 1, seconds / count)


def test_hub_restart_loses_one_interval_and_never_double_counts() -> None:
    """A receiver created after the series began cannot tell what an earlier hub already stored."""
    receiver = OtlpStepReceiver(wall_clock=FakeClock(START_NS / 1e9 + 3600))
    assert receive(receiver, steps(100, 100.0)) == []
    (row,) = receive(receiver, steps(104, 108.0))
    assert (row.steps, row.step, row.duration_s) == (4, 103, 2.0)


def test_delta_temporality_is_taken_as_sent_with_running_step_numbers() -> None:
    receiver = OtlpStepReceiver(wall_clock=since_epoch())
    delta = export(histogram(step_point(4, 2.0), temporality=DELTA)).SerializeToString()
    assert [(row.steps, row.step, row.duration_s) for row in receive(receiver, delta)] == [(4, 3, 0.5)]
    assert [(row.steps, row.step, row.duration_s) for row in receive(receiver, delta)] == [(4, 7, 0.5)]


def test_series_silent_past_forget_after_are_forgotten_without_double_counting() -> None:
    clock = FakeClock(START_NS / 1e9 - 1)
    receiver = OtlpStepReceiver(forget_after_s=600, wall_clock=clock)
    clock.advance(12)
    assert len(receive(receiver, steps(10, 10.0))) == 1
    clock.advance(3600)
    later_start = START_NS + 3000 * 10**9
    (other,) = receive(receiver, steps(1, 1.0, rank=4, start_ns=later_start))  # prunes rank 3's series
    assert other.steps == 1, "a series that began after the forgotten one was last seen is new"
    assert receive(receiver, steps(12, 12.0)) == [], "a forgotten series that comes back is a baseline"
    (row,) = receive(receiver, steps(15, 18.0))
    assert (row.steps, row.duration_s) == (3, 2.0)


def test_points_it_cannot_use_are_a_partial_success_and_other_metrics_are_ignored() -> None:
    receiver = OtlpStepReceiver(wall_clock=since_epoch())
    request = export(
        histogram(step_point(4, 2.0)),
        histogram(step_point(4, 1.0, phase="forward"), step_point(4, 1.0, phase="comm"), name=PHASE_DURATION),
        Metric(name=STEP_DURATION, gauge=Gauge(data_points=[{"as_double": 1.0}])),
        Metric(name="process.cpu.time", gauge=Gauge(data_points=[{"as_double": 1.0}, {"as_double": 2.0}])),
        histogram(step_point(4, 2.0), temporality=AggregationTemporality.AGGREGATION_TEMPORALITY_UNSPECIFIED),
    )
    result = receiver.receive(request.SerializeToString(), PROTOBUF)

    (row,) = result.rows
    assert (row.steps, row.duration_s, row.comm_s, row.compute_s) == (4, 0.5, 0.25, None)
    assert (result.ignored_points, result.rejected_points) == (2, 3)
    partial = ExportMetricsServiceResponse.FromString(result.response.body).partial_success
    assert partial.rejected_data_points == 3
    assert "metrics[1].histogram.data_points[0]: unknown phase 'forward'" in partial.error_message
    assert "metrics[2] (fleetlens.step.duration) is a gauge, not a histogram" in partial.error_message
    assert "metrics[4] (fleetlens.step.duration) has aggregation temporality 0" in partial.error_message

    as_json = json_format.MessageToJson(request, use_integers_for_enums=True).encode()
    answer = json.loads(OtlpStepReceiver(wall_clock=since_epoch()).receive(as_json, JSON).response.body)
    assert answer["partialSuccess"]["rejectedDataPoints"] == "3"


def test_full_success_leaves_partial_success_unset() -> None:
    result = OtlpStepReceiver().receive(steps(1, 1.0), "application/x-protobuf")
    assert result.response.status == HTTPStatus.OK
    assert result.response.content_type == PROTOBUF
    assert not ExportMetricsServiceResponse.FromString(result.response.body).HasField("partial_success")


def parse_json_status(body: bytes) -> Status:
    return json_format.Parse(body, Status())


@pytest.mark.parametrize(
    ("content_type", "body", "decode"),
    [(PROTOBUF, b"\x0a\xff", Status.FromString), (JSON, b"{", parse_json_status)],
    ids=["protobuf", "json"],
)
def test_refusal_is_a_status_message_in_the_request_encoding(
    content_type: str, body: bytes, decode: Callable[[bytes], Status]
) -> None:
    with pytest.raises(PayloadError) as caught:
        OtlpStepReceiver().receive(body, content_type)
    response = otlp_error_response(caught.value, content_type)
    assert (response.status, response.content_type) == (HTTPStatus.BAD_REQUEST, content_type)
    assert decode(response.body).message.startswith("malformed")


def good_json(count: int = 20, seconds: float = 40.0) -> dict:
    return json_format.MessageToDict(export(histogram(step_point(count, seconds))))


def with_bad_metric(metric: dict) -> bytes:
    """A JSON export whose first metric is a good point of the IDENTITY rank and the second `metric`."""
    document = good_json()
    document["resourceMetrics"][0]["scopeMetrics"][0]["metrics"].append(metric)
    return json.dumps(document).encode()


def with_bad_point(**fields: object) -> bytes:
    """A JSON export: the IDENTITY rank's good point, then another rank's point with `fields` replaced."""
    point = json_format.MessageToDict(step_point(5, 1.0, rank=9))
    return with_bad_metric(
        {
            "name": STEP_DURATION,
            "histogram": {"aggregationTemporality": 2, "dataPoints": [{**point, **fields}]},
        }
    )


def with_bad_protobuf_point(**fields: object) -> bytes:
    bad = step_point(5, 1.0, rank=9)
    for name, value in fields.items():
        setattr(bad, name, value)
    return export(histogram(step_point(20, 40.0)), histogram(bad)).SerializeToString()


def huge_label() -> bytes:
    bad = step_point(5, 1.0, job="x" * MIB)
    return export(histogram(step_point(20, 40.0)), histogram(bad)).SerializeToString()


def gzip_members(parts: list[bytes], level: int = 9) -> bytes:
    """Each part as a gzip member of its own, one after the other: a multi-member gzip body."""
    return b"".join(gzip.compress(part, compresslevel=level) for part in parts)


@functools.cache
def gzip_bomb() -> bytes:
    """16 MiB of zeros in 16 KiB: under the body limit as sent, eight times over it inflated."""
    return gzip.compress(bytes(16 * MIB), compresslevel=9)


POINT = r"resource_metrics\[0\]\.scope_metrics\[0\]\.metrics\[1\]\.histogram\.data_points\[0\]"
BAD_RANK = rf"{POINT}\.attributes\[0\] \('rank'\): must be an int_value from 0 to 4294967295, got"
LIMITS = ReceiverLimits(max_body_bytes=2 * MIB, max_label_length=4096, max_rows=3)


@dataclass(frozen=True)
class Bad:
    body: Callable[[], bytes]
    problem: str  # a regular expression the message must match
    status: HTTPStatus = HTTPStatus.BAD_REQUEST
    content_type: str = JSON
    encoding: str | None = None


BAD_OTLP = {
    "malformed-protobuf": Bad(
        lambda: steps(20, 40.0)[:-3],
        "malformed protobuf.*not an ExportMetricsServiceRequest",
        content_type=PROTOBUF,
    ),
    "truncated-json": Bad(
        lambda: json.dumps(good_json()).encode()[:150], r"malformed or truncated JSON at line 1 column \d+"
    ),
    "deeply-nested-json": Bad(lambda: b"[" * 100_000, "JSON nested too deeply"),
    "wrong-type-array": Bad(
        lambda: b'{"resourceMetrics": {"scopeMetrics": []}}',
        "^resource_metrics: expected a JSON array, got an object",
    ),
    "wrong-type-object": Bad(
        lambda: with_bad_metric({"name": STEP_DURATION, "histogram": "fast"}),
        r"metrics\[1\]\.histogram: expected a JSON object, got a string",
    ),
    "wrong-type-scalar": Bad(lambda: with_bad_point(count="many"), f"^{POINT}: Failed to parse count field"),
    "wrong-type-attribute": Bad(
        lambda: with_bad_point(attributes=[{"key": "rank", "value": {"stringValue": "9"}}]),
        f"{BAD_RANK} string_value '9'",
    ),
    "two-values-in-a-oneof": Bad(
        lambda: with_bad_point(attributes=[{"key": "rank", "value": {"intValue": "9", "arrayValue": {}}}]),
        rf"{POINT}\.attributes\[0\]\.value: more than one field of oneof value",
    ),
    "negative-rank": Bad(
        lambda: with_bad_point(attributes=[{"key": "rank", "value": {"intValue": "-1"}}]),
        f"{BAD_RANK} int_value -1",
    ),
    "missing-attribute": Bad(
        lambda: with_bad_point(attributes=[{"key": "job", "value": {"stringValue": "j"}}]),
        f"{POINT}: missing attribute.*rank, node",
    ),
    "nan-json": Bad(
        lambda: with_bad_point(sum="NaN"), rf"{POINT}\.sum: nan is not a finite non-negative number"
    ),
    "nan-protobuf": Bad(
        lambda: with_bad_protobuf_point(sum=math.nan),
        rf"{POINT}\.sum: nan is not a finite",
        content_type=PROTOBUF,
    ),
    "negative-sum": Bad(
        lambda: with_bad_point(sum=-1.5), rf"{POINT}\.sum: -1.5 is not a finite non-negative"
    ),
    "negative-count-json": Bad(lambda: with_bad_point(count="-1"), f"{POINT}: .*count.*out of range: -1"),
    "negative-count-protobuf": Bad(
        lambda: with_bad_protobuf_point(count=2**64 - 1),
        rf"{POINT}\.count: 18446744073709551615 is a negative int64",
        content_type=PROTOBUF,
    ),
    "label-of-1-mib": Bad(
        huge_label,
        rf"{POINT}\.attributes\[0\] \('job'\): value of 1048576 characters is longer than the limit of 4096",
        content_type=PROTOBUF,
    ),
    "rank-past-uint32": Bad(
        lambda: with_bad_point(attributes=[{"key": "rank", "value": {"intValue": str(2**32)}}]),
        f"{BAD_RANK} int_value 4294967296",
    ),
    "time-past-2200": Bad(
        lambda: with_bad_point(timeUnixNano=str(8 * 10**18)),
        rf"{POINT}\.time_unix_nano: 8000000000000000000 is not a time the store holds: unix seconds from 0 "
        r"\(1970-01-01 UTC\) to 7258118400 \(2200-01-01 UTC\)",
    ),
    "integer-past-double-range": Bad(
        lambda: with_bad_point(sum=10**400), f"^{POINT}: int too large to convert to float"
    ),
    "steps-past-uint32": Bad(
        lambda: with_bad_protobuf_point(count=2**32),
        rf"{POINT}\.count: 4294967296 steps in one export, more than the 4294967295 a row holds",
        content_type=PROTOBUF,
    ),
    "seconds-past-double-range": Bad(
        lambda: export(
            histogram(step_point(20, 40.0)),
            histogram(step_point(1, 1.5e308, rank=9), step_point(1, 1.5e308, rank=9), temporality=DELTA),
        ).SerializeToString(),
        POINT.replace(r"data_points\[0\]", r"data_points\[1\]")
        + r"\.sum: the seconds of its series in this request exceed a float's range",
        content_type=PROTOBUF,
    ),
    "too-many-rows": Bad(
        lambda: export(
            *(histogram(step_point(1, 1.0, rank=rank)) for rank in range(LIMITS.max_rows + 1))
        ).SerializeToString(),
        f"{LIMITS.max_rows + 1} step series points in one request, more than the limit of {LIMITS.max_rows}",
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        PROTOBUF,
    ),
    "body-over-limit": Bad(
        lambda: b" " * (LIMITS.max_body_bytes + 1),
        f"body of {LIMITS.max_body_bytes + 1} bytes exceeds the limit of {LIMITS.max_body_bytes}",
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    ),
    "gzip-bomb": Bad(
        gzip_bomb, "inflates past the limit", HTTPStatus.REQUEST_ENTITY_TOO_LARGE, encoding="gzip"
    ),
    "truncated-gzip": Bad(
        lambda: gzip.compress(steps(20, 40.0))[:-9],
        "gzip body is truncated",
        encoding="gzip",
        content_type=PROTOBUF,
    ),
    "gzip-members-past-the-bound": Bad(
        lambda: gzip_members([steps(20, 40.0)] + [b""] * MAX_GZIP_MEMBERS),
        f"gzip body has more than {MAX_GZIP_MEMBERS} members",
        encoding="gzip",
        content_type=PROTOBUF,
    ),
    "wrong-content-type": Bad(
        lambda: steps(20, 40.0),
        "'text/plain' is not accepted",
        HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
        "text/plain",
    ),
    "unsupported-encoding": Bad(
        lambda: steps(20, 40.0),
        "Content-Encoding 'br' is not supported",
        HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
        PROTOBUF,
        "br",
    ),
}


@pytest.mark.parametrize("bad", BAD_OTLP.values(), ids=BAD_OTLP.keys())
def test_bad_otlp_request_is_refused_whole_and_changes_nothing(bad: Bad) -> None:
    receiver = OtlpStepReceiver(LIMITS, wall_clock=since_epoch())
    receive(receiver, steps(10, 10.0))
    with pytest.raises(PayloadError, match=bad.problem) as caught:
        receiver.receive(bad.body(), bad.content_type, bad.encoding)
    assert caught.value.status == bad.status
    (row,) = receive(receiver, steps(15, 20.0))
    assert (row.steps, row.duration_s) == (5, 2.0), "the refused request's good point must not count"


def test_unknown_json_fields_are_ignored_as_otlp_requires() -> None:
    document = good_json()
    document["futureField"] = 1
    resource = document["resourceMetrics"][0]
    resource["schemaUrl2"] = "x"
    metric = resource["scopeMetrics"][0]["metrics"][0]
    metric["newKind"] = {"dataPoints": [1, 2]}
    metric["histogram"]["dataPoints"][0]["exemplarsV2"] = [{"spanId": "00f067aa0ba902b7"}]
    plain = OtlpStepReceiver(wall_clock=since_epoch()).receive(json.dumps(good_json()).encode(), JSON).rows
    rows = OtlpStepReceiver(wall_clock=since_epoch()).receive(json.dumps(document).encode(), JSON).rows
    assert rows == plain and len(rows) == 1


def test_step_lines_from_the_sdk_become_rows(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    clock = FakeClock()
    with StepTracker(**IDENTITY, pp_stage=2, jsonl_path=path, clock=clock, environ={}) as tracker:
        for seconds in (0.5, 0.75):
            with tracker.step(), tracker.phase("compute"):
                clock.advance(seconds)
    rows = parse_steps_jsonl(gzip.compress(path.read_bytes()), "application/x-ndjson", "gzip")
    assert [(row.step, row.duration_s, row.compute_s, row.pp_stage, row.source) for row in rows] == [
        (0, 0.5, 0.5, 2, "jsonl"),
        (1, 0.75, 0.75, 2, "jsonl"),
    ]
    assert [row.ts for row in rows] == [record.ts for record in read_step_records(path)]


def good_line(step: int = 3) -> str:
    return json.dumps({"ts": 1.5, "job": "j", "rank": 0, "node": "n", "step": step, "duration_s": 0.5})


GOOD_LINE = good_line()


def test_a_step_run_again_after_a_checkpoint_restore_is_no_duplicate() -> None:
    again = json.dumps({"ts": 9.5, "job": "j", "rank": 0, "node": "n", "step": 1, "duration_s": 0.5})
    rows = parse_steps_jsonl(lines(again), "application/x-ndjson")
    assert [(row.step, row.ts) for row in rows] == [(1, 1.5), (2, 1.5), (1, 9.5)]


def lines(*extra: str) -> bytes:
    """The good lines of steps 1 and 2 and a blank one, then `extra`: a bad line is line 4."""
    return "\n".join([good_line(1), good_line(2), "", *extra]).encode()


BAD_LINES = {
    "truncated-line": Bad(lambda: lines(GOOD_LINE[:30]), "^line 4: (Unterminated|Expecting)"),
    "wrong-type": Bad(
        lambda: lines(GOOD_LINE.replace('"rank": 0', '"rank": "0"')),
        "^line 4: 'rank' must be a non-negative integer",
    ),
    "missing-key": Bad(
        lambda: lines(GOOD_LINE.replace("duration_s", "duration_ms")), "^line 4: missing key.*duration_s"
    ),
    "unknown-key": Bad(
        lambda: lines(GOOD_LINE.replace("}", ', "compute": 0.1}')), "^line 4: unknown key.*compute"
    ),
    "nan": Bad(lambda: lines(GOOD_LINE.replace("0.5", "NaN")), "^line 4: 'duration_s' must be a finite"),
    "label-of-1-mib": Bad(
        lambda: lines(GOOD_LINE.replace('"j"', json.dumps("x" * MIB))),
        "^line 4: 'job': value of 1048576 characters is longer than the limit of 4096",
    ),
    "not-utf8": Bad(lambda: lines() + b"\n\xff\n", r"^line 4: byte \d+ of the body is not UTF-8"),
    "too-many-rows": Bad(
        lambda: lines(GOOD_LINE, good_line(4)),
        f"^line 5: more than {LIMITS.max_rows} step records",
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    ),
    "body-over-limit": Bad(
        lambda: lines(" " * LIMITS.max_body_bytes), "exceeds the limit", HTTPStatus.REQUEST_ENTITY_TOO_LARGE
    ),
    "gzip-bomb": Bad(
        gzip_bomb, "inflates past the limit", HTTPStatus.REQUEST_ENTITY_TOO_LARGE, encoding="gzip"
    ),
    "wrong-content-type": Bad(
        lambda: lines(), "'text/csv' is not accepted", HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "text/csv"
    ),
    "duplicate-step": Bad(
        lambda: lines(good_line(1)), "^line 4: duplicate of line 1: job 'j' rank 0 step 1 at ts 1.5 again"
    ),
    "rank-past-uint32": Bad(
        lambda: lines(GOOD_LINE.replace('"rank": 0', f'"rank": {2**32}')),
        "^line 4: 'rank' must be a non-negative integer up to 4294967295, got 4294967296",
    ),
    "step-past-uint64": Bad(
        lambda: lines(GOOD_LINE.replace('"step": 3', f'"step": {2**64}')),
        "^line 4: 'step' must be a non-negative integer up to 18446744073709551615, got 18446744073709551616",
    ),
    "ts-past-2200": Bad(
        lambda: lines(GOOD_LINE.replace('"ts": 1.5', '"ts": 1e10')),
        r"^line 4: 'ts' must be unix seconds from 0 \(1970-01-01 UTC\) to 7258118400 \(2200-01-01 UTC\), "
        "got 10000000000.0",
    ),
    "ts-before-1970": Bad(
        lambda: lines(GOOD_LINE.replace('"ts": 1.5', '"ts": -1')), "^line 4: 'ts' must be unix seconds from 0"
    ),
    "integer-past-float-range": Bad(
        lambda: lines(GOOD_LINE.replace('"duration_s": 0.5', f'"duration_s": {10**400}')),
        "^line 4: 'duration_s' must be a finite non-negative number",
    ),
    "infinity-literal": Bad(
        lambda: lines(GOOD_LINE.replace('"duration_s": 0.5', '"duration_s": Infinity')),
        "^line 4: 'duration_s' must be a finite non-negative number, got inf",
    ),
    "lone-surrogate": Bad(
        lambda: lines(GOOD_LINE.replace('"j"', '"\\ud800"')),
        r"^line 4: 'job' must be printable Unicode: U\+D800, a lone surrogate .* at index 0 of '\\ud800'",
    ),
    "deeply-nested-json": Bad(lambda: lines("[" * 100_000), "^line 4: JSON nested too deeply"),
    "gzip-members-past-the-bound": Bad(
        lambda: gzip_members([lines()] + [b""] * MAX_GZIP_MEMBERS),
        f"gzip body has more than {MAX_GZIP_MEMBERS} members",
        encoding="gzip",
    ),
}


@pytest.mark.parametrize("bad", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_bad_step_lines_are_refused_whole_naming_the_line(bad: Bad) -> None:
    with pytest.raises(PayloadError, match=bad.problem) as caught:
        parse_steps_jsonl(bad.body(), bad.content_type, bad.encoding, LIMITS)
    assert caught.value.status == bad.status


def test_a_body_of_200k_gzip_members_is_refused_at_once() -> None:
    """Each member used to copy the rest of the body: 200,000 tiny members took half a minute."""
    body = gzip_members([b""]) * 200_000
    for parse in (
        lambda: parse_steps_jsonl(body, "application/x-ndjson", "gzip"),
        lambda: OtlpStepReceiver().receive(body, PROTOBUF, "gzip"),
    ):
        start = time.monotonic()
        with pytest.raises(PayloadError, match=f"more than {MAX_GZIP_MEMBERS} members") as caught:
            parse()
        assert caught.value.status == HTTPStatus.BAD_REQUEST
        assert time.monotonic() - start < 2.0


def test_exactly_max_gzip_members_are_read_and_an_empty_gzip_body_is_empty() -> None:
    body = gzip_members([f"{good_line(step)}\n".encode() for step in range(MAX_GZIP_MEMBERS)])
    assert len(parse_steps_jsonl(body, "application/x-ndjson", "gzip")) == MAX_GZIP_MEMBERS
    assert parse_steps_jsonl(b"", "application/x-ndjson", "gzip") == []


@settings(max_examples=100, deadline=None)
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=200_000), max_size=MAX_GZIP_MEMBERS - 1),
    level=st.sampled_from([0, 1, 9]),
)
def test_gzip_members_up_to_the_bound_read_as_one_body(cuts: list[int], level: int) -> None:
    """Members cut anywhere, stored (level 0: members span several reads of the inflater) or
    compressed, read whole."""
    body = "\n".join(good_line(step).replace('"n"', f'"{step:x}' + "n" * 4000 + '"') for step in range(40))
    body = body.encode()
    bounds = [0, *sorted(cut % (len(body) + 1) for cut in cuts), len(body)]
    members = gzip_members([body[start:end] for start, end in itertools.pairwise(bounds)], level)
    assert parse_steps_jsonl(members, "application/x-ndjson", "gzip") == parse_steps_jsonl(
        body, "application/x-ndjson"
    )


def test_series_past_max_series_are_forgotten_least_recently_seen_first_and_counted() -> None:
    clock = FakeClock(START_NS / 1e9 - 1)
    receiver = OtlpStepReceiver(max_series=2, wall_clock=clock)
    for rank, count in ((1, 10), (2, 10), (1, 12)):  # rank 2 is now the least recently seen
        clock.advance(1)
        assert len(receive(receiver, steps(count, float(count), rank=rank))) == 1
    clock.advance(1)
    (new,) = receive(receiver, steps(1, 1.0, rank=4, start_ns=START_NS + 10**12))
    assert new.steps == 1, "a series that began after the forgotten one was last seen is new"
    assert (receiver.series, receiver.forgotten_series) == (2, 1)
    assert receive(receiver, steps(14, 14.0, rank=2)) == [], (
        "a forgotten series that comes back is a baseline"
    )
    (row,) = receive(receiver, steps(16, 18.0, rank=2))
    assert (row.rank, row.steps, row.duration_s) == (2, 2, 2.0)
    assert (receiver.series, receiver.forgotten_series) == (2, 2), "rank 1 made way for rank 2"


def test_state_stays_within_max_series_however_many_ranks_export() -> None:
    receiver = OtlpStepReceiver(max_series=100, wall_clock=since_epoch())
    for rank in range(1000):
        receive(receiver, steps(1, 1.0, rank=rank))
    assert (receiver.series, receiver.forgotten_series) == (100, 900)


def test_a_refused_request_leaves_no_series_behind() -> None:
    receiver = OtlpStepReceiver(wall_clock=since_epoch())
    with pytest.raises(PayloadError):
        receiver.receive(with_bad_protobuf_point(count=2**32), PROTOBUF)
    assert receiver.series == 0


# -- arbitrary input: every outcome is rows that fit the store, or a PayloadError -------------------------

POINT_FIELDS = [
    "attributes",
    "startTimeUnixNano",
    "timeUnixNano",
    "count",
    "sum",
    "bucketCounts",
    "explicitBounds",
    "exemplars",
    "flags",
    "min",
    "max",
]
STEP_KEYS = ["ts", "job", "rank", "node", "step", "duration_s", "compute_s", "dp_rank", "extra"]


def assert_storable(rows: list[StepRecord]) -> None:
    """Every value within what the store's `steps` columns hold."""
    for row in rows:
        assert TS_RANGE_S[0] <= row.ts <= TS_RANGE_S[1]
        assert 0 <= row.step <= UINT64_MAX and 1 <= row.steps <= UINT32_MAX
        for value in (row.rank, row.dp_rank, row.pp_stage, row.tp_rank):
            assert value is None or 0 <= value <= UINT32_MAX
        for seconds in (row.duration_s, row.compute_s, row.comm_s, row.data_s):
            assert seconds is None or (math.isfinite(seconds) and seconds >= 0)
        row.job.encode()
        row.node.encode()


def receive_anything(body: bytes, content_type: str, encoding: str | None = None) -> None:
    try:
        result = OtlpStepReceiver(wall_clock=since_epoch()).receive(body, content_type, encoding)
    except PayloadError as error:
        assert str(error) and error.status in (400, 413, 415)
    else:
        assert_storable(result.rows)


def parse_anything(body: bytes, encoding: str | None = None) -> None:
    try:
        rows = parse_steps_jsonl(body, "application/x-ndjson", encoding)
    except PayloadError as error:
        assert str(error) and error.status in (400, 413, 415)
    else:
        assert_storable(rows)


FUZZ = settings(max_examples=200, deadline=None)


@FUZZ
@given(body=st.binary(max_size=2000), encoding=st.sampled_from([None, "gzip"]))
def test_arbitrary_bytes_are_rows_or_a_payload_error(body: bytes, encoding: str | None) -> None:
    for content_type in (PROTOBUF, JSON):
        receive_anything(body, content_type, encoding)
    parse_anything(body, encoding)


@FUZZ
@given(data=st.data())
def test_a_protobuf_export_with_bytes_changed_is_rows_or_a_payload_error(data: st.DataObject) -> None:
    body = bytearray(export(histogram(step_point(20, 40.0), step_point(5, 1.0, rank=9))).SerializeToString())
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        body[data.draw(st.integers(min_value=0, max_value=len(body) - 1))] = data.draw(st.integers(0, 255))
    receive_anything(bytes(body), PROTOBUF)


@FUZZ
@given(
    fields=st.dictionaries(st.sampled_from(POINT_FIELDS), JSON_VALUES, max_size=3),
    attribute=JSON_VALUES,
    temporality=JSON_VALUES,
)
def test_an_otlp_json_export_with_arbitrary_values_is_rows_or_a_payload_error(
    fields: dict, attribute: object, temporality: object
) -> None:
    point = json_format.MessageToDict(step_point(5, 1.0, rank=9))
    for replaced in (
        {**point, **fields},
        {**point, "attributes": [*point["attributes"][:2], {"key": "node", "value": attribute}]},
    ):
        metric = {"name": STEP_DURATION, "histogram": {"aggregationTemporality": 2, "dataPoints": [replaced]}}
        receive_anything(with_bad_metric(metric), JSON)
    metric = {
        "name": STEP_DURATION,
        "histogram": {"aggregationTemporality": temporality, "dataPoints": [point]},
    }
    receive_anything(with_bad_metric(metric), JSON)
    receive_anything(json.dumps(attribute).encode(), JSON)


@FUZZ
@given(fields=st.dictionaries(st.sampled_from(STEP_KEYS), JSON_VALUES, max_size=4))
def test_step_lines_with_arbitrary_values_are_rows_or_a_payload_error(fields: dict) -> None:
    record = {**json.loads(good_line()), **fields}
    parse_anything(lines(json.dumps(record)))


@pytest.mark.parametrize("depth", [100, 1000, 100_000])
def test_deeply_nested_json_anywhere_is_rows_or_a_payload_error(depth: int) -> None:
    """JSON text nested `depth` deep in an attribute value, a number field and a step line."""
    kvlists = '{"kvlistValue": {"values": [{"key": "k", "value": ' * depth + "{}" + "}]}}" * depth
    arrays = "[" * depth + "]" * depth
    hole = '"HOLE"'
    attribute = with_bad_point(attributes=[{"key": "extra", "value": "HOLE"}]).replace(
        hole.encode(), kvlists.encode()
    )
    receive_anything(attribute, JSON)
    receive_anything(with_bad_point(sum="HOLE").replace(hole.encode(), arrays.encode()), JSON)
    parse_anything(lines(GOOD_LINE.replace('"j"', arrays)))

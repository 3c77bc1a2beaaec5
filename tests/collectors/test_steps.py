"""The step-time SDK: the JSON-lines contract and its reader, OTLP export, and never slowing training."""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.errors import LogParseError
from collectors.steprecord import (
    PHASE_DURATION,
    STEP_DURATION,
    TS_RANGE_S,
    UINT32_MAX,
    UINT64_MAX,
    StepRecord,
    parse_step_record,
    read_step_records,
)
from collectors.steps import StepTracker, otlp_metrics_url
from tests.conftest import REPO
from tests.support.clock import FakeClock
from tests.support.otlp import OtlpReceiver
from tests.support.peers import free_port, hung_listener
from tests.support.strategies import JSON_VALUES

IDENTITY = {"job": "job-a", "rank": 3, "node": "node-7"}


@pytest.fixture
def otlp_receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def tracker_for_test(clock: FakeClock, **kwargs: object) -> StepTracker:
    """A tracker with a fixed identity, the fake clock, and no environment leaking in from the test run."""
    options = {**IDENTITY, "clock": clock, "environ": {}, **kwargs}
    return StepTracker(**options)


def test_phases_add_up_and_repeated_phases_accumulate(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "steps.jsonl"
    with tracker_for_test(clock, jsonl_path=path) as tracker, tracker.step():
        with tracker.phase("data"):
            clock.advance(0.010)
        with tracker.phase("compute"):
            clock.advance(0.100)
        clock.advance(0.001)  # between phases: part of the step, of no phase
        with tracker.phase("comm"):
            clock.advance(0.020)
        with tracker.phase("compute"):  # the optimizer step after the all-reduce
            clock.advance(0.050)
    (record,) = read_step_records(path)
    assert record.compute_s == pytest.approx(0.150, abs=1e-9)
    assert record.comm_s == pytest.approx(0.020, abs=1e-9)
    assert record.data_s == pytest.approx(0.010, abs=1e-9)
    assert record.duration_s == pytest.approx(0.181, abs=1e-9)


def test_steps_count_from_zero_follow_explicit_numbers_and_skip_failed_steps(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "steps.jsonl"
    with tracker_for_test(clock, jsonl_path=path) as tracker:
        for _ in range(2):
            with tracker.step():
                clock.advance(0.5)
        with pytest.raises(ZeroDivisionError), tracker.step():
            1 / 0  # noqa: B018 - a step whose body fails
        with tracker.step(1000):  # resumed from a checkpoint
            clock.advance(0.5)
        with tracker.step():
            clock.advance(0.5)
    assert [record.step for record in read_step_records(path)] == [0, 1, 1000, 1001]


def test_restarted_rank_appends_to_its_records(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "steps.jsonl"
    for first_step in (0, 50):
        with tracker_for_test(clock, jsonl_path=path) as tracker, tracker.step(first_step):
            clock.advance(0.5)
    assert [record.step for record in read_step_records(path)] == [0, 50]


def test_jsonl_line_is_the_contract_with_keys_in_order(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "steps.jsonl"
    wall_clock = FakeClock(1_700_000_000.25)
    with (
        tracker_for_test(
            clock, wall_clock=wall_clock, dp_rank=1, pp_stage=2, tp_rank=0, jsonl_path=path
        ) as tracker,
        tracker.step(),
    ):
        with tracker.phase("data"):
            clock.advance(0.25)
        with tracker.phase("comm"):
            clock.advance(0.5)
        wall_clock.advance(0.75)
    (line,) = path.read_text().splitlines()
    assert json.loads(line, object_pairs_hook=list) == [
        ("ts", 1_700_000_001.0),  # the step's end
        ("job", "job-a"),
        ("rank", 3),
        ("node", "node-7"),
        ("step", 0),
        ("duration_s", 0.75),
        ("comm_s", 0.5),
        ("data_s", 0.25),
        ("dp_rank", 1),
        ("pp_stage", 2),
        ("tp_rank", 0),
    ]


def test_jsonl_line_omits_what_is_unknown(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "steps.jsonl"
    with tracker_for_test(clock, jsonl_path=path) as tracker, tracker.step():
        clock.advance(2.0)
    (line,) = path.read_text().splitlines()
    assert list(json.loads(line)) == ["ts", "job", "rank", "node", "step", "duration_s"]


TORCHRUN_ENVIRONMENT = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "run-42"}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({}, ("run-42", 5, socket.gethostname())),
        ({"job": "job-b", "rank": 6, "node": "n9"}, ("job-b", 6, "n9")),
    ],
    ids=["from-torchrun", "arguments-win"],
)
def test_identity_comes_from_torchrun_environment_unless_given(
    tmp_path: Path, clock: FakeClock, arguments: dict[str, str | int], expected: tuple[str, int, str]
) -> None:
    path = tmp_path / "steps.jsonl"
    tracker = StepTracker(**arguments, clock=clock, environ=TORCHRUN_ENVIRONMENT, jsonl_path=path)
    with tracker, tracker.step():
        pass
    (record,) = read_step_records(path)
    assert (record.job, record.rank, record.node) == expected


@pytest.mark.parametrize(
    "environ", [{}, {"TORCHELASTIC_RUN_ID": "none"}], ids=["no-env", "torchrun-without-rdzv-id"]
)
def test_missing_job_name_is_refused(environ: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="job"):
        StepTracker(rank=0, environ=environ)


def test_misuse_is_refused_at_once(clock: FakeClock) -> None:
    with tracker_for_test(clock) as tracker:
        with pytest.raises(RuntimeError, match="outside"), tracker.phase("compute"):
            pass
        with pytest.raises(ValueError, match="forward"):
            tracker.phase("forward")
        with tracker.step(), pytest.raises(RuntimeError, match="nest"):
            tracker.step()
        with (
            tracker.step(),
            tracker.phase("compute"),
            pytest.raises(RuntimeError, match="nest"),
            tracker.phase("comm"),
        ):
            pass
        with pytest.raises(ValueError, match="negative"):
            tracker.step(-1)
        with pytest.raises(
            ValueError, match="'step' must be a non-negative integer up to 18446744073709551615"
        ):
            tracker.step(2**64)


@pytest.mark.parametrize(
    ("arguments", "environ", "problem"),
    [
        ({"rank": -1}, {}, "'rank' must be a non-negative integer"),
        ({"dp_rank": "0"}, {}, "'dp_rank' must be a non-negative integer"),
        ({"tp_rank": 2**32}, {}, "'tp_rank' must be a non-negative integer up to 4294967295"),
        ({"node": "\udc80"}, {}, "'node' must be printable Unicode: U.DC80, a lone surrogate"),
        ({"node": "gpu\x1b[2J"}, {}, "'node' must be printable Unicode: U.001B, a control character"),
        ({}, {"RANK": "zero"}, "RANK='zero' is not an integer"),
    ],
)
def test_identity_the_reader_would_refuse_is_refused_at_start(
    arguments: dict[str, object], environ: dict[str, str], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        StepTracker("job-a", **arguments, environ=environ)


GOOD = {"ts": 1.5, "job": "j", "rank": 0, "node": "n", "step": 1, "duration_s": 0.5}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"ts": 1.5, "job": "j", "rank"', "Expecting"),  # torn by a crash mid-write
        ("[1, 2]", "JSON object, got list"),
        (
            json.dumps({key: value for key, value in GOOD.items() if key != "duration_s"}),
            "missing key.*duration_s",
        ),
        (json.dumps({**GOOD, "compute": 0.1}), "unknown key.*compute"),
        (json.dumps({**GOOD, "rank": "3"}), "'rank' must be a non-negative integer"),
        (json.dumps({**GOOD, "rank": True}), "'rank' must be a non-negative integer"),
        (json.dumps({**GOOD, "dp_rank": 1.5}), "'dp_rank' must be a non-negative integer"),
        (json.dumps({**GOOD, "duration_s": -0.1}), "'duration_s' must be a finite non-negative number"),
        (json.dumps({**GOOD, "comm_s": float("nan")}), "'comm_s' must be a finite non-negative number"),
        (json.dumps({**GOOD, "node": 7}), "'node' must be a string"),
        (json.dumps({**GOOD, "rank": 2**32}), "'rank' must be a non-negative integer up to 4294967295"),
        (
            json.dumps({**GOOD, "step": 2**64}),
            "'step' must be a non-negative integer up to 18446744073709551615",
        ),
        (
            json.dumps({**GOOD, "ts": 1e10}),
            re.escape("'ts' must be unix seconds from 0 (1970-01-01 UTC) to 72"),
        ),
        (json.dumps({**GOOD, "ts": -0.5}), "'ts' must be unix seconds from 0"),
        (json.dumps({**GOOD, "data_s": 10**400}), "'data_s' must be a finite non-negative number"),
        (
            json.dumps({**GOOD, "duration_s": float("inf")}),
            "'duration_s' must be a finite non-negative number",
        ),
        (json.dumps({**GOOD, "job": "\ud800"}), "'job' must be printable Unicode: U.D800, a lone surrogate"),
        (json.dumps({**GOOD, "job": "a\nb"}), "'job' must be printable Unicode: U.000A, a control character"),
        ("[" * 100_000, "JSON nested too deeply"),
        (json.dumps({**GOOD, "step": 1}), "duplicate of line 1: job 'j' rank 0 step 1 at ts 1.5 again"),
    ],
)
def test_malformed_line_is_named_after_the_good_ones_are_read(
    tmp_path: Path, line: str, problem: str
) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_text(f"{json.dumps(GOOD)}\n\n{json.dumps({**GOOD, 'step': 2})}\n{line}\n")
    read = []
    with pytest.raises(LogParseError, match=f"^{re.escape(str(path))}:4: .*{problem}"):
        read.extend(read_step_records(path))
    assert [record.step for record in read] == [1, 2]


def test_bytes_that_are_not_utf8_are_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_bytes(
        json.dumps(GOOD).encode()
        + b"\n"
        + json.dumps({**GOOD, "step": 2}).encode().replace(b'"j"', b'"\xff"')
    )
    with pytest.raises(
        LogParseError, match=f"^{re.escape(str(path))}:2: 'job' must be printable Unicode: U.DCFF, a lone"
    ):
        list(read_step_records(path))


def test_reader_accepts_lines_and_names_them(tmp_path: Path) -> None:
    lines = [json.dumps(GOOD), json.dumps({**GOOD, "step": 2, "compute_s": 1, "tp_rank": 2}), "{}"]
    read = []
    with pytest.raises(LogParseError, match=r"^<lines>:3: missing key"):
        read.extend(read_step_records(lines))
    assert read[1].compute_s == 1.0
    assert read[1].tp_rank == 2


def test_otlp_export_carries_counts_sums_and_attributes(
    otlp_receiver: OtlpReceiver, clock: FakeClock
) -> None:
    topology = {"dp_rank": 1, "pp_stage": 2, "tp_rank": 0}
    tracker = tracker_for_test(clock, otlp_endpoint=otlp_receiver.url, export_interval_s=60, **topology)
    computes = (0.25, 0.5, 120.0)
    for compute in computes:
        with tracker.step():
            with tracker.phase("compute"):
                clock.advance(compute)
            with tracker.phase("comm"):
                clock.advance(0.125)
    tracker.close()

    (steps,) = otlp_receiver.latest(STEP_DURATION)
    assert steps.attributes == {**IDENTITY, **topology}
    assert steps.unit == "s"
    assert (steps.count, steps.sum) == (3, sum(computes) + 3 * 0.125)
    bounds = steps.explicit_bounds
    assert bounds[0] <= 0.001 and bounds[-1] >= 300, "buckets must span 1 ms to minutes"
    expected_buckets = [0] * (len(bounds) + 1)
    for compute in computes:
        expected_buckets[bisect.bisect_left(bounds, compute + 0.125)] += 1
    assert steps.bucket_counts == expected_buckets

    phases = {point.attributes["phase"]: point for point in otlp_receiver.latest(PHASE_DURATION)}
    assert set(phases) == {"compute", "comm"}, "a phase never entered has no series"
    assert phases["compute"].attributes == {**IDENTITY, **topology, "phase": "compute"}
    assert (phases["compute"].count, phases["compute"].sum) == (3, sum(computes))
    assert (phases["comm"].count, phases["comm"].sum) == (3, 3 * 0.125)


@pytest.mark.parametrize(
    ("argument", "environ", "expected"),
    [
        (
            "http://arg:4318/",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318"},
            "http://arg:4318/v1/metrics",
        ),
        (
            None,
            {
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:1/x",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318",
            },
            "http://m:1/x",
        ),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318"}, "http://env:4318/v1/metrics"),
        (None, {}, None),
    ],
    ids=["argument-wins", "metrics-variable-is-a-full-url", "base-variable", "nothing-configured"],
)
def test_endpoint_precedence(argument: str | None, environ: dict[str, str], expected: str | None) -> None:
    assert otlp_metrics_url(argument, environ) == expected


def test_environment_endpoint_is_used_without_argument(otlp_receiver: OtlpReceiver, clock: FakeClock) -> None:
    tracker = tracker_for_test(clock, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.url})
    with tracker.step():
        clock.advance(1.0)
    tracker.close()
    assert [point.count for point in otlp_receiver.latest(STEP_DURATION)] == [1]


@pytest.fixture
def refused_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def hanging_endpoint() -> Iterator[str]:
    """Accepts connections into its backlog and never answers: a hub that is up but stuck."""
    with hung_listener() as address:
        yield f"http://{address}"


@pytest.mark.timing  # its slowest step is a wall-clock interval: the other worker's load stalled one 0.44 s
@pytest.mark.parametrize("endpoint_fixture", ["refused_endpoint", "hanging_endpoint"])
def test_unreachable_endpoint_neither_blocks_nor_fails_training(
    endpoint_fixture: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint = request.getfixturevalue(endpoint_fixture)
    timeout_s = 0.5
    tracker = StepTracker(
        "job-a", otlp_endpoint=endpoint, export_interval_s=0.05, export_timeout_s=timeout_s, environ={}
    )
    slowest_step = 0.0
    give_up = time.monotonic() + 10
    while tracker.otlp_failures < 2 and time.monotonic() < give_up:
        started = time.perf_counter()
        with tracker.step(), tracker.phase("compute"):
            time.sleep(0.002)
        slowest_step = max(slowest_step, time.perf_counter() - started)
    closing = time.monotonic()
    tracker.close()

    assert tracker.otlp_failures >= 2
    assert slowest_step < timeout_s / 2, "a step waited for the network"
    assert time.monotonic() - closing < 2 * timeout_s + 1.0
    complaints = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(complaints) == 1, complaints
    assert endpoint in complaints[0]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_unwritable_jsonl_is_counted_not_raised(caplog: pytest.LogCaptureFixture, clock: FakeClock) -> None:
    tracker = tracker_for_test(clock, jsonl_path="/dev/full")
    for _ in range(3):
        with tracker.step():
            clock.advance(1.0)
    tracker.close()
    assert tracker.jsonl_failures >= 3
    complaints = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(complaints) == 1
    assert "/dev/full" in complaints[0]


EXITING_JOB = """
import sys
from collectors.steps import StepTracker
tracker = StepTracker("job-a", rank=1, jsonl_path=sys.argv[1], otlp_endpoint=sys.argv[2])
for _ in range(5):
    with tracker.step():
        pass
"""


def test_records_are_flushed_when_the_process_exits_without_close(
    tmp_path: Path, otlp_receiver: OtlpReceiver
) -> None:
    path = tmp_path / "steps.jsonl"
    environ = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    subprocess.run(
        [sys.executable, "-c", EXITING_JOB, str(path), otlp_receiver.url],
        cwd=REPO,
        env=environ,
        check=True,
        timeout=60,
    )
    assert [record.step for record in read_step_records(path)] == [0, 1, 2, 3, 4]
    assert [point.count for point in otlp_receiver.latest(STEP_DURATION)] == [5]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_does_not_export_for_the_rank(otlp_receiver: OtlpReceiver, clock: FakeClock) -> None:
    """A forked DataLoader worker inherits the tracker; its exit must not send a copy of the rank's data."""
    tracker = tracker_for_test(clock, otlp_endpoint=otlp_receiver.url, export_interval_s=60)
    with tracker.step():
        clock.advance(1.0)
    child = os.fork()
    if child == 0:
        tracker.close()
        os._exit(0)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert otlp_receiver.requests == []
    tracker.close()
    assert [point.count for point in otlp_receiver.latest(STEP_DURATION)] == [1]


def parse_or_refuse(line: str) -> StepRecord | None:
    """The record of `line`, or None where it is refused with a ValueError that says why."""
    try:
        return parse_step_record(line)
    except ValueError as error:
        assert str(error)
        return None


@settings(max_examples=200, deadline=None)
@given(
    fields=st.dictionaries(st.sampled_from([*GOOD, "compute_s", "tp_rank", "other"]), JSON_VALUES, max_size=4)
)
def test_any_json_value_in_any_field_is_a_record_or_a_value_error(fields: dict) -> None:
    record = parse_or_refuse(json.dumps({**GOOD, **fields}))
    if record is not None:  # everything the store's steps columns hold, nothing else
        assert TS_RANGE_S[0] <= record.ts <= TS_RANGE_S[1] and 0 <= record.step <= UINT64_MAX
        assert all(rank is None or 0 <= rank <= UINT32_MAX for rank in (record.rank, record.tp_rank))
        assert all(s is None or (math.isfinite(s) and s >= 0) for s in (record.duration_s, record.compute_s))


@settings(max_examples=200, deadline=None)
@given(line=st.text() | JSON_VALUES.map(json.dumps))
def test_any_line_is_a_record_or_a_value_error(line: str) -> None:
    parse_or_refuse(line)

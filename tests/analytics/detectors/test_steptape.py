"""analytics.detectors.steptape: the steps tape holds what a fresh read of its range holds, window after
window, rows inserted late within the overlap included; slow_node's cadence and units from it are what
JOB_CADENCE and STEP_UNITS give on chDB; and the runner reads the steps table once a steady window for
every detector that reads steps."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors import build
from analytics.detectors.base import Window, frame
from analytics.detectors.runner import DetectionRunner
from analytics.detectors.slow_node import JOB_CADENCE, MAX_LOOKBACK_S, STEP_UNITS, step_units
from analytics.detectors.steptape import COLUMN_TYPES, StepRows, StepTape
from analytics.errors import DetectorError
from analytics.store import Store
from analytics.store.records import QueryResult
from collectors.steprecord import StepRecord
from tests.analytics.detectors import T0, SyncJob, records, window

BASE = time.time() // 3600 * 3600 - 3 * 86400  # recent enough for the steps' retention
examples = itertools.count()
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
ROW = st.tuples(
    st.sampled_from(["n1", "n2", "n3"]),
    st.sampled_from(["llm", "eval"]),
    st.integers(0, 3),  # rank
    st.sampled_from([None, 0, 2]),  # pp_stage
    st.integers(1, 5),  # step
    st.sampled_from([1, 1, 3]),  # steps: an OTLP record of 3 is bucketed by time
    st.sampled_from([None, 0.5, 1.0, 2.0, 0.25]),  # compute_s
    st.sampled_from([0.5, 1.0, 4.0, 1.5, 0.1, 0.7]),  # duration_s
)


def canonical(rows: StepRows) -> pd.DataFrame:
    """The rows with names for codes, in one order whatever the order rows of one time were read in."""
    columns = {name: getattr(rows, name) for name in COLUMN_TYPES}
    columns["job"], columns["node"] = rows.jobs[rows.job], rows.nodes[rows.node]
    table = pd.DataFrame(columns)
    return table.sort_values(list(COLUMN_TYPES)).reset_index(drop=True)


def medians(tape: StepTape, store: Store, window: Window, since: float) -> dict[str, float]:
    jobs, step_s = tape.job_medians(store, window, since)
    return dict(zip(tape.jobs_.names[jobs].tolist(), step_s.tolist(), strict=True))


@SETTINGS
@given(
    rows=st.lists(st.tuples(st.integers(0, 60_000), ROW), max_size=30, unique_by=lambda row: row[0]),
    lookbacks=st.tuples(st.sampled_from([10.0, 20.0, 45.5]), st.sampled_from([10.0, 30.0, 3600.0])),
    last=st.sampled_from([1, 2, 32]),
)
def test_units_and_cadence_from_the_tape_are_step_units_and_job_cadence_sql(
    store: Store, rows: list[tuple[int, tuple[Any, ...]]], lookbacks: tuple[float, float], last: int
) -> None:
    """Per job lookbacks, stages and compute times missing or not, OTLP records bucketed by time, even
    counts (the median's upper middle), LIMIT BY cutting a node's units. Times are distinct, so that
    LIMIT BY's choice among units ending together is not left to chance."""
    base = BASE - next(examples) * 7200  # an hour from every other example's rows, both ways
    store.insert_steps(records(base, rows), token=f"units-{base}")
    window = Window(base + 50, base + 60)
    tape = StepTape()
    held = tape.rows(store, window, window.end - MAX_LOOKBACK_S)
    cadence = Window(window.end - MAX_LOOKBACK_S, window.end).parameters
    expected_cadence = dict(store.query(JOB_CADENCE, parameters=cadence).rows)
    assert medians(tape, store, window, window.end - MAX_LOOKBACK_S) == expected_cadence

    since = {"eval": int((window.end - lookbacks[0]) * 1000), "llm": int((window.end - lookbacks[1]) * 1000)}
    parameters = {
        **cadence,
        "jobs": list(since),
        "since_ms": list(since.values()),
        "bucket_s": 10,
        "last": last,
    }
    expected = frame(store.query(STEP_UNITS, parameters=parameters))
    job_since = np.array([since[job] for job in held.jobs], np.int64)
    units = step_units(held.where(held.t_ms >= job_since[held.job]), 10, last)
    found = pd.DataFrame({name: units[name] for name in expected.columns})
    assert len(found) == len(expected)
    if len(expected):
        expected = expected.astype({"compute_s": float, "ranks": np.int64, "stage": np.int64})
        pd.testing.assert_frame_equal(found, expected, check_dtype=False)


@SETTINGS
@given(
    # per row: the window before which it is inserted, how late (ms before that window's start), ROW; one
    # row per (job, rank, step): the store keeps one of a step sent again (analytics.store.ledger)
    rows=st.lists(
        st.tuples(st.integers(0, 5), st.integers(-10_000, 9_999), ROW),
        max_size=40,
        unique_by=lambda row: (row[2][1], row[2][2], row[2][4]),
    ),
    overlap_s=st.sampled_from([0.0, 10.0]),
)
def test_a_tape_stepped_through_windows_holds_what_a_fresh_read_holds(
    store: Store, rows: list[tuple[int, int, tuple[Any, ...]]], overlap_s: float
) -> None:
    """Rows inserted for the window about to run and late, for the one before it (within the overlap);
    rows over 25 s and medians over 40 s, so that rows leave each; rows over a part of the range."""
    base = BASE - next(examples) * 7200
    tape = StepTape(overlap_s=overlap_s)
    for k in range(6):
        start = base + 100 + 10 * k
        due = [(round((start - base) * 1000) + offset, row) for when, offset, row in rows if when == k]
        store.insert_steps(records(base, due), token=f"stepped-{base}-{k}")
        window = Window(start, start + 10)
        warm = tape.rows(store, window, window.end - 25)
        fresh_tape = StepTape()
        fresh = fresh_tape.rows(store, window, window.end - 25)
        if overlap_s:
            pd.testing.assert_frame_equal(canonical(warm), canonical(fresh))
            since = window.end - 40  # longer than the rows': the medians' rows outlive the others
            assert medians(tape, store, window, since) == medians(fresh_tape, store, window, since)
            part = window.end - 12
            pd.testing.assert_frame_equal(
                canonical(tape.rows(store, window, part)), canonical(fresh_tape.rows(store, window, part))
            )
        else:  # a late row is missed, and stays so while in the range: what the overlap buys
            assert len(warm) <= len(fresh)
            if k > 0 and any(when == k and offset < 0 for when, offset, _ in rows):
                assert len(warm) < len(fresh)


class StatementCounter:
    """A Reader on a store that counts the statements that read the steps table."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.step_reads = 0

    def query(
        self, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = 10_000
    ) -> QueryResult:
        self.step_reads += "FROM steps" in sql
        return self._store.query(sql, parameters=parameters, max_rows=max_rows)


@pytest.mark.parametrize("names", [["slow_node", "peer_outlier", "gpu_fault", "dma_degraded"], ["slow_node"]])
def test_the_runner_reads_steps_once_a_steady_window_for_all_step_readers(store: Store, names: list[str]):
    store.insert_steps(SyncJob().steps(T0, 100), token="steps")
    reads = StatementCounter(store)
    runner = DetectionRunner(build(names))
    runner.step(reads, window(0))
    for index in range(1, 6):
        reads.step_reads = 0
        runner.step(reads, window(index))
        assert reads.step_reads == 1


def test_job_medians_are_kept_over_the_longest_range_alone(store: Store):
    store.insert_steps(SyncJob().steps(T0, 30), token="steps")
    tape = StepTape()
    tape.rows(store, window(3), window(3).end - 60)
    assert len(tape.job_medians(store, window(3), window(3).end - 60)[0]) == 1
    with pytest.raises(DetectorError, match="longest range alone"):
        tape.job_medians(store, window(3), window(3).end - 30)


def test_the_tape_reads_every_column_as_the_store_holds_it(store: Store):
    """Large step numbers, a NULL stage as 0, a NULL compute time as NaN, times to the millisecond."""
    at = datetime.fromtimestamp(BASE + 12.345, UTC).timestamp()
    store.insert_steps(
        [
            StepRecord(ts=at, job="j", rank=7, node="a", step=2**62, duration_s=1.25, steps=3),
            StepRecord(ts=at, job="j", rank=8, node="b", step=1, duration_s=2.5, compute_s=2.0, pp_stage=4),
        ],
        token="columns",
    )
    rows = StepTape().rows(store, Window(BASE, BASE + 20), BASE)
    table = canonical(rows)
    assert table["step"].tolist() == [2**62, 1] and table["stage"].tolist() == [0, 4]
    assert np.isnan(table["compute_s"][0]) and table["compute_s"][1] == 2.0
    assert table["t_ms"].tolist() == [round(at * 1000)] * 2 and table["steps"].tolist() == [3, 1]


def test_the_tape_forgets_jobs_without_rows_and_holds_what_a_fresh_read_holds(store: Store):
    """Forty jobs one after the other, each named before the last (every new name numbers the others
    again): the names kept stay few, the rows and medians those of a fresh read."""
    base = BASE - next(examples) * 7200
    tape = StepTape()
    for k in range(40):
        start = base + 100 + 10 * k
        rows = [
            (round((start - base) * 1000) + 1000 * i, ("n1", f"job-{99 - k}", i, None, k, 1, None, 1.0 + i))
            for i in range(3)
        ]
        store.insert_steps(records(base, rows), token=f"jobs-{base}-{k}")
        window = Window(start, start + 10)
        fresh = StepTape()
        pd.testing.assert_frame_equal(
            canonical(tape.rows(store, window, start - 20)), canonical(fresh.rows(store, window, start - 20))
        )
        assert medians(tape, store, window, start - 20) == medians(fresh, store, window, start - 20)
    assert len(tape.jobs_.names) <= 2 * 3 + 16 + 1


def test_a_longer_range_reads_its_older_rows_alone(store: Store):
    """A range asked for that grew (a job's steps lengthened) costs a read of the rows before those held,
    not of the whole range; rows and medians stay those of a fresh read."""
    store.insert_steps(SyncJob().steps(T0, 60), token="steps")
    reads, tape = StatementCounter(store), StepTape()
    tape.job_medians(reads, window(10), window(10).end - 30)
    tape.rows(reads, window(10), window(10).end - 20)
    assert reads.step_reads == 2  # each kind of range first asked for is read: medians keep 3 columns
    for since_s, medians_since_s in [(60, 30), (60, 90)]:
        reads.step_reads = 0
        rows = tape.rows(reads, window(11), window(11).end - since_s)
        got = medians(tape, reads, window(11), window(11).end - medians_since_s)
        fresh = StepTape()
        want = canonical(fresh.rows(store, window(11), window(11).end - since_s))
        pd.testing.assert_frame_equal(canonical(rows), want)
        assert got == medians(fresh, store, window(11), window(11).end - medians_since_s)
        assert reads.step_reads == (2 if medians_since_s == 30 else 1)  # new rows and older; older alone

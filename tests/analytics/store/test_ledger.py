"""The store's inserts are idempotent (analytics.store.ledger), on a real chDB store: whatever the order,
grouping and repetition of what is sent, across restarts and sessions, the store holds the first row of
each (series, ts), (job, rank, step) and (target, node, ts), and every other one is reported as a
duplicate (same value, bit for bit) or a conflict (another value)."""

from __future__ import annotations

import itertools
import math
import struct
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.store import Store
from analytics.store.clickhouse import series_id
from analytics.store.records import ScrapeBatch, TargetStatus
from collectors.steprecord import StepRecord

EXAMPLES = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
NODES = ("vela-001", "vela-002")
LABELS = [{"gpu": str(gpu)} for gpu in range(3)]
VALUES = (1.0, 2.0, -0.0, 0.0, math.nan)
START = time.time() - 3600  # examples go forward from an hour ago, a minute each: their own samples
_examples = itertools.count()
_tokens = itertools.count()


def bits(value: float) -> bytes:
    return struct.pack("<d", value)


# a sample: (node, series, ts index, value); a batch: one node and ts, samples of series in any order
batches = st.builds(
    lambda node, tick, samples: (node, tick, samples),
    st.sampled_from(range(len(NODES))),
    st.integers(0, 3),
    st.lists(st.tuples(st.sampled_from(range(len(LABELS))), st.sampled_from(VALUES)), min_size=1, max_size=5),
)
# inserts of one or more batches, each one maybe after a restart (a new process: an empty ledger)
calls = st.lists(st.tuples(st.lists(batches, min_size=1, max_size=3), st.booleans()), min_size=1, max_size=6)


@EXAMPLES
@given(calls=calls)
def test_the_store_holds_the_first_of_every_series_and_ts_and_reports_every_other(
    store: Store, chdb_dir: Path, calls: list
) -> None:
    base = START + next(_examples) * 60
    first: dict[tuple[int, int], float] = {}
    dropped = expected = 0
    duplicates = conflicts = 0
    writer = store
    opened: list[Store] = []
    for inserted, restart in calls:
        if restart:
            writer = Store.open(f"chdb://{chdb_dir}", database=store.database)
            opened.append(writer)
        sent = [
            ScrapeBatch(
                f"{NODES[node]}:9400",
                NODES[node],
                base + tick * 0.25,
                ["DCGM_FI_DEV_GPU_TEMP"] * len(samples),
                [dict(LABELS[series]) for series, _ in samples],  # a new dict each, as a spool replay
                [value for _, value in samples],
            )
            for node, tick, samples in inserted
        ]
        result = writer.insert_samples(sent, token=f"call-{next(_tokens)}")  # a token never used before
        duplicates += result.duplicates
        conflicts += result.conflicts
        for batch in sent:
            for labels, value in zip(batch.labels, batch.values, strict=True):
                key = (series_id("DCGM_FI_DEV_GPU_TEMP", batch.node, labels), round(batch.ts * 1000))
                if key not in first:
                    first[key] = value
                    expected += 1
                else:
                    dropped += 1
                    same = bits(first[key]) == bits(value)
                    duplicates -= same
                    conflicts -= not same
    for extra in opened:
        extra.close()
    rows = store.query(
        "SELECT series_id, toUnixTimestamp64Milli(ts), value FROM samples"
        " WHERE ts >= fromUnixTimestamp64Milli({low:Int64}) AND ts < fromUnixTimestamp64Milli({high:Int64})",
        parameters={"low": round(base * 1000), "high": round(base * 1000) + 1000},
    ).rows
    assert len(rows) == expected
    assert {(sid, t): bits(value) for sid, t, value in rows} == {key: bits(v) for key, v in first.items()}
    assert (duplicates, conflicts) == (0, 0), "every repeat is reported once, as what it is"


steps = st.lists(
    st.tuples(
        st.sampled_from(("job-a", "job-b")),
        st.integers(0, 2),
        st.integers(0, 5),
        st.sampled_from((0.5, 0.75)),
        st.booleans(),
    ),
    min_size=1,
    max_size=30,
)


@EXAMPLES
@given(records=steps, split=st.integers(1, 6))
def test_the_store_holds_the_first_step_of_every_job_rank_and_step_in_any_order(
    store: Store, chdb_dir: Path, records: list, split: int
) -> None:
    example = next(_examples)
    now = time.time()
    first: dict[tuple[str, int, int], float] = {}
    writer = store
    opened = []
    for start in range(0, len(records), split):
        chunk = records[start : start + split]
        if chunk[0][4]:  # a restart before this request
            writer = Store.open(f"chdb://{chdb_dir}", database=store.database)
            opened.append(writer)
        rows = [
            StepRecord(now + 0.0001 * i, f"{job}-{example}", rank, "vela-001", step, duration)
            for i, (job, rank, step, duration, _) in enumerate(chunk)
        ]
        result = writer.insert_steps(rows, token=f"steps-{example}-{start}")
        assert int(result) + result.duplicates + result.conflicts == len(rows)
        for row in rows:
            first.setdefault((row.job, row.rank, row.step), row.duration_s)
    for extra in opened:
        extra.close()
    stored = store.query(
        "SELECT job, rank, step, duration_s FROM steps WHERE endsWith(job, {suffix:String})",
        parameters={"suffix": f"-{example}"},
    ).rows
    assert sorted(stored) == sorted((*key, duration) for key, duration in first.items())


def test_scrape_rows_repeated_in_one_insert_and_later_are_stored_once(store: Store) -> None:
    now = time.time()
    up = TargetStatus(now, "vela-001:9400", "vela-001", True, 0.01, 3)
    down = TargetStatus(now, "vela-001:9400", "vela-001", False, 0.5, 0, "refused")
    result = store.insert_targets([up, up, down], token="one")
    assert (int(result), result.duplicates, result.conflicts) == (1, 1, 1)
    result = store.insert_targets(
        [up, TargetStatus(now + 1, "vela-001:9400", "vela-001", True, 0.01, 3)], token="two"
    )
    assert (int(result), result.duplicates, result.conflicts) == (1, 1, 0)
    assert store.query("SELECT count(), countIf(up) FROM targets").rows == [(2, 2)]


def test_a_step_run_again_after_a_restart_from_a_checkpoint_is_stored_and_its_retry_is_not(store: Store):
    now = time.time()
    first_run = [
        StepRecord(now + i, "job-c", 0, "vela-001", step, 0.5) for i, step in enumerate(range(100, 105))
    ]
    rerun = [
        StepRecord(now + 60 + i, "job-c", 0, "vela-001", step, 0.6) for i, step in enumerate(range(101, 107))
    ]
    assert store.insert_steps(first_run, token="run-1") == 5
    result = store.insert_steps(rerun, token="run-2")  # restarted from the checkpoint at step 100
    assert (int(result), result.duplicates, result.conflicts) == (6, 0, 0)
    result = store.insert_steps([*first_run[2:], *rerun[:3]], token="retry")  # both runs sent again
    assert (int(result), result.duplicates, result.conflicts) == (0, 6, 0)
    runs = store.query("SELECT step, count() FROM steps WHERE job = 'job-c' GROUP BY step ORDER BY step").rows
    assert runs == [(100, 1), (101, 2), (102, 2), (103, 2), (104, 2), (105, 1), (106, 1)]

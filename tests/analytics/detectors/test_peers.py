"""analytics.detectors.peers: the numpy peer baseline gives the numbers of the pandas one it replaced
(kept here as the reference), on random features with NaNs, infinities, lone nodes and empty stages; and
node_jobs and step_aggregates answer NODE_JOBS (for any lookback) and STEP_AGGREGATES from the steps tape's
rows."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from analytics.detectors.base import Window, frame
from analytics.detectors.groups import Groups
from analytics.detectors.peers import (
    MAD_TO_SIGMA,
    NODE_JOBS,
    STEP_AGGREGATES,
    clip_lower,
    node_jobs,
    node_values,
    peer_baseline,
    step_aggregates,
)
from analytics.store import Store
from analytics.store.records import QueryResult
from collectors.steprecord import StepRecord
from tests.analytics.detectors import records

FEATURES = 3
VALUES = st.one_of(
    st.sampled_from([np.nan, 0.0, -0.0, 1.0, 2.5, np.inf, -np.inf]),
    st.floats(min_value=-1e4, max_value=1e4, allow_nan=False),
)


def pandas_baseline(
    values: pd.DataFrame, groups: list[pd.Series], relative_floor: float, absolute_floor: pd.Series
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """peer_baseline as it was, on pandas groupby."""
    median = values.groupby(groups).transform("median")
    mad = (values - median).abs().groupby(groups).transform("median")
    floor = (relative_floor * median.abs()).clip(lower=absolute_floor, axis=1)
    return median, (mad * MAD_TO_SIGMA).clip(lower=floor)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2)), min_size=1, max_size=30).flatmap(
        lambda keys: st.tuples(
            st.just(keys), arrays(float, (len(keys), FEATURES), elements=VALUES), st.sampled_from([0.0, 0.02])
        )
    ),
    arrays(float, FEATURES, elements=st.sampled_from([0.0, 1.0, 20.0])),
)
def test_peer_baseline_equals_the_pandas_one(case: tuple, absolute_floor: np.ndarray) -> None:
    keys, values, relative_floor = case
    job, stage = np.array([k[0] for k in keys], dtype=object), np.array([k[1] for k in keys])
    median, spread = peer_baseline(values, Groups(job, stage), relative_floor, absolute_floor)
    frame = pd.DataFrame(values, columns=list("xyz"))
    expected_median, expected_spread = pandas_baseline(
        frame,
        [pd.Series(job), pd.Series(stage)],
        relative_floor,
        pd.Series(absolute_floor, index=list("xyz")),
    )
    assert np.array_equal(median, expected_median.to_numpy(), equal_nan=True)
    assert np.array_equal(spread, expected_spread.to_numpy(), equal_nan=True)
    assert np.array_equal(np.signbit(spread), np.signbit(expected_spread.to_numpy()))


@settings(max_examples=200, deadline=None)
@given(arrays(float, 8, elements=VALUES), arrays(float, 8, elements=VALUES))
def test_clip_lower_is_pandas_clip(values: np.ndarray, floor: np.ndarray) -> None:
    expected = pd.Series(values).clip(lower=pd.Series(floor)).to_numpy()
    assert np.array_equal(clip_lower(values, floor), expected, equal_nan=True)
    assert np.array_equal(np.signbit(clip_lower(values, floor)), np.signbit(expected))


def test_node_values_place_each_row_and_leave_the_rest_nan() -> None:
    result = QueryResult(
        columns=["node", "metric", "value"],
        types=["String", "String", "Nullable(Float64)"],
        rows=[
            ("n2", "m1", 3.0),
            ("n1", "m2", None),
            ("n9", "m1", 1.0),
            ("n1", "other", 5.0),
            ("n1", "m1", 2.0),
        ],
    )
    values = node_values(result, ["m1", "m2"], ["n1", "n2", "n3"])
    assert np.array_equal(values, [[2.0, np.nan], [3.0, np.nan], [np.nan, np.nan]], equal_nan=True)


BASE = time.time() // 3600 * 3600 - 3 * 86400  # recent enough for the steps' retention
examples = itertools.count()
# a row's time after BASE in ms: anywhere, or at the bounds of a window [1000 s, 1010 s) and its lookbacks
MILLISECONDS = st.one_of(
    st.integers(0, 1_010_000),
    st.sampled_from([699_999, 700_000, 700_001, 940_000, 990_000, 999_999, 1_000_000, 1_009_999, 1_010_000]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.sampled_from(["llm", "eval", "b"]), MILLISECONDS),
        max_size=25,
        unique_by=lambda row: (row[0], row[2]),  # no two rows of a node at one time: argMax would pick any
    ),
    lookback_s=st.sampled_from([0.0, 0.0015, 10.0, 60.0, 299.9995, 300.0, 900.0]),
    window_start=st.sampled_from([1000.0, 1000.0005, 1000.25]),
)
def test_node_jobs_is_node_jobs_sql_for_any_lookback(
    store: Store, rows: list[tuple[str, str, int]], lookback_s: float, window_start: float
) -> None:
    """Rows in the window, in and out of the lookback, and before the longest lookback read; times to the
    millisecond, lookbacks and windows off the millisecond."""
    base = BASE - next(examples) * 7200  # an hour from every other example's rows, both ways
    steps = [
        StepRecord(ts=base + ms / 1000, job=job, rank=0, node=node, step=0, duration_s=1.0)
        for node, job, ms in rows
    ]
    store.insert_steps(steps, token=f"jobs-{base}")
    window = Window(base + window_start, base + window_start + 10)
    parameters = {
        "lookback": datetime.fromtimestamp(window.start - lookback_s, UTC),
        "end": datetime.fromtimestamp(window.end, UTC),
    }
    expected = dict(store.query(NODE_JOBS, parameters=parameters).rows)
    assert node_jobs(store, window, lookback_s).to_dict() == expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["n1", "n2"]),
            st.sampled_from(["llm", "eval"]),
            st.sampled_from([None, 0, 3]),  # pp_stage
            st.sampled_from([None, 0.5, 1.0, 2.0, 0.25]),  # compute_s
            st.sampled_from([0.5, 1.0, 4.0, 1.5]),  # duration_s
            st.integers(1, 4),  # steps
            MILLISECONDS,
        ),
        max_size=25,
    ),
    window_start=st.sampled_from([1000.0, 1000.0005]),
)
def test_step_aggregates_is_step_aggregates_sql(
    store: Store, rows: list[tuple[Any, ...]], window_start: float
) -> None:
    """Rows in the window and before it (in the shared statement's lookback and beyond), stages and
    compute times missing or not, groups with an even count (the median's upper middle)."""
    base = BASE - next(examples) * 7200
    drawn = [
        (ms, (node, job, rank, stage, rank, covered, compute_s, duration_s))
        for rank, (node, job, stage, compute_s, duration_s, covered, ms) in enumerate(rows)
    ]
    steps = records(base, drawn)
    store.insert_steps(steps, token=f"aggregates-{base}")
    window = Window(base + window_start, base + window_start + 10)
    expected = frame(store.query(STEP_AGGREGATES, parameters=window.parameters))
    found = step_aggregates(store, window)
    assert list(found.columns) == list(expected.columns)
    assert len(found) == len(expected)
    if len(expected):
        expected = expected.astype({"compute_s": float, "duration_s": float, "steps": int, "stage": int})
        pd.testing.assert_frame_equal(found, expected, check_dtype=False)

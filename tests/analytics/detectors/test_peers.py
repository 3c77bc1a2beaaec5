"""analytics.detectors.peers: the numpy peer baseline gives the numbers of the pandas one it replaced
(kept here as the reference), on random features with NaNs, infinities, lone nodes and empty stages."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from analytics.detectors.groups import Groups
from analytics.detectors.peers import MAD_TO_SIGMA, clip_lower, node_values, peer_baseline
from analytics.store.records import QueryResult

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

"""The contract's helpers: as_tuples is itertuples, value for value and type for type."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from analytics.detectors.base import as_tuples

ROW = st.tuples(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**62), 2**62),
    st.booleans(),
    st.text(max_size=5),
    st.lists(st.integers(0, 9), max_size=3),
    st.integers(0, 2**40),
)
NAMES = ["value", "count", "flag", "node", "_ranks", "ts"]  # "_ranks" is renamed, as pandas does


def same(left: object, right: object) -> bool:
    both_nan = isinstance(left, float) and isinstance(right, float) and math.isnan(left) and math.isnan(right)
    return type(left) is type(right) and (both_nan or left == right)


@settings(max_examples=80, deadline=None)
@given(rows=st.lists(ROW, max_size=6), labels=st.lists(st.integers(-5, 5), min_size=6, max_size=6))
def test_as_tuples_gives_what_itertuples_gives(rows: list[tuple], labels: list[int]) -> None:
    columns = list(zip(*rows, strict=True)) or [[] for _ in NAMES]
    frame = pd.DataFrame(
        {
            "value": np.array(columns[0], float),
            "count": np.array(columns[1], np.int64),
            "flag": np.array(columns[2], bool),
            "node": pd.Series(columns[3], dtype=object),
            "_ranks": pd.Series(columns[4], dtype=object),
            "ts": pd.to_datetime(np.array(columns[5], np.int64), unit="ms", utc=True),
        },
        index=labels[: len(rows)],
    )
    for index in (True, False):
        expected, found = list(frame.itertuples(index=index)), as_tuples(frame, index=index)
        assert [row._fields for row in found] == [row._fields for row in expected]
        rows_pairs = zip(expected, found, strict=True)
        pairs = [pair for want, got in rows_pairs for pair in zip(want, got, strict=True)]
        assert all(same(left, right) for left, right in pairs)

"""analytics.detectors.groups gives pandas groupby's numbers to the bit, on random frames with NaNs,
infinities, ties, groups of one row and groups without a value."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors.groups import (
    Groups,
    by_group_then_value,
    columns_frame,
    group_bit_or,
    group_mean,
    looked_up,
    objects,
    sorted_codes,
)
from analytics.store import Store

VALUES = st.one_of(
    st.sampled_from([np.nan, 0.0, 1.0, 1.0 / 3, -2.5, np.inf, -np.inf]),
    st.integers(0, 23).map(lambda k: k / 23),  # standings: their sums round by order
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
)
ROWS = st.lists(
    st.tuples(st.sampled_from(["job-b", "job-a", "j"]), st.integers(0, 3), st.integers(-2, 2), VALUES),
    max_size=60,
)


def _frame(rows: list[tuple[str, int, int, float]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["job", "stage", "unit", "value"])
    return frame.astype({"job": object, "stage": np.int64, "unit": np.int64, "value": float})


def _same(ours: np.ndarray, theirs: pd.Series) -> None:
    """Equal to the bit, NaN where pandas has NaN."""
    assert np.array_equal(ours, theirs.to_numpy(dtype=float), equal_nan=True), (ours, theirs.to_numpy())
    assert np.array_equal(np.signbit(ours), np.signbit(theirs.to_numpy(dtype=float)))


@settings(max_examples=300, deadline=None)
@given(ROWS)
def test_reductions_equal_pandas(rows: list[tuple[str, int, int, float]]) -> None:
    frame = _frame(rows)
    keys = ["job", "stage", "unit"]
    groups = Groups(*(frame[key].to_numpy() for key in keys))
    grouped = frame.groupby(keys)["value"]
    values = frame["value"].to_numpy()
    assert groups.count == grouped.ngroups
    _same(groups.median(values), grouped.median())
    _same(groups.max(values), grouped.max())
    _same(groups.sum(values), grouped.sum())
    _same(groups.mean(values), grouped.mean())
    _same(groups.first(values), grouped.first())
    assert np.array_equal(groups.non_null(values), grouped.count().to_numpy())
    _same(groups.rank(values), grouped.rank(method="average"))
    _same(groups.median(values)[groups.ids], grouped.transform("median"))
    if len(frame):
        first = frame.iloc[groups.first_rows()][keys]
        assert list(first.itertuples(index=False, name=None)) == list(grouped.median().index)


@settings(max_examples=200, deadline=None)
@given(ROWS)
def test_second_largest_is_np_sort_second_from_the_end(rows: list[tuple[str, int, int, float]]) -> None:
    frame = _frame(rows)
    groups = Groups(frame["job"].to_numpy(), frame["unit"].to_numpy())

    def second(values: pd.Series) -> float:
        ordered = np.sort(values.to_numpy(dtype=float))
        return float(ordered[-2]) if len(ordered) >= 2 else float("nan")

    expected = frame.groupby(["job", "unit"])["value"].agg(second)
    _same(groups.second_largest(frame["value"].to_numpy()), expected)


KEYS = st.one_of(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40).map(lambda key: np.array(key, np.int64)),
    st.lists(st.integers(-3, 3000), max_size=40).map(lambda key: np.array(key, np.int64)),
    st.lists(st.integers(2**64 - 8, 2**64 - 1) | st.integers(0, 9), max_size=40).map(
        lambda key: np.array(key, np.uint64)
    ),
    st.lists(st.text(max_size=3), max_size=40).map(lambda key: np.array(key, dtype=object)),
)


@settings(max_examples=300, deadline=None)
@given(KEYS)
def test_sorted_codes_are_np_uniques_inverse(key: np.ndarray) -> None:
    """Counted over a short range of integers or factorized, the codes are np.unique's (a range that
    wraps past int64, large unsigned keys and text included)."""
    distinct, inverse = np.unique(key, return_inverse=True)
    codes, count = sorted_codes(key)
    assert count == len(distinct) and codes.tolist() == inverse.reshape(-1).tolist()


def test_no_rows_no_groups() -> None:
    groups = Groups(np.array([], dtype=object), np.array([], dtype=np.int64))
    empty = np.array([], dtype=float)
    assert groups.count == 0
    for reduction in (groups.median, groups.max, groups.sum, groups.mean, groups.first, groups.rank):
        assert len(reduction(empty)) == 0


ROWS_BY_CODE = st.lists(  # a group code (4 groups, some without rows), a value, some bits
    st.tuples(st.integers(0, 3), VALUES, st.integers(0, (1 << 62) - 1)), max_size=40
)
CLICKHOUSE_REDUCTIONS = """
SELECT g, avg(v) AS mean, groupBitOr(b) AS bits
FROM (
    SELECT arrayJoin(arrayZip({g:Array(Int64)}, {v:Array(Float64)}, {b:Array(Int64)})) AS row,
        row.1 AS g, row.2 AS v, row.3 AS b
)
GROUP BY g
ORDER BY g
"""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ROWS_BY_CODE)
def test_group_mean_and_bit_or_are_clickhouses_avg_and_group_bit_or(
    store: Store, rows: list[tuple[int, float, int]]
) -> None:
    codes = np.array([row[0] for row in rows], dtype=np.int64)
    values = np.array([row[1] for row in rows], dtype=float)
    bits = np.array([row[2] for row in rows], dtype=np.int64)
    parameters = {"g": codes.tolist(), "v": values.tolist(), "b": bits.tolist()}
    result = store.query(CLICKHOUSE_REDUCTIONS, parameters=parameters)
    want_mean, want_bits = np.full(4, np.nan), np.zeros(4, np.int64)  # a group without rows: NaN and 0
    for group, mean, bit_or in result.rows:
        want_mean[group], want_bits[group] = mean, bit_or
    got_mean = group_mean(codes, 4, values)
    assert np.array_equal(got_mean, want_mean, equal_nan=True), (got_mean, want_mean)
    numbers = ~np.isnan(want_mean)  # a zero's sign too; NaN's has no meaning
    assert np.array_equal(np.signbit(got_mean[numbers]), np.signbit(want_mean[numbers]))
    assert np.array_equal(group_bit_or(codes, 4, bits), want_bits)


@settings(max_examples=200, deadline=None)
@given(
    table=st.dictionaries(
        st.sampled_from(["n1", "n2", "n3", "", "nœud"]), st.sampled_from(["job-a", "", "j"])
    ),
    keys=st.lists(st.sampled_from(["n1", "n2", "n3", "n4", "", "nœud"]), max_size=20),
)
def test_looked_up_is_reindex_with_its_default(table: dict[str, str], keys: list[str]) -> None:
    """What peers.node_jobs(...).reindex(nodes, fill_value="") gave, from any table (empty too) and keys
    in and out of it, repeated or none."""
    series = pd.Series(table, dtype=object, name="job")
    found = looked_up(series, np.array(keys, dtype=object), "")
    expected = series.reindex(np.array(keys, dtype=object), fill_value="").to_numpy(object)
    assert found.dtype == object and found.tolist() == expected.tolist()


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(0, 6).flatmap(
        lambda n: st.tuples(
            st.lists(VALUES, min_size=n, max_size=n),
            st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n),
            st.lists(st.sampled_from(["", "gpu:0", "nœud", "1"]), min_size=n, max_size=n),
        )
    )
)
def test_columns_frame_is_the_dict_frame_with_text_kept_as_python_objects(
    rows: tuple[list[float], list[int], list[str]],
) -> None:
    """The frame DataFrame(dict) builds, numbered from 0, but text and lists stay object columns: what
    a detector reads back is the Python value it put in, not an Arrow string."""
    values, counts, names = rows
    columns = {
        "value": np.array(values, np.float64),
        "count": np.array(counts, np.int64),
        "flag": np.array([v > 0 for v in values], bool),
        "name": np.array(names, object),
        "reasons": objects([[name] for name in names]),
    }
    found = columns_frame(columns)
    expected = pd.DataFrame({name: pd.Series(column, dtype=column.dtype) for name, column in columns.items()})
    pd.testing.assert_frame_equal(found, expected)
    assert found["name"].dtype == object and found["reasons"].tolist() == [[name] for name in names]
    columns["value"][:] = 7.0  # the frame holds its own copy
    assert np.array_equal(found["value"].to_numpy(), np.array(values, np.float64), equal_nan=True)


def test_columns_frame_refuses_columns_of_different_lengths() -> None:
    with pytest.raises(ValueError, match=r"'a': 2, 'b': 1"):
        columns_frame({"a": np.zeros(2), "b": np.zeros(1)})


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 5), VALUES | st.sampled_from([-0.0, 0.0])), max_size=60),
    wide=st.booleans(),
    integers=st.booleans(),
)
def test_by_group_then_value_is_lexsorts_order(rows: list[tuple[int, float]], wide: bool, integers: bool):
    """Whether the group codes fit 16 bits or not, of float values (NaN last, a -0.0 and a 0.0 in the
    order they came: a median can land on either) or integers: lexsort's order, row for row."""
    count = 70_000 if wide else 6
    groups = np.array([group * (count // 6) for group, _ in rows], np.int64)
    values = np.array([value for _, value in rows], np.float64)
    if integers:
        values = np.nan_to_num(values, posinf=9, neginf=-9).astype(np.int64)
    assert by_group_then_value(groups, count, values).tolist() == np.lexsort((values, groups)).tolist()


def test_columns_frame_spreads_a_text_over_the_rows_as_a_python_object_column() -> None:
    found = columns_frame({"node": np.array(["n1", "n2"], object), "job": "", "value": np.ones(2)})
    assert found["job"].dtype == object and found["job"].tolist() == ["", ""]
    assert columns_frame({"job": ""}).empty

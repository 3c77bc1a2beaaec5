"""The tape's per-series summaries are series_sql's, value for value, on real chDB: for random series
with counter resets, NaN and +Inf, gaps shorter and longer than the lookback, samples on window edges,
several series per node, samples inserted late; stepped window by window or fresh."""

from __future__ import annotations

import itertools
import math
import time
import uuid
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors.base import Window, read_frame
from analytics.detectors.counters import (
    INCREASE,
    INSIDE_MAX,
    INSIDE_MIN,
    LAST,
    STEADY_INCREASE,
    STEADY_RATE,
    STEADY_SECONDS,
    series_sql,
)
from analytics.detectors.groups import group_sum
from analytics.detectors.tape import (
    OVERLAP_S,
    Tape,
    TapeView,
    append_per_key,
    first_ms_from,
    key_time_order,
    tape_view,
)
from analytics.store import Store
from analytics.store.records import ScrapeBatch
from tests.analytics.detectors.replay import series_sql_frame

WINDOW_S = 10.0
WINDOWS = 4
SUMMARIES_SQL = series_sql(
    "series_id",
    f"{INCREASE} AS increase",
    f"{STEADY_INCREASE} AS steady_increase",
    f"{STEADY_SECONDS} AS steady_seconds",
    f"{STEADY_RATE} AS steady_rate",
    f"{LAST} AS last",
    "length(inside) AS samples",
    f"{INSIDE_MIN} AS inside_min",
    f"{INSIDE_MAX} AS inside_max",
)
COLUMNS = [
    "series_id", "metric", "node", "labels", "samples", "last", "increase", "steady_increase",
    "steady_seconds", "steady_rate", "inside_min", "inside_max",
]  # fmt: skip
examples = itertools.count()

# a value: mostly a counter's (whole numbers, so that a drop is a reset), now and then a gauge's
values = st.one_of(
    st.integers(0, 50).map(float),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([math.nan, math.inf, 0.0]),
)
# a sample's offset in ms from the lookback's start of the first window: on window edges, just off them,
# anywhere; a series' times are distinct, as a store's are
offsets = st.one_of(
    st.integers(0, 12).map(lambda k: k * 10_000),
    st.integers(0, 12).map(lambda k: k * 10_000 - 1),
    st.integers(0, 120_000),
)
series_samples = st.dictionaries(offsets.filter(lambda ms: ms >= 0), values, max_size=25)
fleets = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 2), series_samples),  # node, metric, samples
    min_size=1,
    max_size=6,
)


def base_ms() -> int:
    """An aligned time an hour ago (the store's retention keeps it), in ms."""
    return int((math.floor(time.time() / WINDOW_S) * WINDOW_S - 3600) * 1000)


def store_samples(store: Store, samples: list[tuple[str, str, dict[str, str], int, float]]) -> None:
    """Insert (node, metric, labels, unix ms, value) samples, one scrape per node and time."""
    scrapes: dict[tuple[str, int], list[tuple[str, dict[str, str], float]]] = defaultdict(list)
    for node, metric, labels, ms, value in samples:
        scrapes[(node, ms)].append((metric, labels, value))
    batches = [
        ScrapeBatch(f"{node}:9100", node, ms / 1000, *(list(column) for column in zip(*rows, strict=True)))
        for (node, ms), rows in scrapes.items()
    ]
    store.insert_samples(batches, token=f"tape/{uuid.uuid4()}")


def expected(store: Store, metrics: list[str], window: Window, lookback_s: float) -> pd.DataFrame:
    return ordered(series_sql_frame(store, SUMMARIES_SQL, metrics, window, lookback_s))


def summarised(view: TapeView) -> pd.DataFrame:
    """The view's series with their summaries: what series_sql gives."""
    return pd.concat([view.series, view.summaries()], axis=1)


def ordered(summaries: pd.DataFrame) -> pd.DataFrame:
    summaries = summaries.astype({"series_id": np.uint64})
    return summaries.sort_values("series_id")[COLUMNS].reset_index(drop=True)


def assert_same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Equal in every value: numbers bit for bit (NaN where NaN), labels as dicts."""
    got = ordered(got)
    assert len(got) == len(want)
    for column in COLUMNS:
        if column in ("metric", "node", "labels"):
            assert got[column].tolist() == want[column].tolist(), column
        else:
            np.testing.assert_array_equal(
                got[column].to_numpy(np.float64), want[column].to_numpy(np.float64), column
            )


def assert_same_points(got: TapeView, want: TapeView) -> None:
    """The same samples of the same series, each with the same role: in the window, ending its series, a
    step between points."""
    np.testing.assert_array_equal(got.rows, want.rows)
    for name in ("group", "value", "t", "inside", "last", "points", "step", "previous_value"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fleet=fleets,
    late=fleets,
    lookbacks=st.lists(st.sampled_from([0.0, 5.0, 20.0, 60.0]), min_size=3, max_size=3),
)
def test_the_tape_summarises_each_series_as_series_sql_does_stepped_or_fresh(
    store: Store,
    fleet: list[tuple[int, int, dict[int, float]]],
    late: list[tuple[int, int, dict[int, float]]],
    lookbacks: list[float],
):
    """Each metric read with its own lookback (all alike, or mixed, held each for its own), and series
    that first appear in a later window (`late`)."""
    example = next(examples)
    metrics = [f"tape_{example}_metric_{k}" for k in range(3)]
    start_ms = base_ms()
    first = Window((start_ms + 60_000) / 1000, (start_ms + 60_000) / 1000 + WINDOW_S)
    windows = [Window(first.start + k * WINDOW_S, first.end + k * WINDOW_S) for k in range(WINDOWS)]

    def samples(specs, keep) -> list[tuple[str, str, dict[str, str], int, float]]:
        return [
            (f"node-{node}", metrics[metric], {"device": f"mlx5_{index}", "port": "1"}, start_ms + ms, value)
            for index, (node, metric, points) in enumerate(specs)
            for ms, value in points.items()
            if keep(start_ms + ms) and (node, metric, index, ms) not in stored
        ]

    stored: set[tuple[int, int, int, int]] = set()  # a late sample never repeats a stored one's time
    store_samples(store, samples(fleet, lambda ms: True))
    stored.update((n, m, i, ms) for i, (n, m, points) in enumerate(fleet) for ms in points)
    readers: dict[float, list[str]] = defaultdict(list)  # lookback -> the metrics read with it
    for metric, lookback_s in zip(metrics, lookbacks, strict=True):
        readers[lookback_s].append(metric)
    tape = Tape()
    tape.register(dict(zip(metrics, lookbacks, strict=True)))
    for index, window in enumerate(windows):
        if index:  # samples for the last window, inserted after it ran, within the overlap of its end
            since_ms = round((window.start - OVERLAP_S) * 1000)
            store_samples(store, samples(late, lambda ms, w=window, s=since_ms: s <= ms < w.start * 1000))
        for lookback_s, read in readers.items():
            want = expected(store, read, window, lookback_s)
            view = tape.view(store, read, window, lookback_s)
            assert_same(summarised(view), want)
            assert_same(summarised(Tape().view(store, read, window, lookback_s)), want)
            assert_same_points(tape.view(store, read, window, lookback_s, points_only=True), view.points_only)


def test_the_tape_reads_only_the_new_samples_and_its_overlap_when_warm(store: Store):
    start_ms = base_ms()
    store_samples(store, [("node-0", "warm_metric", {}, start_ms + k * 1000, float(k)) for k in range(200)])
    tape, reads = Tape(), CountingReader(store)
    window = Window(start_ms / 1000 + 120, start_ms / 1000 + 130)
    tape.view(reads, ["warm_metric"], window, 60.0)
    assert len(tape.t_ms_) == 70  # the lookback and the window
    following = Window(window.end, window.end + WINDOW_S)
    view = tape.view(reads, ["warm_metric"], following, 60.0)
    assert reads.rows == [70, 1, 20]  # samples, the catalog, then the new window and the overlap alone
    assert summarised(view)["samples"].tolist() == [10]


def test_a_warm_tape_reads_the_catalog_rows_of_new_series_alone(store: Store):
    """A series first sampled in a later window costs its own row of `series`, not the metric's table."""
    start_ms = base_ms()
    old = [
        ("node-0", "churn", {"gpu": str(gpu)}, start_ms + k * 10_000, 1.0)
        for gpu in range(9)
        for k in range(13)
    ]
    store_samples(store, [*old, ("node-1", "churn", {"gpu": "0"}, start_ms + 125_000, 2.0)])
    tape, reads = Tape(), CountingReader(store)
    window = Window(start_ms / 1000 + 110, start_ms / 1000 + 120)
    tape.view(reads, ["churn"], window, 60.0)
    following = Window(window.end, window.end + WINDOW_S)
    view = tape.view(reads, ["churn"], following, 60.0)
    assert reads.rows[1] == 9 and reads.rows[3] == 1  # the catalog: nine series, then the new one alone
    assert_same(summarised(view), expected(store, ["churn"], following, 60.0))


def test_a_detector_alone_reads_a_fresh_tape_through_any_reader(store: Store):
    """A Reader without columnar reads (a HubClient, a fake) gets the same summaries through query()."""
    start_ms = base_ms()
    rows = [("node-0", "plain_metric", {"gpu": "0"}, start_ms + k * 5000, float(k % 7)) for k in range(30)]
    store_samples(store, rows)
    window = Window(start_ms / 1000 + 100, start_ms / 1000 + 110)
    plain = summarised(tape_view(RowsOnly(store), ["plain_metric"], window, 60.0))
    assert_same(plain, expected(store, ["plain_metric"], window, 60.0))


def test_a_series_the_series_table_does_not_list_is_summarised_as_series_sql_does(store: Store):
    """No labels, its metric and node from its samples (a writer that failed between the two tables)."""
    start_ms = base_ms()
    store_samples(
        store, [("node-0", "unlisted", {"gpu": "0"}, start_ms + k * 10_000, float(k)) for k in range(9)]
    )
    store._client.command(
        f"INSERT INTO {store.database}.samples (metric, node, series_id, ts, value) VALUES "
        + ", ".join(
            f"('unlisted', 'node-9', 42, fromUnixTimestamp64Milli({start_ms + k * 7000}), {k})"
            for k in range(9)
        )
    )
    window = Window(start_ms / 1000 + 50, start_ms / 1000 + 60)
    summaries = summarised(Tape().view(store, ["unlisted"], window, 60.0))
    assert_same(summaries, expected(store, ["unlisted"], window, 60.0))
    assert summaries["labels"].tolist().count({}) == 1


class RowsOnly:
    """A Reader with query() alone."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def query(self, sql, *, parameters=None, max_rows=10_000):
        return self._store.query(sql, parameters=parameters, max_rows=max_rows)


class CountingReader(RowsOnly):
    """Counts the rows of each columnar read."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.rows: list[int] = []

    def query_frame(self, sql, *, parameters=None, max_rows=10_000):
        result = read_frame(self._store, sql, parameters=parameters, max_rows=max_rows)
        self.rows.append(len(result.frame))
        return result


@pytest.mark.parametrize("overlap_s", [0.0, OVERLAP_S])
def test_a_sample_later_than_the_overlap_is_missed_by_a_warm_tape_only(store: Store, overlap_s: float):
    """What the overlap buys: a sample inserted for the last window after it ran is seen when it is within
    the overlap of that window's end."""
    start_ms = base_ms()
    store_samples(
        store, [("node-0", f"late_{overlap_s}", {}, start_ms + k * 10_000, float(k)) for k in range(13)]
    )
    tape = Tape(overlap_s=overlap_s)
    window = Window(start_ms / 1000 + 110, start_ms / 1000 + 120)
    tape.view(store, [f"late_{overlap_s}"], window, 60.0)
    store_samples(store, [("node-0", f"late_{overlap_s}", {}, start_ms + 115_000, 100.0)])
    following = Window(window.end, window.end + WINDOW_S)
    warm = summarised(tape.view(store, [f"late_{overlap_s}"], following, 60.0))
    fresh = summarised(Tape().view(store, [f"late_{overlap_s}"], following, 60.0))
    assert (warm["increase"].tolist() == fresh["increase"].tolist()) == (overlap_s > 0)


KEYS = st.integers(0, 5) | st.integers(0, 2**62)  # few, repeated; or too wide to pack
TIMES = st.integers(0, 3) | st.integers(-(2**40), 2**40)


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(
        st.tuples(KEYS, TIMES),
        max_size=300,
    )
)
def test_key_time_order_is_lexsorts_ties_and_all(samples: list[tuple[int, int]]):
    """Packed into one integer where the keys, the time span and the row numbers fit in 63 bits, by
    lexsort itself where not: either way lexsort's order, repeated samples in the order read."""
    key = np.array([key for key, _ in samples], np.int64)
    t_ms = np.array([t_ms for _, t_ms in samples], np.int64)
    assert key_time_order(key, t_ms).tolist() == np.lexsort((t_ms, key)).tolist()


@settings(max_examples=200, deadline=None)
@given(
    held=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 5)), max_size=60),
    new=st.lists(st.tuples(st.integers(0, 6), st.integers(6, 9)), max_size=30),
    keys=st.integers(7, 9),
)
def test_append_per_key_is_a_stable_sort_by_key_of_held_then_new(
    held: list[tuple[int, int]], new: list[tuple[int, int]], keys: int
):
    """Each key's held samples, then its new ones (all later), every sample once, each column alike; and
    where each key starts, keys without samples too."""

    def samples(rows: list[tuple[int, int]], tag: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = sorted(rows)
        key = np.array([key for key, _ in rows], np.int64)
        t_ms = np.array([t_ms for _, t_ms in rows], np.int64)
        return key, t_ms, tag + np.arange(len(rows), dtype=np.float64)

    both = [np.concatenate(pair) for pair in zip(samples(held, 0.0), samples(new, 0.5), strict=True)]
    order = np.lexsort((both[1], both[0]))  # stable: held before new on a tie, none here
    (key, t_ms, value), starts = append_per_key(samples(held, 0.0), samples(new, 0.5), keys)
    assert [key.tolist(), t_ms.tolist(), value.tolist()] == [column[order].tolist() for column in both]
    assert starts.tolist() == np.searchsorted(key, np.arange(keys + 1)).tolist()


@settings(max_examples=300, deadline=None)
@given(
    seconds=st.floats(-(2.0**40), 2.0**40, allow_nan=False)
    | st.integers(-(2**40), 2**40).map(lambda ms: ms / 1000)
)
def test_first_ms_from_is_where_the_divided_milliseconds_reach_the_window(seconds: float):
    """A view's `inside` compares whole milliseconds with first_ms_from(since): the same samples as
    dividing each by 1000 and comparing with since, on either side of the bound."""
    first = first_ms_from(seconds)
    t_ms = np.arange(first - 3, first + 3, dtype=np.int64)
    assert ((t_ms / 1000) >= seconds).tolist() == (t_ms >= first).tolist()


@pytest.mark.parametrize("where", [[False, False, False], [True, False, True]])
def test_group_sum_is_float64_whether_or_not_anything_is_summed(where: list[bool]):
    sums = group_sum(np.array([0, 1, 1]), 3, np.array([1.5, 2.0, 4.0]), np.array(where))
    assert sums.dtype == np.float64
    assert sums.tolist() == [float(where[0]) * 1.5, 4.0 * where[2], 0.0]


def test_the_tape_forgets_series_without_samples_for_the_longest_lookback(store: Store):
    """A series sampled no more is dropped from the catalog once nothing of it has been held for the
    longest lookback; its derived columns go with it, also when a new series takes its place in the
    catalog's length, and one sampled again is read back."""
    start_ms = base_ms()
    rows = [("node-0", "gone", {"gpu": "0"}, start_ms + k * 10_000, float(k)) for k in range(30)]
    rows += [("node-0", "gone", {"gpu": "1"}, start_ms + k * 10_000, float(k)) for k in range(6)]
    rows += [("node-0", "gone", {"gpu": "2"}, start_ms + k * 10_000, float(k)) for k in range(10, 30)]
    rows += [("node-0", "gone", {"gpu": "1"}, start_ms + k * 10_000, float(k)) for k in range(26, 30)]
    store_samples(store, rows)
    tape = Tape()
    tape.register({"gone": 20.0})
    catalogs = []

    def identity(catalog: pd.DataFrame) -> pd.DataFrame:  # one derivation, cached from window to window
        return catalog[["labels"]]

    for k in range(3, 29):
        window = Window(start_ms / 1000 + k * WINDOW_S, start_ms / 1000 + (k + 1) * WINDOW_S)
        view = tape.view(store, ["gone"], window, 20.0)
        assert_same(summarised(view), expected(store, ["gone"], window, 20.0))
        derived = view.derived(identity)
        assert derived["labels"].tolist() == view.series["labels"].tolist()
        catalogs.append([labels["gpu"] for labels in tape.catalog_["labels"]])
    # gpu 1's last sample (50 s) is held up to the window ending at 80 s: forgotten over 20 s after that,
    # in the window ending at 110 s, where gpu 2 first comes (the catalog as long as before)
    assert catalogs[6] == ["0", "1"] and catalogs[7] == ["0", "2"]
    assert catalogs[-1] == ["0", "2", "1"]


def gpu_and_node(catalog: pd.DataFrame) -> pd.DataFrame:
    """A derivation: each series' node and gpu label."""
    return pd.DataFrame({"node": catalog["node"], "gpu": catalog["labels"].map(lambda labels: labels["gpu"])})


def test_a_reader_cannot_change_the_derived_columns_the_next_window_is_handed(store: Store):
    """The same series window after window are taken once and handed out again: read-only arrays, in a
    dict of the reader's own."""
    start_ms = base_ms()
    store_samples(
        store,
        [
            ("node-0", "kept", {"gpu": str(gpu)}, start_ms + k * 5000, float(k))
            for gpu in range(3)
            for k in range(40)
        ],
    )
    tape = Tape()
    first = tape.view(store, ["kept"], Window(start_ms / 1000 + 100, start_ms / 1000 + 110), 30.0).derived(
        gpu_and_node
    )
    expected = {name: column.copy() for name, column in first.items()}
    with pytest.raises(ValueError, match="read-only"):
        first["node"][0] = "changed"
    first["gpu"] = np.array(["changed"] * 3, object)
    following = tape.view(store, ["kept"], Window(start_ms / 1000 + 110, start_ms / 1000 + 120), 30.0)
    handed = following.derived(gpu_and_node)
    assert {name: column.tolist() for name, column in handed.items()} == {
        name: column.tolist() for name, column in expected.items()
    }
    assert sorted(expected["gpu"]) == ["0", "1", "2"]

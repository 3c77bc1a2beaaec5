"""The tape: the recent samples of the metrics some detectors read, kept in memory between windows, so
that each window reads only its new samples (one columnar read) instead of every detector's SQL
re-reading and re-grouping its whole lookback.

    tape = Tape()
    tape.register({"node_infiniband_link_downed_total": 60.0})   # metric -> lookback it is read with
    view = tape.view(store, ["node_infiniband_link_downed_total"], window, lookback_s=60.0)
    view.summaries()        # one row per series: what counters.series_sql computes, in numpy

A window's read covers the samples since what the tape holds, less `overlap_s` (one window by default),
which is read again: a sample inserted after the previous window ran but within that overlap of its end
(the hub runs a window `lag_s` after it closes; a slow scrape round can land later) is seen as SQL would
see it. A sample later than that is missed by a warm tape until it leaves the lookback. A fresh tape (the
first window, a detector run alone through detect()) reads the whole lookback at once, one read per
distinct lookback; so does one stepped out of order or asked for another source, and a metric it does not
hold or wants a longer lookback for is read so alone. Each metric is held for its own (longest) lookback,
and the new samples are merged into those held, which stay sorted by series and time.

The per-series summaries follow counters.series_sql (its module doc says what `inside`, `points` and
`steps` are) value for value: sums add a series' steps in time order from 0, as ClickHouse's arraySum
does, so floating-point results are identical, not merely close.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from analytics.detectors.base import Window, read_frame, read_numbers
from analytics.detectors.groups import Columns, columns_frame, group_extreme, group_sum
from analytics.errors import DetectorError
from analytics.store.protocols import Reader

OVERLAP_S = 10.0  # read again each window: samples inserted this late for the last window are still seen
MAX_TAPE_ROWS = 50_000_000  # samples one read may return: the lookback of a large fleet's registered metrics
EPOCH = datetime.fromtimestamp(0, UTC)
NO_READ = (np.empty(0, np.uint64), np.empty(0, np.int64))  # a tape's last read before its first
CATALOG_COLUMNS = ["series_id", "metric", "node", "labels"]
# what a detector derives from each series' identity (the catalog's rows: metric, node, labels), once
Derive = Callable[[pd.DataFrame], pd.DataFrame]

# the registered metrics' samples in [from_ms, until_ms)
SAMPLES_IN_RANGE = """metric IN {metrics:Array(String)}
    AND ts >= fromUnixTimestamp64Milli({from_ms:Int64}) AND ts < fromUnixTimestamp64Milli({until_ms:Int64})"""
TAPE_SQL = f"""
SELECT series_id, toUnixTimestamp64Milli(ts) AS t, value
FROM samples
WHERE {SAMPLES_IN_RANGE}
"""
TAPE_COLUMNS = {"series_id": np.uint64, "t": np.int64, "value": np.float64}  # TAPE_SQL's, read as numbers
# The series of `ids` (of the metrics), as `series` lists them; and, for a series sampled in a range that it
# does not list (none of the store's writers leaves one out), its metric and node from the samples and no
# labels, as series_sql's join gives them.
SERIES_SQL = """
SELECT series_id, CAST(metric, 'String') AS metric, CAST(node, 'String') AS node,
    CAST(labels, 'Map(String, String)') AS labels
FROM series
WHERE metric IN {metrics:Array(String)} AND series_id IN {ids:Array(UInt64)}
"""
UNLISTED_SQL = f"""
SELECT series_id, CAST(any(metric), 'String') AS sampled_metric, CAST(any(node), 'String') AS sampled_node,
    CAST(map(), 'Map(String, String)') AS labels
FROM samples
WHERE {SAMPLES_IN_RANGE} AND series_id IN {{ids:Array(UInt64)}}
GROUP BY series_id
"""


def millis(seconds: float) -> int:
    """Unix milliseconds of `seconds` as the store reads a range bound passed as a datetime parameter
    (series_parameters): to the microsecond, then cut to the millisecond."""
    return (datetime.fromtimestamp(seconds, UTC) - EPOCH) // timedelta(milliseconds=1)


class Tape:
    """Samples of the registered metrics, each over its own lookback and the last window, per series in
    time order; see the module doc."""

    def __init__(self, overlap_s: float = OVERLAP_S) -> None:
        self.overlap_s = overlap_s
        self.needs_: dict[str, float] = {}  # metric -> the longest lookback it is read with
        self.codes_: dict[str, int] = {}  # metric -> its code, in the order metrics were registered
        self.source_: Reader | None = None  # what the samples were read from
        self.held_: dict[str, int] = {}  # metric -> from_ms: it is held over [from_ms, until_ms_)
        self.until_ms_ = 0
        self.key_ = np.empty(0, np.int64)  # per sample: its series' row of catalog_; sorted by key, then t
        self.t_ms_ = np.empty(0, np.int64)
        self.value_ = np.empty(0, np.float64)
        self.starts_ = np.zeros(1, np.int64)  # per row of catalog_ and one more: where its samples start
        self.catalog_ = pd.DataFrame(columns=CATALOG_COLUMNS)  # one row per series seen
        self.metric_ = np.empty(0, np.int64)  # per row of catalog_: its metric's code
        self.seen_ms_ = np.empty(0, np.int64)  # per row of catalog_: the last until_ms_ it had samples held
        self.ids_ = pd.Index([], dtype=np.uint64)  # catalog_'s series ids, to find a series' row
        self.derived_: dict[Derive, tuple[int, Columns]] = {}  # per derivation: catalog_'s length, columns
        self.taken_: dict[Derive, tuple[np.ndarray, Columns]] = {}  # per derivation: its last rows taken
        self.rows_of_: dict[tuple[str, ...], np.ndarray] = {}  # per metrics viewed: catalog_'s rows of them
        self.last_read_ = NO_READ  # the last read's series id per sample, and its row of catalog_

    def register(self, needs: Mapping[str, float]) -> None:
        """Add metrics to read every window, each with the lookback its reader uses."""
        for metric, lookback_s in needs.items():
            self.needs_[metric] = max(lookback_s, self.needs_.get(metric, 0.0))
            self.codes_.setdefault(metric, len(self.codes_))

    def view(
        self,
        source: Reader,
        metrics: Sequence[str],
        window: Window,
        lookback_s: float,
        *,
        points_only: bool = False,
    ) -> TapeView:
        """The samples of `metrics` in [window.start - lookback_s, window.end), read from `source` as far
        as the tape does not hold them yet; with `points_only`, that view's points_only alone, found
        without taking the rest of the lookback."""
        self.register(dict.fromkeys(metrics, lookback_s))
        self._advance(source, window)
        rows = self._rows_of(tuple(metrics))
        held_from = min((self.held_[metric] for metric in metrics), default=0)
        first = self._first_at(rows, millis(window.start - lookback_s), held_from)
        stop = self._first_at(rows, millis(window.end), held_from)
        if points_only:  # from the last sample before the window, where the lookback holds one
            first = np.maximum(first, self._first_at(rows, first_ms_from(window.start), held_from) - 1)
        present = stop > first
        rows, first, stop = rows[present], first[present], stop[present]
        chosen = spans(first, stop)  # by row, then time
        group = np.repeat(np.arange(len(rows)), stop - first)
        return TapeView(self, rows, group, self.t_ms_[chosen], self.value_[chosen], window.start)

    def _rows_of(self, metrics: tuple[str, ...]) -> np.ndarray:
        """The rows of catalog_ of `metrics`, found again only when the catalog changed (a table per
        code, 10x np.isin; found every view, 1% of a steady cycle)."""
        if metrics not in self.rows_of_:
            self.rows_of_[metrics] = np.flatnonzero(self._per_row(dict.fromkeys(metrics, 1)))
        return self.rows_of_[metrics]

    def _first_at(self, rows: np.ndarray, ms: int, held_from: int) -> np.ndarray:
        """Per row of `rows` (whose samples are held from `held_from` on), where its first sample at `ms`
        or later is, where the next row starts when none is: its first or its end without a look at
        the samples when `ms` is outside the range held, else one binary search per row, all at once."""
        low, high = self.starts_[rows], self.starts_[rows + 1]
        if ms <= held_from or ms >= self.until_ms_:
            return low if ms <= held_from else high
        while (searching := low < high).any():
            middle = (low + high) >> 1
            before = searching & (self.t_ms_[np.minimum(middle, len(self.t_ms_) - 1)] < ms)
            low = np.where(before, middle + 1, low)
            high = np.where(searching & ~before, middle, high)
        return low

    def derived(self, derive: Derive) -> Columns:
        """`derive`'s columns for every series in the catalog, computed again only when new series were
        seen (forgetting series empties the cache: a catalog as long as before may hold other series)."""
        known = self.derived_.get(derive)
        if known is None or known[0] != len(self.catalog_):
            known = self.derived_[derive] = (len(self.catalog_), derived_columns(derive, self.catalog_))
            self.taken_.pop(derive, None)
        return known[1]

    def taken(self, derive: Derive, rows: np.ndarray) -> Columns:
        """derived()'s rows `rows`. The rows a reader takes are mostly those it took the window before
        (the same series): those are taken once and handed out again, read-only (the take was 5% of a
        steady cycle; a frame of them, and each column's lookup in it, 2%)."""
        known = self.derived(derive)
        last = self.taken_.get(derive)
        if last is None or not np.array_equal(last[0], rows):
            last = self.taken_[derive] = (rows, taken_rows(known, rows))
        return dict(last[1])

    def _advance(self, source: Reader, window: Window) -> None:
        """Hold each registered metric over [start - its lookback, end): the new samples only, with the
        overlap, where the tape already holds the rest; merged into those held, which stay sorted."""
        until_ms = millis(window.end)
        # per distinct lookback, not per metric: a datetime per metric was 2% of a steady cycle
        from_ms = {lookback_s: millis(window.start - lookback_s) for lookback_s in set(self.needs_.values())}
        froms = {metric: from_ms[lookback_s] for metric, lookback_s in self.needs_.items()}
        same = source is self.source_
        held = {
            metric
            for metric, from_ms in froms.items()
            if same and metric in self.held_ and self.held_[metric] <= from_ms
        }
        if len(held) == len(froms) and until_ms <= self.until_ms_:
            return
        overlap_ms = self.until_ms_ - round(self.overlap_s * 1000)
        resume = same and until_ms >= self.until_ms_
        # per metric: the first sample read (held ones keep those before it), a held one's from the overlap
        reads = {
            metric: overlap_ms if resume and metric in held and from_ms <= self.until_ms_ else from_ms
            for metric, from_ms in froms.items()
        }
        ids, t_ms, value = self._read_all(source, reads, until_ms)
        key = self._rows_of_ids(source, ids, reads, until_ms)
        lowest, first_read = self._per_row(froms), self._per_row(reads)
        kept = (self.t_ms_ >= lowest[self.key_]) & (self.t_ms_ < first_read[self.key_])
        new = key >= 0  # all but a series whose samples expired between the two reads
        new[new] = t_ms[new] >= lowest[key[new]]  # a held metric's overlap read before its lookback
        key, t_ms, value = key[new], t_ms[new], value[new]
        order = key_time_order(key, t_ms)
        (self.key_, self.t_ms_, self.value_), self.starts_ = append_per_key(
            (self.key_[kept], self.t_ms_[kept], self.value_[kept]),
            (key[order], t_ms[order], value[order]),
            len(self.catalog_),
        )
        self.source_, self.held_, self.until_ms_ = source, froms, until_ms
        self._forget()

    def _rows_of_ids(
        self, source: Reader, ids: np.ndarray, reads: Mapping[str, int], until_ms: int
    ) -> np.ndarray:
        """Per id read, its series' row of catalog_ (-1 for a series found nowhere), cataloguing those not
        seen before. A steady window reads the same series as the last in the same order (the store's
        sort order), so that its rows are the last read's, found by a comparison of the ids instead of a
        look-up of each (3% of a steady cycle)."""
        if np.array_equal(ids, self.last_read_[0]):
            return self.last_read_[1]
        key = self.ids_.get_indexer(ids)
        unseen = key < 0
        if unseen.any():
            self._catalogue(source, np.unique(ids[unseen]), sorted(reads), min(reads.values()), until_ms)
            key[unseen] = self.ids_.get_indexer(ids[unseen])
        key.flags.writeable = False
        if (key >= 0).all():  # a series found nowhere is looked for again next read
            self.last_read_ = (ids, key)
        return key

    def _forget(self) -> None:
        """Drop from the catalog the series with no sample held for longer than the longest lookback, so
        that series that come and go (jobs' ranks, replaced GPUs) do not grow the tape for as long as it
        lives; one back later is read into the catalog again."""
        self.seen_ms_[np.diff(self.starts_) > 0] = self.until_ms_
        kept = self.seen_ms_ >= self.until_ms_ - round(max(self.needs_.values()) * 1000)
        if kept.all():
            return
        self.key_ = (np.cumsum(kept) - 1)[self.key_]  # a series with samples held is kept
        self.catalog_ = self.catalog_[kept].reset_index(drop=True)
        self.metric_, self.seen_ms_ = self.metric_[kept], self.seen_ms_[kept]
        self.ids_ = pd.Index(self.catalog_["series_id"].to_numpy(np.uint64))
        self.starts_ = np.searchsorted(self.key_, np.arange(len(self.catalog_) + 1))
        self.derived_.clear()
        self.taken_.clear()
        self.rows_of_.clear()
        self.last_read_ = NO_READ

    def _per_row(self, per_metric: Mapping[str, int]) -> np.ndarray:
        """Per row of catalog_, its metric's figure in `per_metric`."""
        figures = np.zeros(len(self.codes_), np.int64)
        figures[[self.codes_[metric] for metric in per_metric]] = list(per_metric.values())
        return figures[self.metric_]

    def _read_all(
        self, source: Reader, reads: Mapping[str, int], until_ms: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The samples of each metric of `reads` from its first ms until `until_ms`: one read per first ms."""
        by_first: dict[int, list[str]] = {}
        for metric in sorted(reads):
            by_first.setdefault(reads[metric], []).append(metric)
        found = [self._read(source, metrics, from_ms, until_ms) for from_ms, metrics in by_first.items()]
        if len(found) == 1:  # a steady window's one read: no copy of it
            return found[0]
        return tuple(np.concatenate(column) for column in zip(*found, strict=True))

    def _read(
        self, source: Reader, metrics: list[str], from_ms: int, until_ms: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Series ids, unix ms and values of the samples of `metrics` in [from_ms, until_ms)."""
        parameters = {"metrics": metrics, "from_ms": from_ms, "until_ms": until_ms}
        result = read_numbers(source, TAPE_SQL, TAPE_COLUMNS, parameters=parameters, max_rows=MAX_TAPE_ROWS)
        if result.truncated:
            raise DetectorError(f"over {MAX_TAPE_ROWS} samples in the tape's range: a lookback too long")
        return result.columns["series_id"], result.columns["t"], result.columns["value"]

    def _catalogue(
        self, source: Reader, unseen: np.ndarray, metrics: list[str], from_ms: int, until_ms: int
    ) -> None:
        """Add the series of `unseen` (distinct ids not in the catalog) to the catalog (series id ->
        metric, node, labels), reading their rows of `series` alone: the whole table of the metrics holds
        every series they ever had. A window's read is looked up in the catalog first, so a steady window
        sorts no ids: a np.unique of every id read was 8% of a steady cycle."""
        listed = self._catalog_rows(source, SERIES_SQL, {"metrics": metrics, "ids": unseen.tolist()})
        listed = listed.drop_duplicates("series_id")
        unlisted = np.setdiff1d(unseen, listed["series_id"].to_numpy(np.uint64))
        if len(unlisted):
            parameters = {
                "metrics": metrics,
                "from_ms": from_ms,
                "until_ms": until_ms,
                "ids": unlisted.tolist(),
            }
            sampled = self._catalog_rows(source, UNLISTED_SQL, parameters)
            listed = pd.concat([listed, sampled.rename(columns=lambda name: name.removeprefix("sampled_"))])
        new = listed[CATALOG_COLUMNS].astype({"series_id": np.uint64, "metric": object, "node": object})
        new = new.reset_index(drop=True)
        self.catalog_ = pd.concat([self.catalog_, new], ignore_index=True) if len(self.catalog_) else new
        self.metric_ = np.concatenate([self.metric_, new["metric"].map(self.codes_).to_numpy(np.int64)])
        self.rows_of_.clear()
        self.seen_ms_ = np.concatenate([self.seen_ms_, np.full(len(new), until_ms)])
        self.ids_ = pd.Index(self.catalog_["series_id"].to_numpy(np.uint64))

    @staticmethod
    def _catalog_rows(source: Reader, sql: str, parameters: Mapping[str, object]) -> pd.DataFrame:
        found = read_frame(source, sql, parameters=parameters, max_rows=MAX_TAPE_ROWS).frame
        return found.astype({"series_id": np.uint64})


def derived_columns(derive: Derive, catalog: pd.DataFrame) -> Columns:
    """`derive`'s columns for each row of `catalog` as numpy arrays, text as Python strings (object
    arrays): the tape hands out rows of them window after window, and a numpy take of Python strings
    costs a quarter of a take of pandas's Arrow strings and their conversion back to Python strings."""
    return {name: column.to_numpy() for name, column in derive(catalog).items()}


def taken_rows(columns: Columns, rows: np.ndarray) -> Columns:
    """The rows `rows` of each of `columns`, read-only: handed out again, no reader may change them."""
    taken = {}
    for name, column in columns.items():
        taken[name] = column[rows]
        taken[name].flags.writeable = False
    return taken


def first_ms_from(seconds: float) -> int:
    """The first whole millisecond m with m / 1000 >= `seconds` (numpy's division of a tape's int64
    milliseconds, correctly rounded as Python's int / int is), so that a view's window is a comparison
    of its integers, not a division of each."""
    ms = math.ceil(seconds * 1000)
    while (ms - 1) / 1000 >= seconds:
        ms -= 1
    while ms / 1000 < seconds:
        ms += 1
    return ms


def spans(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The indices of [starts[i], stops[i]) for each i in turn: where some rows' samples lie."""
    lengths = stops - starts
    return np.arange(lengths.sum()) + np.repeat(starts + lengths - np.cumsum(lengths), lengths)


def key_time_order(key: np.ndarray, t_ms: np.ndarray) -> np.ndarray:
    """np.lexsort((t_ms, key)) of non-negative `key`: the samples by key, then time, then as read. Where
    they fit in 63 bits (a window's read: a catalog row, a span of seconds and a row number), the three
    are packed into one integer per sample, each distinct, which one unstable sort orders in a third of
    lexsort's time (its two stable sorts were 2% of a steady cycle); else lexsort itself."""
    if not len(key):
        return np.empty(0, np.int64)
    low = int(t_ms.min())
    time_bits, row_bits = (int(t_ms.max()) - low).bit_length(), (len(key) - 1).bit_length()
    if int(key.max()).bit_length() + time_bits + row_bits > 63:
        return np.lexsort((t_ms, key))
    packed = ((key.astype(np.int64) << time_bits) | (t_ms - low)) << row_bits
    return np.argsort(packed | np.arange(len(key)), kind="stable")  # a steady read comes in key order


Samples = tuple[np.ndarray, np.ndarray, np.ndarray]  # key (catalog row), t_ms and value per sample


def append_per_key(held: Samples, new: Samples, keys: int) -> tuple[Samples, np.ndarray]:
    """`held` and `new` samples, each sorted by key then time, in one run sorted alike, and where each of
    the `keys` keys starts in it (one more at the end). Every new sample of a key is later than its held
    ones (it was read from where those stop), so each key's held samples come first, then its new ones:
    placed by counting them, with no comparison of keys and times (merging by comparison was 5% of a
    steady cycle). The new samples are scattered to their places and the held ones fill the rest in
    order, one masked copy each: a scatter of the held ones too (a window adds a tenth) cost 60% more."""
    held_count = np.bincount(held[0], minlength=keys)
    starts = np.zeros(keys + 1, np.int64)
    np.cumsum(held_count + np.bincount(new[0], minlength=keys), out=starts[1:])
    new_at = np.arange(len(new[0])) + np.cumsum(held_count)[new[0]]
    is_held = np.ones(len(held[0]) + len(new[0]), bool)
    is_held[new_at] = False
    appended = []
    for held_column, new_column in zip(held, new, strict=True):
        column = np.empty(len(is_held), held_column.dtype)
        column[new_at], column[is_held] = new_column, held_column
        appended.append(column)
    return (appended[0], appended[1], appended[2]), starts


class TapeView:
    """The samples of some metrics in [since - lookback, end), grouped by series and in time order, and
    their per-series summaries over [since, end) as series_sql defines them."""

    def __init__(
        self,
        tape: Tape,
        rows: np.ndarray,
        group: np.ndarray,
        t_ms: np.ndarray,
        value: np.ndarray,
        since: float,
        catalog: pd.DataFrame | None = None,
    ) -> None:
        self._tape = tape
        self.t_ms = t_ms  # unix ms, as the tape holds them
        self._since = since
        self.value = value
        self.rows = rows  # per series: its row of the tape's catalog
        # per sample: its series' row of `rows` (each series has one or more samples, in order); the tape
        # repeats it from each series' length, 2.6x cheaper than a cumsum
        self.group = group
        first = np.ones(len(group), bool)
        first[1:] = group[1:] != group[:-1]
        self.first = first  # the sample starts its series
        # the tape's catalog as it is now (or as `catalog`, a view's own): a later read may add series to
        # the tape's, or drop some
        self._catalog = tape.catalog_ if catalog is None else catalog

    # The per-sample masks below are computed when first asked: a detector that only groups values (GPU
    # clocks) pays for none of them.

    @functools.cached_property
    def t(self) -> np.ndarray:
        """Unix seconds, as series_sql's `t`."""
        return self.t_ms / 1000

    @functools.cached_property
    def inside(self) -> np.ndarray:
        """The sample is in the window: `t` >= since, compared in whole milliseconds."""
        return self.t_ms >= first_ms_from(self._since)

    @functools.cached_property
    def last(self) -> np.ndarray:
        """The sample ends its series."""
        last = np.ones(len(self.first), bool)
        last[:-1] = self.first[1:]
        return last

    @functools.cached_property
    def points(self) -> np.ndarray:
        """`inside`, led by the last sample before the window."""
        following_inside = np.ones(len(self.first), bool)
        following_inside[:-1] = self.inside[1:]
        return self.inside | (~self.inside & (self.last | following_inside))

    @functools.cached_property
    def step(self) -> np.ndarray:
        """The sample ends a step between points."""
        previous = np.ones(len(self.first), bool)
        previous[1:] = self.points[:-1]
        return self.points & previous & ~self.first

    @functools.cached_property
    def recent_step(self) -> np.ndarray:
        """The sample ends a step between any two samples since the lookback."""
        return ~self.first

    @functools.cached_property
    def previous_value(self) -> np.ndarray:
        return np.concatenate([[np.nan], self.value[:-1]])

    @functools.cached_property
    def previous_t(self) -> np.ndarray:
        return np.concatenate([[np.nan], self.t[:-1]])

    @functools.cached_property
    def series(self) -> pd.DataFrame:
        """One row per series, its identity: series_id, metric, node and labels (the catalog's rows)."""
        return _take(self._catalog, self.rows)

    def derived(self, derive: Derive) -> Columns:
        """Per series, the columns `derive` computes from series' identities (rows of `series` without
        their summaries), each series' computed once for as long as the tape lives."""
        if self._catalog is self._tape.catalog_:
            return self._tape.taken(derive, self.rows)
        return taken_rows(derived_columns(derive, self._catalog), self.rows)

    def sum(self, values: np.ndarray, where: np.ndarray) -> np.ndarray:
        """Per series, the sum of `values` where `where`, in time order from 0 (arraySum's order)."""
        return group_sum(self.group, len(self.rows), values, where)

    def count(self, where: np.ndarray) -> np.ndarray:
        """Per series, the samples where `where`."""
        return np.bincount(self.group[where], minlength=len(self.rows))

    def max(self, values: np.ndarray, where: np.ndarray) -> np.ndarray:
        """Per series, the largest of `values` where `where` (maxIf)."""
        return group_extreme(np.fmax, self.group, len(self.rows), values, where)

    def steady_increase(self, steps: np.ndarray) -> np.ndarray:
        """Per series, the increase over the steps ending where `steps`, those going down left out."""
        rises = steps & (self.value >= self.previous_value)
        return self.sum(self.value - self.previous_value, rises)

    def steady_figures(self, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per series, over the steps ending where `steps`, those going down left out: STEADY_INCREASE,
        STEADY_SECONDS and STEADY_RATE (the increase per second, 0 without a second)."""
        with np.errstate(invalid="ignore"):  # inf - inf is NaN, as in ClickHouse
            increase = self.steady_increase(steps)
        seconds = self.sum(self.t - self.previous_t, steps & (self.value >= self.previous_value))
        with np.errstate(invalid="ignore", divide="ignore"):
            rate = np.where(seconds > 0, increase / seconds, 0.0)
        return increase, seconds, rate

    @functools.cached_property
    def points_only(self) -> TapeView:
        """This view's `points` alone, series for series (every series has one: its last sample), each
        with the same `inside`, `step`, `last` and previous value as here: what reads no more than the
        window and the sample before it costs a fraction of the view over a lookback of many windows."""
        if self.points.all():
            return self
        at = np.flatnonzero(self.points)
        return TapeView(
            self._tape, self.rows, self.group[at], self.t_ms[at], self.value[at], self._since, self._catalog
        )

    def summaries(self) -> pd.DataFrame:
        """One row per series, in the rows of `series`: series_sql's INCREASE (`increase`),
        STEADY_INCREASE, STEADY_SECONDS, STEADY_RATE, LAST, INSIDE_MIN and INSIDE_MAX, and `samples`, the
        length of `inside`. Without the series' identity: detectors take theirs from derived()."""
        return self.points_only._summaries()

    def _summaries(self) -> pd.DataFrame:
        rising = self.value >= self.previous_value
        with np.errstate(invalid="ignore"):  # inf - inf is NaN, as in ClickHouse
            increase = self.sum(np.where(rising, self.value - self.previous_value, self.value), self.step)
        steady_increase, steady_seconds, steady_rate = self.steady_figures(self.step)
        samples = self.count(self.inside)
        # one frame built from its columns: DataFrame.assign of these eight cost 30 times as much
        return columns_frame(
            {
                "samples": samples,
                "last": self.value[self.last],
                "increase": increase,
                "steady_increase": steady_increase,
                "steady_seconds": steady_seconds,
                "steady_rate": steady_rate,
                "inside_min": group_extreme(np.fmin, self.group, len(self.rows), self.value, self.inside),
                "inside_max": self.max(self.value, self.inside),
            }
        )


def _take(frame: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """The rows of `frame` at positions `rows`, numbered from 0."""
    return frame.iloc[rows].reset_index(drop=True)


def label(catalog: pd.DataFrame, name: str) -> pd.Series:
    """Each series' label `name`, "" where it has none (as a ClickHouse map reads a missing key)."""
    return catalog["labels"].map(lambda labels: labels.get(name, ""))


def port_identity(catalog: pd.DataFrame, metrics: Mapping[str, str]) -> pd.DataFrame:
    """Per series of an InfiniBand/RoCE port's metric: the port's node and `component` ("mlx5_2:1", from
    node_exporter's device and port labels), `port` (a code ordering ports by node and component), and
    for each name of `metrics` whether the series is that metric (a boolean column each)."""
    device, port = label(catalog, "device"), label(catalog, "port")
    metric = catalog["metric"]
    identity = pd.DataFrame({"node": catalog["node"], "component": device + ":" + port})
    for name, of in metrics.items():
        identity[name] = (metric == of).to_numpy(bool)
    identity["port"] = identity.groupby(["node", "component"], sort=True).ngroup()
    return identity


@runtime_checkable
class TapeReader(Reader, Protocol):
    """A Reader with a tape behind it (the runner's source for its detectors)."""

    def tape_view(
        self, metrics: Sequence[str], window: Window, lookback_s: float, *, points_only: bool = False
    ) -> TapeView: ...


def tape_view(
    source: Reader, metrics: Sequence[str], window: Window, lookback_s: float, *, points_only: bool = False
) -> TapeView:
    """The samples of `metrics` in `window` and the lookback before it (Tape.view): from the runner's
    tape when `source` has one, else read at once into a fresh tape (a detector run alone)."""
    return tape_views(source)(metrics, window, lookback_s, points_only=points_only)


def tape_views(source: Reader) -> Callable[..., TapeView]:
    """tape_view's views, all of one tape (the runner's, or one fresh tape), so that their `rows` number
    the same series alike."""
    if isinstance(source, TapeReader):
        return source.tape_view
    return functools.partial(Tape().view, source)

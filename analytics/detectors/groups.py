"""Per-group reductions over numpy columns, equal to the bit to pandas groupby's or to ClickHouse's
aggregate functions (each says which: the SQL a detector's numpy replaced was one or the other).

The peer-comparing detectors reduce a window's few thousand rows by job, node, stage and step; through
pandas each groupby call costs a millisecond of bookkeeping whatever the rows, and a window made dozens
of them. Here the rows are grouped once (`Groups`) and every reduction is a few numpy calls. Each keeps
pandas's result exactly: NaN is left out of counts, medians, sums and means; a median of an even count
is the mean of the two middle values; ranks of ties are their average rank. Sums and means, whose
compensated summation is pandas's own, are pandas's, in one call over the group numbers. The lookups
and frames those columns end in are here too (looked_up, objects, columns_frame).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

Columns = dict[str, np.ndarray]  # a frame's columns by name, each a 1-D numpy array of one value per row
# sorted_codes counts over a range of integers up to this long, per row and beyond, rather than sort them
DENSE_RANGE_PER_ROW = 4
DENSE_RANGE = 1024


class Groups:
    """The rows of equal keys, numbered in the keys' sorted order (pandas's groupby(sort=True) order).
    Keys must have no nulls (pandas drops rows of null keys, these never have any). Where np.unique sorted
    every row, each key is numbered by sorted_codes: a count over the range of integers (codes of jobs,
    nodes, stages), a hash of the rows and a sort of the distinct values for the rest (Python strings);
    a quarter of the cost."""

    def __init__(self, *keys: np.ndarray) -> None:
        ids = np.zeros(len(keys[0]), dtype=np.int64)
        for key in keys:
            codes, distinct = sorted_codes(key)
            ids = sorted_codes(ids * distinct + codes)[0]
        self.ids = ids.reshape(-1)
        self.count = int(self.ids.max()) + 1 if len(self.ids) else 0
        self.sizes = np.bincount(self.ids, minlength=self.count)
        self.starts = np.cumsum(self.sizes) - self.sizes  # each group's first row in grouped order
        self.order = np.argsort(self.ids, kind="stable")  # grouped, each group's rows in row order

    def first_rows(self) -> np.ndarray:
        """Each group's first row (its position in the rows)."""
        return self.order[self.starts]

    def non_null(self, values: np.ndarray) -> np.ndarray:
        """How many of each group's values are not NaN (pandas's count)."""
        return np.bincount(self.ids, weights=~np.isnan(values), minlength=self.count).astype(np.int64)

    def first(self, values: np.ndarray) -> np.ndarray:
        """Each group's first value that is not NaN, in row order (pandas's first); NaN if none."""
        present = self.order[~np.isnan(values[self.order])]
        found, where = np.unique(self.ids[present], return_index=True)
        out = np.full(self.count, np.nan)
        out[found] = values[present[where]]
        return out

    def min(self, values: np.ndarray) -> np.ndarray:
        """Each group's smallest value (of values without NaN: integers)."""
        return values[self._value_order(values)][self.starts]

    def median(self, values: np.ndarray) -> np.ndarray:
        """Each group's median of its values that are not NaN; NaN if none."""
        ordered, counts = self._sorted(values)
        low = self.starts + np.maximum(counts - 1, 0) // 2
        high = self.starts + counts // 2
        with np.errstate(invalid="ignore", over="ignore"):
            middle = np.where(counts % 2 == 1, ordered[high], (ordered[low] + ordered[high]) / 2)
        return np.where(counts > 0, middle, np.nan)

    def max(self, values: np.ndarray) -> np.ndarray:
        """Each group's largest value that is not NaN, the first in row order of equal ones (as pandas
        keeps 0.0 of 0.0 and -0.0); NaN if none."""
        if values.dtype.kind != "f":  # integers: equal ones are alike, and negating unsigned ones wraps
            return values[self._value_order(values)][self.starts + self.sizes - 1].astype(np.float64)
        descending = values[by_group_then_value(self.ids, self.count, -values)]  # ties in row order
        return np.where(self.non_null(values) > 0, descending[self.starts], np.nan)

    def second_largest(self, values: np.ndarray) -> np.ndarray:
        """Each group's second value from the end of its values sorted by np.sort (NaN last); NaN for a
        group of one row."""
        ordered = values[self._value_order(values)]
        last = self.starts + self.sizes - 2
        return np.where(self.sizes >= 2, ordered[np.maximum(last, 0)], np.nan)

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Each group's sum of its values that are not NaN (0 if none): pandas's own, one call for every
        group, as its compensated summation is its own to the bit."""
        return pd.Series(values).groupby(self.ids).sum().to_numpy()

    def mean(self, values: np.ndarray) -> np.ndarray:
        """Each group's mean of its values that are not NaN (NaN if none): pandas's own, as for sum."""
        return pd.Series(values).groupby(self.ids).mean().to_numpy()

    def rank(self, values: np.ndarray) -> np.ndarray:
        """Each row's rank among its group's values, 1 the smallest, ties their average rank (pandas's
        rank(method="average")); NaN for NaN."""
        order = self._value_order(values)
        ordered, ids = values[order], self.ids[order]
        position = np.arange(len(order)) - self.starts[ids] + 1.0
        tied = np.zeros(len(order), dtype=bool)  # the same value as the row before, in the same group
        tied[1:] = (ids[1:] == ids[:-1]) & (ordered[1:] == ordered[:-1])
        begins = np.flatnonzero(~tied)  # the first row of each run of equal values
        ends = np.append(begins[1:] - 1, len(order) - 1)[: len(begins)]  # and its last
        run = np.cumsum(~tied) - 1
        ranks = np.empty(len(order))
        ranks[order] = (position[begins][run] + position[ends][run]) / 2
        return np.where(np.isnan(values), np.nan, ranks)

    def _value_order(self, values: np.ndarray) -> np.ndarray:
        """The rows grouped, each group's sorted by value, NaN last."""
        return by_group_then_value(self.ids, self.count, values)

    def _sorted(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The values grouped and sorted within groups (NaN last), and each group's count of non-NaN."""
        return values[self._value_order(values)], self.non_null(values)


def sorted_codes(key: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's place among the distinct values of `key` in sorted order, and how many there are (what
    np.unique's inverse and length give). Integers spread over a range not much longer than the rows
    are placed by a count over that range; others by pd.factorize."""
    if key.dtype.kind in "iu" and len(key):
        low, high = int(key.min()), int(key.max())
        if high - low <= DENSE_RANGE_PER_ROW * len(key) + DENSE_RANGE and high <= np.iinfo(np.int64).max:
            at = key.astype(np.int64) - low
            present = np.zeros(high - low + 1, bool)
            present[at] = True
            place = np.cumsum(present) - 1
            return place[at], int(place[-1]) + 1
    codes, distinct = pd.factorize(key, sort=True)
    return codes, len(distinct)


def groups(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For series grouped by non-negative integer `codes` (ordered as the groups are to be; a catalog's
    ngroup numbers, or products of them): the group of each series, and one series of each group. The
    codes present are numbered in order by sorted_codes, where np.unique sorted every code."""
    group, count = sorted_codes(np.asarray(codes, np.int64))
    member = np.empty(count, np.int64)
    member[group] = np.arange(len(group))
    return group, member


def ordered_groups(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows of integer `codes` of any range: each row's group, numbered in the codes' order, and each
    group's first row. By a hash of every row (pd.factorize) and a sort of the distinct codes alone, where
    np.unique sorts every row (5 ms for a large fleet's 5 minutes of step rows)."""
    found, distinct = pd.factorize(codes)
    seen = np.maximum.accumulate(np.concatenate([[-1], found[:-1]])) if len(found) else found
    first = np.flatnonzero(found > seen)  # factorize numbers codes as first seen: each one's first row
    order = np.argsort(distinct, kind="stable")
    place = np.empty(len(distinct), np.int64)
    place[order] = np.arange(len(distinct))
    return place[found], first[order]


def group_sum(groups: np.ndarray, count: int, values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per group (0 .. count - 1), the sum of `values` where `where`, added in their order from 0 as
    ClickHouse adds them (a NaN or infinite value goes into the sum); float64 even where nothing is
    summed, which np.bincount alone gives as int64 zeros."""
    return np.bincount(groups[where], weights=values[where], minlength=count).astype(np.float64, copy=False)


def group_extreme(
    extreme: np.ufunc, groups: np.ndarray, count: int, values: np.ndarray, where: np.ndarray
) -> np.ndarray:
    """Per group, `extreme` (np.fmin or np.fmax) of `values` where `where`, as ClickHouse's min and max
    (and arrayMin, arrayMax) take it: NaN values skipped, NaN when all are, 0 where there are none."""
    found = np.full(count, np.nan)
    extreme.at(found, groups[where], values[where])
    return np.where(np.bincount(groups[where], minlength=count) > 0, found, 0.0)


def median_exact(values: np.ndarray) -> float:
    """ClickHouse's medianExact of all `values`: group_quantile_exact of one group."""
    return float(group_quantile_exact(np.zeros(len(values), np.int64), 1, values)[0])


def group_quantile_exact(groups: np.ndarray, count: int, values: np.ndarray) -> np.ndarray:
    """Per group (0 .. count - 1), ClickHouse's quantileExact(0.5) of `values`: NaN values skipped, of the
    n others sorted the one at n // 2 (the upper of two middles); NaN for a group with none."""
    ordered, starts, sizes = _sorted_groups(groups, count, values)
    found = np.full(count, np.nan)
    some = sizes > 0
    found[some] = ordered[starts[some] + sizes[some] // 2]
    return found


def group_median(groups: np.ndarray, count: int, values: np.ndarray) -> np.ndarray:
    """Per group, ClickHouse's median (quantile(0.5): a reservoir sampler, exact below 8,192 values):
    NaN values skipped, of the n others sorted, at h = 0.5 * (n - 1), a[l] * (l + 1 - h) + a[l + 1] * (h - l)
    with l = floor(h), in that floating form (so 0.1 and 0.7 give 0.39999999999999997, and an infinite
    a[l + 1] times 0 gives NaN, as ClickHouse does); a[l] alone when l is the last; NaN for none."""
    ordered, starts, sizes = _sorted_groups(groups, count, values)
    found = np.full(count, np.nan)
    some = np.flatnonzero(sizes > 0)
    found[some] = sorted_medians(ordered, starts[some], sizes[some])
    return found


def sorted_medians(ordered: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """group_median of groups already sorted: each of `sizes` (at least 1) values from its start in
    `ordered`, without NaN (the steps tape keeps each job's durations so)."""
    index = 0.5 * (sizes - 1)
    left = index.astype(np.int64)
    low, high = ordered[starts + left], ordered[starts + np.minimum(left + 1, sizes - 1)]
    with np.errstate(invalid="ignore"):  # inf x 0 is NaN, as in ClickHouse
        interpolated = low * ((left + 1) - index) + high * (index - left)
    return np.where(left + 1 == sizes, low, interpolated)


def by_group_then_value(groups: np.ndarray, count: int, values: np.ndarray) -> np.ndarray:
    """np.lexsort((values, groups)) of groups 0 .. count - 1: the rows by group, then value (NaN last),
    then row. In two stable sorts, by value and then by group, the groups as 16-bit codes where they
    fit, which numpy sorts by radix: 30-45% less than lexsort's two."""
    by_value = np.argsort(values, kind="stable")
    codes = groups[by_value]
    if count <= 1 << 16:
        codes = codes.astype(np.uint16)
    return by_value[np.argsort(codes, kind="stable")]


def _sorted_groups(
    groups: np.ndarray, count: int, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-NaN `values` sorted by group, then value; where each group's start; and how many each has."""
    kept = ~np.isnan(values)
    groups, values = groups[kept], values[kept]
    ordered = values[by_group_then_value(groups, count, values)]
    sizes = np.bincount(groups, minlength=count)
    return ordered, np.cumsum(sizes) - sizes, sizes


def group_mean(groups: np.ndarray, count: int, values: np.ndarray) -> np.ndarray:
    """Per group (0 .. count - 1) of each row's `groups`, ClickHouse's avg of its rows' `values`: their sum,
    added in row order from 0 (a NaN or infinite value goes into it), over their number; NaN for a group
    without rows."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(groups, weights=values, minlength=count) / np.bincount(groups, minlength=count)


def group_bit_or(groups: np.ndarray, count: int, values: np.ndarray) -> np.ndarray:
    """Per group (0 .. count - 1) of each row's `groups`, ClickHouse's groupBitOr of its rows' integer
    `values`: every bit set in any of them; 0 for a group without rows."""
    bits = np.zeros(count, np.int64)
    np.bitwise_or.at(bits, groups, values.astype(np.int64))
    return bits


def looked_up(table: pd.Series, keys: np.ndarray, default: object) -> np.ndarray:
    """`table`'s value at each of `keys` (`default` where it has none), as an object array: what
    table.reindex(keys, fill_value=default) holds, by a dict's lookups of each distinct key; a reindex
    builds an Index of the keys first (Arrow strings under pandas 3), five times the cost."""
    codes, distinct = pd.factorize(keys)
    values = dict(zip(table.index.tolist(), table.tolist(), strict=True))
    return objects([values.get(key, default) for key in distinct.tolist()])[codes]


def objects(values: Sequence[object]) -> np.ndarray:
    """`values` as a 1-D object array, each value whole (np.array would make equal lists a 2-D array)."""
    found = np.empty(len(values), object)
    found[:] = values
    return found


def columns_frame(columns: Mapping[str, np.ndarray | str]) -> pd.DataFrame:
    """A frame of the equally long 1-D numpy `columns`, each kept as it is: an object array (Python
    strings, lists) stays one, where pandas 3 infers Arrow strings from it, a conversion on the way in and
    another on every read back (2 ms for a detector's 768 rows of two text columns). A text in place of
    a column (a candidate's job "" where none is involved) is that text in every row, as an object
    column too. Built by pandas's own unchecked constructor (what DataFrame.from_records ends in), a
    quarter of DataFrame(dict)'s time (frames of numpy columns were 6% of a steady cycle); the one check
    it skips, the lengths, is here."""
    lengths = {name: len(column) for name, column in columns.items() if not isinstance(column, str)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"columns of different lengths: {lengths}")
    rows = next(iter(lengths.values()), 0)
    arrays = [
        np.full(rows, column, object) if isinstance(column, str) else column for column in columns.values()
    ]
    names = _column_names(tuple(columns))
    return pd.DataFrame._from_arrays(arrays, names, pd.RangeIndex(rows), verify_integrity=False)


@functools.lru_cache(maxsize=256)
def _column_names(names: tuple[str, ...]) -> pd.Index:
    """The Index of a frame's column names, made once per set of names: an Index is immutable, and
    making one (Arrow strings) was half of the frame's cost; a detector's frames have the same columns
    window after window."""
    return pd.Index(names)

"""One row per sample, step and scrape, however often each is sent: what the store's inserts admit.

The store holds one sample per (series, ts in ms), one step row per (job, rank, step) and one scrape row
per (target, node, ts in ms), whatever the retries and repeats: within a request or batch, across
requests, across batches grouped together or replayed from the hub's spool, across restarts. The first
row stored stays, with Prometheus's TSDB semantics for a sample at a timestamp its series already has
(storage.ErrDuplicateSampleForTimestamp): the identical value, bit for bit, is dropped in silence (a
retry, a replay, a sender's repeat); another value is refused and the stored one kept. Steps compare
their duration_s, scrape rows their `up`. Records of one (job, rank, step) STEP_RUN_APART_MS or more
apart are two runs of the step, both stored (a job restarted from its checkpoint); nearer ones are one
step sent again. Each insert reports what it dropped (Inserted.duplicates, Inserted.conflicts). Unlike
Prometheus, a row older than its key's latest is stored if its key is not: backfill is not out of order.

A ledger keeps per key a high-water mark, learnt from the store the first time the key is met in this
process: a row past its mark is new (one numpy comparison per batch for samples); a row at or before it is
looked up among the insert's rows, then in the store, one query per insert. Past `limit` keys (label
churn) a ledger starts over and learns again.

A Store and its sessions share one set of ledgers, whose lock is held from admit() to the end of the
insert. Processes do not share ledgers: sharded hubs write disjoint keys and stay exact, but two hubs
that write the same series can both store one sample, so each sender should write to one hub.
docs/architecture.md says why.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from analytics.store.records import ScrapeBatch, TargetStatus

MAX_LEDGER_KEYS = 2_000_000  # past this many keys a ledger starts over (label churn)
MAX_CACHED_BATCH_SERIES = 100_000  # series lists whose marks' positions a SampleLedger keeps
# Records of one (job, rank, step) this far apart in time are two runs of the step (a job restarted from a
# checkpoint runs its last steps again, sim.jobs), nearer one step sent again (a retry keeps its time).
STEP_RUN_APART_MS = 10_000

R = TypeVar("R")
K = TypeVar("K", bound=Hashable)

TimedValues = list[tuple[int, object]]  # the time (ms) and value of each stored row of one key and order
# (sql, parameters) -> rows: a query on the inserting session, its failures the store's StoreErrors
Query = Callable[[str, Mapping[str, Any]], Sequence[tuple]]


def millis(ts: float) -> int:
    """Unix seconds as the integer milliseconds DateTime64(3) columns hold, as the inserts write them."""
    return round(ts * 1000)


def same(first: object, other: object) -> bool:
    """Whether a repeated row's value is the stored one: floats bit for bit (as Prometheus compares, so
    that NaN repeats NaN), anything else by equality."""
    if isinstance(first, float) and isinstance(other, float):
        return _BITS.pack(first) == _BITS.pack(other)
    return first == other


_BITS = struct.Struct("<d")
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Admitted(Generic[R]):
    """The rows of an insert to send, and those dropped as already stored: `duplicates` with the stored
    value, `conflicts` with another."""

    rows: list[R]
    duplicates: int = 0
    conflicts: int = 0


@dataclass(frozen=True, slots=True)
class AdmittedSamples:
    """Which samples of an insert's batches to send: per batch None (all of them) or a bool mask; and how
    many were dropped as already stored, with the stored value (`duplicates`) or another (`conflicts`)."""

    keep: list[np.ndarray | None]
    duplicates: int = 0
    conflicts: int = 0


class RecordLookup(Protocol[K]):
    """What a RecordLedger asks the store."""

    def marks(self, keys: Collection[K], since: int) -> Mapping[K, int]:
        """Of `keys`, those with a row at order `since` or later, and their latest order."""
        ...

    def values(self, keys: Collection[tuple[K, int]]) -> Mapping[tuple[K, int], TimedValues]:
        """Of `keys` ((key, order) pairs), those stored, and the time (ms) and value of each of their
        stored rows."""
        ...


class SampleLookup(Protocol):
    """What a SampleLedger asks the store; `nodes` are those of the series asked about."""

    def sample_marks(self, nodes: Collection[str], since_ms: int) -> Mapping[int, int]:
        """Per series of `nodes` with a sample at `since_ms` or later, its latest ts (ms)."""
        ...

    def sample_values(
        self, nodes: Collection[str], times_ms: Collection[int]
    ) -> Mapping[tuple[int, int], float]:
        """Per (series, ts in ms) of `nodes` stored at one of `times_ms`, its value."""
        ...


class RecordLedger(Generic[R, K]):
    """High-water marks of the rows of one table, by `key`; `order` orders a key's rows (an int), `value`
    is what a repeat is compared by. With `apart_ms`, rows of one key and order whose `time` (ms) is that
    far from every other's are different rows, each stored: a step run again (module docstring)."""

    def __init__(
        self,
        key: Callable[[R], K],
        order: Callable[[R], int],
        value: Callable[[R], object],
        time: Callable[[R], int],
        apart_ms: int = 0,
        limit: int = MAX_LEDGER_KEYS,
    ) -> None:
        self.lock = threading.Lock()  # held by the store from admit() to the end of the insert
        self._key, self._order, self._value, self._time = key, order, value, time
        self._apart_ms = apart_ms
        self._limit = limit
        self._marks: dict[K, int] = {}

    def admit(self, rows: Sequence[R], lookup: RecordLookup[K]) -> Admitted[R]:
        """The rows of `rows` not stored yet, the first of each key and order (and time, with apart_ms),
        in their order; the marks move past them. Raises the lookup's StoreError (the marks then only
        claim more than is stored)."""
        key, order, marks = self._key, self._order, self._marks
        keyed = [(key(row), order(row), row) for row in rows]
        if unknown := {k for k, _, _ in keyed} - marks.keys():
            if len(marks) + len(unknown) > self._limit:
                marks.clear()
                unknown = {k for k, _, _ in keyed}
            since = min(o for k, o, _ in keyed if k in unknown)
            found = lookup.marks(unknown, since)
            marks.update((k, found.get(k, since - 1)) for k in unknown)
        kept: list[R] = []
        seen: dict[tuple[K, int], list[tuple[int, object]]] = {}  # rows kept, by key and order
        later: list[tuple[K, int, R]] = []
        for k, o, row in keyed:
            if o > marks[k]:
                marks[k] = o
                kept.append(row)
                seen[k, o] = [(self._time(row), self._value(row))]
            else:
                later.append((k, o, row))
        if not later:
            return Admitted(kept)
        stored = lookup.values({(k, o) for k, o, _ in later})
        duplicates = conflicts = 0
        for k, o, row in later:
            t, value = self._time(row), self._value(row)
            before = [*stored.get((k, o), ()), *seen.get((k, o), ())]
            first = next((v for when, v in before if self._repeats(t, when)), _MISSING)
            if first is _MISSING:
                seen.setdefault((k, o), []).append((t, value))
                kept.append(row)
            elif same(first, value):
                duplicates += 1
            else:
                conflicts += 1
        return Admitted(kept, duplicates, conflicts)

    def _repeats(self, time: int, other: int) -> bool:
        """Whether a row at `time` repeats one of the same key and order at `other`."""
        return not self._apart_ms or abs(time - other) < self._apart_ms


class SampleLedger:
    """High-water marks of samples per series id, in one int64 array (ms), with the positions of each
    batch's series in it cached per series list (the store's SeriesColumns.ids, reused while a target's
    series stay the same)."""

    def __init__(self, limit: int = MAX_LEDGER_KEYS) -> None:
        self.lock = threading.Lock()  # held by the store from admit() to the end of the insert
        self._limit = limit
        self._slots: dict[int, int] = {}  # series id -> its position in _marks
        self._marks = np.empty(1 << 10, dtype=np.int64)
        # id(series list) -> (the list, its positions in _marks, whether it names each series once)
        self._cached: dict[int, tuple[list[int], np.ndarray, bool]] = {}

    def admit(
        self, batches: Sequence[ScrapeBatch], ids: Sequence[list[int]], lookup: SampleLookup
    ) -> AdmittedSamples:
        """Which samples of `batches` (their series ids in `ids`, batch by batch) are not stored yet, the
        first of each (series, ts) in their order; the marks move past them. Raises the lookup's
        StoreError (the marks then only claim more than is stored)."""
        entries = [self._cached_entry(series) for series in ids]
        if any(entry is None for entry in entries):
            self._learn(batches, ids, lookup)
            entries = [self._cached_entry(series) for series in ids]
        marks = self._marks
        keep: list[np.ndarray | None] = [None] * len(batches)
        later: list[int] = []
        for index, (batch, entry) in enumerate(zip(batches, entries, strict=True)):
            _, slots, unique = entry  # type: ignore[misc]
            if not len(slots):
                continue
            t = millis(batch.ts)
            before = marks[slots]
            if unique and before.max() < t:
                marks[slots] = t
                continue
            new = before < t
            if not unique:
                first = np.zeros(len(slots), dtype=bool)
                first[np.unique(slots, return_index=True)[1]] = True
                new &= first
            marks[slots[new]] = t
            keep[index] = new
            later.append(index)
        if not later:
            return AdmittedSamples(keep)
        return self._resolve(batches, ids, keep, later, lookup)

    def _resolve(
        self,
        batches: Sequence[ScrapeBatch],
        ids: Sequence[list[int]],
        keep: list[np.ndarray | None],
        later: list[int],
        lookup: SampleLookup,
    ) -> AdmittedSamples:
        """Decide the samples at or before their series' mark (batches `later`, `keep` False): the first of
        a (series, ts) that neither this insert nor the store holds is kept."""
        asked = [
            (index, int(position), ids[index][position], millis(batches[index].ts))
            for index in later
            for position in np.flatnonzero(~keep[index])  # type: ignore[operator]
        ]
        times = {t for *_, t in asked}
        firsts: dict[tuple[int, int], float] = {}  # samples this insert keeps at those times
        for index, batch in enumerate(batches):
            if (t := millis(batch.ts)) in times:
                mask = keep[index]
                for position, (sid, value) in enumerate(zip(ids[index], batch.values, strict=True)):
                    if mask is None or mask[position]:
                        firsts.setdefault((sid, t), value)
        missing = {(sid, t) for _, _, sid, t in asked} - firsts.keys()
        stored: Mapping[tuple[int, int], float] = {}
        if missing:
            nodes = {batches[index].node for index in later}
            stored = lookup.sample_values(nodes, {t for _, t in missing})
        duplicates = conflicts = 0
        for index, position, sid, t in asked:
            value = batches[index].values[position]
            first = firsts.get((sid, t), stored.get((sid, t), _MISSING))
            if first is _MISSING:
                firsts[sid, t] = value
                keep[index][position] = True  # type: ignore[index]
            elif same(first, value):
                duplicates += 1
            else:
                conflicts += 1
        return AdmittedSamples(keep, duplicates, conflicts)

    def _cached_entry(self, series: list[int]) -> tuple[list[int], np.ndarray, bool] | None:
        """The positions of `series` in the marks, cached by the list's identity; None while a series of
        it has no mark."""
        entry = self._cached.get(id(series))
        if entry is not None and entry[0] is series:
            return entry
        get = self._slots.get
        positions = [get(sid) for sid in series]
        if None in positions:
            return None
        if len(self._cached) >= MAX_CACHED_BATCH_SERIES:
            self._cached.clear()
        entry = (series, np.array(positions, dtype=np.intp), len(set(series)) == len(series))
        self._cached[id(series)] = entry
        return entry

    def _learn(self, batches: Sequence[ScrapeBatch], ids: Sequence[list[int]], lookup: SampleLookup) -> None:
        """Give every series of `ids` a mark, learning those met for the first time from the store."""
        unknown, nodes, since = self._unknown(batches, ids)
        if len(self._slots) + len(unknown) > self._limit:
            self._slots.clear()
            self._cached.clear()
            unknown, nodes, since = self._unknown(batches, ids)
        if since is None:
            return
        found = lookup.sample_marks(nodes, since)
        first = len(self._slots)
        if first + len(unknown) > len(self._marks):
            grown = np.empty(max(2 * len(self._marks), first + len(unknown)), dtype=np.int64)
            grown[:first] = self._marks[:first]
            self._marks = grown
        for offset, sid in enumerate(unknown):
            self._slots[sid] = first + offset
            self._marks[first + offset] = found.get(sid, since - 1)

    def _unknown(
        self, batches: Sequence[ScrapeBatch], ids: Sequence[list[int]]
    ) -> tuple[set[int], set[str], int | None]:
        """The series of `ids` without a mark, their nodes, and the earliest ts (ms) of their batches."""
        unknown: set[int] = set()
        nodes: set[str] = set()
        since = None
        for batch, series in zip(batches, ids, strict=True):
            if new := [sid for sid in series if sid not in self._slots]:
                unknown.update(new)
                nodes.add(batch.node)
                t = millis(batch.ts)
                since = t if since is None else min(since, t)
        return unknown, nodes, since


class Ledgers:
    """The ledgers of one store, shared by its sessions."""

    def __init__(self, limit: int = MAX_LEDGER_KEYS) -> None:
        self.samples = SampleLedger(limit)
        self.steps: RecordLedger[Any, tuple[str, int]] = RecordLedger(
            lambda row: (row.job, row.rank),
            lambda row: row.step,
            lambda row: float(row.duration_s),
            lambda row: millis(row.ts),
            STEP_RUN_APART_MS,
            limit,
        )
        self.targets: RecordLedger[TargetStatus, tuple[str, str]] = RecordLedger(
            lambda row: (row.target, row.node),
            lambda row: millis(row.ts),
            lambda row: bool(row.up),
            lambda row: millis(row.ts),
            limit=limit,
        )


class SampleRows:
    """A SampleLedger's lookups, and the scrapes a restarted hub asks about, as SQL on `table` (samples'
    qualified name) run by `query`: by time (part pruning) and node."""

    def __init__(self, query: Query, table: str) -> None:
        self._query, self._table = query, table

    def sample_marks(self, nodes: Collection[str], since_ms: int) -> dict[int, int]:
        rows = self._query(
            f"SELECT series_id, max(toUnixTimestamp64Milli(ts)) FROM {self._table}"
            " WHERE ts >= fromUnixTimestamp64Milli({since:Int64}) AND node IN {nodes:Array(String)}"
            " GROUP BY series_id",
            {"since": since_ms, "nodes": sorted(nodes)},
        )
        return dict(rows)

    def sample_values(
        self, nodes: Collection[str], times_ms: Collection[int]
    ) -> dict[tuple[int, int], float]:
        found: dict[tuple[int, int], float] = {}
        for sid, t, value in self._at(nodes, times_ms, "series_id, toUnixTimestamp64Milli(ts) AS t, value"):
            found.setdefault((sid, t), value)
        return found

    def stored_scrapes(self, scrapes: Collection[tuple[str, int]]) -> set[tuple[str, int]]:
        """Of `scrapes` ((node, ts in ms) pairs), those with samples stored."""
        if not scrapes:
            return set()
        nodes, times = {node for node, _ in scrapes}, {t for _, t in scrapes}
        rows = self._at(nodes, times, "DISTINCT node, toUnixTimestamp64Milli(ts) AS t")
        return {(str(node), t) for node, t in rows} & set(scrapes)

    def _at(self, nodes: Collection[str], times_ms: Collection[int], columns: str) -> Sequence[tuple]:
        """`columns` of the samples of `nodes` at one of `times_ms` (the alias t is their ts in ms)."""
        return self._query(
            f"SELECT {columns} FROM {self._table}"
            " WHERE ts >= fromUnixTimestamp64Milli({low:Int64})"
            " AND ts <= fromUnixTimestamp64Milli({high:Int64}) AND node IN {nodes:Array(String)}"
            " AND toUnixTimestamp64Milli(ts) IN {times:Array(Int64)}",
            {"low": min(times_ms), "high": max(times_ms), "nodes": sorted(nodes), "times": sorted(times_ms)},
        )


class StepRows:
    """A steps RecordLedger's lookups by (job, rank), ordered by step number, as SQL on `table` run by
    `query`: the sort key (job, step, rank) finds them."""

    def __init__(self, query: Query, table: str) -> None:
        self._query, self._table = query, table

    def marks(self, keys: Collection[tuple[str, int]], since: int) -> dict[tuple[str, int], int]:
        rows = self._query(
            f"SELECT job, rank, max(step) FROM {self._table}"
            " WHERE job IN {jobs:Array(String)} AND step >= {since:UInt64} GROUP BY job, rank",
            {"jobs": sorted({job for job, _ in keys}), "since": since},
        )
        wanted = set(keys)
        return {(job, rank): step for job, rank, step in rows if (job, rank) in wanted}

    def values(self, keys: Collection[tuple[tuple[str, int], int]]) -> dict[tuple[Any, int], TimedValues]:
        rows = self._query(
            f"SELECT job, rank, step, toUnixTimestamp64Milli(ts), duration_s FROM {self._table}"
            " WHERE job IN {jobs:Array(String)} AND step IN {steps:Array(UInt64)} ORDER BY ts",
            {"jobs": sorted({job for (job, _), _ in keys}), "steps": sorted({step for _, step in keys})},
        )
        return _by_key(((job, rank), step, t, duration) for job, rank, step, t, duration in rows)


class TargetRows:
    """A targets RecordLedger's lookups by (target, node), ordered by ts (ms), as SQL on `table` run by
    `query`: the sort key (target, ts) finds them."""

    def __init__(self, query: Query, table: str) -> None:
        self._query, self._table = query, table

    def marks(self, keys: Collection[tuple[str, str]], since: int) -> dict[tuple[str, str], int]:
        rows = self._query(
            f"SELECT target, node, max(toUnixTimestamp64Milli(ts)) FROM {self._table}"
            " WHERE target IN {targets:Array(String)} AND ts >= fromUnixTimestamp64Milli({since:Int64})"
            " GROUP BY target, node",
            {"targets": sorted({target for target, _ in keys}), "since": since},
        )
        wanted = set(keys)
        return {(target, node): t for target, node, t in rows if (target, node) in wanted}

    def values(self, keys: Collection[tuple[tuple[str, str], int]]) -> dict[tuple[Any, int], TimedValues]:
        times = {t for _, t in keys}
        rows = self._query(
            f"SELECT target, node, toUnixTimestamp64Milli(ts) AS t, up FROM {self._table}"
            " WHERE target IN {targets:Array(String)} AND ts >= fromUnixTimestamp64Milli({low:Int64})"
            " AND ts <= fromUnixTimestamp64Milli({high:Int64}) AND t IN {times:Array(Int64)}",
            {
                "targets": sorted({target for (target, _), _ in keys}),
                "low": min(times),
                "high": max(times),
                "times": sorted(times),
            },
        )
        return _by_key(((target, node), t, t, bool(up)) for target, node, t, up in rows)


def _by_key(rows: Iterable[tuple[Hashable, int, int, object]]) -> dict[tuple[Any, int], TimedValues]:
    """(key, order) -> [(time, value)] of stored rows given as (key, order, time, value); the rows of a
    key asked about may hold others of its orders, which the ledger does not ask for."""
    found: dict[tuple[Any, int], TimedValues] = {}
    for key, order, time, value in rows:
        found.setdefault((key, order), []).append((time, value))
    return found

"""The steps tape: the recent rows of `steps`, kept in memory between windows, so that each window reads
only its new rows (one read) where the step readers' statements re-read and re-grouped their lookbacks:
slow_node's job cadence over an hour and its recent steps, and the step summary of gpu_fault, dma_degraded
and peer_outlier. On chDB those three cost 97 ms a window, their analysis alone 20-26 ms each.

    tape = StepTape()
    jobs, step_s = tape.job_medians(store, window, since=window.end - 3600)  # each job's median step
    rows = tape.rows(store, window, since=window.end - 20)   # the rows in [since, window.end)
    rows.jobs[rows.job]                                      # each row's job (jobs[job_medians's codes])

As the samples tape (analytics.detectors.tape) does, a window's read covers the rows since what the tape
holds, less `overlap_s` (one window by default), which is read again for rows inserted late; a row later
than that is missed by a warm tape until it leaves the range. A fresh tape, or one asked for a longer range,
another source or a window out of order, reads the whole range at once. The tape holds the longest range it
was asked for, measured back from the window's end: the rows of each read as a chunk, in time order, job
and node as codes, so that a window adds a chunk and drops the rows that left the range, and copies none
of the rest.

Each job's median step is kept over the range job_medians() is asked for (slow_node's cadence: an hour,
1.4 M rows for 1,536 ranks at 4 s), from each job's durations held sorted: a window deletes the values that
left and inserts the new ones, instead of sorting the hour. For that range the tape holds each row's time,
job and duration alone (24 bytes), every column (72) only over the range rows() is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np

from analytics.detectors.base import Window, read_numbers
from analytics.detectors.groups import sorted_medians
from analytics.detectors.tape import OVERLAP_S, millis
from analytics.errors import DetectorError
from analytics.store import native
from analytics.store.protocols import Reader

FORGET_AFTER = 16  # names without rows held kept beyond as many as those with rows
MAX_STEP_ROWS = 50_000_000  # rows one read may return: an hour of a 100k-rank fleet at 7 s steps

STEP_ROWS_SQL = """
SELECT toUnixTimestamp64Milli(ts) AS t_ms, job, node, toInt64(rank) AS rank, toInt64(step) AS step,
    toInt64(steps) AS steps, toInt64(ifNull(pp_stage, 0)) AS stage, ifNull(compute_s, nan) AS compute_s,
    duration_s
FROM steps
WHERE ts >= fromUnixTimestamp64Milli({from_ms:Int64}) AND ts < fromUnixTimestamp64Milli({until_ms:Int64})
"""
COLUMN_TYPES = {  # the columns held, as numpy arrays (a NULL compute_s is NaN; job and node are codes)
    "t_ms": np.int64,
    "job": np.int64,
    "node": np.int64,
    "rank": np.int64,
    "step": np.int64,
    "steps": np.int64,
    "stage": np.int64,
    "compute_s": np.float64,
    "duration_s": np.float64,
}
# STEP_ROWS_SQL's columns as read (native.numbers): job and node as codes, not text (a frame of the text
# and its factorizing cost 35% of the read)
STEP_ROWS_READ = COLUMN_TYPES | {"job": native.TEXT, "node": native.TEXT}


Chunk = dict[str, np.ndarray]  # rows as a numpy array per column of COLUMN_TYPES (or of TIMED)
TIMED = ["t_ms", "job", "duration_s"]  # what job medians are kept from


@dataclass(frozen=True)
class StepRows:
    """Step rows in [since_ms, until_ms), in time order, a numpy array per column of COLUMN_TYPES; `job` and
    `node` are codes into `jobs` and `nodes`, whose names are sorted, so that codes order as their names
    do (as ORDER BY job does)."""

    t_ms: np.ndarray
    job: np.ndarray
    node: np.ndarray
    rank: np.ndarray
    step: np.ndarray
    steps: np.ndarray
    stage: np.ndarray
    compute_s: np.ndarray
    duration_s: np.ndarray
    jobs: np.ndarray
    nodes: np.ndarray
    since_ms: int
    until_ms: int

    def __len__(self) -> int:
        return len(self.t_ms)

    def where(self, kept: np.ndarray) -> StepRows:
        """The rows where `kept`."""
        return replace(self, **{name: getattr(self, name)[kept] for name in COLUMN_TYPES})


class _Names:
    """Text (jobs, nodes) as integer codes that order as the names do: the place of each in the sorted
    names seen, which a new name renumbers (rare: a job starts, a node joins)."""

    def __init__(self) -> None:
        self.names = np.empty(0, object)

    def encode(self, text: native.Coded) -> tuple[np.ndarray, np.ndarray | None]:
        """The codes of `text`; and if it holds a name not seen before, each earlier code's new number."""
        codes, distinct = text.codes, text.texts
        renumbered = None
        if unseen := set(distinct.tolist()) - set(self.names.tolist()):
            names = np.array(sorted({*self.names.tolist(), *unseen}), dtype=object)
            renumbered = np.searchsorted(names, self.names)
            self.names = names
        return np.searchsorted(self.names, distinct)[codes], renumbered

    def keep(self, used: np.ndarray) -> np.ndarray:
        """Forget the names but those of codes `used` (sorted, distinct); each used code's new number."""
        renumbered = np.full(len(self.names), -1, np.int64)
        renumbered[used] = np.arange(len(used))
        self.names = self.names[used]
        return renumbered


class _Chunks:
    """Rows in time order as chunks, one per read, over a range that ends at the last window's end: a
    window appends a chunk and drops the rows that left the range, and copies none of the rest."""

    def __init__(self) -> None:
        self.span_ms = 0  # the longest range asked for, back from a window's end
        self.from_ms = 0  # the rows held are those from here to the tape's until_ms_
        self.chunks: list[Chunk] = []

    def keep(self, from_ms: int, read_from: int) -> list[Chunk]:
        """Keep the rows of [from_ms, read_from): those before left the range, those after are read
        again. Returns the rows dropped."""
        kept, gone = [], []
        for chunk in self.chunks:
            t_ms = chunk["t_ms"]
            if from_ms <= t_ms[0] and t_ms[-1] < read_from:
                kept.append(chunk)
                continue
            first, last = np.searchsorted(t_ms, [from_ms, read_from]).tolist()
            gone += [_part(chunk, 0, first), _part(chunk, last, len(t_ms))]
            if last > first:
                kept.append(_part(chunk, first, last))
        self.chunks, self.from_ms = kept, from_ms
        return gone

    def put_first(self, chunk: Chunk) -> None:
        """Hold `chunk`, rows before from_ms, ahead of the others (the caller sets the new from_ms)."""
        if len(chunk["t_ms"]):
            self.chunks.insert(0, chunk)

    def add(self, chunk: Chunk) -> Chunk:
        """Append the rows of `chunk` (after those held) that are in the range; returns them."""
        chunk = _part(chunk, int(np.searchsorted(chunk["t_ms"], self.from_ms)), len(chunk["t_ms"]))
        if len(chunk["t_ms"]):
            self.chunks.append(chunk)
        return chunk

    def since(self, since_ms: int) -> Chunk:
        """The rows from `since_ms` on, in one chunk."""
        parts = []
        for chunk in reversed(self.chunks):
            t_ms = chunk["t_ms"]
            if t_ms[-1] < since_ms:
                break
            parts.append(_part(chunk, int(np.searchsorted(t_ms, since_ms)), len(t_ms)))
        parts = parts[::-1] or [_empty()]
        return {name: np.concatenate([part[name] for part in parts]) for name in COLUMN_TYPES}

    def renumber(self, column: str, renumbered: np.ndarray) -> None:
        """Give the rows the new codes of column `column` (each old code's new one)."""
        self.chunks = [{**chunk, column: renumbered[chunk[column]]} for chunk in self.chunks]


class StepTape:
    """The step rows of the longest range asked for, before the last window's end; see the module doc."""

    def __init__(self, overlap_s: float = OVERLAP_S) -> None:
        self.overlap_s = overlap_s
        self.source_: Reader | None = None
        self.until_ms_ = 0
        self.rows_ = _Chunks()  # every column, over the longest range rows() was asked for
        self.timed_ = _Chunks()  # time, job and duration alone, over the range of job_medians()
        self.durations_: dict[int, np.ndarray] = {}  # job code -> timed_'s durations but NaN, sorted
        self.jobs_, self.nodes_ = _Names(), _Names()

    def rows(self, source: Reader, window: Window, since: float) -> StepRows:
        """The rows of `steps` in [since, window.end), read from `source` as far as the tape lacks them."""
        since_ms, until_ms = self._advance(source, window, since, self.rows_)
        columns = self.rows_.since(since_ms)
        names = {"jobs": self.jobs_.names, "nodes": self.nodes_.names}
        return StepRows(**columns, **names, since_ms=since_ms, until_ms=until_ms)

    def job_medians(self, source: Reader, window: Window, since: float) -> tuple[np.ndarray, np.ndarray]:
        """Each job with a row in [since, window.end): its code (into the `jobs` of rows this tape hands
        out in this window) and the median of its rows' durations, as ClickHouse's quantile(0.5) gives it
        below 8,192 values (groups.group_median) and exactly at any count. Held for the longest range
        asked for alone: `since` must be its start."""
        since_ms, _ = self._advance(source, window, since, self.timed_)
        if since_ms != self.timed_.from_ms:
            raise DetectorError("the steps tape keeps job medians over its longest range alone")
        codes = np.array(sorted(self.durations_), np.int64)
        first = np.zeros(1, np.int64)  # each job's sorted durations on their own: no copy of the hour
        medians = [
            sorted_medians(self.durations_[code], first, np.array([len(self.durations_[code])]))[0]
            for code in codes.tolist()
        ]
        return codes, np.array(medians, np.float64)

    def _advance(self, source: Reader, window: Window, since: float, asked: _Chunks) -> tuple[int, int]:
        """Hold the rows of each range asked for, `since` on counted in `asked`'s: the new ones only,
        from the overlap on, where the tape holds the rest. Returns [since, window.end) in ms."""
        since_ms, until_ms = millis(since), millis(window.end)
        asked.span_ms = max(asked.span_ms, until_ms - since_ms)
        froms = {held: until_ms - held.span_ms for held in (self.rows_, self.timed_)}
        first_ms, named = min(froms.values()), False
        if source is not self.source_ or until_ms < self.until_ms_ or first_ms > self.until_ms_:
            for held, from_ms in froms.items():
                held.chunks, held.from_ms = [], from_ms
            self.durations_ = {}
            named = self._add(self._read(source, first_ms, until_ms))
        else:
            for held, from_ms in froms.items():
                if from_ms < held.from_ms:  # a longer range than before: its older rows alone
                    named |= self._add(self._read(source, from_ms, held.from_ms), ahead_of=held)
                    held.from_ms = from_ms
            if until_ms > self.until_ms_:
                read_from = max(first_ms, self.until_ms_ - round(self.overlap_s * 1000))
                self.rows_.keep(froms[self.rows_], read_from)
                self._sort_in(self.timed_.keep(froms[self.timed_], read_from), added=False)
                named |= self._add(self._read(source, read_from, until_ms))
        self.source_, self.until_ms_ = source, until_ms
        if named:
            self._forget()
        return since_ms, until_ms

    def _add(self, read: tuple[Chunk, bool], ahead_of: _Chunks | None = None) -> bool:
        """Add the rows read after those held, or ahead of those of `ahead_of` alone (older rows of a
        longer range); returns whether they named a job or node not seen before."""
        rows, named = read
        timed = {name: rows[name] for name in TIMED}
        if ahead_of is None:
            self.rows_.add(rows)
            self._sort_in([self.timed_.add(timed)], added=True)
        else:
            ahead_of.put_first(rows if ahead_of is self.rows_ else timed)
            if ahead_of is self.timed_:
                self._sort_in([timed], added=True)
        return named

    def _sort_in(self, parts: list[Chunk], added: bool) -> None:
        """Insert the durations of `parts` (added) into each job's sorted durations, or delete them."""
        parts = [part for part in parts if len(part["t_ms"])]
        if not parts:
            return
        job, duration = (np.concatenate([part[name] for part in parts]) for name in ("job", "duration_s"))
        real = ~np.isnan(duration)  # quantile leaves NaN out
        job, duration = job[real], duration[real]
        for code in np.unique(job).tolist():
            values = np.sort(duration[job == code])
            held = self.durations_.get(code, np.empty(0))
            if added:
                held = np.insert(held, np.searchsorted(held, values, "right"), values)
            else:  # each value deleted as many times as it left: the i-th of equal values i places on
                repeat = np.arange(len(values)) - np.searchsorted(values, values, "left")
                held = np.delete(held, np.searchsorted(held, values, "left") + repeat)
            if len(held):
                self.durations_[code] = held
            else:
                self.durations_.pop(code, None)

    def _read(self, source: Reader, from_ms: int, until_ms: int) -> tuple[Chunk, bool]:
        """The rows of [from_ms, until_ms), in time order; and whether they named a job or node not seen
        before (the rows held are then numbered again)."""
        parameters = {"from_ms": from_ms, "until_ms": until_ms}
        result = read_numbers(
            source, STEP_ROWS_SQL, STEP_ROWS_READ, parameters=parameters, max_rows=MAX_STEP_ROWS
        )
        if result.truncated:
            raise DetectorError(f"over {MAX_STEP_ROWS} step rows in the steps tape's range: a range too long")
        found = result.columns
        if not len(found["t_ms"]):
            return _empty(), False
        job, renumbered_jobs = self.jobs_.encode(found["job"])
        node, renumbered_nodes = self.nodes_.encode(found["node"])
        self._renumber(renumbered_jobs, renumbered_nodes)
        columns = found | {"job": job, "node": node}
        order = np.argsort(columns["t_ms"], kind="stable")
        named = renumbered_jobs is not None or renumbered_nodes is not None
        return {name: column[order] for name, column in columns.items()}, named

    def _renumber(self, jobs: np.ndarray | None, nodes: np.ndarray | None) -> None:
        """Give the rows held the new codes of their jobs and nodes (each old code's new one)."""
        if jobs is not None:
            self.rows_.renumber("job", jobs)
            self.timed_.renumber("job", jobs)
            self.durations_ = {int(jobs[code]): values for code, values in self.durations_.items()}
        if nodes is not None:
            self.rows_.renumber("node", nodes)

    def _forget(self) -> None:
        """Forget the names of jobs and nodes without a row held once they are most of those known, so
        that names that come and go (jobs) do not grow the tape for as long as it lives. Looked at when a
        new name comes, the only time their number grows."""
        jobs, nodes = self._used("job", self.jobs_), self._used("node", self.nodes_)
        if len(self.jobs_.names) > 2 * len(jobs) + FORGET_AFTER:
            self._renumber(self.jobs_.keep(jobs), None)
        if len(self.nodes_.names) > 2 * len(nodes) + FORGET_AFTER:
            self._renumber(None, self.nodes_.keep(nodes))

    def _used(self, column: str, names: _Names) -> np.ndarray:
        """The codes of `column` that rows held have, sorted."""
        chunks = [chunk for held in (self.rows_, self.timed_) for chunk in held.chunks if column in chunk]
        return np.flatnonzero(sum(np.bincount(chunk[column], minlength=len(names.names)) for chunk in chunks))


def _part(chunk: Chunk, first: int, last: int) -> Chunk:
    """The rows [first, last) of `chunk`, as views."""
    if (first, last) == (0, len(chunk["t_ms"])):
        return chunk
    return {name: column[first:last] for name, column in chunk.items()}


def _empty() -> dict[str, np.ndarray]:
    return {name: np.empty(0, dtype) for name, dtype in COLUMN_TYPES.items()}


@runtime_checkable
class StepReader(Reader, Protocol):
    """A Reader with a steps tape behind it (the runner's source for its detectors)."""

    def step_tape(self) -> tuple[StepTape, Reader]: ...


def step_tape(source: Reader) -> tuple[StepTape, Reader]:
    """A steps tape and the source to read it from: the runner's, when `source` has one; else a fresh
    tape on `source` itself (a detector run alone), which reads what it is asked at once."""
    if isinstance(source, StepReader):
        return source.step_tape()
    return StepTape(), source

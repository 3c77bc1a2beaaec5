"""The steps tape: the recent rows of `steps`, kept in memory between windows, so that each window reads
only its new rows (one read) where the step readers' statements re-read and re-grouped their lookbacks:
slow_node's job cadence over an hour and its recent steps, and the step summary of gpu_fault, dma_degraded
and peer_outlier. On chDB those three cost 97 ms a window, their analysis alone 20-26 ms each.

    tape = StepTape()
    rows = tape.rows(store, window, since=window.end - 3600)   # the rows in [since, window.end)
    rows.jobs[rows.job]                                        # each row's job
    tape.job_medians(rows)                                     # each job's median step over them

As the samples tape (analytics.detectors.tape) does, a window's read covers the rows since what the tape
holds, less `overlap_s` (one window by default), which is read again for rows inserted late; a row later
than that is missed by a warm tape until it leaves the range. A fresh tape, or one asked for a longer range,
another source or a window out of order, reads the whole range at once. The tape holds the longest range it
was asked for, measured back from the window's end, rows in time order, job and node as codes.

Each job's step durations are held sorted as well: the median step of a job over an hour of a large fleet
(1.4 M rows for 1,536 ranks at 4 s) is then a merge of a window's new rows and a lookup, not a sort.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from analytics.detectors import DetectorError
from analytics.detectors.base import Window, read_frame
from analytics.detectors.tape import OVERLAP_S, millis
from analytics.store.protocols import Reader

MAX_STEP_ROWS = 50_000_000  # rows one read may return: an hour of a 100k-rank fleet at 7 s steps

STEP_ROWS_SQL = """
SELECT toUnixTimestamp64Milli(ts) AS t, CAST(job, 'String') AS job, CAST(node, 'String') AS node, rank,
    step, steps, ifNull(pp_stage, 0) AS stage, compute_s, duration_s
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
    """Text (jobs, nodes) as integer codes, in the order first seen, and their sorted order."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None

    def encode(self, text: pd.Series) -> np.ndarray:
        codes, distinct = pd.factorize(text)
        for name in distinct.tolist():
            if name not in self.codes:
                self.codes[name] = len(self.codes)
                self._sorted = None
        return np.array([self.codes[name] for name in distinct.tolist()], np.int64)[codes]

    def ranked(self) -> tuple[np.ndarray, np.ndarray]:
        """The names sorted, and per code its name's place among them."""
        if self._sorted is None:
            names = np.array(list(self.codes), dtype=object)
            order = np.argsort(names, kind="stable")
            place = np.empty(len(names), np.int64)
            place[order] = np.arange(len(names))
            self._sorted = (names[order], place)
        return self._sorted


class StepTape:
    """The step rows of the longest range asked for, before the last window's end; see the module doc."""

    def __init__(self, overlap_s: float = OVERLAP_S) -> None:
        self.overlap_s = overlap_s
        self.span_ms_ = 0  # the longest range asked for, back from a window's end
        self.source_: Reader | None = None
        self.from_ms_ = 0  # the rows held are those in [from_ms_, until_ms_)
        self.until_ms_ = 0
        self.columns_ = _empty()  # in time order
        self.jobs_, self.nodes_ = _Names(), _Names()
        # every held row's job and duration, sorted by job, then duration; and each one's time
        self.by_duration_ = {name: _empty()[name] for name in ["job", "duration_s", "t_ms"]}

    def rows(self, source: Reader, window: Window, since: float) -> StepRows:
        """The rows of `steps` in [since, window.end), read from `source` as far as the tape lacks them."""
        since_ms, until_ms = millis(since), millis(window.end)
        self.span_ms_ = max(self.span_ms_, until_ms - since_ms)
        self._advance(source, until_ms)
        first, last = np.searchsorted(self.columns_["t_ms"], [since_ms, until_ms])
        columns = {name: column[first:last] for name, column in self.columns_.items()}
        jobs, job_place = self.jobs_.ranked()
        nodes, node_place = self.nodes_.ranked()
        columns["job"], columns["node"] = job_place[columns["job"]], node_place[columns["node"]]
        return StepRows(**columns, jobs=jobs, nodes=nodes, since_ms=since_ms, until_ms=until_ms)

    def job_medians(self, rows: StepRows) -> tuple[np.ndarray, np.ndarray]:
        """For the jobs with rows in `rows` (a range this tape handed out in this window): their codes
        among rows.jobs, and the median of their rows' durations, as ClickHouse's quantile(0.5) gives it
        below 8,192 values (groups.group_median), exactly at any count."""
        if rows.until_ms != self.until_ms_ or rows.since_ms < self.from_ms_:
            raise DetectorError("job_medians asked of rows the tape no longer holds")
        held = self.by_duration_
        kept = (held["t_ms"] >= rows.since_ms) & (held["t_ms"] < rows.until_ms)
        job, duration = held["job"][kept], held["duration_s"][kept]  # still sorted by job, then duration
        codes, starts, sizes = np.unique(job, return_index=True, return_counts=True)
        index = 0.5 * (sizes - 1)
        left = index.astype(np.int64)
        low, high = duration[starts + left], duration[starts + np.minimum(left + 1, sizes - 1)]
        with np.errstate(invalid="ignore"):  # inf x 0 is NaN, as in ClickHouse
            interpolated = low * ((left + 1) - index) + high * (index - left)
        medians = np.where(left + 1 == sizes, low, interpolated)
        return self.jobs_.ranked()[1][codes], medians

    def _advance(self, source: Reader, until_ms: int) -> None:
        """Hold the rows of [until_ms - span_ms_, until_ms): the new ones only, from the overlap on, where
        the tape holds the rest."""
        from_ms = until_ms - self.span_ms_
        covered = source is self.source_ and self.from_ms_ <= from_ms
        if covered and until_ms == self.until_ms_:
            return
        resume = covered and self.until_ms_ < until_ms and from_ms <= self.until_ms_
        read_from = max(from_ms, self.until_ms_ - round(self.overlap_s * 1000)) if resume else from_ms
        new = self._read(source, read_from, until_ms)
        held = self.columns_
        first, last = np.searchsorted(held["t_ms"], [from_ms, read_from]) if resume else (0, 0)
        self.columns_ = {name: np.concatenate([held[name][first:last], new[name]]) for name in held}
        self._merge_durations(new, from_ms, read_from if resume else from_ms)
        self.source_, self.from_ms_, self.until_ms_ = source, from_ms, until_ms

    def _merge_durations(self, new: dict[str, np.ndarray], from_ms: int, read_from: int) -> None:
        """Keep by_duration_ to the rows held: those before `from_ms` and those read again from `read_from`
        out, the new ones in, each at its place in (job, duration) order."""
        held = self.by_duration_
        kept = (held["t_ms"] >= from_ms) & (held["t_ms"] < read_from)
        held = {name: column[kept] for name, column in held.items()}
        order = np.lexsort((new["duration_s"], new["job"]))
        added = {name: new[name][order] for name in held}
        places = np.empty(len(order), np.int64)
        for job in np.unique(added["job"]).tolist():  # within each job's run, by duration
            ours = added["job"] == job
            first, last = np.searchsorted(held["job"], [job, job + 1])
            within = np.searchsorted(held["duration_s"][first:last], added["duration_s"][ours], "right")
            places[ours] = first + within
        self.by_duration_ = {name: np.insert(held[name], places, added[name]) for name in held}

    def _read(self, source: Reader, from_ms: int, until_ms: int) -> dict[str, np.ndarray]:
        """The rows of [from_ms, until_ms), in time order."""
        parameters = {"from_ms": from_ms, "until_ms": until_ms}
        result = read_frame(source, STEP_ROWS_SQL, parameters=parameters, max_rows=MAX_STEP_ROWS)
        if result.truncated:
            raise DetectorError(f"over {MAX_STEP_ROWS} step rows in the steps tape's range: a range too long")
        found = result.frame
        if found.empty:
            return _empty()
        columns = {
            "t_ms": found["t"].to_numpy(np.int64),
            "job": self.jobs_.encode(found["job"]),
            "node": self.nodes_.encode(found["node"]),
            **{name: found[name].to_numpy(np.int64) for name in ["rank", "step", "steps", "stage"]},
            **{
                name: found[name].to_numpy(np.float64, na_value=np.nan)
                for name in ["compute_s", "duration_s"]
            },
        }
        order = np.argsort(columns["t_ms"], kind="stable")
        return {name: column[order] for name, column in columns.items()}


def _empty() -> dict[str, np.ndarray]:
    return {name: np.empty(0, dtype) for name, dtype in COLUMN_TYPES.items()}


@runtime_checkable
class StepReader(Reader, Protocol):
    """A Reader with a steps tape behind it (the runner's source for its detectors)."""

    def step_rows(self, window: Window, since: float) -> tuple[StepTape, StepRows]: ...


def step_rows(source: Reader, window: Window, since: float) -> tuple[StepTape, StepRows]:
    """The rows of `steps` in [since, window.end), and the tape they are on: the runner's when `source`
    has one, else a fresh one read at once (a detector run alone)."""
    if isinstance(source, StepReader):
        return source.step_rows(window, since)
    tape = StepTape()
    return tape, tape.rows(source, window, since)

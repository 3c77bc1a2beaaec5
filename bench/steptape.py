"""The steps tape at a real fleet's hour: what a steady window costs the tape and its readers when the
hour holds 1.4 M step rows (1,536 ranks at 4 s, Vela's size), and what the tape holds, against a naive
peer on the same rows: each job's median step taken from the hour's durations every window (np.median,
a sort), which is what the tape's sorted durations avoid.

The rows come from a fake columnar reader (no chDB: the store's read of a window's rows is measured in
bench/detect.py), so the figures are the tape's numpy alone.

    .venv/bin/python bench/steptape.py [--ranks 1536] [--step-s 4] [--windows 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.detectors.base import Window
from analytics.detectors.peers import node_jobs, step_aggregates
from analytics.detectors.runner import _SharedQueries
from analytics.detectors.slow_node import MAX_LOOKBACK_S, SlowNode
from analytics.detectors.steptape import StepTape
from analytics.detectors.tape import Tape
from analytics.store.protocols import FrameResult

START = 1_790_000_000.0


class HeldRows:
    """A columnar reader of one table of step rows, by time range (what the tape's statement asks)."""

    def __init__(self, rows: pd.DataFrame) -> None:
        self._rows = rows
        self._t = rows["t"].to_numpy()

    def query(self, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = 10_000):
        raise NotImplementedError(sql)

    def query_frame(
        self, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = 10_000
    ) -> FrameResult:
        assert parameters is not None
        first, last = np.searchsorted(self._t, [parameters["from_ms"], parameters["until_ms"]])
        return FrameResult(self._rows.iloc[first:last].reset_index(drop=True), False)


def fleet_hour(ranks: int, step_s: float, seconds: float) -> pd.DataFrame:
    """One job over `ranks` ranks (8 a node, 8 pipeline stages), a step every `step_s` for `seconds`."""
    rng = np.random.default_rng(1)
    step = np.repeat(np.arange(int(seconds / step_s)), ranks)
    rank = np.tile(np.arange(ranks), len(step) // ranks)
    t = (START + (step + 1) * step_s + rng.uniform(0, 0.05, len(step))) * 1000
    nodes = np.array([f"vela-{r // 8:03d}" for r in range(ranks)], dtype=object)
    rows = pd.DataFrame(
        {
            "t": t.astype(np.int64),
            "job": "llm",
            "node": nodes[rank],
            "rank": rank,
            "step": step,
            "steps": 1,
            "stage": rank // max(ranks // 8, 1),
            "compute_s": rng.normal(step_s * 0.75, 0.03, len(step)),
            "duration_s": rng.normal(step_s, 0.02, len(step)),
        }
    )
    return rows.sort_values("t", kind="stable").reset_index(drop=True)


def cpu_ms(action: Callable[[], object]) -> float:
    started = time.process_time()
    action()
    return (time.process_time() - started) * 1e3


def summaries(source: _SharedQueries, window: Window) -> None:
    """What gpu_fault, dma_degraded and peer_outlier ask of the step summary."""
    node_jobs(source, window, 300.0)
    step_aggregates(source, window)


def job_medians(hour: pd.DataFrame) -> pd.Series:
    """The peer: each job's median step over the hour, from its rows."""
    return hour.groupby("job")["duration_s"].median()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1536)
    parser.add_argument("--step-s", type=float, default=4.0)
    parser.add_argument("--windows", type=int, default=8)
    args = parser.parse_args()
    seconds = MAX_LOOKBACK_S + 10 * (args.windows + 2)
    rows = fleet_hour(args.ranks, args.step_s, seconds)
    source, tape, detector = HeldRows(rows), StepTape(), SlowNode()
    end = START + seconds
    windows = [Window(end - 10 * k, end - 10 * (k - 1)) for k in range(args.windows, 0, -1)]
    figures: dict[str, list[float]] = {"units": [], "summary": [], "peer": []}
    for index, window in enumerate(windows):
        shared = _SharedQueries(source, Tape(), tape)
        hour = rows[(rows["t"] >= (window.end - MAX_LOOKBACK_S) * 1000) & (rows["t"] < window.end * 1000)]
        measured = {
            "units": cpu_ms(partial(detector._recent_units, shared, window)),
            "summary": cpu_ms(partial(summaries, shared, window)),
            "peer": cpu_ms(partial(job_medians, hour)),
        }
        for name, figure in measured.items():
            if index:  # the first window is a cold tape
                figures[name].append(figure)
    held = [chunk for kind in (tape.rows_, tape.timed_) for chunk in kind.chunks]
    held_mib = (
        sum(c.nbytes for chunk in held for c in chunk.values())
        + sum(values.nbytes for values in tape.durations_.values())
    ) / 2**20
    hour_rows = sum(len(chunk["t_ms"]) for chunk in tape.timed_.chunks)
    steady = len(windows) - 1
    print(
        f"{args.ranks} ranks at {args.step_s} s: {hour_rows:,} step rows in the hour; {steady} steady windows"
    )
    labels = {
        "units": "steps tape and slow_node units (its cadence included)",
        "summary": "step summary (node_jobs, step_aggregates)",
        "peer": "peer: each job median over the hour by pandas (a sort)",
    }
    for name, label in labels.items():
        print(f"{label:56} {statistics.median(figures[name]):7.1f} ms CPU")
    print(f"held: {held_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

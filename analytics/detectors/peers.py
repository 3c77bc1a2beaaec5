"""What the peer-comparing detectors share: a window's per-node step aggregates, and robust peer baselines.

Peers are the nodes of the same job and pipeline stage (slow_node, peer_outlier), so that a job-wide
stall or a pipeline stage slower by design moves every peer together and stands out from nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from analytics.detectors.base import Window, frame
from analytics.detectors.groups import Groups
from analytics.detectors.tape import millis
from analytics.store.protocols import Reader
from analytics.store.records import QueryResult

MAD_TO_SIGMA = 1.4826  # the MAD of normally distributed values times this is their standard deviation

# Per job, node and pipeline stage in a window: steps (how many), median compute_s (NULL without phase
# data) and median duration_s of the node's ranks. The definition, which step_aggregates answers from
# STEP_SUMMARY (its tests hold it to this).
STEP_AGGREGATES = """
SELECT job, node, ifNull(pp_stage, 0) AS stage, toUInt64(sum(steps)) AS steps,
    quantileExact(0.5)(compute_s) AS compute_s, quantileExact(0.5)(duration_s) AS duration_s
FROM steps
WHERE ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}
GROUP BY job, node, stage
ORDER BY job, node, stage
"""
# Each node's job: the job of its latest step row since the lookback ("" for a node without one, after a
# LEFT JOIN ... ON candidates.node = jobs.node), for detectors whose candidates are a node's parts. The
# definition, which the tape's tests join against; node_jobs answers it from STEP_SUMMARY.
NODE_JOBS = """
    SELECT node, argMax(job, ts) AS job
    FROM steps
    WHERE ts >= {lookback:DateTime64(3)} AND ts < {end:DateTime64(3)}
    GROUP BY node
"""
# What node_jobs and step_aggregates both answer from, in one statement a window: per job, node and stage
# since JOBS_LOOKBACK_S (or more) before the window, the time of its latest step row (Unix ms), and
# STEP_AGGREGATES's figures over the rows in the window (`window_rows` of them: none for a group seen only
# before it). A statement costs its parse and plan (about 10 ms) however few its rows: the two this
# replaced cost 28-30 ms a window, this one 22-25.
STEP_SUMMARY = """
SELECT job, node, ifNull(pp_stage, 0) AS stage, toUnixTimestamp64Milli(max(ts)) AS last_ms,
    countIf(ts >= {start:DateTime64(3)}) AS window_rows,
    toUInt64(sumIf(steps, ts >= {start:DateTime64(3)})) AS steps,
    quantileExactIf(0.5)(compute_s, ts >= {start:DateTime64(3)}) AS compute_s,
    quantileExactIf(0.5)(duration_s, ts >= {start:DateTime64(3)}) AS duration_s
FROM steps
WHERE ts >= {lookback:DateTime64(3)} AND ts < {end:DateTime64(3)}
GROUP BY job, node, stage
ORDER BY job, node, stage
"""
AGGREGATE_COLUMNS = ["job", "node", "stage", "steps", "compute_s", "duration_s"]
# the summary reads at least this far back: the longest lookback of node_jobs's callers (gpu_fault's), so
# that every caller, step_aggregates's too, sends the same statement and the runner's shared reads run it
# once a window, whatever their lookbacks
JOBS_LOOKBACK_S = 300.0


def step_summary(source: Reader, window: Window, lookback_s: float = 0.0) -> QueryResult:
    """STEP_SUMMARY for `window`, looking back `lookback_s` before it or JOBS_LOOKBACK_S if longer."""
    parameters = {
        **window.parameters,
        "lookback": datetime.fromtimestamp(window.start - max(lookback_s, JOBS_LOOKBACK_S), UTC),
    }
    return source.query(STEP_SUMMARY, parameters=parameters, max_rows=1_000_000)


def node_jobs(source: Reader, window: Window, lookback_s: float) -> pd.Series:
    """NODE_JOBS for `window` and the `lookback_s` before it, as a Series: job by node. A node missing
    from it has no job: read it with `.reindex(nodes, fill_value="")`, as the LEFT JOIN reads it.

    Read from each (job, node, stage)'s latest step since JOBS_LOOKBACK_S (or `lookback_s` if longer):
    those whose latest step falls in the lookback are the jobs with a row in it, and the latest of them is
    the job of the node's latest row. Of jobs whose latest rows tie, the last by name (argMax picks any)."""
    since = millis(window.start - lookback_s)
    latest: dict[str, tuple[int, str]] = {}  # node -> its latest (last_ms, job) since the lookback
    summary = step_summary(source, window, lookback_s)
    at = [summary.columns.index(name) for name in ("node", "job", "last_ms")]
    for row in summary.rows:
        node, job, last_ms = (row[i] for i in at)
        if last_ms >= since and (last_ms, job) > latest.get(node, (since - 1, "")):
            latest[node] = (last_ms, job)
    if not latest:
        return pd.Series(dtype=object, name="job")
    jobs = [job for _, job in latest.values()]
    return pd.Series(jobs, index=pd.Index(list(latest), name="node"), dtype=object, name="job")


def step_aggregates(source: Reader, window: Window) -> pd.DataFrame:
    """STEP_AGGREGATES for `window`: per job, node and pipeline stage, steps (how many), median
    compute_s (NaN without phase data) and median duration_s of the node's ranks."""
    steps = frame(step_summary(source, window))
    steps = steps[steps["window_rows"] > 0]
    if steps.empty:
        return pd.DataFrame(columns=AGGREGATE_COLUMNS)
    steps = steps[AGGREGATE_COLUMNS].reset_index(drop=True)
    return steps.astype({"compute_s": float, "duration_s": float, "steps": int, "stage": int})


def node_values(result: QueryResult, names: Sequence[str], nodes: Sequence[str]) -> np.ndarray:
    """A query's rows of (node, metric, value) as a matrix: one row per node of `nodes`, one column per
    metric of `names`; NaN where a node has no value (or a NULL one)."""
    values = np.full((len(nodes), len(names)), np.nan)
    row = {node: i for i, node in enumerate(nodes)}
    column = {metric: j for j, metric in enumerate(names)}
    at = [result.columns.index(name) for name in ("node", "metric", "value")]
    for record in result.rows:
        node, metric, value = (record[i] for i in at)
        if node in row and metric in column and value is not None:
            values[row[node], column[metric]] = value
    return values


def peer_baseline(
    values: np.ndarray, peers: Groups, relative_floor: float, absolute_floor: np.ndarray | float = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Each value's peer median (over the rows of its group of `peers`; a column per feature) and robust
    spread: MAD x 1.4826, but at least `relative_floor` x |median| and `absolute_floor` (per column), so
    that peers in near lockstep do not turn a hair's difference into many sigmas. NaN values are left out
    of both."""
    median = np.column_stack([peers.median(column) for column in values.T])[peers.ids]
    with np.errstate(invalid="ignore"):  # inf - inf and 0 x inf: NaN, as in pandas
        deviation = np.abs(values - median)
        mad = np.column_stack([peers.median(column) for column in deviation.T])[peers.ids]
        floor = clip_lower(relative_floor * np.abs(median), absolute_floor)
        return median, clip_lower(mad * MAD_TO_SIGMA, floor)


def clip_lower(values: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """`values` raised to `floor` where below it, as pandas's clip(lower=) does: NaN stays NaN, and a NaN
    floor is no floor."""
    floor = np.broadcast_to(floor, values.shape)
    kept = np.isnan(values) | (values >= np.where(np.isnan(floor), -np.inf, floor))
    return np.where(kept, values, floor)

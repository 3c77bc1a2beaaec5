"""What the peer-comparing detectors share: a window's per-node step aggregates, and robust peer baselines.

Peers are the nodes of the same job and pipeline stage (slow_node, peer_outlier), so that a job-wide
stall or a pipeline stage slower by design moves every peer together and stands out from nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from analytics.detectors.base import Window, computed_once
from analytics.detectors.groups import Groups, columns_frame, group_quantile_exact, ordered_groups
from analytics.detectors.steptape import StepRows, step_tape
from analytics.detectors.tape import millis
from analytics.store.protocols import Reader
from analytics.store.records import QueryResult

MAD_TO_SIGMA = 1.4826  # the MAD of normally distributed values times this is their standard deviation

# Per job, node and pipeline stage in a window: steps (how many), median compute_s (NULL without phase
# data) and median duration_s of the node's ranks. The definition, which step_aggregates answers from the
# steps tape (its tests hold it to this).
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
# definition, which the tape's tests join against; node_jobs answers it from the steps tape.
NODE_JOBS = """
    SELECT node, argMax(job, ts) AS job
    FROM steps
    WHERE ts >= {lookback:DateTime64(3)} AND ts < {end:DateTime64(3)}
    GROUP BY node
"""
AGGREGATE_COLUMNS = ["job", "node", "stage", "steps", "compute_s", "duration_s"]
# the summary looks at least this far back: the longest lookback of node_jobs's callers (gpu_fault's), so
# that every caller, step_aggregates's too, asks for the same summary and the runner's window computes it
# once, whatever their lookbacks
JOBS_LOOKBACK_S = 300.0

Summary = dict[str, np.ndarray]  # per (job, node, stage), in that order: one array per figure


def step_summary(source: Reader, window: Window, lookback_s: float = 0.0) -> Summary:
    """What node_jobs and step_aggregates both answer from, computed once a window on the runner's
    source: per job, node and stage with a step row since JOBS_LOOKBACK_S (or `lookback_s` if longer)
    before the window, in that order, the time of its latest row (`last_ms`, Unix ms), and
    STEP_AGGREGATES's figures over its rows in the window (`window_rows` of them: none for one seen only
    before it). `job_id` and `node_id` order as the names do. Callers must not change it."""
    since = window.start - max(lookback_s, JOBS_LOOKBACK_S)
    tape, reader = step_tape(source)
    return computed_once(
        source, ("step_summary", window, since), lambda: _summary(tape.rows(reader, window, since), window)
    )


def _summary(rows: StepRows, window: Window) -> Summary:
    key = (rows.job * len(rows.nodes) + rows.node) * (int(rows.stage.max(initial=0)) + 1) + rows.stage
    group, first = ordered_groups(key)
    count = len(first)
    last_ms = np.full(count, np.iinfo(np.int64).min)
    np.maximum.at(last_ms, group, rows.t_ms)
    inside = rows.t_ms >= millis(window.start)
    window_group = group[inside]
    return {
        "job_id": rows.job[first],
        "node_id": rows.node[first],
        "job": rows.jobs[rows.job[first]],
        "node": rows.nodes[rows.node[first]],
        "stage": rows.stage[first],
        "last_ms": last_ms,
        "window_rows": np.bincount(window_group, minlength=count),
        "steps": np.bincount(window_group, weights=rows.steps[inside], minlength=count).astype(np.int64),
        "compute_s": group_quantile_exact(window_group, count, rows.compute_s[inside]),
        "duration_s": group_quantile_exact(window_group, count, rows.duration_s[inside]),
    }


def node_jobs(source: Reader, window: Window, lookback_s: float) -> pd.Series:
    """NODE_JOBS for `window` and the `lookback_s` before it, as a Series: job by node. A node missing
    from it has no job: read it with `.reindex(nodes, fill_value="")`, as the LEFT JOIN reads it.

    Read from each (job, node, stage)'s latest step since JOBS_LOOKBACK_S (or `lookback_s` if longer):
    those whose latest step falls in the lookback are the jobs with a row in it, and the latest of them is
    the job of the node's latest row. Of jobs whose latest rows tie, the last by name (argMax picks any)."""
    summary = step_summary(source, window, lookback_s)
    recent = summary["last_ms"] >= millis(window.start - lookback_s)
    node, last_ms, job = (summary[name][recent] for name in ("node_id", "last_ms", "job_id"))
    order = np.lexsort((job, last_ms, node))  # each node's latest (last_ms, job) ends its run
    latest = order[np.append(node[order][1:] != node[order][:-1], True)] if len(order) else order
    names = summary["job"][recent][latest], summary["node"][recent][latest]
    return pd.Series(names[0], index=pd.Index(names[1], dtype=object, name="node"), dtype=object, name="job")


def step_aggregates(source: Reader, window: Window) -> pd.DataFrame:
    """STEP_AGGREGATES for `window`: per job, node and pipeline stage, steps (how many), median
    compute_s (NaN without phase data) and median duration_s of the node's ranks."""
    summary = step_summary(source, window)
    seen = summary["window_rows"] > 0
    return columns_frame({name: summary[name][seen] for name in AGGREGATE_COLUMNS})


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

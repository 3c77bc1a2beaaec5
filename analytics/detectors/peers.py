"""What the peer-comparing detectors share: a window's per-node step aggregates, and robust peer baselines.

Peers are the nodes of the same job and pipeline stage (slow_node, peer_outlier), so that a job-wide
stall or a pipeline stage slower by design moves every peer together and stands out from nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from analytics.detectors.base import Window, frame
from analytics.store.protocols import Reader

MAD_TO_SIGMA = 1.4826  # the MAD of normally distributed values times this is their standard deviation

STEP_AGGREGATES = """
SELECT job, node, ifNull(pp_stage, 0) AS stage, toUInt64(sum(steps)) AS steps,
    quantileExact(0.5)(compute_s) AS compute_s, quantileExact(0.5)(duration_s) AS duration_s
FROM steps
WHERE ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}
GROUP BY job, node, stage
ORDER BY job, node, stage
"""
# Each node's job: the job of its latest step row since the lookback ("" for a node without one, after a
# LEFT JOIN ... ON candidates.node = jobs.node), for detectors whose candidates are a node's parts.
NODE_JOBS = """
    SELECT node, argMax(job, ts) AS job
    FROM steps
    WHERE ts >= {lookback:DateTime64(3)} AND ts < {end:DateTime64(3)}
    GROUP BY node
"""


def step_aggregates(source: Reader, window: Window) -> pd.DataFrame:
    """Per job, node and pipeline stage in `window`: steps (how many), median compute_s (NaN without
    phase data) and median duration_s of the node's ranks."""
    steps = frame(source.query(STEP_AGGREGATES, parameters=window.parameters))
    if steps.empty:
        return pd.DataFrame(columns=["job", "node", "stage", "steps", "compute_s", "duration_s"])
    return steps.astype({"compute_s": float, "duration_s": float, "steps": int, "stage": int})


def by_node(values: pd.DataFrame, names: Mapping[str, str]) -> pd.DataFrame:
    """Rows of (node, metric, value) as one row per node (the index) and one column per metric, named
    by `names` (metric -> column); NaN where a node has no value."""
    if values.empty:
        return pd.DataFrame(columns=list(names.values()), index=pd.Index([], name="node"), dtype=float)
    wide = values.pivot(index="node", columns="metric", values="value").reindex(columns=list(names))
    return wide.rename(columns=names).astype(float)


def peer_baseline(
    values: pd.DataFrame,
    groups: Sequence[pd.Series],
    relative_floor: float,
    absolute_floor: pd.Series | float = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each value's peer median (over rows of equal `groups`) and robust spread: MAD x 1.4826, but at least
    `relative_floor` x |median| and `absolute_floor`, so that peers in near lockstep do not turn a hair's
    difference into many sigmas. NaN values are left out of both."""
    median = values.groupby(list(groups)).transform("median")
    mad = (values - median).abs().groupby(list(groups)).transform("median")
    floor = (relative_floor * median.abs()).clip(lower=absolute_floor, axis=1)
    return median, (mad * MAD_TO_SIGMA).clip(lower=floor)

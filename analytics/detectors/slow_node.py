"""slow_node: a node whose ranks compute slower than their peers in the same job and pipeline stage.

In synchronous training one slow node sets the pace of the whole job: its peers finish their compute and
wait in communication, so every rank's step time rises and only the compute time (or, without phase data,
the GPU clocks) tells which node it is. Peers are the nodes of the same job and the same pipeline stage,
so a job-wide stall (a checkpoint: every node slows together) and a slower pipeline stage (by design)
compare equal to their peers and are never reported.

Per window, SQL takes each node's median over its ranks' steps (job, node, pp_stage); here each node is
compared with its stage's median over nodes:

    ratio = node / stage median                              (for SM clocks: stage median / node)
    z     = (node - stage median) / max(MAD x 1.4826, relative_floor x stage median)

Signal, per job: `compute_s` when the job's steps carry phase times; else the median SM clock of the
node's GPUs (DCGM_FI_DEV_SM_CLOCK, with GPU utilization and power as context in the evidence); else the
step `duration_s` (an imported job with step times only).

Score: the relative excess, ratio - 1 (0.10 = the node is 10% slower than its stage). A window's finding
needs ratio >= 1 + min_excess and z >= z_threshold, among at least `min_peers` nodes with at least
`min_steps` steps each in the window (a restarting job has few or none); severity critical at
ratio >= 1 + critical_excess.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, frame
from analytics.detectors.peers import by_node, peer_baseline, step_aggregates
from analytics.store.protocols import Reader

GPU_SIGNALS = {  # store metric -> evidence name; the first one measures the slowdown
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util_percent",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
}
GPU_MEDIANS = """
SELECT node, CAST(metric, 'String') AS metric, quantileExact(0.5)(value) AS value
FROM samples
WHERE metric IN {metrics:Array(String)} AND node IN {nodes:Array(String)}
    AND ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}
GROUP BY node, metric
"""
SLOWER_WHEN_LOWER = {"sm_clock_mhz"}  # signals that fall when a node slows down
CONTEXT = list(GPU_SIGNALS.values())[1:]  # in the evidence of a clock-based finding, not in the score
FEATURE_COLUMNS = ["node", "component", "job", "stage", "signal", "value", "peer_median", "ratio", "z"]
FEATURE_COLUMNS += ["peers", "steps", *CONTEXT, *(f"peer_{name}" for name in CONTEXT)]


@register
class SlowNode(Detector):
    """A node slower than its job-and-stage peers, persistently (2 of 3 windows)."""

    name = "slow_node"
    version = "1"
    kinds = ("slow_node",)
    min_windows = 2
    of_windows = 3
    clear_windows = 2

    def __init__(
        self,
        min_excess: float = 0.04,
        z_threshold: float = 3.5,
        relative_floor: float = 0.01,
        min_steps: int = 4,
        min_peers: int = 3,
        critical_excess: float = 0.25,
    ) -> None:
        self.min_excess = min_excess
        self.z_threshold = z_threshold
        self.relative_floor = relative_floor
        self.min_steps = min_steps
        self.min_peers = min_peers
        self.critical_excess = critical_excess

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        steps = step_aggregates(source, window)
        steps = steps[steps["steps"] >= self.min_steps].assign(signal="compute_s", value=steps["compute_s"])
        unphased = steps.groupby("job")["compute_s"].transform("count") == 0
        if unphased.any():
            steps = self._without_phases(source, window, steps, unphased)
        return self._compare_with_peers(steps[steps["value"] > 0])  # NaN: no data for this signal

    def score(self, features: pd.DataFrame) -> np.ndarray:
        """The relative excess over the stage median: ratio - 1."""
        return features["ratio"].to_numpy(dtype=float) - 1.0

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        passed = (
            (scores >= self.min_excess)
            & (features["z"].to_numpy(dtype=float) >= self.z_threshold)
            & (features["peers"].to_numpy() >= self.min_peers)
        )
        return [
            Finding(
                kind="slow_node",
                node=row.node,
                component="",
                job=row.job,
                score=float(score),
                severity="critical" if score >= self.critical_excess else "warning",
                evidence=_evidence(row),
            )
            for row, score in zip(features[passed].itertuples(index=False), scores[passed], strict=True)
        ]

    def _without_phases(
        self, source: Reader, window: Window, steps: pd.DataFrame, unphased: pd.Series
    ) -> pd.DataFrame:
        """The signal of jobs whose steps carry no phase times: their nodes' SM clocks where the job's nodes
        have GPU samples, else their step durations."""
        steps = steps.join(self._gpu_medians(source, window, steps.loc[unphased, "node"].unique()), on="node")
        clocked = unphased & (steps.groupby("job")["sm_clock_mhz"].transform("count") > 0)
        timed = unphased & ~clocked
        steps.loc[clocked, "signal"], steps.loc[clocked, "value"] = "sm_clock_mhz", steps["sm_clock_mhz"]
        steps.loc[timed, "signal"], steps.loc[timed, "value"] = "duration_s", steps["duration_s"]
        return steps

    def _gpu_medians(self, source: Reader, window: Window, nodes: Sequence[str]) -> pd.DataFrame:
        """Per node (the index), the median of each GPU signal over its GPUs and samples in `window`."""
        parameters = {**window.parameters, "metrics": list(GPU_SIGNALS), "nodes": list(nodes)}
        return by_node(frame(source.query(GPU_MEDIANS, parameters=parameters)), GPU_SIGNALS)

    def _compare_with_peers(self, candidates: pd.DataFrame) -> pd.DataFrame:
        """Add each node's stage median, ratio, robust z and peer count (higher ratio and z = slower), and
        the stage medians of the GPU context signals."""
        if candidates.empty:
            return pd.DataFrame(columns=FEATURE_COLUMNS)
        candidates = candidates.reindex(columns=[*candidates.columns.difference(CONTEXT), *CONTEXT])
        groups = [candidates["job"], candidates["stage"]]
        medians, spreads = peer_baseline(candidates[["value", *CONTEXT]], groups, self.relative_floor)
        value, median, spread = candidates["value"], medians["value"], spreads["value"]
        slower_when_lower = candidates["signal"].isin(SLOWER_WHEN_LOWER)
        result = candidates.assign(
            component="",
            peer_median=median,
            ratio=np.where(slower_when_lower, median / value, value / median),
            z=np.where(slower_when_lower, median - value, value - median) / spread,
            peers=candidates.groupby(groups)["value"].transform("count"),
            **{f"peer_{name}": medians[name] for name in CONTEXT},
        )
        return result.reindex(columns=FEATURE_COLUMNS).reset_index(drop=True)


def _evidence(row: Any) -> dict[str, object]:
    """The numbers behind one finding; GPU context only where the SM clock was the signal."""
    evidence: dict[str, object] = {
        "signal": row.signal,
        "value": float(row.value),
        "peer_median": float(row.peer_median),
        "ratio": round(float(row.ratio), 4),
        "z": round(float(row.z), 2),
        "peers": int(row.peers),
        "steps": int(row.steps),
        "stage": int(row.stage),
    }
    for name in CONTEXT:
        if pd.notna(getattr(row, name)):
            evidence[name] = float(getattr(row, name))
            evidence[f"peer_{name}"] = float(getattr(row, f"peer_{name}"))
    return evidence

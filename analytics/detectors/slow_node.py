"""slow_node: a node whose ranks compute slower than their peers in the same job and pipeline stage, in
most of its recent steps, and what that costs the job.

In synchronous training one slow node sets the pace of the whole job: every rank's step time rises and
only the compute time (or, without phase data, the GPU clocks) tells which node it is. Peers are the nodes
of the same job and pipeline stage, so a job-wide stall and a slower pipeline stage compare equal to
their peers and are never reported. A job whose records carry no stage is one stage.

Judged by steps, not by wall-clock windows: each window looks back over at least `lookback_steps` of the
job's median step, and a node is judged only in a window where its ranks finished a step and it has
`min_steps` steps in the lookback (`judged_by = "features"`: a window without a new step neither confirms
nor clears). Per step, each node's median over its ranks is compared with its stage's nodes:

    step ratio = node / stage median in that step
    ratio      = median of the node's step ratios over the lookback           (the score is ratio - 1)
    standing   = the node's place among its stage's nodes in a step: 0 the fastest, 1 the slowest
    consistency= its mean standing over the lookback
    z          = (ratio - median of the stage's node ratios) / max(MAD x 1.4826, relative_floor)

Signal, per job: `compute_s` when its steps carry phase times, else the median SM clock of the node's
GPUs, else the step `duration_s`. The evidence carries `job_slowdown` (the node's excess over the larger
of its stage median and its slowest peer, over the job's step time) and `lost_gpu_hours`. docs/detectors.md
gives the thresholds and the reasoning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, as_tuples
from analytics.detectors.groups import Columns, Groups, columns_frame, group_quantile_exact
from analytics.detectors.peers import MAD_TO_SIGMA, node_values
from analytics.detectors.steptape import StepRows, step_tape
from analytics.evidence import Evidence, SlowNodeEvidence
from analytics.store.protocols import Reader

MAX_LOOKBACK_S = 3600.0  # 5 steps of 10 minutes, with a margin: the longest lookback a window gets
LAST_STEPS = 32  # per node and stage: the most steps a window reads (the lookback takes at most this many)
OTLP_BUCKET_S = 10  # OTLP histograms cover runs of steps: their records are compared by time bucket

# The definitions of what a window reads, which _recent_units answers from the steps tape (its tests hold
# it to these): each job's step cadence over the hour (the median step; quantile is exact below 8,192
# values, the tape at any count), and each node's steps (per job and stage, its last ones) in its job's
# lookback, `since_ms` of its job on.
JOB_CADENCE = """
SELECT CAST(job, 'String') AS job, quantile(0.5)(duration_s) AS step_s
FROM steps
WHERE ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}
GROUP BY job
"""
STEP_UNITS = """
SELECT CAST(job, 'String') AS job, CAST(node, 'String') AS node, ifNull(pp_stage, 0) AS stage,
    if(steps <= 1, toInt64(step), -1 - toInt64(intDiv(toUnixTimestamp(ts), {bucket_s:UInt32}))) AS unit,
    toUnixTimestamp64Milli(max(ts)) / 1000 AS ended,
    quantileExact(0.5)(compute_s) AS compute_s, quantileExact(0.5)(duration_s) AS duration_s,
    uniqExact(rank) AS ranks, sum(steps) / uniqExact(rank) AS covered
FROM steps
WHERE ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}
    AND toUnixTimestamp64Milli(ts)
        >= transform(CAST(job, 'String'), {jobs:Array(String)}, {since_ms:Array(Int64)}, toInt64(0))
GROUP BY job, node, stage, unit
ORDER BY job, node, stage, ended DESC
LIMIT {last:UInt32} BY job, node, stage
"""
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
CONTEXT = list(GPU_SIGNALS.values())[1:]  # in the evidence of a clock-based finding, not in the score
FEATURE_COLUMNS = [
    "node",
    "component",
    "job",
    "stage",
    "signal",
    "value",
    "peer_median",
    "ratio",
    "z",
    "consistency",
    "peers",
    "steps",
    "job_slowdown",
    "job_step_s",
    "job_gpus",
    "lookback_s",
    *CONTEXT,
    *(f"peer_{name}" for name in CONTEXT),
]


@register
class SlowNode(Detector):
    """A node slower than its job-and-stage peers in most of its recent steps, persistently (2 of 3 of
    the windows that judged it)."""

    name = "slow_node"
    version = "2"
    kinds = ("slow_node",)
    min_windows = 2
    of_windows = 3
    clear_windows = 2
    judged_by = "features"

    def __init__(
        self,
        min_excess: float = 0.04,
        z_threshold: float = 3.5,
        relative_floor: float = 0.01,
        min_steps: int = 3,
        lookback_steps: int = 5,
        min_peers: int = 3,
        min_consistency: float = 0.85,
        critical_excess: float = 0.25,
    ) -> None:
        self.min_excess = min_excess
        self.z_threshold = z_threshold
        self.relative_floor = relative_floor
        self.min_steps = min_steps
        self.lookback_steps = lookback_steps
        self.min_peers = min_peers
        self.min_consistency = min_consistency
        self.critical_excess = critical_excess

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        units = self._recent_units(source, window)
        if units is None:
            return pd.DataFrame(columns=FEATURE_COLUMNS)
        units.update(signal=np.full(len(units["job"]), "compute_s", dtype=object), value=units["compute_s"])
        jobs = Groups(units["job_id"])
        unphased = jobs.non_null(units["compute_s"])[jobs.ids] == 0
        if unphased.any():
            units = self._without_phases(source, window, units, unphased)
        nan = np.full(len(units["job"]), np.nan)
        units = {**{name: nan for name in CONTEXT}, **units}  # GPU context only where a job had no phases
        kept = np.isfinite(units["value"]) & (units["value"] > 0)
        return self._compare_with_peers({name: column[kept] for name, column in units.items()}, window)

    def score(self, features: pd.DataFrame) -> np.ndarray:
        """The relative excess over the stage median: ratio - 1 (0.10 = 10% slower than its stage)."""
        return features["ratio"].to_numpy(dtype=float) - 1.0

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        passed = (
            (scores >= self.min_excess)
            & (features["z"].to_numpy(dtype=float) >= self.z_threshold)
            & (features["peers"].to_numpy(dtype=float) >= self.min_peers)
            & (features["consistency"].to_numpy(dtype=float) >= self.min_consistency)
        )
        return [
            Finding.at(
                row,
                "slow_node",
                score,
                "critical" if score >= self.critical_excess else "warning",
                _evidence(row),
            )
            for row, score in zip(as_tuples(features[passed], index=False), scores[passed], strict=True)
        ]

    def so_far(self, evidence: Evidence, elapsed_s: float) -> Evidence:
        """The anomaly's evidence after `elapsed_s`: the GPU-hours the job has lost to the node."""
        if not isinstance(evidence, SlowNodeEvidence):
            return evidence
        lost = (evidence.job_slowdown or 0.0) * elapsed_s * evidence.job_gpus / 3600
        return replace(evidence, lost_gpu_hours=round(lost, 3))

    def _recent_units(self, source: Reader, window: Window) -> Columns | None:
        """Each node's last steps (per job and stage) before the window's end, within the lookback its job's
        step length asks for; None if there are none. Only steps in the lookback are read, so a job that
        restarted from a checkpoint (its step numbers again) is not mixed with its steps before the
        restart."""
        tape, reader = step_tape(source)
        jobs, step_s = tape.job_medians(reader, window, window.end - MAX_LOOKBACK_S)
        if not len(jobs):
            return None
        lookback_s = np.full(len(tape.jobs_.names), np.nan)  # per job code (none: durations all NaN)
        lookback_s[jobs] = np.clip(self.lookback_steps * step_s, window.end - window.start, MAX_LOOKBACK_S)
        since_ms = np.zeros(len(lookback_s), np.int64)
        since_ms[jobs] = [int((window.end - seconds) * 1000) for seconds in lookback_s[jobs].tolist()]
        # the longest lookback's rows alone, in whole windows: a range that grew costs the tape a read
        whole = math.ceil((window.end - since_ms[jobs].min() / 1000) / (window.end - window.start))
        rows = tape.rows(reader, window, window.end - whole * (window.end - window.start))
        units = step_units(rows.where(rows.t_ms >= since_ms[rows.job]), OTLP_BUCKET_S, LAST_STEPS)
        units["lookback_s"] = lookback_s[units["job_id"]]
        return units

    def _without_phases(
        self, source: Reader, window: Window, units: Columns, unphased: np.ndarray
    ) -> Columns:
        """The signal of jobs whose steps carry no phase times: their nodes' SM clocks where the job's nodes
        have GPU samples in the window, else their step durations; and every unit's GPU context."""
        nodes, at = np.unique(units["node"], return_inverse=True)
        gpus = self._gpu_medians(source, window, pd.unique(units["node"][unphased]), nodes)[at.reshape(-1)]
        units = {**units, **{name: gpus[:, i] for i, name in enumerate(GPU_SIGNALS.values())}}
        jobs = Groups(units["job_id"])
        clocked = unphased & (jobs.non_null(units["sm_clock_mhz"])[jobs.ids] > 0)
        timed = unphased & ~clocked
        # a clock is slower when lower: its inverse keeps "higher = slower" for every signal
        with np.errstate(divide="ignore"):
            value = np.where(clocked, 1 / units["sm_clock_mhz"], units["value"])
        units["value"] = np.where(timed, units["duration_s"], value)
        units["signal"] = np.where(clocked, "sm_clock_mhz", np.where(timed, "duration_s", units["signal"]))
        return units

    def _gpu_medians(
        self, source: Reader, window: Window, asked: Sequence[str], nodes: Sequence[str]
    ) -> np.ndarray:
        """For each of `nodes`, the median of each GPU signal (a column each, in GPU_SIGNALS's order) over
        its GPUs and samples in `window`, for the nodes `asked` (NaN for the others)."""
        parameters = {**window.parameters, "metrics": list(GPU_SIGNALS), "nodes": list(asked)}
        return node_values(source.query(GPU_MEDIANS, parameters=parameters), list(GPU_SIGNALS), nodes)

    def _compare_with_peers(self, units: Columns, window: Window) -> pd.DataFrame:
        """One row per judged node and stage: its ratios to its stage's nodes step by step, their robust
        z among the stage's nodes, and the job time it costs."""
        judged = _judged(units, window, self.min_steps)
        if not judged.any():
            return pd.DataFrame(columns=FEATURE_COLUMNS)
        units = _step_ratios({**units, "judged": judged})
        if not len(units["value"]):  # no step seen by two nodes of a stage: nobody to compare with
            return pd.DataFrame(columns=FEATURE_COLUMNS)
        nodes = _per_node(units, self.relative_floor)
        nodes = {name: column[nodes["judged"]] for name, column in nodes.items()}
        if not len(nodes["node"]):
            return pd.DataFrame(columns=FEATURE_COLUMNS)
        clock = nodes["signal"] == "sm_clock_mhz"
        ratio = nodes["ratio"]
        with np.errstate(divide="ignore", invalid="ignore"):
            nodes |= {
                "component": np.full(len(ratio), "", dtype=object),
                "z": (ratio - nodes["stage_ratio"]) / nodes["spread"],
                "job_slowdown": np.where(clock, (ratio - 1) / ratio, nodes["job_slowdown"]).clip(0, 0.99),
                "value": np.where(clock, 1 / nodes["value"], nodes["value"]),
                "peer_median": np.where(clock, 1 / nodes["peer_median"], nodes["peer_median"]),
            }
        # text kept as Python strings: the runner's and findings' row tuples read them back every window
        return columns_frame({name: nodes[name] for name in FEATURE_COLUMNS})


def step_units(rows: StepRows, bucket_s: int, last: int) -> Columns:
    """STEP_UNITS's rows over `rows` (those in the lookback of their job), a numpy array per column (a
    NULL compute_s is NaN), with the job's and node's codes (`job_id`, `node_id`), which order as their
    names do: per job, node, stage and unit (a step, or an OTLP record's time bucket), when its last row
    ended, its ranks' median compute and step times, its ranks, and the steps each covered; each node's
    `last` latest units per job and stage."""
    unit = np.where(rows.steps <= 1, rows.step, -1 - (rows.t_ms // 1000) // bucket_s)
    key = Groups(rows.job, rows.node, rows.stage, unit)
    ended_ms = np.full(key.count, np.iinfo(np.int64).min)
    np.maximum.at(ended_ms, key.ids, rows.t_ms)
    first = key.first_rows()
    ranks = np.bincount(key.ids[Groups(key.ids, rows.rank).first_rows()], minlength=key.count)  # distinct
    units = {
        "job_id": rows.job[first],
        "node_id": rows.node[first],
        "stage": rows.stage[first],
        "unit": unit[first],
        "ended": ended_ms / 1000,
        "compute_s": group_quantile_exact(key.ids, key.count, rows.compute_s),
        "duration_s": group_quantile_exact(key.ids, key.count, rows.duration_s),
        "ranks": ranks,
        "covered": np.bincount(key.ids, weights=rows.steps, minlength=key.count) / ranks,
    }
    order = np.lexsort((-units["ended"], units["stage"], units["node_id"], units["job_id"]))
    units = {name: column[order] for name, column in units.items()}
    run = Groups(units["job_id"], units["node_id"], units["stage"])
    latest = np.arange(len(order)) - run.starts[run.ids] < last  # rows of a run are consecutive here
    units = {name: column[latest] for name, column in units.items()}
    return {"job": rows.jobs[units["job_id"]], "node": rows.nodes[units["node_id"]], **units}


def _judged(units: Columns, window: Window, min_steps: int) -> np.ndarray:
    """Per unit, whether this window judges its (job, node, stage): a step of theirs ends in the window
    and they have `min_steps` steps in their lookback (an OTLP record stands for the steps it aggregates)."""
    key = Groups(units["job_id"], units["node_id"], units["stage"])
    judged = (key.max(units["ended"]) >= window.start) & (key.sum(units["covered"]) >= min_steps)
    return judged[key.ids]


def _step_ratios(units: Columns) -> Columns:
    """Each node's value in each step against its stage's median and the job's slowest other node in that
    step, and the job's step time; steps seen by one node of a stage only are left out (no peer to compare
    with)."""
    value = units["value"]
    step = Groups(units["job_id"], units["stage"], units["unit"])
    count = step.non_null(value)[step.ids]
    median = step.median(value)[step.ids]
    in_job = Groups(units["job_id"], units["unit"])
    top, second = in_job.max(value)[in_job.ids], in_job.second_largest(value)[in_job.ids]
    slowest_other = np.where(value >= top, second, top)  # the job waits for it without this node
    job_step = in_job.max(units["duration_s"])[in_job.ids]
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = value - np.maximum(median, slowest_other)
        units = {
            **units,
            "step_ratio": value / median,
            "standing": (step.rank(value) - 1) / np.maximum(count - 1, 1),
            "step_slowdown": np.where(units["signal"] == "sm_clock_mhz", np.nan, excess / job_step),
            "job_step_s": job_step,
            "stage_median": median,
        }
    kept = count >= 2
    return {name: column[kept] for name, column in units.items()}


def _per_node(units: Columns, relative_floor: float) -> Columns:
    """Per (job, node, stage), in that order (a candidate: a node hosting ranks of two stages is judged in
    each): medians over its steps, its consistency, the job's size, and its stage's nodes' median ratio
    and robust spread (at least the floor)."""
    key = Groups(units["job_id"], units["node_id"], units["stage"])
    first = key.first_rows()
    nodes = {name: units[name][first] for name in ["job", "job_id", "node", "stage", "signal", "judged"]}
    nodes.update(
        value=key.median(units["value"]),
        peer_median=key.median(units["stage_median"]),
        ratio=key.median(units["step_ratio"]),
        consistency=key.mean(units["standing"]),
        steps=key.sum(units["covered"]),
        job_slowdown=key.median(units["step_slowdown"]),
        job_step_s=key.median(units["job_step_s"]),
        lookback_s=key.first(units["lookback_s"]),
        job_gpus=_job_gpus(units)[first],
        **{name: key.median(units[name]) for name in CONTEXT},
    )
    stage = Groups(nodes["job_id"], nodes["stage"])
    nodes["peers"] = stage.non_null(nodes["ratio"])[stage.ids]
    for name in CONTEXT:
        nodes[f"peer_{name}"] = stage.median(nodes[name])[stage.ids]
    median = stage.median(nodes["ratio"])
    mad = stage.median(np.abs(nodes["ratio"] - median[stage.ids]))
    nodes["stage_ratio"] = median[stage.ids]
    nodes["spread"] = np.maximum(mad * MAD_TO_SIGMA, relative_floor)[stage.ids]
    return nodes


def _job_gpus(units: Columns) -> np.ndarray:
    """Per unit, its job's GPUs: its ranks (one GPU each), the most any step of each node showed."""
    jobs, hosts = Groups(units["job_id"]), Groups(units["job_id"], units["node_id"])
    most = np.zeros(hosts.count, dtype=np.int64)
    np.maximum.at(most, hosts.ids, units["ranks"])
    gpus = np.zeros(jobs.count, dtype=np.int64)
    np.add.at(gpus, jobs.ids[hosts.first_rows()], most)
    return gpus[jobs.ids]


def _evidence(row: Any) -> SlowNodeEvidence:
    """The numbers behind one finding; GPU context only where the SM clock was the signal."""
    context: dict[str, float] = {}
    for name in CONTEXT:
        if pd.notna(getattr(row, name)):
            context[name] = float(getattr(row, name))
            context[f"peer_{name}"] = float(getattr(row, f"peer_{name}"))
    return SlowNodeEvidence(
        signal=row.signal,
        value=float(row.value),
        peer_median=float(row.peer_median),
        ratio=round(float(row.ratio), 4),
        z=round(float(row.z), 2),
        consistency=round(float(row.consistency), 3),
        peers=int(row.peers),
        steps=int(row.steps),
        stage=int(row.stage),
        job_slowdown=round(float(row.job_slowdown), 4) if pd.notna(row.job_slowdown) else 0.0,
        job_step_s=round(float(row.job_step_s), 4),
        job_gpus=int(row.job_gpus),
        lookback_s=round(float(row.lookback_s), 1),
        **context,
    )

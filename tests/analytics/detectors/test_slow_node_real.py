"""slow_node on step times written by others, and on steps far longer than a window.

Real data: ../shared/fixtures/steps/alibaba-pai (PROVENANCE.md §9), per-worker mini-batch times of two
real jobs of 10 workers, every 10th iteration. Each worker becomes a node with one rank; a worker's
mini-batch time is its own processing, so it is `compute_s`, and as in a synchronous job every worker's
`duration_s` is the slowest worker's plus a fixed communication time; times are scaled so that a median
step takes about 10 s.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import pytest

from analytics.detectors.runner import DetectionRunner, detect
from analytics.detectors.slow_node import SlowNode
from analytics.store import Store
from analytics.store.records import Anomaly
from collectors.steprecord import StepRecord
from tests.analytics.detectors import T0, SyncJob, window

SECONDS_PER_UNIT = 0.02  # a normalized time of 500 (a typical mini-batch) is a 10 s step
COMM_S = 1.0


def real_job(fixtures: Path, name: str) -> tuple[list[StepRecord], dict[int, tuple[float, float]]]:
    """The job's step records, and each iteration's [start, end) in scenario time."""
    times: dict[int, dict[int, float]] = defaultdict(dict)
    with (fixtures / "steps" / "alibaba-pai" / f"{name}_norm.csv").open() as rows:
        for row in csv.DictReader(rows):
            times[int(row["time"])][int(row["worker"])] = float(row["batch_time_norm"]) * SECONDS_PER_UNIT
    records, spans, t = [], {}, T0
    for iteration in sorted(times):
        computes = times[iteration]
        duration = max(computes.values()) + COMM_S
        spans[iteration] = (t, t + duration)
        t += duration
        records.extend(
            StepRecord(
                ts=t,
                job=name,
                rank=worker,
                node=f"worker-{worker}",
                step=iteration,
                duration_s=duration,
                compute_s=compute,
                comm_s=duration - compute,
            )
            for worker, compute in computes.items()
        )
    return records, spans


def slow_nodes(store: Store, job: str) -> list[Anomaly]:
    return [anomaly for anomaly in detect(store, names=["slow_node"]) if anomaly.job == job]


def test_real_transient_straggler_is_reported_in_its_episode_and_nowhere_else(
    store: Store, fixtures: Path
) -> None:
    records, spans = real_job(fixtures, "job_1")
    store.insert_steps(records, token="job_1")
    episode = (spans[1811][0], spans[1941][1])
    anomalies = slow_nodes(store, "job_1")
    in_episode = [
        a for a in anomalies if a.node == "worker-6" and a.start < episode[1] and a.end > episode[0]
    ]
    assert in_episode, anomalies
    strongest = max(in_episode, key=lambda anomaly: anomaly.score)
    assert strongest.severity == "critical"
    evidence = strongest.evidence
    assert 0.3 < evidence.job_slowdown < 0.6  # 1.7-2.3x the median: the job waits for most of it
    assert evidence.lost_gpu_hours > 0
    outside = [a for a in anomalies if a.severity == "critical" and a not in in_episode]
    assert outside == []


def test_real_steady_worker_differences_never_report_the_faster_workers(store: Store, fixtures: Path) -> None:
    records, _ = real_job(fixtures, "job_2")
    store.insert_steps(records, token="job_2")
    anomalies = slow_nodes(store, "job_2")
    assert {a.node for a in anomalies} <= {"worker-5"}
    assert all(a.evidence.job_slowdown < 0.12 for a in anomalies)


def test_a_node_twice_slower_in_a_job_of_46_s_steps_is_found_within_5_of_its_steps(store: Store) -> None:
    """16 nodes: 4 pipeline stages x 4 data-parallel workers, 4 ranks per node; a step lasts 46 s, so a
    10-s window rarely holds a step of every node."""
    onset = T0 + 600

    def slow(node: str, stage: int, t: float) -> float:
        return 2.0 if node == "vela-006" and t >= onset else 1.0

    job = SyncJob(nodes=16, ranks_per_node=4, stages=4, step_s=46.0, slowdown=slow)
    records = job.steps(T0, 1500)
    store.insert_steps(records, token="long-steps")
    runner = DetectionRunner([SlowNode()])
    reported: list[Anomaly] = []
    index = 0
    while not reported and window(index).end <= T0 + 1500:
        reported = runner.step(store, window(index))
        index += 1
    assert [(a.node, a.job) for a in reported] == [("vela-006", "llm")]
    assert runner.failures == {}  # windows holding one node's step used to raise IndexError
    reported_at = window(index - 1).end
    steps_until_report = {r.step for r in records if r.node == "vela-006" and onset <= r.ts < reported_at}
    assert 1 <= len(steps_until_report) <= 5
    evidence = reported[0].evidence
    assert evidence.peers == 4 and evidence.lookback_s >= 5 * 46
    # the job's step went from 46 s to about 0.7 x 46 more: the node costs the job about 0.41 of it
    assert evidence.job_slowdown == pytest.approx(0.7 / 1.7, abs=0.06)
    assert detect(store, T0, T0 + 1500, names=["slow_node"])[0].node == "vela-006"

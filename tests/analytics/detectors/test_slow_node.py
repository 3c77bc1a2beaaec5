"""slow_node on a real store: a synchronous job of 8 nodes x 8 ranks in 2 pipeline stages, its step records
as the SDK reports them, and for the GPU fallback simulated GPUs read by the real collectors."""

from __future__ import annotations

from pathlib import Path

import pytest

from analytics.detectors.runner import DetectionRunner, detect
from analytics.detectors.slow_node import SlowNode
from analytics.store import Store
from analytics.store.records import Anomaly
from tests.analytics.detectors import T0, SyncJob, gpu_clock_straggler, window
from tests.support.fleetdata import SimulatedFleet

ONSET = 5  # the window in which the slow node starts


def slow_from_onset(factor: float, node: str = "vela-003"):
    """`node` slow in its steps that end from the onset window on (a step starting at t ends about a step
    later)."""

    def slowdown(name: str, stage: int, t: float) -> float:
        return factor if name == node and t + SyncJob.step_s >= window(ONSET).start else 1.0

    return slowdown


def first_report(store: Store, windows: int) -> tuple[int, list[Anomaly]] | None:
    """The first window in which the runner reported an anomaly, and what it reported."""
    runner = DetectionRunner([SlowNode()])
    for index in range(windows):
        if reported := runner.step(store, window(index)):
            return index, reported
    return None


def test_a_node_ten_percent_slower_is_found_within_three_windows_of_onset(store: Store) -> None:
    store.insert_steps(SyncJob(slowdown=slow_from_onset(1.10)).steps(T0, 150), token="steps")
    found = first_report(store, 15)
    assert found is not None
    index, (anomaly,) = found
    assert index <= ONSET + 2
    assert (anomaly.node, anomaly.kind, anomaly.job, anomaly.component) == (
        "vela-003",
        "slow_node",
        "llm",
        "",
    )
    assert anomaly.start == window(ONSET).start and anomaly.end is None
    evidence = anomaly.evidence
    assert evidence.signal == "compute_s" and evidence.peers == 4 and evidence.stage == 0
    assert evidence.ratio == pytest.approx(1.10, abs=0.02)
    assert evidence.value > evidence.peer_median


def test_a_node_five_percent_slower_is_found_and_stays_reported(store: Store) -> None:
    store.insert_steps(SyncJob(slowdown=slow_from_onset(1.05)).steps(T0, 200), token="steps")
    (anomaly,) = detect(store, names=["slow_node"])
    assert anomaly.node == "vela-003" and anomaly.end is None and anomaly.severity == "warning"
    assert window(ONSET).start <= anomaly.start <= window(ONSET + 2).start
    assert anomaly.score == pytest.approx(0.05, abs=0.015)


def test_a_node_a_third_slower_is_critical(store: Store) -> None:
    store.insert_steps(SyncJob(slowdown=slow_from_onset(1.33)).steps(T0, 100), token="steps")
    (anomaly,) = detect(store, names=["slow_node"])
    assert (anomaly.node, anomaly.severity) == ("vela-003", "critical")


def test_the_anomaly_ends_when_the_node_recovers(store: Store) -> None:
    recovered = window(12).start

    def slow_for_a_while(node: str, stage: int, t: float) -> float:
        return 1.15 if node == "vela-006" and window(ONSET).start <= t + SyncJob.step_s < recovered else 1.0

    store.insert_steps(SyncJob(slowdown=slow_for_a_while).steps(T0, 250), token="steps")
    (anomaly,) = detect(store, names=["slow_node"])
    assert anomaly.node == "vela-006" and anomaly.end is not None
    assert anomaly.start == window(ONSET).start
    assert recovered <= anomaly.end <= recovered + 10
    assert anomaly.evidence.stage == 1


def stall(node: str, stage: int, t: float) -> float:
    """A checkpoint: every rank three times slower for 20 s."""
    return 3.0 if window(6).start <= t < window(8).start else 1.0


def slow_last_stage(node: str, stage: int, t: float) -> float:
    """The last of three stages does 20% more work by design: a third of the job's nodes."""
    return 1.2 if stage == 2 else 1.0


@pytest.mark.parametrize(
    "slowdown", [stall, slow_last_stage], ids=["job-wide stall", "slower pipeline stage"]
)
def test_what_every_peer_shares_is_not_a_slow_node(store: Store, slowdown) -> None:
    store.insert_steps(SyncJob(nodes=12, stages=3, slowdown=slowdown).steps(T0, 200), token="steps")
    assert detect(store, names=["slow_node"]) == []


def test_a_job_restart_is_not_a_slow_node(store: Store) -> None:
    """The job stops at 60 s and comes back 60 s later from step 0, its first steps slow on every rank
    (warm-up), the ranks of the first node a little later than the others."""
    job = SyncJob()
    restarted = T0 + 120

    def warm_up(node: str, stage: int, t: float) -> float:
        late = 1.5 if node == "vela-001" else 0.0
        return 4.0 if t < restarted + 6 + late else 1.0

    store.insert_steps(job.steps(T0, 60), token="before")
    store.insert_steps(SyncJob(slowdown=warm_up).steps(restarted, 120), token="after")
    assert detect(store, T0, T0 + 240, names=["slow_node"]) == []


def test_step_times_alone_find_the_node_whose_ranks_take_longer(store: Store) -> None:
    """A job reporting only step durations, its ranks not held together by a barrier."""
    job = SyncJob(slowdown=slow_from_onset(1.15), phases=False, barrier=False)
    store.insert_steps(job.steps(T0, 150), token="steps")
    (anomaly,) = detect(store, names=["slow_node"])
    assert anomaly.node == "vela-003"
    assert anomaly.evidence.signal == "duration_s"


def test_without_phase_times_the_gpu_clocks_find_the_slow_node(store: Store, tmp_path: Path) -> None:
    """Step durations alone cannot tell (a barrier makes every rank's step as long), the SM clocks can."""
    with SimulatedFleet(store, tmp_path, nodes=8, gpus=4) as fleet:
        start = gpu_clock_straggler(fleet, store)
    (anomaly,) = detect(store, start, start + 100, names=["slow_node"])
    assert anomaly.node == "vela-003" and start + 40 <= anomaly.start <= start + 60
    evidence = anomaly.evidence
    assert evidence.signal == "sm_clock_mhz" and evidence.value < evidence.peer_median
    assert evidence.ratio == pytest.approx(1 / 0.85, abs=0.02)
    assert evidence.power_w < evidence.peer_power_w

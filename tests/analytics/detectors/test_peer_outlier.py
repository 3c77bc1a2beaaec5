"""peer_outlier on a real store: 16 simulated nodes read by the real collectors, running one pipelined job."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.ensemble import IsolationForest

from analytics.detectors.peer_outlier import NAMES, PeerOutlier
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
from tests.analytics.detectors import SyncJob
from tests.support.fleetdata import SimulatedFleet

NODES = 16
TICKS = 10


def run_job(store: Store, tmp_path: Path, job: SyncJob, odd_node: str | None = None) -> tuple[float, float]:
    """`job` on a fleet of NODES for TICKS scrape intervals, `odd_node`'s GPUs thermally throttled from the
    third; returns the time range of the data."""
    with SimulatedFleet(store, tmp_path, nodes=NODES) as fleet:
        start = fleet.clock() + fleet.interval_s
        fleet.tick(2)
        if odd_node is not None:
            for gpu in range(4):
                fleet[odd_node].gpus.set_fault(gpu, "thermal_throttle")
        fleet.tick(TICKS - 2)
    store.insert_steps(job.steps(start, TICKS * fleet.interval_s), token="steps")
    return start, start + TICKS * fleet.interval_s


def test_a_node_unlike_its_peers_is_reported_with_the_features_that_set_it_apart(
    store: Store, tmp_path: Path
) -> None:
    span = run_job(store, tmp_path, SyncJob(nodes=NODES), odd_node="vela-005")
    (anomaly,) = DetectionRunner([PeerOutlier()]).run(store, *span)
    assert (anomaly.node, anomaly.kind, anomaly.severity, anomaly.job) == (
        "vela-005",
        "peer_outlier",
        "info",
        "llm",
    )
    evidence = anomaly.evidence
    drivers = {driver.feature: driver for driver in evidence.features}
    assert {"sm_clock_mhz", "gpu_temp_c"} <= set(drivers)
    assert drivers["sm_clock_mhz"].value < drivers["sm_clock_mhz"].peer_median
    assert drivers["gpu_temp_c"].z > 4 and evidence.peers == NODES
    assert DetectionRunner([PeerOutlier(min_peers=NODES + 1)]).run(store, *span) == []


def test_healthy_nodes_and_a_pipeline_stage_slower_by_design_are_not_reported(
    store: Store, tmp_path: Path
) -> None:
    def slow_last_stage(node: str, stage: int, t: float) -> float:
        return 1.25 if stage == 7 else 1.0

    span = run_job(store, tmp_path, SyncJob(nodes=NODES, stages=8, slowdown=slow_last_stage))
    assert DetectionRunner([PeerOutlier()]).run(store, *span) == []


Z = st.one_of(st.sampled_from([0.0, -0.0, 4.0, 1e30, np.inf, -np.inf]), st.floats(-50, 50))


@settings(max_examples=60, deadline=None)
@given(vectors=hnp.arrays(float, st.tuples(st.integers(2, 300), st.just(len(NAMES))), elements=Z))
def test_scores_are_a_plain_isolation_forests(vectors: np.ndarray) -> None:
    """score() grows the forest's trees itself, without sklearn's checks and per-tree overheads: the
    scores stay those of the forest fitted as sklearn does by default, bit for bit, on any z vectors (ties,
    infinities, more nodes than a tree samples)."""
    detector = PeerOutlier()
    features = pd.DataFrame(vectors, columns=[f"z_{name}" for name in NAMES])
    forest = IsolationForest(n_estimators=detector.n_estimators, random_state=detector.random_state)
    expected = -forest.fit(vectors).score_samples(vectors)
    np.testing.assert_array_equal(detector.score(features), expected)

"""A small incident seeded into a store with the real collectors and detector, for postmortem tests: a GPU
throttled on a simulated fleet, its anomaly alerted and a drain waiting for approval, then a scrape gap."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analytics.detectors.gpu_throttle import GpuThrottle
from analytics.detectors.runner import DetectionRunner, store_anomalies
from analytics.store import Store
from analytics.store.records import ActionRow, AlertChange, Anomaly
from tests.support.fleetdata import SimulatedFleet

NODE = "vela-002"
THROTTLED_GPU = 1
JOBS = {"vela-001": "job-a", NODE: "job-a", "vela-003": "job-b"}


@dataclass(frozen=True)
class Incident:
    """What was done to the fleet, and when (unix seconds of the samples)."""

    start: float
    end: float
    throttled: tuple[float, float]  # first and last scrape with the GPU throttled
    gap: tuple[float, float]  # first and last failed scrape of NODE (and of vela-003)
    anomaly: Anomaly
    alert_at: float
    drain_at: float


def seed_incident(store: Store, root: Path) -> Incident:
    """Three nodes in two jobs: NODE's GPU 1 throttles for five scrapes, then NODE and vela-003 miss three
    scrapes; the detector's anomaly is stored, alerted (pending, firing, resolved) and a drain waits for
    approval."""
    with SimulatedFleet(store, root, nodes=3, gpus=2, nics=1) as fleet:
        for node in fleet.nodes:
            node.job = JOBS[node.name]
        start = fleet.clock()
        fleet.tick(5)
        fleet[NODE].gpus.set_fault(THROTTLED_GPU, "thermal_throttle", temp_c=91, clock_factor=0.7)
        first_throttled = fleet.tick().start
        last_throttled = fleet.tick(4).start
        fleet[NODE].gpus.clear_fault(THROTTLED_GPU, "thermal_throttle")
        fleet.tick(2)
        gap_from = fleet.tick(skip={NODE, "vela-003"}).start
        gap_to = fleet.tick(2, skip={NODE, "vela-003"}).start
        end = fleet.tick(2).end
    runner = DetectionRunner([GpuThrottle()])
    [anomaly] = {found.id: found for found in [*runner.run(store, start, end), *runner.flush()]}.values()
    store_anomalies(store, [anomaly])
    alert_at, drain_at = anomaly.start + 20, anomaly.start + 30
    labels = {"alertname": "FleetlensGpuThrottle", "node": NODE, "kind": anomaly.kind, "component": "gpu:1"}
    summary = {"summary": f"gpu_throttle on {NODE} gpu:1"}
    store.insert_alert_changes(
        [
            AlertChange(
                anomaly.start, "fp-1", "FleetlensGpuThrottle", "pending", labels, summary, alert_at, None
            ),
            AlertChange(alert_at, "fp-1", "FleetlensGpuThrottle", "firing", labels, summary, alert_at, None),
            AlertChange(
                anomaly.end,
                "fp-1",
                "FleetlensGpuThrottle",
                "resolved",
                labels,
                summary,
                alert_at,
                anomaly.end,
            ),
        ],
        token="incident/alerts",
    )
    store.insert_actions(
        [
            ActionRow(
                drain_at, "drain", NODE, "job-a", "fleetlens: gpu_throttle fp-1", "approve", "pending", "d-1"
            )
        ],
        token="incident/actions",
    )
    return Incident(
        start, end, (first_throttled, last_throttled), (gap_from, gap_to), anomaly, alert_at, drain_at
    )

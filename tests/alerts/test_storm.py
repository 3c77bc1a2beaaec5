"""A fabric event, simulated: 30% of a 32-node fleet loses a GPU link at once. The real simulator,
detectors, alert engine and drain controller in auto mode must drain no more than the limits allow,
stop at the breaker, and raise one fleet-level critical alert; in dry-run, nothing is called at all."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from alerts import commands
from alerts.drain import FLEET_ALERT, DrainController
from alerts.engine import AlertEngine
from alerts.policy import DrainPolicy
from alerts.service import AlertService
from analytics.detectors import build
from analytics.detectors.runner import DetectionRunner, windows
from analytics.store import Store
from sim.offline import simulate_offline
from sim.scenario import parse_scenario
from tests.alerts.test_drain import RecordingBackend

STRUCK = [f"vela-{i:03d}" for i in range(3, 13)]  # 10 of 32 nodes
SCENARIO = {
    "seed": 11,
    "duration_s": 240,
    "interval_s": 10,
    "fleet": {"nodes": 32, "gpus_per_node": 2, "nics_per_node": 1},
    "jobs": [{"name": "llm", "nodes": 32, "step_s": 2.0, "dp": 8, "pp": 4, "tp": 2}],
    "faults": [{"kind": "gpu_lost", "node": node, "gpu": 1, "start_s": 120} for node in STRUCK],
}


@pytest.fixture(scope="module")
def fabric_event(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The scenario simulated once into the session's store; (store, epoch, end)."""
    epoch = math.floor((time.time() - 3600) / 10) * 10
    scenario = parse_scenario(SCENARIO, "fabric-event")
    with Store.open(f"chdb://{chdb_dir}", database="storm") as store:
        simulate_offline(scenario, store, tmp_path_factory.mktemp("storm"), epoch, workers=1)
        yield store, epoch, epoch + scenario.duration_s


def run(store: Store, start: float, end: float, mode: str) -> tuple[AlertService, RecordingBackend]:
    backend = RecordingBackend()
    controller = DrainController(DrainPolicy(mode=mode), [backend], fleet_size=0)
    service = AlertService(store, AlertEngine(), controller=controller)
    runner = DetectionRunner(build(["gpu_fault"]))
    for window in windows(start, end):
        service.cycle(runner.step(store, window), now=window.end)
    return service, backend


def test_a_third_of_the_fleet_at_once_opens_the_breaker_and_raises_one_fleet_alert(fabric_event):
    store, start, end = fabric_event
    service, backend = run(store, start, end, "auto")

    assert service.controller.fleet_size == 32
    assert backend.calls == []  # the breaker opens in the cycle the storm arrives, before any drain
    audit = commands.actions(store)
    opened = [row for row in audit if row.action == "breaker" and row.outcome == "open"]
    assert len(opened) == 1 and "10 of 32 nodes" in opened[0].reason
    refused = {row.node for row in audit if row.outcome == "refused"}
    assert refused == set(STRUCK)
    fleet_alerts = [a for a in commands.alert_states(store) if a["alertname"] == FLEET_ALERT]
    assert [a["state"] for a in fleet_alerts] == ["firing"] and fleet_alerts[0]["labels"][
        "severity"
    ] == "critical"


def test_dry_run_decides_the_same_storm_without_a_single_backend_call(fabric_event):
    store, start, end = fabric_event
    service, backend = run(store, start, end, "dry-run")
    assert backend.calls == []
    assert service.controller.breaker_open

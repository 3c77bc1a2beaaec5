"""Alerting and draining end to end: a simulated GPU fault, the real detector and runner, the alert
service, and real peers: Debian's Alertmanager receives the alert and sees it resolved; a real Slurm
cluster drains the node with our reason once a person approves, and resumes it when it is healthy."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from alerts import commands
from alerts.backends.slurm import SlurmBackend
from alerts.drain import DrainController
from alerts.engine import AlertEngine
from alerts.notifiers import AlertmanagerNotifier
from alerts.policy import DrainLimits, DrainPolicy
from alerts.service import AlertService
from alerts.silences import new_silence
from analytics.detectors.gpu_fault import GpuFault
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
from tests.support.alertmanager import alertmanager
from tests.support.fleetdata import SimulatedFleet
from tests.support.slurm import slurm_cluster
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
NODES = ["vela-001", "vela-002", "vela-003", "vela-004"]


def run_windows(
    fleet: SimulatedFleet, runner: DetectionRunner, service: AlertService, store: Store, count: int
):
    """`count` scrape intervals, each followed by a detection window and an alerting cycle."""
    for _ in range(count):
        window = fleet.tick()
        service.cycle(runner.step(store, window), now=window.end)


def active_alerts(base: str) -> list[dict]:
    with urllib.request.urlopen(f"{base}/api/v2/alerts?active=true&silenced=false", timeout=5) as answer:
        return json.load(answer)


def test_a_lost_gpu_fires_in_alertmanager_a_silenced_one_does_not_and_both_resolve(
    store: Store, tmp_path: Path
):
    runner = DetectionRunner([GpuFault()])
    with alertmanager(tmp_path) as base, SimulatedFleet(store, tmp_path, nodes=4, gpus=2) as fleet:
        service = AlertService(store, AlertEngine(), [AlertmanagerNotifier(base)])
        swap = new_silence(["node=vela-003"], 3600, created_by="sre", comment="GPU swap", now=fleet.clock())
        commands.add_silence(store, swap)
        run_windows(fleet, runner, service, store, 2)
        fleet["vela-002"].gpus.set_fault(1, "gpu_lost")
        fleet["vela-003"].gpus.set_fault(0, "gpu_lost")
        run_windows(fleet, runner, service, store, 2)

        [alert] = wait_for(lambda: active_alerts(base), "the alert in Alertmanager")
        assert alert["labels"] == {
            "alertname": "FleetlensGpuFault",
            "node": "vela-002",
            "component": "gpu:1",
            "kind": "gpu_fault",
            "severity": "critical",
        }
        assert alert["fingerprint"] == service.engine.firing[0].fingerprint  # the same id in both places
        assert "lost" in alert["annotations"]["evidence"]

        fleet["vela-002"].gpus.clear_fault(1, "gpu_lost")
        fleet["vela-003"].gpus.clear_fault(0, "gpu_lost")
        run_windows(fleet, runner, service, store, GpuFault.clear_windows + 1)
        wait_for(lambda: not active_alerts(base), "the alert resolved in Alertmanager")
        service.close()

    states = {(row["labels"]["node"], row["state"]) for row in commands.alert_states(store)}
    assert states == {("vela-002", "resolved"), ("vela-003", "resolved")}
    deliveries = store.query(
        "SELECT ok, arrayJoin(states) FROM notifications WHERE receiver = 'alertmanager'"
    )
    sent = [state for ok, state in deliveries.rows if ok]  # firing (resent every minute), then resolved once
    assert (
        len(sent) == len(deliveries.rows)
        and set(sent) == {"firing", "resolved"}
        and sent.count("resolved") == 1
    )


def test_slurm_drains_a_faulty_node_once_approved_and_resumes_it_when_healthy(store: Store, tmp_path: Path):
    runner = DetectionRunner([GpuFault()])
    with (
        slurm_cluster(tmp_path, names=NODES) as cluster,
        SimulatedFleet(store, tmp_path, nodes=4, gpus=2) as fleet,
    ):
        policy = DrainPolicy(
            mode="approve",
            limits=DrainLimits(max_nodes=1, max_fraction=0.25, breaker_fraction=0.5),
            return_after_healthy_s=30,
        )
        controller = DrainController(policy, [SlurmBackend(env=cluster.env)], fleet_size=len(NODES))
        service = AlertService(store, AlertEngine(), controller=controller)
        run_windows(fleet, runner, service, store, 1)
        fleet["vela-004"].gpus.set_fault(0, "gpu_lost")
        run_windows(fleet, runner, service, store, 2)

        [waiting] = commands.drain_status(store)["pending"]
        assert waiting.node == "vela-004" and cluster.sinfo()["vela-004"][0] == "idle"
        commands.request(store, "approve", waiting.decision_id, "alice", now=waiting.ts + 5)
        run_windows(fleet, runner, service, store, 1)

        state, reason = cluster.sinfo()["vela-004"]
        assert (
            state in ("drained", "draining") and reason == f"fleetlens: gpu_fault {waiting.reason.split()[2]}"
        )
        assert {node: s for node, (s, _) in cluster.sinfo().items() if node != "vela-004"} == dict.fromkeys(
            NODES[:3], "idle"
        )

        fleet["vela-004"].gpus.clear_fault(0, "gpu_lost")
        run_windows(fleet, runner, service, store, GpuFault.clear_windows + 4)
        cluster.wait_until(lambda states: states["vela-004"] == ("idle", ""), "vela-004 back in service")

    audit = [(row.action, row.outcome) for row in commands.actions(store)]
    assert audit == [
        ("drain", "pending"),
        ("approve", "requested"),
        ("approve", "approved"),
        ("drain", "done"),
        ("undrain", "done"),
    ]

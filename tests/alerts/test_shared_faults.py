"""Drains follow the shared-fault diagnosis, end to end: simulated VMs whose ports really flap, the real
link and GPU detectors in the hub's DetectionLoop with shared-fault localization, a chDB store holding
the topology, and the alert service with its drain controller in auto mode (a recording backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from alerts.drain import DrainController
from alerts.engine import AlertEngine
from alerts.policy import DRAINING_ACTIONS, DrainLimits, DrainPolicy, DrainRule
from alerts.service import AlertService
from analytics.detectors.gpu_fault import GpuFault
from analytics.detectors.links import LinkFlap
from analytics.detectors.runner import DetectionRunner
from analytics.detectors.shared_faults import SharedFaults
from analytics.store import Store
from analytics.store.topology import TopologyReads
from analytics.topology.model import Entity, Kind, Link, Source
from hub.detect import DetectionLoop
from tests.alerts.test_drain import RecordingBackend
from tests.support.fleetdata import SimulatedFleet

pytestmark = pytest.mark.integration
NODES = 16  # vela-001..008 under leaf-00, vela-009..016 under leaf-01; two VMs a host
LEAF_00 = [f"vela-{i:03d}" for i in range(1, 9)]
LOST_GPU = "vela-012"  # under leaf-01


def inventory(nodes: int = NODES) -> list[Link]:
    """Two VMs per host, eight per leaf."""
    links = []
    for index in range(nodes):
        host = Entity(Kind.HOST, f"host-{index // 2:03d}")
        links.append(Link(Entity(Kind.NODE, f"vela-{index + 1:03d}"), host))
        if index % 2 == 0:
            links.append(Link(host, Entity(Kind.LEAF, f"leaf-{index // 8:02d}")))
    return links


class Hub:
    """The hub's detection and alerting on `store`, one cycle per tick of `fleet`."""

    def __init__(self, store: Store, fleet: SimulatedFleet, **policy: object) -> None:
        self.backend = RecordingBackend()
        rules = (
            DrainRule(("gpu_fault",), min_severity="critical", actions=DRAINING_ACTIONS),
            DrainRule(("link_flap",), after_s=30),  # the operator of the issue: drains on flaps too
        )
        limits = DrainLimits(max_nodes=10, max_fraction=0.75, max_per_job=10, max_per_hour=10)
        controller = DrainController(
            DrainPolicy(mode="auto", rules=rules, limits=limits, **policy),  # type: ignore[arg-type]
            [self.backend],
            fleet_size=NODES,
            parents=TopologyReads(store).parents,
        )
        self.service = AlertService(store, AlertEngine(), [], controller)
        runner = DetectionRunner([LinkFlap(), GpuFault()], shared_faults=SharedFaults())
        self.loop = DetectionLoop(runner, store, window_s=10, lag_s=11, alerting=self.service)
        self.fleet = fleet
        self.store = store

    def tick(self, count: int = 1) -> None:
        for _ in range(count):
            self.loop.cycle(self.fleet.tick())
        assert self.loop.failures == self.loop.alerting_failures == 0

    def flap(self, nodes: list[str]) -> None:
        """One flap of each node's port: down for a scrape, then up again."""
        for node in nodes:
            self.fleet[node].sysfs.set_link(0, up=False)
        self.tick()
        for node in nodes:
            self.fleet[node].sysfs.set_link(0, up=True)
        self.tick()

    def drained(self) -> list[str]:
        return sorted(node for verb, node, _ in self.backend.calls if verb == "drain")

    def refusals(self, node: str) -> list[str]:
        rows = self.store.query(
            "SELECT reason FROM actions WHERE node = {node:String} AND outcome = 'refused' ORDER BY ts",
            parameters={"node": node},
        ).rows
        return [reason for (reason,) in rows]


@pytest.fixture
def fleet(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path, nodes=NODES, gpus=1, nics=1) as simulated:
        store.replace_links(Source.INVENTORY, inventory(), simulated.clock())
        yield simulated


def test_a_flapping_leaf_is_one_shared_fault_its_nodes_stay_and_a_lost_gpu_elsewhere_drains(store, fleet):
    hub = Hub(store, fleet)
    hub.tick(2)
    fleet[LOST_GPU].gpus.set_fault(0, "gpu_lost")
    hub.flap(LEAF_00)
    hub.flap(LEAF_00)
    hub.tick(4)  # past the link_flap rule's 30 s

    [(fault_id, node, component)] = store.query(
        "SELECT id, node, component FROM anomalies FINAL WHERE kind = 'shared_fault'"
    ).rows
    assert (node, component) == ("leaf-00", "leaf")
    flaps = store.query(
        "SELECT node, explained_by FROM anomalies FINAL WHERE kind = 'link_flap' ORDER BY node"
    ).rows
    assert flaps == [(node, fault_id) for node in LEAF_00]
    assert hub.drained() == [LOST_GPU]
    assert all("held: its link_flap is explained by shared fault" in hub.refusals(n)[-1] for n in LEAF_00)
    shared = [alert for alert in hub.service.engine.firing if alert.alertname == "FleetlensSharedFault"]
    assert [alert.labels for alert in shared] == [
        {
            "alertname": "FleetlensSharedFault",
            "kind": "shared_fault",
            "severity": "warning",
            "layer": "leaf",
            "parent": "leaf-00",
        }
    ]
    assert (
        shared[0].annotations["summary"].startswith("shared fault of leaf leaf-00: leaf-00: link flaps on 8")
    )
    flap_alerts = [a for a in hub.service.engine.firing if a.alertname == "FleetlensLinkFlap"]
    assert {a.annotations["explained_by"] for a in flap_alerts} == {fault_id}


def test_a_lone_flapping_node_under_a_healthy_leaf_drains_as_before(store, fleet):
    hub = Hub(store, fleet)
    hub.tick(2)
    hub.flap(["vela-003"])
    hub.flap(["vela-003"])
    hub.tick(4)

    assert store.query("SELECT count() FROM anomalies FINAL WHERE kind = 'shared_fault'").rows == [(0,)]
    assert hub.drained() == ["vela-003"]


def test_a_second_node_of_one_leaf_within_the_hour_is_refused_with_the_reason(store, fleet):
    hub = Hub(store, fleet)
    hub.tick(2)
    hub.flap(["vela-001", "vela-009"])  # under two leaves, so no shared fault; then one more of leaf-00
    hub.flap(["vela-001", "vela-009"])
    hub.tick(4)
    hub.flap(["vela-003"])
    hub.flap(["vela-003"])
    hub.tick(4)

    assert hub.drained() == ["vela-001", "vela-009"]
    assert hub.refusals("vela-003")[-1] == (
        "limit: at most 1 drains per hour under one parent; leaf leaf-00 had vela-001"
    )


def test_when_the_hold_ends_and_the_shared_fault_lasts_one_node_of_the_leaf_drains_an_hour(store, fleet):
    hub = Hub(store, fleet, hold_explained_s=30)
    hub.tick(2)
    for _ in range(5):  # the leaf flaps on, past the hold
        hub.flap(LEAF_00)

    assert store.query("SELECT count() FROM anomalies FINAL WHERE kind = 'shared_fault'").rows == [(1,)]
    [drained] = hub.drained()
    assert drained in LEAF_00
    others = [node for node in LEAF_00 if node != drained]
    assert all(
        hub.refusals(n)[-1].startswith("limit: at most 1 drains per hour under one parent") for n in others
    )


def test_the_last_flaps_of_a_recovering_leaf_stay_its_own_and_drain_nothing(store, fleet):
    hub = Hub(store, fleet)
    hub.tick(2)
    hub.flap(LEAF_00)
    hub.flap(LEAF_00)
    for _ in range(10):  # the leaf recovers but for two ports: 2 of 8 is no shared fault any more
        hub.flap(LEAF_00[:2])

    [(fault_id, end)] = store.query("SELECT id, end FROM anomalies FINAL WHERE kind = 'shared_fault'").rows
    assert end is not None
    open_flaps = "SELECT node, explained_by FROM anomalies FINAL WHERE kind = 'link_flap' AND end IS NULL"
    still = store.query(f"{open_flaps} ORDER BY node").rows
    assert still == [(node, fault_id) for node in LEAF_00[:2]]
    assert hub.drained() == []

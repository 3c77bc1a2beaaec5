"""A scenario's topology: names laid out in node order, the links a real fleet's importers would report,
and faults of a shared layer kept as one truth and played as the per-node faults they cause."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics.topology.model import Entity, Kind, Link
from sim.errors import ScenarioError
from sim.scenario import SPINE_SHARE, LayerFault, Scenario, load_scenario
from sim.topology import Topology
from tests.conftest import REPO

# 8 VMs, 2 per host: host-000 holds vela-001 and vela-002, ... host-003 vela-007 and vela-008; two hosts
# per leaf (leaf-00: host-000, host-001), one leaf per spine, three hosts per rack (rack-01: host-003)
SMALL = """\
duration_s: 600
fleet: {nodes: 8, gpus_per_node: 2, nics_per_node: 2}
jobs: []
topology: {vms_per_host: 2, hosts_per_leaf: 2, leaves_per_spine: 1, hosts_per_rack: 3}
"""


def write(tmp_path: Path, text: str, name: str = "fabric.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def with_faults(tmp_path: Path, *faults: str) -> Scenario:
    return load_scenario(write(tmp_path, SMALL + "faults:\n" + "".join(f"  - {f}\n" for f in faults)))


def only(scenario: Scenario) -> LayerFault:
    (fault,) = scenario.layer_faults
    return fault


def touched(fault: LayerFault) -> set[tuple[str, int | None, int | None]]:
    return {(effect.node, effect.nic, effect.gpu) for effect in fault.effects}


def test_names_follow_node_order(tmp_path: Path) -> None:
    topology = load_scenario(write(tmp_path, SMALL)).topology
    assert topology is not None
    parents = {
        node: tuple(topology.parent(node, layer) for layer in (Kind.HOST, Kind.LEAF, Kind.SPINE, Kind.RACK))
        for node in ("vela-001", "vela-004", "vela-005", "vela-008")
    }
    assert parents == {
        "vela-001": ("host-000", "leaf-00", "spine-0", "rack-00"),
        "vela-004": ("host-001", "leaf-00", "spine-0", "rack-00"),
        "vela-005": ("host-002", "leaf-01", "spine-1", "rack-00"),
        "vela-008": ("host-003", "leaf-01", "spine-1", "rack-01"),
    }
    assert topology.names(Kind.RAIL) == ("rail-0", "rail-1")
    assert topology.names(Kind.RACK) == ("rack-00", "rack-01")


def test_topology_links_are_every_child_parent_pair_once(tmp_path: Path) -> None:
    links = set(load_scenario(write(tmp_path, SMALL)).topology_links())

    def link(child: tuple[Kind, str], parent: tuple[Kind, str]) -> Link:
        return Link(Entity(*child), Entity(*parent))

    assert {link.parent for link in links if link.child == Entity(Kind.NODE, "vela-003")} == {
        Entity(Kind.HOST, "host-001")
    }
    # NIC j of each node, named as sim.sysfs names its RDMA device, is on rail j
    assert {link.parent for link in links if link.child == Entity(Kind.VF, "vela-003/mlx5_1")} == {
        Entity(Kind.NODE, "vela-003"),
        Entity(Kind.RAIL, "rail-1"),
    }
    assert link((Kind.HOST, "host-003"), (Kind.LEAF, "leaf-01")) in links
    assert link((Kind.HOST, "host-003"), (Kind.RACK, "rack-01")) in links
    assert link((Kind.LEAF, "leaf-01"), (Kind.SPINE, "spine-1")) in links
    # 8 node->host, 16 NIC->node, 16 NIC->rail, 4 host->leaf, 4 host->rack, 2 leaf->spine
    assert len(links) == len(load_scenario(write(tmp_path, SMALL)).topology_links()) == 50


def test_a_scenario_without_topology_has_no_links(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, SMALL.replace("topology:", "# topology:")))
    assert scenario.topology is None and scenario.topology_links() == []


def test_defaults_give_one_vm_per_host_and_a_rail_per_nic(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, SMALL.replace("{vms_per_host: 2, ", "{")))
    assert scenario.topology == Topology(
        nodes=tuple(scenario.fleet.names), hosts_per_leaf=2, leaves_per_spine=1, rails=2, hosts_per_rack=3
    )
    assert scenario.topology.parent("vela-008", Kind.HOST) == "host-007"


@given(
    nodes=st.integers(1, 40),
    vms=st.integers(1, 5),
    hosts=st.integers(1, 5),
    leaves=st.integers(1, 4),
    rack=st.integers(1, 6),
)
def test_every_node_sits_under_exactly_one_parent_per_layer(
    nodes: int, vms: int, hosts: int, leaves: int, rack: int
) -> None:
    names = tuple(f"vela-{i + 1:03d}" for i in range(nodes))
    topology = Topology(names, vms, hosts, leaves, 4, rack)
    for layer in (Kind.HOST, Kind.LEAF, Kind.SPINE, Kind.RACK):
        below = [node for parent in topology.names(layer) for node in topology.nodes_under(layer, parent)]
        assert below == list(names), layer  # a partition, in node order
    assert all(len(topology.nodes_under(Kind.HOST, host)) <= vms for host in topology.names(Kind.HOST))


def test_leaf_degraded_touches_every_nic_of_the_vms_of_its_hosts(tmp_path: Path) -> None:
    fault = only(with_faults(tmp_path, "{kind: leaf_degraded, leaf: leaf-01, start_s: 100}"))
    assert (fault.layer, fault.parent, fault.nodes) == (
        Kind.LEAF,
        "leaf-01",
        ("vela-005", "vela-006", "vela-007", "vela-008"),
    )
    assert touched(fault) == {(node, nic, None) for node in fault.nodes for nic in (0, 1)}
    assert {effect.kind for effect in fault.effects} == {"link_flap"}
    assert fault.end_s == 190  # three flaps of 30 s, as a link_flap's end


@pytest.mark.parametrize(("mode", "kind"), [("errors", "port_errors"), ("congestion", "congestion")])
def test_leaf_modes_play_as_their_per_node_effect(tmp_path: Path, mode: str, kind: str) -> None:
    text = f"{{kind: leaf_degraded, leaf: leaf-00, mode: {mode}, level: 0.5, start_s: 100, end_s: 200}}"
    fault = only(with_faults(tmp_path, text))
    assert {(effect.kind, effect.params["level"], effect.end_s) for effect in fault.effects} == {
        (kind, 0.5, 200)
    }
    assert {effect.node for effect in fault.effects} == {"vela-001", "vela-002", "vela-003", "vela-004"}


def test_spine_degraded_congests_every_leaf_below_it_more_mildly(tmp_path: Path) -> None:
    fault = only(with_faults(tmp_path, "{kind: spine_degraded, spine: spine-0, start_s: 100, level: 0.8}"))
    assert touched(fault) == {(f"vela-00{i}", nic, None) for i in range(1, 5) for nic in (0, 1)}
    assert {(e.kind, e.params["level"]) for e in fault.effects} == {("congestion", 0.8 * SPINE_SHARE)}


def test_rail_congestion_congests_that_nic_of_every_node(tmp_path: Path) -> None:
    fault = only(with_faults(tmp_path, "{kind: rail_congestion, rail: rail-1, start_s: 100}"))
    assert fault.nodes == tuple(f"vela-00{i}" for i in range(1, 9))
    assert touched(fault) == {(node, 1, None) for node in fault.nodes}


def test_host_pcie_degraded_loses_gdr_on_its_vms_or_trains_their_gpus_down(tmp_path: Path) -> None:
    fault = only(with_faults(tmp_path, "{kind: host_pcie_degraded, host: host-002, start_s: 100}"))
    assert touched(fault) == {(node, nic, None) for node in ("vela-005", "vela-006") for nic in (0, 1)}
    assert {(e.kind, e.params["mode"], e.component) for e in fault.effects if e.node == "vela-005"} == {
        ("dma_degraded", "no_gdr", "mlx5_0:1"),
        ("dma_degraded", "no_gdr", "mlx5_1:1"),
    }
    text = "{kind: host_pcie_degraded, host: host-002, start_s: 100, mode: pcie_downgrade}"
    downgraded = only(with_faults(tmp_path, text))
    assert touched(downgraded) == {(node, None, gpu) for node in ("vela-005", "vela-006") for gpu in (0, 1)}


def test_rack_power_brakes_every_gpu_in_the_rack(tmp_path: Path) -> None:
    fault = only(with_faults(tmp_path, "{kind: rack_power, rack: rack-01, start_s: 100, end_s: 300}"))
    assert [(e.kind, e.node, e.gpu) for e in fault.effects] == [
        ("power_brake", "vela-007", None),  # gpu None: every GPU of the node
        ("power_brake", "vela-008", None),
    ]


def test_layer_faults_are_one_truth_and_play_beside_node_faults(tmp_path: Path) -> None:
    scenario = with_faults(
        tmp_path,
        "{kind: slow_node, node: vela-001, start_s: 100}",
        "{kind: rack_power, rack: rack-01, start_s: 100}",
    )
    assert [fault.kind for fault in scenario.faults] == ["slow_node"]
    assert [fault.kind for fault in scenario.layer_faults] == ["rack_power"]
    assert [(f.kind, f.node) for f in scenario.played_faults] == [
        ("slow_node", "vela-001"),
        ("power_brake", "vela-007"),
        ("power_brake", "vela-008"),
    ]
    assert scenario.until(50).layer_faults == () and scenario.until(150).layer_faults == scenario.layer_faults


@pytest.mark.parametrize(
    ("fault", "key", "words"),
    [
        (
            "{kind: leaf_degraded, leaf: leaf-09, start_s: 100}",
            "faults[0].leaf",
            "'leaf-09' is not one of leaf-00, leaf-01",
        ),
        (
            "{kind: rail_congestion, rail: rail-2, start_s: 100}",
            "faults[0].rail",
            "not one of rail-0, rail-1",
        ),
        ("{kind: rack_power, start_s: 100}", "faults[0].rack", "missing"),
        ("{kind: rack_power, leaf: leaf-00, start_s: 100}", "faults[0]", "unknown key(s) leaf"),
        (
            "{kind: leaf_degraded, leaf: leaf-00, mode: loud, start_s: 100}",
            "faults[0].mode",
            "'loud' is not one of",
        ),
        ("{kind: leaf_degraded, leaf: leaf-00, level: 2, start_s: 100}", "faults[0].level", "mode flaps"),
        (
            "{kind: leaf_degraded, leaf: leaf-00, mode: errors, flaps: 2, start_s: 100}",
            "faults[0].flaps",
            "mode errors",
        ),
        ("{kind: spine_degraded, spine: spine-0, level: -1, start_s: 100}", "faults[0].level", "outside 0.."),
        ("{kind: host_pcie_degraded, host: host-004, start_s: 100}", "faults[0].host", "not one of host-000"),
    ],
)
def test_a_bad_layer_fault_names_the_file_and_the_key(
    tmp_path: Path, fault: str, key: str, words: str
) -> None:
    with pytest.raises(ScenarioError, match=r"fabric\.yaml") as raised:
        with_faults(tmp_path, fault)
    assert f": {key}: " in str(raised.value) and words in str(raised.value)


def test_a_layer_fault_without_a_topology_section_is_refused(tmp_path: Path) -> None:
    text = (
        SMALL.replace("topology:", "# topology:")
        + "faults:\n  - {kind: leaf_degraded, leaf: leaf-00, start_s: 9}\n"
    )
    with pytest.raises(
        ScenarioError, match=r"fabric.yaml: faults\[0\].leaf: a leaf_degraded fault needs a topology"
    ):
        load_scenario(write(tmp_path, text))


@pytest.mark.parametrize(
    ("section", "key", "words"),
    [
        ("{vms_per_host: 0}", "topology.vms_per_host", "outside 1.."),
        ("{rails: 3}", "topology.rails", "nodes have 2"),
        ("{hosts_per_pod: 2}", "topology", "unknown key(s) hosts_per_pod"),
        ("[2, 2]", "topology", "want a mapping"),
    ],
)
def test_a_bad_topology_section_names_the_key(tmp_path: Path, section: str, key: str, words: str) -> None:
    text = SMALL.replace(
        "{vms_per_host: 2, hosts_per_leaf: 2, leaves_per_spine: 1, hosts_per_rack: 3}", section
    )
    with pytest.raises(ScenarioError, match=r"fabric\.yaml") as raised:
        load_scenario(write(tmp_path, text))
    assert f": {key}: " in str(raised.value) and words in str(raised.value)


def test_the_example_scenario_faults_one_leaf_beside_a_node_fault() -> None:
    scenario = load_scenario(REPO / "tests" / "scenarios" / "topology" / "leaf-flaps-16.yaml")
    fault = only(scenario)
    assert (fault.kind, fault.parent) == ("leaf_degraded", "leaf-02")
    assert fault.nodes == ("vela-009", "vela-010", "vela-011", "vela-012")
    assert {fault.node for fault in scenario.faults}.isdisjoint(fault.nodes)

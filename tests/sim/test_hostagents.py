"""The simulated fleet tells its topology as a real one does: each host's agent report and the operator's
inventory, read by the hub's own importers, place every node exactly where the scenario's layout does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analytics.store import Store
from analytics.topology import inventory
from analytics.topology.importers import host_agent, libvirt, lldp, parser_of
from analytics.topology.model import Edge, Entity, Kind, Link, Source
from analytics.topology.view import NodeView, in_force, node_views
from sim.errors import SimulationError
from sim.hostagents import MAX_VFS_PER_PF, operator_inventory, topology_reports
from sim.offline import store_topology
from sim.online import simulate_online
from sim.scenario import Scenario, parse_scenario
from sim.topology import Topology
from tests.sim.test_offline_online import EPOCH, open_store


def fleet(nodes: int, nics: int = 2, gpus: int = 2, **fan_out: int) -> Scenario:
    return parse_scenario(
        {
            "duration_s": 60,
            "fleet": {"nodes": nodes, "gpus_per_node": gpus, "nics_per_node": nics},
            "topology": fan_out,
            "jobs": [],
        },
        "fan-out",
    )


def layout_views(topology: Topology) -> list[NodeView]:
    """Each node's view as the scenario lays it out (what `fleetlens topology show --json` should say)."""
    rails = list(topology.names(Kind.RAIL))
    single = (Kind.HOST, Kind.LEAF, Kind.SPINE, Kind.RACK)
    return [
        {"node": node, **{str(kind): topology.parent(node, kind) for kind in single}, "rail": rails}
        for node in sorted(topology.nodes)
    ]


def imported_edges(scenario: Scenario) -> list[Edge]:
    """The reports as a hub imports them: each through its format's importer, under its format's source."""
    edges = []
    for report in topology_reports(scenario):
        parse, source = parser_of(report.format)
        edges += [Edge(link, source, EPOCH) for link in parse(report.text, report.file)]
    return edges


@settings(max_examples=40, deadline=None)
@given(
    nodes=st.integers(1, 24),
    nics=st.integers(1, 4),
    vms_per_host=st.integers(1, 4),
    hosts_per_leaf=st.integers(1, 5),
    leaves_per_spine=st.integers(1, 3),
    hosts_per_rack=st.integers(1, 5),
)
def test_the_reports_place_every_node_where_the_layout_does(
    nodes: int, nics: int, vms_per_host: int, hosts_per_leaf: int, leaves_per_spine: int, hosts_per_rack: int
) -> None:
    scenario = fleet(
        nodes,
        nics,
        vms_per_host=vms_per_host,
        hosts_per_leaf=hosts_per_leaf,
        leaves_per_spine=leaves_per_spine,
        hosts_per_rack=hosts_per_rack,
    )
    assert scenario.topology is not None
    assert node_views(in_force(imported_edges(scenario), EPOCH + 1)) == layout_views(scenario.topology)


def test_the_agents_say_host_and_leaf_and_the_operator_only_what_no_agent_sees() -> None:
    scenario = fleet(8, vms_per_host=2, hosts_per_leaf=2, leaves_per_spine=1, hosts_per_rack=1)
    assert scenario.topology is not None
    said = {(edge.link, edge.source) for edge in imported_edges(scenario)}
    by_inventory = {link for link, source in said if source is Source.INVENTORY}
    everything = set(inventory.parse(scenario.topology.inventory(), "layout"))
    agents_say = {
        link
        for link in everything
        if (link.child.kind, link.parent.kind) in {(Kind.NODE, Kind.HOST), (Kind.HOST, Kind.LEAF)}
    }
    assert agents_say and by_inventory == everything - agents_say  # the rest passes through unchanged
    vm_on_host = Link(Entity(Kind.NODE, "vela-003"), Entity(Kind.HOST, "host-001"))
    assert (vm_on_host, Source.HOST_AGENT) in said
    pf_leaves = {link.parent.name for link, _ in said if link.child.name.startswith("host-001/")}
    assert "leaf-00" in pf_leaves


def test_each_report_holds_a_pf_per_nic_a_vf_per_vm_and_a_domain_per_vm_with_its_gpus() -> None:
    scenario = fleet(3, nics=4, gpus=8, vms_per_host=2)
    agents = [report for report in topology_reports(scenario) if report.reporter]
    assert [report.reporter for report in agents] == ["host-000", "host-001"]
    first = json.loads(agents[0].text)
    assert [pf["name"] for pf in first["pfs"]] == ["enp16s0np0", "enp17s0np0", "enp18s0np0", "enp19s0np0"]
    assert all(len(pf["vfs"]) == 2 for pf in first["pfs"])
    domains = [libvirt.read_domain(domain["xml"], "dumpxml") for domain in first["domains"]]
    assert [domain.name for domain in domains] == ["vela-001", "vela-002"]
    assert len({domain.uuid for domain in domains}) == 2 and all(domain.uuid for domain in domains)
    assert [len(domain.network) for domain in domains] == [4, 4] and [len(d.other) for d in domains] == [8, 8]
    every_address = [a for d in domains for a in (*d.network, *d.other)]
    assert len(set(every_address)) == len(every_address) == 24  # no device passed to two VMs
    neighbors = lldp.neighbors(first["lldp"], "lldpcli")
    assert {neighbor.chassis for neighbor in neighbors} == {"leaf-00"}
    second = lldp.neighbors(json.loads(agents[1].text)["lldp"], "lldpcli")
    ports = [neighbor.port for neighbor in (*neighbors, *second)]
    assert len(set(ports)) == len(ports)  # each PF on its own port of the leaf
    assert host_agent.parse(agents[1].text, "host-001")  # a lone VM on the last host


def test_the_operator_part_keeps_what_the_layout_gains() -> None:
    topology = fleet(2).topology
    assert topology is not None
    layout = json.loads(topology.inventory())
    layout["nodes"]["vela-001"]["rack"] = "rack-09"  # a key inventory() might write some day
    kept = json.loads(operator_inventory(json.dumps(layout)))
    nics = {"mlx5_0": {"rail": "rail-0"}, "mlx5_1": {"rail": "rail-1"}}
    assert kept["nodes"]["vela-001"] == {"nics": nics, "rack": "rack-09"}
    assert kept["hosts"]["host-000"] == {"rack": "rack-00"}


def test_more_vms_on_a_host_than_a_pf_has_vfs_is_refused() -> None:
    with pytest.raises(SimulationError, match="vms_per_host"):
        topology_reports(fleet(1, vms_per_host=MAX_VFS_PER_PF + 1))


def test_an_offline_run_stores_each_host_agents_report_under_its_host(store: Store) -> None:
    scenario = fleet(6, vms_per_host=2, hosts_per_leaf=2, leaves_per_spine=1, hosts_per_rack=2)
    assert scenario.topology is not None
    store_topology(scenario, store, EPOCH)
    assert node_views(store.topology_at(EPOCH + 1)) == layout_views(scenario.topology)
    reporters = store.query(
        "SELECT source, groupUniqArray(reporter) FROM topology GROUP BY source ORDER BY source"
    ).rows
    assert [(source, sorted(names)) for source, names in reporters] == [
        ("host_agent", ["host-000", "host-001", "host-002"]),
        ("inventory", [""]),
    ]


def test_an_online_run_posts_the_same_topology_an_offline_run_stores(
    store: Store, chdb_dir: Path, tmp_path: Path
) -> None:
    scenario = fleet(3, vms_per_host=2, hosts_per_leaf=1, leaves_per_spine=2)
    simulate_online(scenario, store, tmp_path, speed=0, epoch=EPOCH)
    rows = "SELECT * EXCEPT (valid_from, valid_to) FROM topology ORDER BY ALL"
    with open_store(chdb_dir) as offline:
        store_topology(scenario, offline, EPOCH)
        assert store.query(rows).rows == offline.query(rows).rows != []
    assert scenario.topology is not None
    assert node_views(store.topology_at(EPOCH + 1)) == layout_views(scenario.topology)


def test_a_node_name_with_xml_markup_reaches_the_hub_as_written() -> None:
    scenario = parse_scenario(
        {"duration_s": 60, "fleet": {"nodes": 1, "prefix": "r&d<"}, "topology": {}, "jobs": []}, "markup"
    )
    assert node_views(in_force(imported_edges(scenario), EPOCH + 1))[0]["node"] == "r&d<001"

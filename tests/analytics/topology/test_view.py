"""A node's view from the edges of every source: the walk up through the devices it holds, source
precedence, and the groups the localization reads."""

from __future__ import annotations

import re

import pytest

from analytics.errors import TopologyError
from analytics.topology.checks import check_links
from analytics.topology.model import Edge, Entity, Kind, Link, Source
from analytics.topology.view import in_force, members, node_views, unit_node


def link(child: str, parent: str) -> Link:
    (ck, cn), (pk, pn) = child.split(":", 1), parent.split(":", 1)
    return Link(Entity(Kind(ck), cn), Entity(Kind(pk), pn))


def edges(
    source: Source, *pairs: tuple[str, str], since: float = 0.0, until: float | None = None
) -> list[Edge]:
    return [Edge(link(child, parent), source, since, until) for child, parent in pairs]


# A host agent's view of a rail-optimized host: each VF of the VM on a PF of its own, each PF on a leaf and
# a rail of its own.
AGENT = edges(
    Source.HOST_AGENT,
    ("node:vela-001", "host:host-000"),
    ("vf:0000:3b:00.2", "node:vela-001"),
    ("vf:0000:3b:00.2", "pf:0000:3b:00.0"),
    ("vf:0000:5e:00.2", "node:vela-001"),
    ("vf:0000:5e:00.2", "pf:0000:5e:00.0"),
    ("pf:0000:3b:00.0", "leaf:leaf-00"),
    ("pf:0000:3b:00.0", "rail:rail-0"),
    ("pf:0000:5e:00.0", "leaf:leaf-01"),
    ("pf:0000:5e:00.0", "rail:rail-1"),
    ("leaf:leaf-00", "spine:spine-0"),
    ("leaf:leaf-01", "spine:spine-0"),
    ("host:host-000", "rack:rack-00"),
)


def test_a_vm_reaches_its_leaves_rails_and_spine_through_the_vfs_it_holds() -> None:
    assert node_views(AGENT) == [
        {"node": "vela-001", "host": "host-000", "leaf": "leaf-00", "spine": "spine-0", "rack": "rack-00",
         "rail": ["rail-0", "rail-1"]}
    ]  # fmt: skip
    groups = members(AGENT)
    assert groups[Kind.LEAF] == {"leaf-00": {"vela-001"}, "leaf-01": {"vela-001"}}
    # a PF's and a rail's children are the node's NICs below them, not the node
    assert groups[Kind.PF] == {
        "0000:3b:00.0": {"vela-001/0000:3b:00.2"},
        "0000:5e:00.0": {"vela-001/0000:5e:00.2"},
    }
    assert groups[Kind.RAIL] == {"rail-0": {"vela-001/0000:3b:00.2"}, "rail-1": {"vela-001/0000:5e:00.2"}}
    assert groups[Kind.HOST] == {"host-000": {"vela-001"}}


def test_a_node_on_a_rail_with_no_nic_named_is_the_whole_node_there() -> None:
    said = edges(
        Source.INVENTORY,
        ("node:vela-001", "rail:rail-0"),
        ("node:vela-002", "host:host-000"),
        ("host:host-000", "rail:rail-0"),
        ("vf:vela-003/mlx5_0", "node:vela-003"),
        ("vf:vela-003/mlx5_0", "rail:rail-0"),
        ("vf:vela-003/mlx5_1", "node:vela-003"),
    )
    assert members(said)[Kind.RAIL] == {"rail-0": {"vela-001/", "vela-002/", "vela-003/mlx5_0"}}
    assert {unit_node(unit) for unit in members(said)[Kind.RAIL]["rail-0"]} == {
        "vela-001",
        "vela-002",
        "vela-003",
    }


def test_a_pf_above_the_whole_node_counts_nothing_and_leaves_the_fault_to_the_host() -> None:
    """As libvirt reports it, the VM sits under the host's VF (its fault reaches the VM), and no guest NIC
    is joined to that VF: the PF is above the node whole, so it would hold what its host holds."""
    said = edges(
        Source.HOST_AGENT,
        *[(f"node:vela-00{i}", "host:host-000") for i in (1, 2)],
        *[(f"node:vela-00{i}", f"vf:host-000/0000:10:00.{i}") for i in (1, 2)],
        *[(f"vf:host-000/0000:10:00.{i}", "pf:host-000/enp16s0np0") for i in (1, 2)],
        ("pf:host-000/enp16s0np0", "leaf:leaf-00"),
    )
    assert [view["leaf"] for view in node_views(said)] == ["leaf-00", "leaf-00"]
    groups = members(said)
    assert groups[Kind.PF] == {}
    assert groups[Kind.HOST] == {"host-000": {"vela-001", "vela-002"}}


def test_the_higher_source_wins_for_a_child_and_layer_and_only_while_its_edge_holds() -> None:
    said = [
        *edges(Source.GUEST, ("node:vela-001", "host:host-009")),
        *edges(Source.HOST_AGENT, ("node:vela-001", "host:host-000")),
        *edges(Source.INVENTORY, ("node:vela-001", "host:host-001"), since=100.0, until=200.0),
        *edges(Source.SLURM, ("node:vela-001", "leaf:leaf-03")),
    ]
    hosts = {
        ts: [e.link.parent.name for e in in_force(said, ts) if e.link.parent.kind is Kind.HOST]
        for ts in (50, 150, 250)
    }
    assert hosts == {50: ["host-000"], 150: ["host-001"], 250: ["host-000"]}
    assert [e.source for e in in_force(said, 150) if e.link.parent.kind is Kind.LEAF] == [Source.SLURM]


def test_a_loop_between_sources_ends_the_walk() -> None:
    looped = [*AGENT, *edges(Source.SLURM, ("spine:spine-0", "leaf:leaf-00"))]
    assert node_views(looped)[0]["spine"] == "spine-0"


def test_links_that_loop_are_refused_naming_the_loop() -> None:
    loop = re.escape("lldp.json: links: a loop: leaf:a -> spine:b -> leaf:a")
    with pytest.raises(TopologyError, match=loop):
        check_links(
            [link("leaf:a", "spine:b"), link("spine:b", "leaf:a"), link("node:n", "leaf:a")], "lldp.json"
        )

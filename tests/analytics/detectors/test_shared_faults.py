"""The topology the shared-fault localization reads each window, from a real store: the nodes that sent
nothing in the window (dead, removed) count in no parent, and a node's NICs sit on their rails."""

from __future__ import annotations

from analytics.detectors.shared_faults import SharedFaults
from analytics.store import Store
from analytics.store.records import TargetStatus
from analytics.topology.model import Entity, Kind, Link, Source
from tests.analytics.detectors import T0, records, window

LEAF = [f"vela-{at:03d}" for at in range(1, 9)]


def scrape(node: str, ts: float, up: bool = True) -> TargetStatus:
    return TargetStatus(ts, f"{node}:9100", node, up, 0.05, 0 if not up else 900)


def test_a_leaf_of_8_with_4_dead_vms_has_its_4_active_ones_and_each_nic_its_rail(store: Store) -> None:
    """vela-001..003 scrape in window 3, vela-004 only reports a step there, vela-005's scrape fails and
    vela-006..008 send nothing."""
    links = [Link(Entity(Kind.NODE, node), Entity(Kind.LEAF, "leaf-00")) for node in LEAF]
    for node in LEAF:
        nic = Entity(Kind.VF, f"{node}/mlx5_0")
        links += [Link(nic, Entity(Kind.NODE, node)), Link(nic, Entity(Kind.RAIL, "rail-0"))]
    store.replace_links(Source.INVENTORY, links, T0)
    shared = SharedFaults()
    quiet = shared.topology(store, window(3))  # nothing stored for the window: every node counts
    assert quiet.children[("leaf", "leaf-00")] == frozenset(LEAF)

    scrapes = [scrape(node, window(3).start + 1) for node in LEAF[:3]]
    store.insert_targets([*scrapes, scrape(LEAF[4], window(3).start + 1, up=False)], token="scrapes")
    store.insert_steps(
        records(window(3).start, [(500, (LEAF[3], "llm", 0, 0, 1, 1, 0.9, 1.0))]), token="steps"
    )
    topology = shared.topology(store, window(3))
    assert topology.children[("leaf", "leaf-00")] == frozenset(LEAF[:4])
    assert topology.children[("rail", "rail-0")] == frozenset(f"{node}/mlx5_0" for node in LEAF[:4])
    assert topology.fleet == frozenset(LEAF[:4])
    assert shared.topology(store, window(4)).children[("leaf", "leaf-00")] == frozenset(LEAF)

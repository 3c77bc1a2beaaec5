"""A Membership built once per topology gives, for any active nodes, the same Topology as building it
from the layers with those nodes (the shared-fault detector's window, analytics.detectors.shared_faults):
checked against a plain restatement of Topology.of's contract, on random layers and active subsets."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from analytics.topology.localize import Membership, NodeAnomaly, SharedFaultLocalizer, Topology
from analytics.topology.view import NIC_LAYERS, unit_node

NODES = [f"vm-{at}" for at in range(10)]
LAYER_NAMES = ("pf", "host", "leaf", "rack", "spine", "rail")


def reference(layers: Mapping[str, Mapping[str, Iterable[str]]], active: Collection[str] | None) -> Topology:
    """Topology.of's contract, stated directly: each parent's units whose node is active, parents left
    with none left out, the fleet and each granularity's units the union of what is kept."""
    children, nodes = {}, {}
    for layer, parents in layers.items():
        node_of = unit_node if layer in NIC_LAYERS else str
        for parent, units in parents.items():
            kept = {unit: node_of(unit) for unit in units if active is None or node_of(unit) in active}
            if kept:
                children[(layer, parent)] = frozenset(kept)
                nodes[(layer, parent)] = frozenset(kept.values())
    units = {
        nic: frozenset(u for (layer, _), c in children.items() if (layer in NIC_LAYERS) is nic for u in c)
        for nic in (False, True)
    }
    return Topology(children, nodes, frozenset(n for held in nodes.values() for n in held), units)


@st.composite
def unit_lists(draw: st.DrawFn, nic: bool) -> list[str]:
    """A parent's units, maybe none or repeated: nodes, or in a NIC layer "<node>/<device>", "<node>/"."""
    nodes = draw(st.lists(st.sampled_from(NODES), max_size=8))
    if not nic:
        return nodes
    return [f"{node}/{draw(st.sampled_from(('', 'mlx5_0', 'mlx5_1')))}" for node in nodes]


@st.composite
def layer_maps(draw: st.DrawFn) -> dict[str, dict[str, list[str]]]:
    names = draw(st.lists(st.sampled_from(LAYER_NAMES), unique=True, max_size=len(LAYER_NAMES)))
    return {
        layer: {
            f"{layer}-{at}": draw(unit_lists(layer in NIC_LAYERS)) for at in range(draw(st.integers(0, 4)))
        }
        for layer in names
    }


# the active nodes: none given, or any subset of the fleet with nodes the topology does not hold
ACTIVE = st.none() | st.frozensets(st.sampled_from([*NODES, "vm-elsewhere", "vm-gone"]))


@settings(max_examples=300)
@given(layers=layer_maps(), active=st.lists(ACTIVE, min_size=1, max_size=4))
def test_a_membership_built_once_gives_each_windows_topology_as_if_rebuilt(layers, active):
    """Several windows' active nodes applied to one Membership: every field the localizer reads (and the
    order of the parents) is the reference's, and so is the localization of every node flapping."""
    membership = Membership.of(layers)
    localizer = SharedFaultLocalizer(persistence=1, alpha=0.99, min_fraction=0.5)
    flapping = [NodeAnomaly(node, "link_flap", f"flap@{node}", "mlx5_0:1") for node in NODES]
    for window_active in active:
        expected, applied = reference(layers, window_active), membership.topology(window_active)
        assert applied == expected
        assert list(applied.children) == list(expected.children)
        assert list(applied.nodes) == list(expected.nodes)
        assert Topology.of(layers, window_active) == expected
        assert localizer.localize(applied, flapping) == localizer.localize(expected, flapping)


def test_a_window_with_every_node_active_reuses_the_sets_built_once():
    layers = {
        "leaf": {"leaf-0": NODES[:4], "leaf-1": NODES[4:8]},
        "rail": {"rail-0": [f"{n}/x" for n in NODES]},
    }
    membership = Membership.of(layers)
    assert membership.topology(None) is membership.whole
    assert membership.topology({*NODES, "vm-elsewhere"}) is membership.whole
    window = membership.topology(set(NODES) - {NODES[5]})
    assert window.children[("leaf", "leaf-0")] is membership.whole.children[("leaf", "leaf-0")]
    assert window.children[("leaf", "leaf-1")] == frozenset(NODES[4:5] + NODES[6:8])
    assert f"{NODES[5]}/x" not in window.units[True]

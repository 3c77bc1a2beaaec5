"""fleet_topology on a real store: any inventory (imported as `fleetlens topology import` does) with any
nodes anomalous and any leaves with a shared fault comes back as one heat map cell per node, each in its
leaf's row, the counts per parent agreeing with the cells, and the faulted leaves marked."""

from __future__ import annotations

import itertools
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors.runner import store_anomalies
from analytics.reports.topology import NO_LEAF, fleet_topology, node_layers
from analytics.store import Store
from analytics.store.records import Anomaly
from analytics.topology import inventory
from analytics.topology.model import Source
from tests.support.evidence import example

T0 = 1_800_000_000.0
CLOCK = itertools.count()


@st.composite
def fleets(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, str | None], set[str], set[str]]:
    """Node -> host, host -> leaf (None: no leaf), the anomalous nodes and the leaves with a shared fault."""
    hosts = [f"host-{i}" for i in range(draw(st.integers(1, 6)))]
    leaves = [f"leaf-{i}" for i in range(draw(st.integers(1, 3)))]
    host_leaf = {host: draw(st.sampled_from([*leaves, None])) for host in hosts}
    nodes = {f"vm-{i:02d}": draw(st.sampled_from(hosts)) for i in range(draw(st.integers(1, 20)))}
    anomalous = draw(st.sets(st.sampled_from(sorted(nodes))))
    faulted = draw(st.sets(st.sampled_from(leaves)))
    return nodes, host_leaf, anomalous, faulted


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fleet=fleets())
def test_every_node_is_one_cell_in_its_leafs_row_and_the_counts_agree(store: Store, fleet) -> None:
    nodes, host_leaf, anomalous, faulted = fleet
    prefix = f"x{uuid.uuid4().hex[:6]}-"  # examples share the store: names of their own
    now = T0 + 1000 * next(CLOCK)
    lines = ["nodes:", *(f"  {prefix}{node}: {{host: {prefix}{host}}}" for node, host in nodes.items())]
    lines += ["hosts:", *(f"  {prefix}{host}: {{leaf: {prefix}{leaf}}}" if leaf else f"  {prefix}{host}: {{}}"
                          for host, leaf in host_leaf.items())]  # fmt: skip
    store.replace_links(Source.INVENTORY, inventory.parse("\n".join(lines), "topology.yaml"), now - 100)
    flaps = [
        Anomaly(f"{prefix}{node}", now - 10, None, "link_flap", f"{prefix}{node}", "mlx5_0:1", "", "warning",
                1.0, example("link_flap"), "link_flap", "1")
        for node in anomalous
    ]  # fmt: skip
    fault_evidence = {leaf: example("shared_fault", kinds={}, check=f"check {leaf}") for leaf in faulted}
    faults = [
        Anomaly(f"{prefix}{leaf}", now - 10, None, "shared_fault", f"{prefix}{leaf}", "leaf", "", "warning",
                1.0, evidence, "shared_fault", "1")
        for leaf, evidence in fault_evidence.items()
    ]  # fmt: skip
    store_anomalies(store, [*flaps, *faults])

    fleet_now = fleet_topology(store, now)

    cells = fleet_now.nodes.set_index("node")
    assert sorted(cells.index) == sorted(prefix + node for node in nodes)
    for node, host in nodes.items():
        leaf = host_leaf[host]
        cell = cells.loc[prefix + node]
        assert cell["host"] == prefix + host and cell["leaf"] == (prefix + leaf if leaf else "")
        assert cell["state"] == ("anomalous" if node in anomalous else "healthy")
        assert cell["row"].startswith(prefix + leaf) if leaf else cell["row"] == NO_LEAF
        assert ("SHARED FAULT" in cell["row"]) == (leaf in faulted)
    for _, row in fleet_now.nodes.groupby("row"):
        assert sorted(row["slot"]) == list(range(len(row)))
    parents = fleet_now.parents.set_index(["layer", "parent"])
    for leaf in {leaf for leaf in host_leaf.values() if leaf}:
        below = [node for node, host in nodes.items() if host_leaf[host] == leaf]
        if below:
            counted = parents.loc[("leaf", prefix + leaf)]
            assert counted["nodes"] == len(below)
            assert counted["anomalous"] == len(set(below) & anomalous)
            assert (counted["check"] == f"check {leaf}") == (leaf in faulted)
    assert node_layers(store, "not-a-node", now) is None


def test_a_store_without_topology_gives_an_empty_frame(store: Store) -> None:
    assert fleet_topology(store, T0).empty

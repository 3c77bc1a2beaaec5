"""The topology table: each reporter's links dated as they come and go, read as they were at any time."""

from __future__ import annotations

import pytest

from analytics.errors import StoreRejected
from analytics.store import Store
from analytics.store.topology import Changes
from analytics.topology.model import Edge, Entity, Kind, Link, Source

T0 = 1_767_000_000.0


def on_host(node: str, host: str) -> Link:
    return Link(Entity(Kind.NODE, node), Entity(Kind.HOST, host))


def hosts_at(store: Store, ts: float) -> dict[str, tuple[str, Source]]:
    """node -> (host, source) of the node -> host edges in force at `ts`."""
    return {
        edge.link.child.name: (edge.link.parent.name, edge.source)
        for edge in store.topology_at(ts)
        if edge.link.parent.kind is Kind.HOST
    }


def rows(store: Store) -> int:
    return store.query("SELECT count() FROM topology").rows[0][0]


def test_a_new_report_opens_its_links_and_the_same_report_again_writes_nothing(store: Store) -> None:
    links = [on_host("vela-001", "host-000"), on_host("vela-002", "host-000")]
    assert store.replace_links(Source.INVENTORY, links, T0) == Changes(opened=2, closed=0, unchanged=0)
    written = rows(store)
    assert store.replace_links(Source.INVENTORY, reversed(links), T0 + 60) == Changes(0, 0, 2)
    assert rows(store) == written
    assert store.topology_at(T0 + 120) == [Edge(link, Source.INVENTORY, T0) for link in sorted(links)]


def test_a_link_no_longer_reported_ends_and_the_past_still_reads_as_it_was(store: Store) -> None:
    store.replace_links(Source.INVENTORY, [on_host("vela-001", "host-000")], T0)
    assert store.replace_links(Source.INVENTORY, [on_host("vela-001", "host-001")], T0 + 100) == Changes(
        1, 1, 0
    )
    assert hosts_at(store, T0 - 1) == {}
    assert hosts_at(store, T0 + 50) == {"vela-001": ("host-000", Source.INVENTORY)}
    assert hosts_at(store, T0 + 100) == {"vela-001": ("host-001", Source.INVENTORY)}
    [ended] = [e for e in store.query("SELECT parent, closed FROM topology FINAL").rows if e[0] == "host-000"]
    assert ended == ("host-000", 1)


def test_a_link_that_comes_back_opens_a_new_interval(store: Store) -> None:
    link = on_host("vela-001", "host-000")
    store.replace_links(Source.INVENTORY, [link], T0)
    store.replace_links(Source.INVENTORY, [], T0 + 10)
    store.replace_links(Source.INVENTORY, [link], T0 + 20)
    assert hosts_at(store, T0 + 15) == {}
    assert [(e.valid_from, e.valid_to) for e in store.topology_at(T0 + 30)] == [(T0 + 20, None)]


def test_the_inventory_wins_over_a_host_agent_for_one_child_and_layer(store: Store) -> None:
    store.replace_links(Source.HOST_AGENT, [on_host("vela-001", "host-007")], T0, reporter="host-007")
    store.replace_links(Source.INVENTORY, [on_host("vela-001", "host-000")], T0 + 10)
    assert hosts_at(store, T0 + 5) == {"vela-001": ("host-007", Source.HOST_AGENT)}
    assert hosts_at(store, T0 + 20) == {"vela-001": ("host-000", Source.INVENTORY)}
    store.replace_links(Source.INVENTORY, [], T0 + 30)
    assert hosts_at(store, T0 + 40) == {"vela-001": ("host-007", Source.HOST_AGENT)}


def test_each_reporter_of_a_source_replaces_only_its_own_links(store: Store) -> None:
    store.replace_links(Source.HOST_AGENT, [on_host("vela-001", "host-000")], T0, reporter="host-000")
    store.replace_links(Source.HOST_AGENT, [on_host("vela-002", "host-001")], T0 + 1, reporter="host-001")
    assert set(hosts_at(store, T0 + 2)) == {"vela-001", "vela-002"}


def test_a_report_dated_before_the_last_change_is_refused(store: Store) -> None:
    store.replace_links(Source.INVENTORY, [on_host("vela-001", "host-000")], T0)
    with pytest.raises(StoreRejected, match="clock gone back"):
        store.replace_links(Source.INVENTORY, [], T0 - 1)
    assert hosts_at(store, T0 + 1) == {"vela-001": ("host-000", Source.INVENTORY)}

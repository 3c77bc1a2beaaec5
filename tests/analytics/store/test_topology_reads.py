"""The topology a loop asks for every window (TopologyReads): read again only when the table changed,
so a window costs one small query, and a change reaches the next window."""

from __future__ import annotations

from typing import Any

from analytics.store import Store
from analytics.store.records import QueryResult
from analytics.store.topology import EDGES_AT, TopologyReads
from analytics.topology.model import Entity, Kind, Link, Source

NOW = 1_780_000_000.0


class CountingReader:
    """The store, counting the full reads of the edges."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.edge_reads = 0

    def query(self, sql: str, *, parameters: Any = None, max_rows: int = 10_000) -> QueryResult:
        self.edge_reads += sql == EDGES_AT
        return self.store.query(sql, parameters=parameters, max_rows=max_rows)


def vm(name: str, host: str) -> Link:
    return Link(Entity(Kind.NODE, name), Entity(Kind.HOST, host))


def test_the_edges_are_read_again_only_when_they_changed_or_every_nth_call(store: Store) -> None:
    reader = CountingReader(store)
    reads = TopologyReads(reader, every=5)
    store.replace_links(Source.INVENTORY, [vm("vela-001", "host-000")], NOW)

    first = reads.at(NOW + 10)
    again = [reads.at(NOW + 10 * i) for i in range(2, 6)]
    assert reader.edge_reads == 1 and all(snapshot is first for snapshot in again)
    assert reads.parents("vela-001", NOW + 60) == {("host", "host-000")}
    assert reader.edge_reads == 2, "the sixth call, after five from one read, reads again"

    store.replace_links(Source.INVENTORY, [vm("vela-001", "host-001")], NOW + 65)
    assert reads.parents("vela-001", NOW + 75) == {("host", "host-001")}
    assert reads.parents("vela-404", NOW + 75) == frozenset()


def test_an_edge_stored_from_after_the_last_window_asked_reaches_the_window_it_holds_in(store: Store) -> None:
    """A hub stamps a report with its clock while its detection asks about a window that ended earlier:
    the edge is not in force then, but must be in the first window that reaches its time."""
    reads = TopologyReads(store, every=30)
    store.replace_links(Source.HOST_AGENT, [vm("vela-001", "host-000")], NOW + 20, reporter="host-000")

    assert reads.parents("vela-001", NOW + 10) == frozenset()
    assert reads.parents("vela-001", NOW + 30) == {("host", "host-000")}

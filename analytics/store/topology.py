"""The topology table's reads and writes (schema.TOPOLOGY): dated edges, replaced one reporter at a time.

A source (analytics.topology.model.Source) has reporters: the inventory file, each host's agent, each
imported file. `replacement` turns what one reporter says now into the rows to write: its edges no longer
said are closed (the same row again with valid_to = now and closed = 1, which replaces the open one on
merge; reads use FINAL), unless they are of a part it could not read this time (`unsaid`), links new to
it are opened with valid_from = now, and links it said before are left alone. Saying the same again
writes nothing; a batch replayed after a crash carries the same insert token and is stored once. One
writer per reporter at a time (the hub, or one import).

`topology_at` reads the edges in force at a time through any reader with Store.query's signature (the
store, or a hub's query API through HubClient), with source precedence applied (analytics.topology.view).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from analytics.errors import SettingError, StoreRejected
from analytics.store.records import QueryResult
from analytics.topology.model import Edge, Entity, Kind, Link, Source
from analytics.topology.view import in_force, layers_above, members

COLUMNS = (
    "child_kind",
    "child",
    "parent_kind",
    "parent",
    "source",
    "reporter",
    "valid_from",
    "valid_to",
    "closed",
)
MAX_EDGES = 1_000_000  # rows one read of the topology takes; a larger one is refused, not cut
_SECONDS = "toFloat64(toUnixTimestamp64Milli({column})) / 1000"
# Every edge in force at {at}, of every source: what topology_at reads (through the query API too).
EDGES_AT = f"""SELECT child_kind, child, parent_kind, parent, source,
    {_SECONDS.format(column="valid_from")} AS valid_from, {_SECONDS.format(column="valid_to")} AS valid_to
FROM topology FINAL
WHERE valid_from <= {{at:DateTime64(3, 'UTC')}}
    AND (valid_to IS NULL OR valid_to > {{at:DateTime64(3, 'UTC')}})
ORDER BY source, child_kind, child, parent_kind, parent"""

# What changes whenever any edge is written (opened or closed): a reader re-reads EDGES_AT when it does.
VERSION_SQL = (  # the newest change's times in unix milliseconds, for TopologyReads to compare
    "SELECT count(), max(toUnixTimestamp64Milli(valid_from)), max(toUnixTimestamp64Milli(valid_to))"
    " FROM topology"
)


def open_edges(table: str) -> str:
    """The edges of one reporter still in force, in `table` (qualified): what `replacement` takes."""
    return f"""SELECT child_kind, child, parent_kind, parent, toUnixTimestamp64Milli(valid_from)
FROM {table} FINAL
WHERE source = {{source:String}} AND reporter = {{reporter:String}} AND valid_to IS NULL"""


class Reader(Protocol):
    def query(self, sql: str, *, parameters: Any = None, max_rows: int = ...) -> QueryResult: ...


@dataclass(frozen=True)
class Changes:
    """What one replace_links did: links `opened` (new), edges `closed` (no longer said), `unchanged`."""

    opened: int
    closed: int
    unchanged: int


@dataclass(frozen=True)
class Replacement:
    """The rows one replace_links writes (as columns, COLUMNS order), their insert token, and its Changes."""

    columns: list[list[Any]]
    token: str
    changes: Changes


def replacement(
    source: Source,
    reporter: str,
    links: Iterable[Link],
    open_rows: Sequence[tuple],
    now: float,
    unsaid: Callable[[Link], bool] | None = None,
) -> Replacement:
    """The rows that make `reporter` of `source` say exactly `links` from `now` on, given its edges still
    open (OPEN_EDGES rows), except that an open edge `unsaid` accepts (a part the reporter could not read
    this time) stays open, counted unchanged; StoreRejected when `now` is before one of them opened (a
    clock gone back)."""
    now_ms = _millis(now)
    said = set(links)
    held = {Link(Entity(Kind(ck), c), Entity(Kind(pk), p)): int(since) for ck, c, pk, p, since in open_rows}
    if unsaid is not None:
        said |= {link for link in held if link not in said and unsaid(link)}
    if (latest := max(held.values(), default=now_ms)) > now_ms:
        raise StoreRejected(
            f"topology: {source}/{reporter} changed at {latest / 1000:.3f}, after now ({now:.3f}): a clock"
            " gone back?"
        )
    rows = [
        _row(link, source, reporter, since, now_ms)
        for link, since in sorted(held.items())
        if link not in said
    ]
    rows += [_row(link, source, reporter, now_ms, None) for link in sorted(said - held.keys())]
    digest = hashlib.sha256(json.dumps([source, reporter, now_ms, rows]).encode()).hexdigest()
    changes = Changes(
        opened=len(said - held.keys()), closed=len(held.keys() - said), unchanged=len(said & held.keys())
    )
    return Replacement([list(column) for column in zip(*rows, strict=True)] if rows else [], digest, changes)


def topology_at(reader: Reader, ts: float) -> list[Edge]:
    """The edges in force at `ts` (unix seconds), source precedence applied; rows of a kind or source this
    code does not know (written by a newer fleetlens) are left out. StoreRejected when there are more
    than the reader returns at once."""
    at = datetime.fromtimestamp(ts, UTC)
    result = reader.query(EDGES_AT, parameters={"at": at}, max_rows=MAX_EDGES)
    if result.truncated:
        raise StoreRejected(
            f"topology: more edges in force than one read returns ({len(result.rows)}); raise the hub's"
            " query_max_rows"
        )
    return in_force(filter(None, map(_edge, result.rows)), ts)


def topology_version(reader: Reader) -> tuple[Any, ...]:
    """A cheap token of the topology table's contents: it changes whenever a link is opened or closed
    (and may change when the store merges rows), so a reader that keeps the edges re-reads them then."""
    return tuple(reader.query(VERSION_SQL).rows[0])


def _edge(row: Sequence[Any]) -> Edge | None:
    child_kind, child, parent_kind, parent, source, valid_from, valid_to = row
    known = {str(kind) for kind in Kind}
    if child_kind not in known or parent_kind not in known or source not in {str(s) for s in Source}:
        return None
    link = Link(Entity(Kind(child_kind), child), Entity(Kind(parent_kind), parent))
    return Edge(link, Source(source), float(valid_from), None if valid_to is None else float(valid_to))


def _row(link: Link, source: Source, reporter: str, since_ms: int, until_ms: int | None) -> tuple:
    child, parent = link.child, link.parent
    closed = int(until_ms is not None)
    return (
        str(child.kind),
        child.name,
        str(parent.kind),
        parent.name,
        str(source),
        reporter,
        since_ms,
        until_ms,
        closed,
    )


def _millis(ts: float) -> int:
    return round(ts * 1000)


@dataclass(frozen=True)
class Snapshot:
    """The topology in force, as readers use it: the edges, each node's parents of every layer
    (analytics.topology.view.layers_above) and each layer's parents with their nodes (view.members)."""

    edges: tuple[Edge, ...]
    parents: Mapping[str, frozenset[Entity]]
    members: Mapping[Kind, Mapping[str, set[str]]]


class TopologyReads:
    """The topology in force, read through `reader` again only when the table changed (topology_version,
    one small query a call), when the last read was for a time before a change the table holds (an edge
    stored from a moment after the window last asked about, as a hub stamps a report with its clock while
    its detection lags behind), or after `every` calls served from one read: what a loop that asks each
    window keeps. A call returns the same Snapshot object until a read changes it; StoreUnavailable as
    the reader raises it."""

    def __init__(self, reader: Reader, every: int = 30) -> None:
        if every < 1:
            raise SettingError(f"topology reads: every must be >= 1 call, got {every}")
        self.reader = reader
        self.every = every
        self.snapshot_: Snapshot = Snapshot((), {}, {})
        self.version_: tuple[Any, ...] | None = None
        self.calls_ = 0
        self.read_at_ = -float("inf")  # the time the latest read was for

    def at(self, ts: float) -> Snapshot:
        """The topology in force at `ts` (the latest read's, when nothing changed since)."""
        version = topology_version(self.reader)
        ahead = any(ms is not None and ms / 1000 > self.read_at_ for ms in version[1:])  # read too early
        if version != self.version_ or ahead or self.calls_ >= self.every:
            edges = topology_at(self.reader, ts)
            above = layers_above(edges)
            parents = {node: frozenset(entities) for node, entities in above.items()}
            snapshot = Snapshot(tuple(edges), parents, members(edges))
            if snapshot != self.snapshot_:
                self.snapshot_ = snapshot
            self.version_, self.calls_, self.read_at_ = version, 0, ts
        self.calls_ += 1
        return self.snapshot_

    def parents(self, node: str, ts: float) -> frozenset[tuple[str, str]]:
        """`node`'s parents of every layer in force at `ts`, as (layer, name): ("leaf", "leaf-07"); none
        for a node the topology does not hold. What the drain controller caps drains per parent by."""
        return frozenset((str(entity.kind), entity.name) for entity in self.at(ts).parents.get(node, ()))

"""What the topology says of each node: the edges in force at a time, and per node the layers above it.

`in_force(edges, ts)` keeps the edges that held at `ts` and applies source precedence: for one child and
one kind of parent, only the edges of the highest-precedence source that names such a parent count (so an
inventory's `host` for a VM overrides a host agent's; a source that puts a node on several rails keeps
them all).

A node's layers are found by walking child -> parent from the node and from the devices it holds (its
children: VFs, GPUs), breadth first:

    host   node -> host
    leaf   node -> leaf (a source says so directly), node's VF -> PF -> leaf, or node -> host -> leaf
    spine  the spine above its leaf (leaf -> spine), or node -> spine directly
    rail   every rail above the node or its VFs and PFs (a rail-optimized fabric: NIC j on rail j)
    rack   node -> rack, or node -> host -> rack
    pf     the PFs its VFs belong to (used by the localization; not in the node's view)

Of each layer only the parents nearest to the node count, and the walk goes on from them alone: a leaf
a source gives the node itself overrides its host's leaf (and that leaf's spine), while the eight leaves
its eight NICs' PFs sit on all count. `node_views` gives one object per node, {"node", "host", "leaf",
"spine", "rail": [...], "rack"}, absent layers omitted; where a single-valued layer has several (NICs on
two leaves) it names the lowest. `members` gives the localization every parent per layer with all the
nodes that count under it, so a leaf any NIC of a node sits on has that node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from analytics.topology.model import SOURCES, Edge, Entity, Kind

SINGLE_LAYERS = (Kind.HOST, Kind.LEAF, Kind.SPINE, Kind.RACK)  # one name in a node's view
LIST_LAYERS = (Kind.RAIL,)  # every one, sorted
# The layers a fault can be shared on, which members() groups nodes by.
LAYERS = (Kind.HOST, Kind.PF, Kind.LEAF, Kind.SPINE, Kind.RAIL, Kind.RACK, Kind.PDU)
NodeView = dict[str, str | list[str]]


def in_force(edges: Iterable[Edge], ts: float) -> list[Edge]:
    """The edges that held at `ts`, of the highest-precedence source for each child and parent kind."""
    holding = [edge for edge in edges if edge.holds_at(ts)]
    best: dict[tuple[Entity, Kind], int] = {}
    for edge in holding:
        key, rank = (edge.link.child, edge.link.parent.kind), SOURCES.index(edge.source)
        best[key] = min(best.get(key, rank), rank)
    return sorted(
        edge
        for edge in holding
        if SOURCES.index(edge.source) == best[(edge.link.child, edge.link.parent.kind)]
    )


def layers_above(edges: Iterable[Edge]) -> dict[str, set[Entity]]:
    """Per node name, its parents of each layer (LAYERS): walked breadth first from the node and the
    devices it holds, a layer taken at the first level that reaches it and never walked into again
    further up, each entity once (so a loop that sources made between them ends the walk)."""
    parents: dict[Entity, set[Entity]] = defaultdict(set)
    devices: dict[Entity, set[Entity]] = defaultdict(set)
    nodes: set[Entity] = set()
    for edge in edges:
        child, parent = edge.link.child, edge.link.parent
        parents[child].add(parent)
        if parent.kind is Kind.NODE:
            devices[parent].add(child)
        nodes.update(entity for entity in (child, parent) if entity.kind is Kind.NODE)
    found = {}
    for node in nodes:
        reached = {node, *devices[node]}
        taken = {entity.kind for entity in reached}
        frontier = reached
        while frontier:
            step = {p for e in frontier for p in parents[e] if p not in reached and p.kind not in taken}
            taken.update(entity.kind for entity in step)
            reached |= step
            frontier = step
        found[node.name] = {entity for entity in reached if entity.kind in LAYERS}
    return found


def node_views(edges: Iterable[Edge]) -> list[NodeView]:
    """One object per node, sorted by node: {"node", "host", "leaf", "spine", "rail": [...], "rack"},
    the layers the edges do not give omitted (`edges` already in force: in_force)."""
    views = []
    for node, above in sorted(layers_above(edges).items()):
        view: NodeView = {"node": node}
        for kind in (*SINGLE_LAYERS, *LIST_LAYERS):
            if names := sorted(entity.name for entity in above if entity.kind is kind):
                view[str(kind)] = names if kind in LIST_LAYERS else names[0]
        views.append(view)
    return views


def members(edges: Iterable[Edge]) -> dict[Kind, dict[str, set[str]]]:
    """Per layer (LAYERS), each parent's name -> the names of every node below it (`edges` in force)."""
    groups: dict[Kind, dict[str, set[str]]] = {kind: defaultdict(set) for kind in LAYERS}
    for node, above in layers_above(edges).items():
        for entity in above:
            groups[entity.kind][entity.name].add(node)
    return {kind: dict(parents) for kind, parents in groups.items()}

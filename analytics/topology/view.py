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
units that count under it: nodes, so a leaf any NIC of a node sits on has that node; but in the NIC
layers (NIC_LAYERS: a rail, a PF), where a fault shows on one NIC of each node, NICs: the unit
"<node>/<device>" of each of the node's VFs below the parent (device: the VF's name after its last "/",
"mlx5_2" for the inventory's "vela-001/mlx5_2"), or "<node>/" where the node is below it but none of its
VFs is (a node, or its host, put on a rail with no NIC named). `unit_node` gives a unit's node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping

from analytics.topology.model import SOURCES, Edge, Entity, Kind

SINGLE_LAYERS = (Kind.HOST, Kind.LEAF, Kind.SPINE, Kind.RACK)  # one name in a node's view
LIST_LAYERS = (Kind.RAIL,)  # every one, sorted
# The layers a fault can be shared on, which members() groups nodes by; in the order the localization
# names one of two parents with the same children: the more specific first.
LAYERS = (Kind.PF, Kind.HOST, Kind.LEAF, Kind.RACK, Kind.PDU, Kind.SPINE, Kind.RAIL)
NIC_LAYERS = (Kind.PF, Kind.RAIL)  # whose children are a node's NICs, not the node
UNIT_SEPARATOR = "/"  # "<node>/<device>"; a device (an RDMA device, a PCI address) never holds one
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
    return {node.name: above for node, (above, _) in _walked(edges).items()}


def _walked(edges: Iterable[Edge]) -> dict[Entity, tuple[set[Entity], dict[Entity, set[Entity]]]]:
    """Per node: its parents of each layer (layers_above), and per VF it holds the NIC-layer parents
    among them that the VF reaches by itself."""
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
        above = {entity for entity in _walk({node, *devices[node]}, parents) if entity.kind in LAYERS}
        nics = {  # not through the node: what is above the node is not above each of its NICs
            vf: {entity for entity in _walk({vf}, parents, {Kind.NODE}) if entity.kind in NIC_LAYERS} & above
            for vf in devices[node]
            if vf.kind is Kind.VF
        }
        found[node] = (above, nics)
    return found


def _walk(
    start: set[Entity], parents: Mapping[Entity, set[Entity]], skipped: Collection[Kind] = ()
) -> set[Entity]:
    """`start` and what is above it: breadth first, a layer (LAYERS) taken at the first level that
    reaches it, the `skipped` kinds never walked into. Devices (VFs, GPUs, domains) are walked through
    wherever they are: a VF the inventory names on the node does not hide the one its host reports."""
    reached = set(start)
    taken = {*skipped, *(entity.kind for entity in reached if entity.kind in LAYERS)}
    frontier = reached
    while frontier:
        step = {p for e in frontier for p in parents.get(e, ()) if p not in reached and p.kind not in taken}
        taken.update(entity.kind for entity in step if entity.kind in LAYERS)
        reached |= step
        frontier = step
    return reached


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
    """Per layer (LAYERS), each parent's name -> the units below it (`edges` in force): node names, and
    in NIC_LAYERS the node's NICs "<node>/<device>" below it, or "<node>/" for a node on a rail with no
    NIC named (module docstring). A PF has only the NICs known to be its: one above a node reached whole
    (through VFs no guest NIC is joined to) would say no more than the node's host, and be named first."""
    groups: dict[Kind, dict[str, set[str]]] = {kind: defaultdict(set) for kind in LAYERS}
    for node, (above, nics) in _walked(edges).items():
        for entity in above:
            if entity.kind not in NIC_LAYERS:
                groups[entity.kind][entity.name].add(node.name)
                continue
            units = {unit(node.name, vf.name) for vf, reached in nics.items() if entity in reached}
            if units or entity.kind is not Kind.PF:  # a PF above the whole node is no more than its host
                groups[entity.kind][entity.name].update(units or {unit(node.name, "")})
    return {kind: dict(parents) for kind, parents in groups.items()}


def unit(node: str, device: str) -> str:
    """The unit of `node`'s NIC `device` (a VF's name, "vela-001/mlx5_2", or an RDMA device, "mlx5_2"):
    "<node>/<device>", the device named by its last part; "<node>/" for the whole node ("")."""
    return f"{node}{UNIT_SEPARATOR}{device.rpartition(UNIT_SEPARATOR)[2]}"


def unit_node(unit_name: str) -> str:
    """The node of a NIC-layer unit ("vela-001/mlx5_2" or "vela-001/" -> "vela-001")."""
    return unit_name.rpartition(UNIT_SEPARATOR)[0]

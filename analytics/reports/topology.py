"""The topology as the UI and postmortems show it: where each node sits, and which parents are in trouble.

    fleet = fleet_topology(store, now)        # fleet.nodes: one row per node; fleet.parents: per parent
    view = node_layers(store, "vela-007", now)  # {"node", "host", "leaf", "spine", "rail": [...], "rack"}

The edges are read as they were in force at the time asked (analytics.store.topology.topology_at, source
precedence applied), the open anomalies as of that time too, so a page at a past range shows the fleet as
it was then. A node's state is `explained` while a shared fault explains one of its open anomalies,
`anomalous` while it has others, `healthy` otherwise. `source` is anything with Store.query's signature.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from analytics.evidence import SharedFaultEvidence, stored
from analytics.store.protocols import Reader
from analytics.store.topology import topology_at
from analytics.topology.model import Edge
from analytics.topology.view import (
    LIST_LAYERS,
    NIC_LAYERS,
    SINGLE_LAYERS,
    NodeView,
    members,
    node_views,
    unit_node,
)

SHARED_FAULT = SharedFaultEvidence.KIND
NO_LEAF = "(no leaf)"  # the heat map's row of nodes no source puts under a leaf
NODE_STATES = ("explained", "anomalous", "healthy")  # a node shows the first that applies
VIEW_COLUMNS = ("node", *map(str, SINGLE_LAYERS), *map(str, LIST_LAYERS))
NOW = "toDateTime64({now:Float64}, 3, 'UTC')"
OPEN_AT = f"start <= {NOW} AND (end IS NULL OR end > {NOW})"
OPEN_PER_NODE_SQL = f"""
SELECT CAST(node, 'String') AS node, count() AS open_anomalies, countIf(explained_by != '') AS explained,
    arrayStringConcat(arraySort(groupUniqArray(CAST(kind, 'String'))), ', ') AS kinds
FROM anomalies FINAL
WHERE {OPEN_AT} AND kind != '{SHARED_FAULT}'
GROUP BY node
"""
OPEN_SHARED_SQL = f"""
SELECT id, CAST(component, 'String') AS layer, CAST(node, 'String') AS parent, evidence
FROM anomalies FINAL
WHERE {OPEN_AT} AND kind = '{SHARED_FAULT}'
ORDER BY layer, parent
"""
HOW_TO_ADD = (
    "No topology in the store for this time: add one with `fleetlens topology import FILE --format"
    " inventory` or a host agent (docs/topology.md) to see leaves, hosts and VMs here."
)


@dataclass(frozen=True)
class FleetTopology:
    """The fleet's topology at a time with its open anomalies:

    - `nodes`: one row per node the topology holds, sorted by leaf then node: its layers (VIEW_COLUMNS,
      rails joined with ", ", "" where absent), open_anomalies, explained (how many of them a shared
      fault explains), kinds, state (NODE_STATES), and `row` (its leaf, or NO_LEAF, marked with what is
      wrong under it) and `slot` (its place in that row): a heat map's cells;
    - `parents`: one row per parent (layer, parent) with `nodes` below it and `anomalous` of them with an
      open anomaly, and its open shared fault's id and `check` ("" when none), the faulted and then the
      most anomalous first.
    """

    nodes: pd.DataFrame
    parents: pd.DataFrame

    @property
    def empty(self) -> bool:
        """Whether no topology was in force."""
        return self.nodes.empty


def node_layers(source: Reader, node: str, at: float) -> NodeView | None:
    """`node`'s view at `at` (analytics.topology.view.node_views); None when the topology does not hold it."""
    return next(iter(views_of(topology_at(source, at), [node])), None)


def views_of(edges: Iterable[Edge], nodes: Iterable[str]) -> list[NodeView]:
    """The views of `nodes` that the edges (in force) hold, sorted by node."""
    wanted = set(nodes)
    return [view for view in node_views(edges) if view["node"] in wanted]


def fleet_topology(source: Reader, at: float) -> FleetTopology:
    """The topology in force at `at` with the anomalies open then (see FleetTopology)."""
    edges = topology_at(source, at)
    parameters = {"now": float(at)}
    per_node = source.query(OPEN_PER_NODE_SQL, parameters=parameters).rows
    open_counts = {node: (count, explained, kinds) for node, count, explained, kinds in per_node}
    faults = {
        (layer, parent): (fault_id, _check(text))
        for fault_id, layer, parent, text in source.query(OPEN_SHARED_SQL, parameters=parameters).rows
    }
    nodes = _node_rows(node_views(edges), open_counts)
    parents = _parent_rows(edges, nodes, faults)
    return FleetTopology(_with_cells(nodes, parents), parents)


def _node_rows(views: list[NodeView], open_counts: dict[str, tuple[int, int, str]]) -> pd.DataFrame:
    rows = []
    for view in views:
        count, explained, kinds = open_counts.get(str(view["node"]), (0, 0, ""))
        layers = {
            column: ", ".join(value) if isinstance(value, list) else value
            for column in VIEW_COLUMNS
            for value in [view.get(column, "")]
        }
        state = "explained" if explained else "anomalous" if count else "healthy"
        rows.append(
            {**layers, "open_anomalies": count, "explained": explained, "kinds": kinds, "state": state}
        )
    columns = [*VIEW_COLUMNS, "open_anomalies", "explained", "kinds", "state"]
    return pd.DataFrame(rows, columns=columns)


def _check(text: str) -> str:
    """What a shared fault's evidence says to check; "" where the stored text cannot be read."""
    evidence = stored(SHARED_FAULT, text)
    return evidence.check if isinstance(evidence, SharedFaultEvidence) else ""


def _parent_rows(
    edges: list[Edge], nodes: pd.DataFrame, faults: dict[tuple[str, str], tuple[str, str]]
) -> pd.DataFrame:
    anomalous = set(nodes.loc[nodes["open_anomalies"] > 0, "node"])
    rows = []
    for kind, parents in members(edges).items():
        for parent, units in parents.items():
            below = {unit_node(u) for u in units} if kind in NIC_LAYERS else units  # a rail's NICs: nodes
            fault_id, check = faults.get((str(kind), parent), ("", ""))
            rows.append(
                {
                    "layer": str(kind),
                    "parent": parent,
                    "nodes": len(below),
                    "anomalous": len(below & anomalous),
                    "shared_fault": fault_id,
                    "check": check,
                }
            )
    columns = ["layer", "parent", "nodes", "anomalous", "shared_fault", "check"]
    found = pd.DataFrame(rows, columns=columns)
    faulted = found["shared_fault"] != ""
    return (
        found.assign(faulted=faulted)
        .sort_values(["faulted", "anomalous", "layer", "parent"], ascending=[False, False, True, True])
        .drop(columns=["faulted"])
        .reset_index(drop=True)
    )


def _with_cells(nodes: pd.DataFrame, parents: pd.DataFrame) -> pd.DataFrame:
    """`nodes` sorted by leaf and node, each with its heat map row (its leaf, marked) and slot."""
    labels = {
        row.parent: f"{row.parent}{' SHARED FAULT' if row.shared_fault else ''}"
        f" ({row.anomalous}/{row.nodes} anomalous)"
        for row in parents[parents["layer"] == "leaf"].itertuples()
    }
    placed = nodes.assign(row=[labels.get(leaf, NO_LEAF) for leaf in nodes["leaf"]])
    placed = placed.sort_values(["row", "node"], kind="stable").reset_index(drop=True)
    return placed.assign(slot=placed.groupby("row").cumcount())

"""What sat above a postmortem's nodes: the topology as it was, and the shared faults open in the window.

The topology is read as it was in force at the start of the first shared fault above the scope (the
topology its localization judged by), else at the window's last millisecond: a change made after the
window never shows. A shared fault is above the scope when a node of the scope is one of its parent's
children (its evidence, analytics.evidence.SharedFaultEvidence); one whose evidence cannot be read is
left out. What it explained is read by the ids its evidence lists: "link_flap mlx5_0:1 on vela-001".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analytics.detectors.base import Window
from analytics.evidence import SharedFaultEvidence, stored
from analytics.reports.postmortem.model import SECONDS, SharedFault
from analytics.reports.topology import views_of
from analytics.store.protocols import Reader
from analytics.store.topology import topology_at
from analytics.topology.view import NodeView

SHARED_FAULT = SharedFaultEvidence.KIND
SHARED_FAULTS_SQL = f"""
SELECT id, {SECONDS.format(column="start")} AS start_s, {SECONDS.format(column="end")} AS end_s,
    kind, node, component, job, severity, score, evidence
FROM anomalies FINAL
WHERE kind = '{SHARED_FAULT}' AND start < {{end:DateTime64(3)}}
    AND (end IS NULL OR end >= {{start:DateTime64(3)}})
ORDER BY start_s, node
"""
EXPLAINED_SQL = """
SELECT id, CAST(kind, 'String'), CAST(node, 'String'), component
FROM anomalies FINAL WHERE id IN {ids:Array(String)}
"""


@dataclass(frozen=True)
class Layers:
    """The shared faults above the scope (`rows`: as the timeline's anomaly rows, evidence typed;
    `faults`: as the report lists them) and the scope's nodes in the topology `at` that time."""

    rows: list[dict[str, Any]]
    faults: tuple[SharedFault, ...]
    at: float
    topology: tuple[NodeView, ...]


def read_layers(
    source: Reader,
    nodes: Sequence[str],
    window: Window,
    rows: Callable[[str], list[dict[str, Any]]],
) -> Layers:
    """The Layers of `nodes` over `window`; `rows` runs a query with the window's parameters."""
    scope = set(nodes)
    above = []
    for row in rows(SHARED_FAULTS_SQL):
        evidence = stored(row["kind"], row["evidence"])
        if isinstance(evidence, SharedFaultEvidence) and scope & set(evidence.children):
            above.append({**row, "evidence": evidence})
    described = _described(source, [i for row in above for i in row["evidence"].explains])
    faults = tuple(_fault(row, row["evidence"], described) for row in above)
    at = min((row["start_s"] for row in above), default=window.end - 0.001)
    return Layers(above, faults, at, tuple(views_of(topology_at(source, at), nodes)))


def _described(source: Reader, ids: list[str]) -> dict[str, str]:
    if not ids:
        return {}
    result = source.query(EXPLAINED_SQL, parameters={"ids": ids}, max_rows=len(ids) * 2)
    return {
        anomaly_id: " ".join(part for part in (kind, component) if part) + f" on {node}"
        for anomaly_id, kind, node, component in result.rows
    }


def _fault(
    row: Mapping[str, Any], evidence: SharedFaultEvidence, described: Mapping[str, str]
) -> SharedFault:
    return SharedFault(
        id=row["id"],
        start=row["start_s"],
        end=row["end_s"],
        layer=evidence.layer,
        parent=evidence.parent,
        n=evidence.n,
        k=evidence.k,
        p_corrected=evidence.p_corrected,
        anomalous_children=tuple(evidence.anomalous_children),
        explained=tuple(described.get(i, f"anomaly {i}") for i in evidence.explains),
        check=evidence.check,
    )

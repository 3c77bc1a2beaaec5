"""Where each node stands in the node lifecycle (alerts.lifecycle), read from the `actions` audit: the one
reading of it, for the lifecycle itself after a restart, the CLI and the UI.

A node is drained from a `drain` done (or dry-run), `testing` from a `test`, `failed` from a `fail`, and
back in service from an `undrain` done or a `return` done, dry-run or refused (a refused return is
fleetlens letting go of a node someone else holds). A node absent from the result is in service.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from analytics.store.records import ActionRow

STATES = ("drained", "testing", "failed")  # a node in none of them is in service
DONE = ("done", "dry-run")
LIFECYCLE_SQL = """
SELECT toUnixTimestamp64Milli(ts) / 1000 AS ts, action, node, job, reason, mode, outcome, decision_id
FROM actions
WHERE action IN ('drain', 'undrain', 'test', 'fail', 'return')
ORDER BY ts, action
"""
MAX_ROWS = 1_000_000


@dataclass(frozen=True)
class NodeState:
    """Where a node stands: one of STATES, since when, and why (who and what moved it there)."""

    state: str
    since: float
    reason: str = ""


def lifecycle_states(history: Iterable[ActionRow]) -> dict[str, NodeState]:
    """node -> NodeState from an `actions` audit in time order; a node absent is in service. The one
    reading of the audit for the lifecycle, the UI and the CLI."""
    states: dict[str, NodeState] = {}
    for row in history:
        done = row.outcome in DONE
        if row.action == "drain" and done:
            states[row.node] = NodeState("drained", row.ts, row.reason)
        elif row.node not in states:
            continue
        elif row.action == "test" and done:
            states[row.node] = NodeState("testing", row.ts, row.reason)
        elif row.action == "test" and row.outcome == "failed":
            states[row.node] = replace(states[row.node], since=row.ts)
        elif row.action == "fail" and done:
            states[row.node] = NodeState("failed", row.ts, row.reason)
        elif (row.action == "undrain" and done) or (
            row.action == "return" and row.outcome in (*DONE, "refused")
        ):
            del states[row.node]
    return states


def node_states(source: Any) -> dict[str, NodeState]:
    """node -> NodeState from the store's whole audit (`source`: a Reader); a node absent is in service."""
    result = source.query(LIFECYCLE_SQL, max_rows=MAX_ROWS)
    return lifecycle_states(ActionRow(**dict(zip(result.columns, row, strict=True))) for row in result.rows)

"""The checks table: active checks' verdicts stored and read back by time and node."""

from __future__ import annotations

from analytics.store import Store
from analytics.store.records import CheckRow

T0 = 1_767_000_000.0


def verdict(node: str, status: str, started: float, value: float | None = 0.2) -> CheckRow:
    return CheckRow(node, "ping", "peer:vela-002", status, value, "ms", None, '{"loss_pct": 0}', started, 1.5)


def test_checks_read_back_by_window_and_node_and_a_replay_is_stored_once(store: Store) -> None:
    rows = [verdict("vela-001", "PASS", T0), verdict("vela-003", "FAIL", T0 + 1, None)]
    assert store.insert_checks(rows) == 2
    store.insert_checks(rows)  # a retry of the same post
    assert store.checks_between(T0, T0 + 10) == rows
    assert store.checks_between(T0, T0 + 10, node="vela-003") == rows[1:]
    assert store.checks_between(T0 + 1.5, T0 + 10) == []

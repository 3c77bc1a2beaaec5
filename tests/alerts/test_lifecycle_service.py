"""The lifecycle in the hub's alert cycle, on a real store: checks read from the `checks` table, a failed
node's ticket through the engine into `alerts`, a person's test request through `actions`, and the
`lifecycle:` config section."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from alerts import commands
from alerts.drain import DrainController
from alerts.engine import AlertEngine
from alerts.lifecycle import FAILED_ALERT, CommandTrigger, Lifecycle, LifecyclePolicy
from alerts.policy import DrainPolicy
from alerts.service import AlertService
from analytics.reports.dashboards import drain_queue
from analytics.reports.lifecycle import lifecycle_states
from analytics.store import Store
from analytics.store.checks import checks_between
from analytics.store.records import ActionRow, CheckRow
from fleetlens.alerting import build_alert_service
from fleetlens.config import load_config
from fleetlens.errors import ConfigError
from tests.alerts.test_drain import anomaly
from tests.alerts.test_lifecycle import Backend

T0 = 1_800_000_000.0


def verdicts(node: str, status: str, at: float) -> list[CheckRow]:
    return [
        CheckRow(node, check, "gpu:0", status, 1.0, "", 0.0, '{"dcgmi": "..."}', at, 5.0)
        for check in ("dcgm_diag", "remapped_rows")
    ]


def test_a_node_fails_with_a_ticket_then_a_persons_test_returns_it(store: Store) -> None:
    controller = DrainController(DrainPolicy(mode="approve"), [Backend()], fleet_size=100)
    trigger = CommandTrigger(
        [sys.executable, "-c", "import sys; sys.exit(0 if sys.argv[1] == 'vela-001' else 255)", "{node}"]
    )
    reader = lambda node, since, until: checks_between(store, since, until, node=node)  # noqa: E731
    policy = LifecyclePolicy(test_after_s=0, checks=("dcgm_diag", "remapped_rows"))
    lifecycle = Lifecycle(policy, controller, trigger, reader)
    service = AlertService(store, AlertEngine(), controller=controller, lifecycle=lifecycle)
    fault = anomaly("vela-001", start=T0)
    service.cycle([fault], T0)
    [pending] = commands.drain_status(store)["pending"]
    commands.request(store, "approve", pending.decision_id, "alice", now=T0 + 1)
    service.cycle([], T0 + 30)
    service.cycle([replace(fault, end=T0 + 45)], T0 + 60)

    commands.request(store, "test", "vela-001", "alice", now=T0 + 61)
    service.cycle([], T0 + 120)
    store.insert_checks(verdicts("vela-001", "FAIL", T0 + 121))
    service.cycle([], T0 + 180)
    service.cycle([], T0 + 240)

    [ticket] = [a for a in commands.alert_states(store, "firing") if a["alertname"] == FAILED_ALERT]
    assert ticket["labels"]["node"] == "vela-001" and '"status": "FAIL"' in ticket["annotations"]["evidence"]
    assert lifecycle_states(commands.actions(store))["vela-001"].state == "failed"

    commands.request(store, "test", "vela-001", "bob", now=T0 + 241)
    service.cycle([], T0 + 300)
    store.insert_checks(verdicts("vela-001", "PASS", T0 + 301))
    service.cycle([], T0 + 360)
    service.cycle([], T0 + 420)

    audit = [
        (row.action, row.outcome)
        for row in commands.actions(store)
        if row.action in ("test", "fail", "return")
    ]
    assert audit == [
        ("test", "requested"),
        ("test", "done"),
        ("fail", "done"),
        ("test", "requested"),
        ("test", "done"),
        ("return", "done"),
    ]
    assert "requested by bob" in [row for row in commands.actions(store) if row.action == "test"][-1].reason
    assert lifecycle_states(commands.actions(store)) == {}
    assert not [a for a in commands.alert_states(store, "firing") if a["alertname"] == FAILED_ALERT]


def test_a_test_request_without_the_lifecycle_is_refused_with_the_reason(store: Store) -> None:
    service = AlertService(store, AlertEngine(), controller=DrainController(DrainPolicy(), [], fleet_size=10))
    commands.request(store, "test", "vela-001", "alice", now=T0)
    service.cycle([], T0 + 60)

    [answer] = [row for row in commands.actions(store) if row.outcome == "refused"]
    assert answer.action == "test" and "the node lifecycle is off" in answer.reason


def test_a_hub_with_the_lifecycle_enabled_runs_it(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "fleetlens.yaml"
    path.write_text("lifecycle: {enabled: true, max_testing: 1, checks: [dcgm_diag]}\n")
    config = load_config(path, env={})
    service = build_alert_service(store, config.alerts, config.drain, config.lifecycle)
    try:
        assert service.lifecycle is not None
        assert service.lifecycle.policy == LifecyclePolicy(max_testing=1, checks=("dcgm_diag",))
    finally:
        service.close()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lifecycle: {enabled: true}\ndrain: {return_after_healthy_s: 600}\n", "must be null when lifecycle"),
        (
            "lifecycle: {enabled: true}\ndrain: {mode: auto, backend: exec, exec_command: [x]}\n",
            "needs lifecycle.command",
        ),
        ("lifecycle: {max_testing: 0}\n", "lifecycle.max_testing: must be an integer >= 1"),
        ("lifecycle: {retest: 5}\n", "lifecycle.retest: unknown key"),
    ],
)
def test_a_lifecycle_config_that_cannot_work_is_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "fleetlens.yaml"
    path.write_text(text)

    with pytest.raises(ConfigError, match=message):
        load_config(path, env={})


def test_the_drain_queue_drops_a_node_the_lifecycle_returned_or_let_go_of(store: Store) -> None:
    rows = [
        ActionRow(T0, "drain", node, "", "fleetlens: gpu_fault abc", "auto", "done", node)
        for node in ("vela-001", "vela-002", "vela-003")
    ]
    rows += [
        ActionRow(T0 + 60, "return", "vela-001", "", "checks passed", "auto", "done", "vela-001"),
        ActionRow(
            T0 + 60, "return", "vela-002", "", "no longer drained by fleetlens", "auto", "refused", "vela-002"
        ),
    ]
    store.insert_actions(rows, token="queue")

    assert list(drain_queue(store, T0 + 120)["node"]) == ["vela-003"]

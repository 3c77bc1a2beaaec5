"""The node lifecycle's state machine: drained -> testing -> returned, or failed, on a fake clock.

The trigger and the results reader are the lifecycle's own seams, faked here; the drain controller and
the alert engine are the real ones, and the backend records the calls the controller makes (the real
Slurm backend has its own test in test_slurm_backend.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alerts.commands import standing
from alerts.drain import DrainController
from alerts.errors import AlertConfigError, BackendError, DecisionError
from alerts.lifecycle import (
    FAILED_ALERT,
    CommandTrigger,
    Lifecycle,
    LifecyclePolicy,
    parse_lifecycle_policy,
)
from alerts.model import Alert, DrainRequest
from alerts.policy import DrainPolicy
from alerts.rules import fingerprint
from analytics.reports.lifecycle import NodeState, lifecycle_states
from analytics.store.records import ActionRow, CheckRow
from tests.alerts.test_drain import anomaly, firing

DRAINED_AT = 10.0
POLICY = LifecyclePolicy(
    checks=("dcgm_diag", "remapped_rows"),
    test_after_s=600,
    retest_after_s=3600,
    test_timeout_s=1800,
    max_testing=2,
)


@dataclass
class Backend:
    """Records drains, resumes and marks; `taken` are the nodes a person took over since."""

    name: str = "recording"
    calls: list[tuple[str, str]] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)
    refusing: bool = False

    def drain(self, request: DrainRequest) -> None:
        self.calls.append(("drain", request.node))

    def resume(self, request: DrainRequest) -> None:
        if self.refusing:
            raise BackendError(f"slurm: cannot resume {request.node}: Unable to contact slurm controller")
        self.calls.append(("resume", request.node))

    def holds(self, request: DrainRequest) -> bool:
        return request.node not in self.taken

    def mark(self, request: DrainRequest, health: str) -> None:
        self.calls.append((health, request.node))


@dataclass
class Trigger:
    name: str = "fake"
    started: list[tuple[str, tuple[str, ...], float]] = field(default_factory=list)
    broken: bool = False

    def start(self, node: str, checks: Sequence[str], now: float) -> None:
        if self.broken:
            raise BackendError(f"ssh: connect to host {node} port 22: Connection refused")
        self.started.append((node, tuple(checks), now))


@dataclass
class Results:
    """The `checks` table, as the reader sees it."""

    rows: list[CheckRow] = field(default_factory=list)

    def add(
        self, node: str, check: str, status: str, at: float, target: str = "", value: float = 0.0
    ) -> None:
        self.rows.append(CheckRow(node, check, target, status, value, "", 1.0, "{}", at, 1.0))

    def __call__(self, node: str, since: float, until: float) -> list[CheckRow]:
        return [row for row in self.rows if row.node == node and since <= row.started <= until]


@dataclass
class Fleet:
    controller: DrainController
    backend: Backend
    trigger: Trigger
    results: Results
    lifecycle: Lifecycle

    def passing(self, node: str, at: float) -> None:
        for check in POLICY.checks:
            self.results.add(node, check, "PASS", at)


def fleet(*nodes: str, mode: str = "auto", policy: LifecyclePolicy = POLICY) -> Fleet:
    """A controller that drained `nodes` (a critical GPU fault each) at DRAINED_AT, and its lifecycle."""
    backend, trigger, results = Backend(), Trigger(), Results()
    controller = DrainController(DrainPolicy(mode=mode), [backend], fleet_size=100)
    decisions = controller.step(firing(*(anomaly(node) for node in nodes)), DRAINED_AT)
    for decision in decisions:
        if decision.outcome == "pending":
            controller.approve(decision.decision_id, "ops", DRAINED_AT, firing(anomaly(decision.node)))
    assert sorted(controller.drained) == sorted(nodes)
    return Fleet(controller, backend, trigger, results, Lifecycle(policy, controller, trigger, results))


def alert_on(node: str, at: float = 0.0) -> Alert:
    labels = {"alertname": "FleetlensGpuFault", "node": node, "severity": "critical", "kind": "gpu_fault"}
    return Alert(fingerprint(labels), labels, {}, "firing", at)


def actions(rows: Sequence[ActionRow]) -> list[tuple[str, str, str]]:
    return [(row.action, row.node, row.outcome) for row in rows]


def test_a_drained_node_is_tested_once_test_after_s_has_passed() -> None:
    f = fleet("n1")

    assert f.lifecycle.step([], DRAINED_AT + 599) == []
    rows = f.lifecycle.step([], DRAINED_AT + 600)

    assert actions(rows) == [("test", "n1", "done")]
    assert f.trigger.started == [("n1", ("dcgm_diag", "remapped_rows"), DRAINED_AT + 600)]
    assert f.lifecycle.states["n1"].state == "testing"
    assert ("TESTING", "n1") in f.backend.calls


def test_a_node_whose_checks_all_pass_is_resumed_and_leaves_the_lifecycle() -> None:
    f = fleet("n1")
    f.lifecycle.step([], 700)
    f.results.add("n1", "dcgm_diag", "PASS", 710)

    assert f.lifecycle.step([], 720) == []  # remapped_rows has not reported yet
    f.results.add("n1", "remapped_rows", "WARN", 730, value=81.0)
    rows = f.lifecycle.step([], 740)

    assert actions(rows) == [("return", "n1", "done")]
    assert "remapped_rows WARN 81" in rows[0].reason
    assert ("resume", "n1") in f.backend.calls
    assert f.lifecycle.states == {} and f.controller.drained == {}


def test_one_failing_check_fails_the_node_with_a_ticket_carrying_the_evidence() -> None:
    f = fleet("n1")
    f.lifecycle.step([], 700)
    f.passing("n1", 710)
    f.results.add("n1", "dcgm_diag", "FAIL", 711, target="gpu:3", value=1.0)
    rows = f.lifecycle.step([], 720)

    assert actions(rows) == [("fail", "n1", "done")]
    assert "dcgm_diag gpu:3 FAIL 1 (threshold 1)" in rows[0].reason
    assert ("resume", "n1") not in f.backend.calls and ("EVICT", "n1") in f.backend.calls
    [ticket] = f.lifecycle.alerts
    assert (
        ticket.alertname == FAILED_ALERT and ticket.node == "n1" and ticket.labels["severity"] == "critical"
    )
    assert json.loads(ticket.annotations["evidence"])[0]["target"] == "gpu:3"


def test_results_from_before_the_test_do_not_count() -> None:
    f = fleet("n1")
    f.passing("n1", 650)  # light checks of the hourly schedule, before the test began
    f.lifecycle.step([], 700)

    assert f.lifecycle.step([], 800) == []
    assert f.lifecycle.states["n1"].state == "testing"


def test_results_missing_past_the_timeout_fail_the_node_naming_the_check() -> None:
    f = fleet("n1")
    f.lifecycle.step([], 700)
    f.results.add("n1", "dcgm_diag", "PASS", 710)

    assert f.lifecycle.step([], 700 + 1799) == []
    [row] = f.lifecycle.step([], 700 + 1800)

    assert (row.action, row.outcome) == ("fail", "done")
    assert "ERROR: no result from remapped_rows within 1800 s" in row.reason


def test_checks_that_pass_while_an_alert_fires_on_the_node_do_not_return_it() -> None:
    f = fleet("n1")
    f.lifecycle.step([], 700)
    f.passing("n1", 710)
    [row] = f.lifecycle.step([alert_on("n1")], 720)

    assert (row.action, row.outcome) == ("fail", "done")
    assert "FleetlensGpuFault" in row.reason
    assert f.controller.drained


def test_a_failed_node_is_retested_after_retest_after_s_and_its_own_ticket_does_not_block_it() -> None:
    f = fleet("n1")
    f.lifecycle.step([], 700)
    f.results.add("n1", "remapped_rows", "ERROR", 710)
    f.lifecycle.step([], 720)

    assert f.lifecycle.step(f.lifecycle.alerts, 720 + 3599) == []
    assert actions(f.lifecycle.step(f.lifecycle.alerts, 720 + 3600)) == [("test", "n1", "done")]
    assert f.lifecycle.alerts == []
    f.passing("n1", 4400)
    assert actions(f.lifecycle.step([], 4410)) == [("return", "n1", "done")]


def test_no_more_than_max_testing_nodes_are_tested_at_once_and_the_refusal_is_recorded_once() -> None:
    f = fleet("n1", "n2", "n3")
    rows = f.lifecycle.step([], 700)

    assert actions(rows) == [("test", "n1", "done"), ("test", "n2", "done"), ("test", "n3", "refused")]
    assert "at most 2 nodes testing at once" in rows[2].reason
    assert f.lifecycle.step([], 710) == []
    f.passing("n1", 720)
    assert actions(f.lifecycle.step([], 730)) == [("return", "n1", "done"), ("test", "n3", "done")]


def test_a_trigger_that_fails_is_recorded_and_tried_again_after_the_same_wait() -> None:
    f = fleet("n1")
    f.trigger.broken = True
    [row] = f.lifecycle.step([], 700)

    assert (row.action, row.outcome) == ("test", "failed") and "Connection refused" in row.reason
    assert f.lifecycle.states["n1"] == NodeState("drained", 700, f.lifecycle.states["n1"].reason)
    f.trigger.broken = False
    assert f.lifecycle.step([], 1299) == []
    assert actions(f.lifecycle.step([], 1300)) == [("test", "n1", "done")]


def test_a_node_someone_took_over_is_not_resumed_and_fleetlens_lets_go_of_it() -> None:
    f = fleet("n1")
    f.lifecycle.step([], 700)
    f.passing("n1", 710)
    f.backend.taken.add("n1")
    [row] = f.lifecycle.step([], 720)

    assert (row.action, row.outcome) == ("return", "refused")
    assert "no longer drained by fleetlens" in row.reason
    assert ("resume", "n1") not in f.backend.calls
    assert f.lifecycle.states == {} and f.controller.drained == {}


def test_a_resume_the_scheduler_refuses_is_retried_each_step_and_recorded_once() -> None:
    f = fleet("n1")
    f.lifecycle.step([], 700)
    f.passing("n1", 710)
    f.backend.refusing = True

    [row] = f.lifecycle.step([], 720)
    assert (row.action, row.outcome) == ("return", "failed") and "Unable to contact" in row.reason
    assert f.lifecycle.step([], 780) == []
    f.backend.refusing = False
    assert actions(f.lifecycle.step([], 840)) == [("return", "n1", "done")]


def test_dry_run_calls_no_trigger_and_no_backend_and_says_so() -> None:
    f = fleet("n1", mode="dry-run")
    rows = f.lifecycle.step([], 700)
    f.passing("n1", 710)
    rows += f.lifecycle.step([], 720)

    assert actions(rows) == [("test", "n1", "dry-run"), ("return", "n1", "dry-run")]
    assert f.trigger.started == [] and f.backend.calls == []


def test_in_approve_mode_only_a_person_starts_a_test() -> None:
    f = fleet("n1", mode="approve")

    assert f.lifecycle.step([], 10_000) == []
    [row] = f.lifecycle.test("n1", "alice", 10_000)

    assert (row.action, row.outcome) == ("test", "done") and "requested by alice" in row.reason
    with pytest.raises(DecisionError, match="being tested already"):
        f.lifecycle.test("n1", "alice", 10_001)
    with pytest.raises(DecisionError, match="has not drained n9"):
        f.lifecycle.test("n9", "alice", 10_001)


def test_a_node_a_person_undrained_leaves_the_lifecycle() -> None:
    f = fleet("n1")
    f.lifecycle.step([], 700)
    f.controller.undrain("n1", "bob", 710)
    f.passing("n1", 720)

    assert f.lifecycle.step([], 730) == []
    assert f.lifecycle.states == {}


def test_after_a_restart_the_states_come_back_from_the_audit() -> None:
    f = fleet("n1", "n2", "n3")
    history = [
        ActionRow(DRAINED_AT, "drain", node, "", f"fleetlens: gpu_fault {node}", "auto", "done", node)
        for node in ("n1", "n2", "n3")
    ]
    history += f.lifecycle.step([], 700)
    f.passing("n1", 710)
    f.results.add("n2", "dcgm_diag", "FAIL", 710)
    history += f.lifecycle.step([], 720)

    restarted = DrainController(DrainPolicy(mode="auto"), [f.backend], fleet_size=100)
    restarted.restore(history, 730)
    again = Lifecycle(POLICY, restarted, f.trigger, f.results)
    again.restore(history, 730)

    assert {node: s.state for node, s in again.states.items()} == {"n2": "failed", "n3": "testing"}
    assert again.states == f.lifecycle.states == lifecycle_states(history)
    assert set(standing(history)[0]) == {"n2", "n3"}


def test_the_lifecycle_refuses_a_policy_that_also_returns_healthy_nodes() -> None:
    controller = DrainController(DrainPolicy(return_after_healthy_s=600), [], fleet_size=10)

    with pytest.raises(AlertConfigError, match="return_after_healthy_s: must be null"):
        Lifecycle(POLICY, controller, Trigger(), Results())


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"max_testing": 0}, "lifecycle.max_testing: must be an integer >= 1"),
        ({"checks": []}, "lifecycle.checks: must be a non-empty list"),
        ({"checks": "dcgm_diag"}, "lifecycle.checks: must be a non-empty list"),
        ({"test_timeout_s": 0}, "lifecycle.test_timeout_s: must be > 0"),
        ({"retest_after_s": -1}, "lifecycle.retest_after_s: must be >= 0"),
        ({"test_after": 5}, r"unknown key\(s\) \['test_after'\]"),
    ],
)
def test_a_lifecycle_section_that_cannot_mean_what_it_says_is_refused(section: dict, message: str) -> None:
    with pytest.raises(AlertConfigError, match=message):
        parse_lifecycle_policy(section)


def test_a_lifecycle_section_is_parsed() -> None:
    policy = parse_lifecycle_policy(
        {"checks": ["dcgm_diag"], "max_testing": 1, "label_prefix": "example.com"}
    )

    assert policy == LifecyclePolicy(checks=("dcgm_diag",), max_testing=1, label_prefix="example.com")


def test_the_command_trigger_runs_its_argv_with_node_and_checks_substituted(tmp_path: Path) -> None:
    out = tmp_path / "argv"
    script = "import sys; open(sys.argv[1], 'w').write(' '.join(sys.argv[2:]))"
    CommandTrigger([sys.executable, "-c", script, str(out), "{node}", "--checks", "{checks}"]).start(
        "vela-001; rm -rf /", ("dcgm_diag", "remapped_rows"), 0.0
    )

    assert out.read_text() == "vela-001; rm -rf / --checks dcgm_diag,remapped_rows"
    unreachable = "import sys; print('ssh: no route to {node}', file=sys.stderr); sys.exit(255)"
    failing = CommandTrigger([sys.executable, "-c", unreachable])
    with pytest.raises(BackendError, match="exited with status 255: ssh: no route to vela-001"):
        failing.start("vela-001", ("dcgm_diag",), 0.0)
    with pytest.raises(BackendError, match=r"no lifecycle\.command is configured"):
        CommandTrigger([]).start("vela-001", ("dcgm_diag",), 0.0)


STATUSES = st.sampled_from(["PASS", "WARN", "FAIL", "ERROR"])
RESULT = st.tuples(st.sampled_from(["n1", "n2"]), st.sampled_from(["dcgm_diag", "remapped_rows"]), STATUSES)
STEP = st.tuples(
    st.integers(1, 2000),  # seconds since the last step
    st.lists(RESULT, max_size=4),  # results that arrive meanwhile
    st.sets(st.sampled_from(["n1", "n2"])),  # nodes with an alert firing at the step
)


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=25))
def test_no_sequence_of_results_and_alerts_returns_a_node_that_is_not_clean(steps: list) -> None:
    f = fleet("n1", "n2", policy=LifecyclePolicy(test_after_s=100, retest_after_s=300, test_timeout_s=900))
    now, began = DRAINED_AT, {}
    for advance, results, alerted in steps:
        for index, (node, check, status) in enumerate(results):
            f.results.add(node, check, status, now + (index + 1) * advance / (len(results) + 1))
        now += advance
        for row in f.lifecycle.step([alert_on(node) for node in sorted(alerted)], now):
            if row.action == "test" and row.outcome == "done":
                began[row.node] = row.ts
            if row.action == "return" and row.outcome == "done":
                latest = {(r.check, r.target): r.status for r in f.results(row.node, began[row.node], now)}
                assert set(latest.values()) <= {"PASS", "WARN"}, (row.node, latest)
                assert set(latest) == {("dcgm_diag", ""), ("remapped_rows", "")}
                assert row.node not in alerted

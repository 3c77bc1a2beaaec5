"""The drain controller's decisions and safety limits, on alerts the engine raises from anomalies.

The backend here records the calls it gets (the real Slurm and Kubernetes backends have their own tests
against real or recorded peers): what matters is which calls the controller makes, and which it never
makes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from alerts.drain import FLEET_ALERT, DrainController
from alerts.engine import AlertEngine
from alerts.errors import AlertConfigError, BackendError, DecisionError
from alerts.model import Alert, DrainRequest
from alerts.policy import DrainLimits, DrainPolicy, DrainRule, parse_policy
from analytics.evidence import Evidence, stored
from analytics.store.records import Anomaly
from analytics.xid_catalog import Action
from fleetlens.config import load_config
from fleetlens.errors import ConfigError
from tests.support.evidence import example


@dataclass
class RecordingBackend:
    name: str = "recording"
    calls: list[tuple[str, str, str]] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)

    def drain(self, request: DrainRequest) -> None:
        self._call("drain", request)

    def resume(self, request: DrainRequest) -> None:
        self._call("resume", request)

    def _call(self, verb: str, request: DrainRequest) -> None:
        if request.node in self.failing:
            raise BackendError(f"scontrol: node {request.node} unreachable")
        self.calls.append((verb, request.node, request.reason))


HARD_FAULT = example("gpu_fault", action=Action.RESET_GPU)  # what a double-bit ECC error's gpu_fault asks


def anomaly(
    node: str,
    kind: str = "gpu_fault",
    start: float = 0.0,
    severity: str = "critical",
    job: str = "",
    evidence: Evidence | None = None,
):
    """An open anomaly; a gpu_fault recommends a GPU reset unless `evidence` says otherwise."""
    if evidence is None:
        evidence = HARD_FAULT if kind == "gpu_fault" else example(kind)
    return Anomaly(
        f"{kind}/{node}/{start}",
        start,
        None,
        kind,
        node,
        "gpu:0" if kind == "gpu_fault" else "",
        job,
        severity,
        1.0,
        evidence,
        kind,
        "1",
    )


def straggler(node: str, job_slowdown: float, lost_gpu_hours: float = 1.0, start: float = 0.0) -> Anomaly:
    """A slow_node anomaly whose evidence says what it costs its job."""
    cost = example("slow_node", ratio=1.5, job_slowdown=job_slowdown, lost_gpu_hours=lost_gpu_hours)
    return anomaly(node, "slow_node", start, "warning", "llm", cost)


def firing(*anomalies: Anomaly, now: float = 10.0) -> list[Alert]:
    engine = AlertEngine()
    engine.evaluate(anomalies, now)
    return engine.firing


def fleet(n: int) -> list[str]:
    return [f"vela-{i:03d}" for i in range(1, n + 1)]


def controller(
    mode: str = "auto", fleet_size: int = 32, **policy: object
) -> tuple[DrainController, RecordingBackend]:
    backend = RecordingBackend()
    return DrainController(DrainPolicy(mode=mode, **policy), [backend], fleet_size), backend


def controller_with(policy: DrainPolicy) -> tuple[DrainController, RecordingBackend]:
    """A controller under `policy` as given (e.g. parsed from config), for a fleet of 32."""
    backend = RecordingBackend()
    return DrainController(policy, [backend], 32), backend


def test_dry_run_records_every_decision_and_calls_no_backend():
    drains, backend = controller("dry-run")
    actions = drains.step(firing(anomaly("vela-001")), now=10)
    actions += drains.undrain("vela-001", "sre", now=20)

    assert backend.calls == []
    assert [(a.action, a.node, a.outcome, a.mode) for a in actions] == [
        ("drain", "vela-001", "dry-run", "dry-run"),
        ("undrain", "vela-001", "dry-run", "dry-run"),
    ]
    assert actions[0].reason.startswith("fleetlens: gpu_fault ")


def test_a_hard_gpu_fault_drains_at_once_with_the_alert_in_the_reason():
    drains, backend = controller()
    alerts = firing(anomaly("vela-004"))
    [action] = drains.step(alerts, now=10)

    assert backend.calls == [("drain", "vela-004", f"fleetlens: gpu_fault {alerts[0].fingerprint}")]
    assert (action.action, action.outcome, action.decision_id) == ("drain", "done", action.decision_id)
    assert drains.step(alerts, now=20) == []  # drained already: nothing more to decide


def test_a_slow_node_drains_only_with_a_second_signal_or_after_it_fired_long_enough():
    drains, backend = controller()
    slow = straggler("vela-002", job_slowdown=0.2)
    assert drains.step(firing(slow, now=100), now=100) == []
    link = anomaly("vela-002", "link_down", start=90, severity="warning")
    [action] = drains.step(firing(slow, link, now=110), now=110)
    assert (action.node, action.outcome) == ("vela-002", "done")

    alone, backend = controller()
    assert alone.step(firing(slow, now=100), now=100) == []
    [late] = alone.step(firing(slow, now=100), now=100 + 600)  # fired at 100; after_s 600 for slow_node
    assert late.outcome == "done" and backend.calls[0][1] == "vela-002"


def test_a_storm_over_a_third_of_the_fleet_opens_the_breaker_drains_nothing_and_raises_one_fleet_alert():
    drains, backend = controller(fleet_size=32)
    storm = firing(*(anomaly(node) for node in fleet(10)))  # 31% of 32 nodes at once
    actions = drains.step(storm, now=10)

    assert backend.calls == []
    assert (actions[0].action, actions[0].outcome) == ("breaker", "open")
    assert {a.outcome for a in actions[1:]} == {"refused"} and len(actions) == 11
    assert all("circuit breaker" in a.reason for a in actions[1:])
    alert = drains.fleet_alert
    assert alert is not None and alert.alertname == FLEET_ALERT and alert.labels["severity"] == "critical"
    assert "10 of 32 nodes" in alert.annotations["summary"]

    assert drains.step(storm, now=20) == []  # the same refusals are not recorded again
    calm = firing(anomaly("vela-001"))
    [closed, drained] = drains.step(calm, now=400)
    assert (closed.action, closed.outcome) == ("breaker", "closed") and drained.outcome == "done"
    assert drains.fleet_alert is None


def test_limits_cap_nodes_at_once_share_of_fleet_per_job_and_per_hour():
    limits = DrainLimits(max_nodes=2, max_fraction=0.5, max_per_job=1, max_per_hour=3, breaker_fraction=1.0)
    drains, _ = controller(fleet_size=32, limits=limits)
    faults = firing(anomaly("vela-001"), anomaly("vela-002"), anomaly("vela-003"))
    actions = drains.step(faults, now=10)
    assert [a.outcome for a in actions] == ["done", "done", "refused"]
    assert "at most 2 nodes drained at once (2 are)" in actions[2].reason

    small, _ = controller(fleet_size=20, limits=DrainLimits(max_fraction=0.05, breaker_fraction=1.0))
    assert [a.outcome for a in small.step(faults, now=10)] == ["done", "refused", "refused"]

    per_job, _ = controller(limits=DrainLimits(max_per_job=1, max_fraction=1, breaker_fraction=1.0))
    slow = [straggler(node, job_slowdown=0.2) for node in ("vela-005", "vela-006")]
    outcomes = per_job.step(firing(*slow, now=100), now=100 + 600)  # slow_node alone: after firing 600 s
    assert [a.outcome for a in outcomes] == ["done", "refused"] and "per job" in outcomes[1].reason

    hourly, _ = controller(
        limits=DrainLimits(max_nodes=10, max_fraction=1, max_per_hour=1, breaker_fraction=1.0),
        return_after_healthy_s=0,
    )
    hourly.step(firing(anomaly("vela-007")), now=10)
    hourly.step([], now=20)  # healthy again: returned to service
    [refused] = hourly.step(firing(anomaly("vela-008")), now=30)
    assert "per hour" in refused.reason


def test_a_flapping_alert_never_drains_the_same_node_twice_inside_its_cooldown():
    drains, backend = controller(cooldown_s=3600, return_after_healthy_s=60)
    for minute in range(30):  # firing one minute, quiet the next two, over half an hour
        now = minute * 60.0
        drains.step(firing(anomaly("vela-009", start=now)) if minute % 3 == 0 else [], now=now)

    verbs = [verb for verb, *_ in backend.calls]
    assert verbs.count("drain") == 1 and verbs[:2] == ["drain", "resume"]  # back after a healthy minute


def test_approve_mode_waits_for_a_person_and_counts_waiting_drains_against_the_limits():
    drains, backend = controller(
        "approve", limits=DrainLimits(max_nodes=1, max_fraction=1, breaker_fraction=1)
    )
    faults = firing(anomaly("vela-001"), anomaly("vela-002"))
    [waiting, refused] = drains.step(faults, now=10)
    assert (waiting.outcome, refused.outcome) == ("pending", "refused") and backend.calls == []

    approval = drains.approve(waiting.decision_id, "alice", now=30, firing=faults)
    assert [(a.action, a.outcome) for a in approval] == [("approve", "approved"), ("drain", "done")]
    assert backend.calls == [("drain", "vela-001", backend.calls[0][2])]
    with pytest.raises(DecisionError, match="no drain decision"):
        drains.approve(waiting.decision_id, "bob", now=40, firing=faults)

    other, backend = controller("approve")
    [pending] = other.step(firing(anomaly("vela-003")), now=10)
    [denial] = other.deny(pending.decision_id, "alice", now=20)
    assert denial.outcome == "denied" and "alice" in denial.reason and backend.calls == []


def test_a_silenced_node_is_not_drained_and_a_failing_backend_is_recorded_and_retried_later():
    drains, backend = controller()
    alerts = firing(anomaly("vela-001"))
    [refused] = drains.step(alerts, now=10, muted={alerts[0].fingerprint: "silence-1"})
    assert refused.outcome == "refused" and "silenced by silence-1" in refused.reason and backend.calls == []

    backend.failing = {"vela-001"}
    [failed] = drains.step(alerts, now=20)
    assert failed.outcome == "failed" and "unreachable" in failed.reason
    [waiting] = drains.step(alerts, now=30)
    assert waiting.outcome == "refused" and "retrying" in waiting.reason
    backend.failing = set()
    [done] = drains.step(alerts, now=90)
    assert done.outcome == "done"


def test_a_restarted_controller_takes_up_its_drains_cooldowns_and_pending_approvals_from_the_audit():
    first, _ = controller("approve", limits=DrainLimits(max_nodes=5, max_fraction=1, breaker_fraction=1))
    faults = firing(anomaly("vela-001"), anomaly("vela-002"))
    rows = first.step(faults, now=10)
    rows += first.approve(rows[0].decision_id, "alice", now=20, firing=faults)

    second, backend = controller(
        "approve", limits=DrainLimits(max_nodes=5, max_fraction=1, breaker_fraction=1)
    )
    second.restore(rows, now=30)
    assert set(second.drained) == {"vela-001"} and [r.node for r in second.pending.values()] == ["vela-002"]
    second.approve(rows[1].decision_id, "bob", now=40, firing=faults)
    assert backend.calls[0][:2] == ("drain", "vela-002")


def test_a_policy_from_config_names_the_key_that_is_wrong():
    policy = parse_policy(
        {
            "mode": "auto",
            "rules": [{"kinds": ["gpu_fault"], "min_severity": "critical"}],
            "limits": {"max_nodes": 2},
        }
    )
    assert (
        policy.mode == "auto"
        and policy.limits.max_nodes == 2
        and policy.rules == (DrainRule(("gpu_fault",), "critical"),)
    )
    with pytest.raises(AlertConfigError, match=r"drain\.mode"):
        parse_policy({"mode": "yolo"})
    with pytest.raises(AlertConfigError, match=r"drain.limits: unknown key\(s\) \['max_drains'\]"):
        parse_policy({"limits": {"max_drains": 3}})
    with pytest.raises(AlertConfigError, match=r"drain.rules\[0\]: unknown key"):
        parse_policy({"rules": [{"kinds": ["x"], "after": 3}]})
    with pytest.raises(AlertConfigError, match="max_fraction"):
        parse_policy({"limits": {"max_fraction": 5}})


def test_under_the_default_rules_a_3_percent_straggler_is_alerted_but_not_drained_a_20_percent_one_is():
    drains, backend = controller_with(parse_policy({"mode": "auto"}))  # the config's defaults
    mild, costly = straggler("vela-003", job_slowdown=0.03), straggler("vela-004", job_slowdown=0.2)
    unknown = anomaly("vela-005", "slow_node", severity="warning", job="llm")  # written before the cost
    alerts = firing(mild, costly, unknown, now=100)
    assert {alert.node for alert in alerts} == {"vela-003", "vela-004", "vela-005"}  # all three alerted

    assert drains.step(alerts, now=100) == []  # slow_node alone: not before it fired 600 s
    [drained] = drains.step(alerts, now=100 + 600)

    assert (drained.node, drained.outcome) == ("vela-004", "done")
    assert "(severity warning, job_slowdown 20%, lost_gpu_hours 1)" in drained.reason
    assert [node for _, node, _ in backend.calls] == ["vela-004"]
    assert drains.step(alerts, now=100 + 3600) == []  # the others never meet the minimum


def test_a_drain_rule_minimum_covers_only_stragglers_that_say_they_cost_that_much():
    rule = DrainRule(("slow_node",), min_job_slowdown=0.05)

    assert rule.covers("slow_node", "warning", job_slowdown=0.05)
    assert not rule.covers("slow_node", "warning", job_slowdown=0.049)
    assert not rule.covers("slow_node", "warning", job_slowdown=None)  # no figure meets no minimum
    assert DrainRule(("slow_node",)).covers("slow_node", "warning", job_slowdown=None)
    assert DrainPolicy().rule_for("slow_node", "critical", 0.3).min_job_slowdown == 0.05


def test_a_policy_from_config_takes_a_job_slowdown_minimum_and_names_it_when_wrong():
    policy = parse_policy({"rules": [{"kinds": ["slow_node"], "after_s": 60, "min_job_slowdown": 0.1}]})
    assert policy.rules == (DrainRule(("slow_node",), after_s=60, min_job_slowdown=0.1),)

    for bad in (1.5, -0.1, "5%", True):
        with pytest.raises(AlertConfigError, match=r"drain.rules\[0\]: .*min_job_slowdown must be a fract"):
            parse_policy({"rules": [{"kinds": ["slow_node"], "min_job_slowdown": bad}]})
    with pytest.raises(AlertConfigError, match=r"drain.rules\[0\]: .*min_job_slowdown applies to slow_node"):
        parse_policy({"rules": [{"kinds": ["slow_node", "link_flap"], "min_job_slowdown": 0.05}]})


def test_the_default_rules_drain_a_gpu_fault_only_for_an_action_that_needs_the_node_out_of_service():
    limits = {"max_nodes": 8, "max_fraction": 1, "max_per_hour": 8, "breaker_fraction": 1}
    drains, backend = controller_with(parse_policy({"mode": "auto", "limits": limits}))  # default rules
    faults = {
        "vela-001": "reset_gpu",
        "vela-002": "reboot_node",
        "vela-003": "drain_for_inspection",
        "vela-004": "restart_job",  # a contained error: the job restarts, the node stays
        "vela-005": "none",
    }
    alerts = firing(
        *(
            anomaly(node, evidence=example("gpu_fault", action=Action(action)))
            for node, action in faults.items()
        ),
        anomaly("vela-006", evidence=stored("gpu_fault", "{}")),  # read from a row without an action
    )
    rows = drains.step(alerts, now=10) + drains.step(alerts, now=10 + 3600)  # at once, or never

    assert sorted(row.node for row in rows if row.outcome == "done") == ["vela-001", "vela-002", "vela-003"]
    assert any("(severity critical, action reboot_node)" in row.reason for row in rows)
    assert sorted(node for _, node, _ in backend.calls) == ["vela-001", "vela-002", "vela-003"]


def test_a_drain_rule_takes_actions_from_config_and_names_what_is_wrong():
    policy = parse_policy({"rules": [{"kinds": ["gpu_fault"], "actions": ["reboot_node"]}]})
    [rule] = policy.rules
    assert rule.actions == ("reboot_node",) and rule.covers("gpu_fault", "warning", action="reboot_node")
    assert not rule.covers("gpu_fault", "critical", action="reset_gpu")
    assert not rule.covers("gpu_fault", "critical")  # no action known matches no actions

    known = "none, restart_job, reset_gpu, reboot_node, drain_for_inspection"
    with pytest.raises(
        AlertConfigError, match=rf"drain.rules\[0\]: .*unknown action\(s\) \['reboot'\]; known: {known}"
    ):
        parse_policy({"rules": [{"kinds": ["gpu_fault"], "actions": ["reboot"]}]})
    with pytest.raises(AlertConfigError, match=r"drain.rules\[0\]: .*actions must be a list"):
        parse_policy({"rules": [{"kinds": ["gpu_fault"], "actions": "reset_gpu"}]})
    with pytest.raises(AlertConfigError, match=r"drain.rules\[0\]: .*actions apply to gpu_fault only"):
        parse_policy({"rules": [{"kinds": ["gpu_fault", "link_down"], "actions": ["reset_gpu"]}]})


def test_a_drain_rule_for_application_xids_is_refused_with_the_reason():
    with pytest.raises(
        AlertConfigError, match=r"drain.rules\[1\]: .*gpu_app_error is never drained: .*application"
    ):
        parse_policy(
            {"rules": [{"kinds": ["gpu_fault"]}, {"kinds": ["gpu_app_error"], "min_severity": "info"}]}
        )
    assert DrainPolicy().rule_for("gpu_app_error", "critical", None, "restart_job") is None


def test_a_config_file_sets_the_minimum_and_a_bad_one_is_refused_naming_the_key(tmp_path: Path):
    path = tmp_path / "fleetlens.yaml"
    path.write_text("drain: {rules: [{kinds: [slow_node], after_s: 300, min_job_slowdown: 0.1}]}\n")
    [rule] = load_config(path, env={}).drain.policy().rules
    assert (rule.kinds, rule.after_s, rule.min_job_slowdown) == (("slow_node",), 300, 0.1)
    assert load_config(env={}).drain.policy().rule_for("slow_node", "warning", 0.05) is not None

    path.write_text("drain: {rules: [{kinds: [gpu_fault]}, {kinds: [slow_node], min_job_slowdown: 5}]}\n")
    with pytest.raises(ConfigError, match=r"drain.rules\[1\]: .*min_job_slowdown must be a fraction in"):
        load_config(path, env={})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("drain: {return_after_healthy_s: -5}", r"drain.return_after_healthy_s: must be >= 0 seconds"),
        ("drain: {limits: {max_fraction: 0}}", r"drain.limits.max_fraction: must be a fraction in \(0, 1\]"),
        ("drain: {limits: {breaker_fraction: 0}}", r"drain.limits.breaker_fraction: must be a fraction in"),
        ("drain: {limits: {max_nodes: 0}}", r"drain.limits.max_nodes: must be >= 1 \(0 allows no drain"),
        ("drain: {limits: {max_per_hour: 0}}", r"drain.limits.max_per_hour: must be >= 1"),
        (
            "alerts: {rules: [{name: Hot, kinds: [gpu_throttle]}, {name: X, kinds: [gpu_fualt]}]}",
            r"alerts.rules\[1\]: unknown kind\(s\) \['gpu_fualt'\], which no detector reports; known: "
            r"congestion, dma_degraded, gpu_app_error, gpu_fault, gpu_throttle, link_down, link_flap, ",
        ),
        ("drain: {rules: [{kinds: [slow_nodes]}]}", r"drain.rules\[0\]: unknown kind\(s\) \['slow_nodes'\]"),
    ],
)
def test_alerting_config_that_cannot_mean_what_it_says_is_refused_in_one_line_naming_the_key(
    tmp_path: Path, text: str, message: str
):
    path = tmp_path / "fleetlens.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match=f"^config file {re.escape(str(path))}: {message}") as refused:
        load_config(path, env={})
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("retry_s", [0, -1, float("nan")])
def test_a_retry_wait_that_is_not_positive_is_refused(retry_s: float):
    with pytest.raises(AlertConfigError, match=r"^drain.retry_s: must be > 0 seconds"):
        parse_policy({"retry_s": retry_s})

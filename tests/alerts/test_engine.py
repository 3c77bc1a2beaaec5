"""The alert lifecycle on anomalies as the detection runner produces them: pending, firing, resolved,
resent while firing, muted by silences, grouped per node."""

from __future__ import annotations

import pytest

from alerts.engine import AlertEngine, change_rows
from alerts.errors import AlertConfigError
from alerts.policy import DrainPolicy
from alerts.rules import AlertRule, fingerprint, parse_rules
from alerts.silences import new_silence
from analytics.evidence import Evidence, stored, to_json
from analytics.store.records import Anomaly
from analytics.xid_catalog import Action
from tests.support.evidence import example

XID_79 = example("gpu_fault", xid_codes=(79,))


def anomaly(
    kind: str = "gpu_fault", node: str = "vela-007", start: float = 1000.0, **fields: object
) -> Anomaly:
    values: dict = dict(
        id=f"{kind}/{node}",
        start=start,
        end=None,
        kind=kind,
        node=node,
        component="gpu:3",
        job="",
        severity="critical",
        score=2.0,
        evidence=XID_79 if kind == "gpu_fault" else example(kind),
        detector=kind,
        detector_version="1",
    )
    return Anomaly(**{**values, **fields})


def states(engine_changes: list) -> list[tuple[str, str]]:
    return [(alert.alertname, alert.state) for alert in engine_changes]


def test_an_anomaly_fires_once_it_lasted_for_the_rule_and_resolves_when_it_closes():
    engine = AlertEngine([AlertRule("SlowNode", ("slow_node",), for_s=30)])
    slow = anomaly("slow_node", severity="warning", component="", job="llm")

    first = engine.evaluate([slow], now=1010)
    assert states(first.changes) == [("SlowNode", "pending")] and first.to_send == []
    assert engine.evaluate([slow], now=1020).changes == []
    fired = engine.evaluate([slow], now=1030)
    assert states(fired.changes) == [("SlowNode", "firing")] and fired.to_send == fired.changes
    resolved = engine.evaluate([], now=1100)
    assert states(resolved.changes) == [("SlowNode", "resolved")]
    assert resolved.to_send[0].ends_at == 1100 and resolved.to_send[0].starts_at == 1030


def test_alert_labels_identify_the_anomaly_and_annotations_carry_its_evidence():
    engine = AlertEngine()
    [alert] = engine.evaluate([anomaly()], now=1010).to_send

    assert alert.labels == {
        "alertname": "FleetlensGpuFault",
        "node": "vela-007",
        "kind": "gpu_fault",
        "severity": "critical",
        "component": "gpu:3",
    }
    assert alert.annotations["summary"] == "gpu_fault on vela-007 gpu:3"
    assert alert.annotations["evidence"] == to_json(XID_79)
    assert alert.fingerprint == fingerprint(alert.labels)


COST = example("slow_node", ratio=1.6, job_slowdown=0.314, lost_gpu_hours=2.43)


def straggler(evidence: Evidence = COST) -> Anomaly:
    """vela-012 slowing job run-42, its evidence saying what that costs (or not)."""
    return anomaly("slow_node", "vela-012", component="", job="run-42", severity="warning", evidence=evidence)


def test_a_slow_node_alert_states_what_the_straggler_costs_its_job():
    [alert] = AlertEngine().evaluate([straggler()], now=1100).to_send  # the default rules

    assert alert.annotations["summary"] == "vela-012 slows job run-42 by 31% (2.4 GPU-hours lost so far)"
    assert alert.annotations["description"].endswith("; the job's steps would be 31% shorter without it")
    assert alert.annotations["evidence"] == to_json(COST)
    assert alert.evidence == COST  # typed, for the drain policy


@pytest.mark.parametrize(
    "evidence",
    [
        example("slow_node", ratio=1.6),  # without the cost
        stored("slow_node", '{"job_slowdown": "31%", "lost_gpu_hours": null}'),  # not numbers
        example("slow_node", job_slowdown=1.5, lost_gpu_hours=-2),  # out of range
        stored("slow_node", "not json"),
        stored("slow_node", "[0.3]"),
    ],
)
def test_a_slow_node_alert_without_its_cost_reads_as_before(evidence: Evidence):
    [alert] = AlertEngine().evaluate([straggler(evidence)], now=1100).to_send

    assert alert.annotations["summary"] == "slow_node on vela-012"
    assert alert.annotations["description"] == (
        "detector slow_node reports slow_node on vela-012, severity warning, score 2"
    )


def test_a_configured_rule_may_use_the_cost_and_falls_back_to_the_default_without_it():
    [rule] = parse_rules(
        [
            {
                "name": "Straggler",
                "kinds": ["slow_node"],
                "annotations": {"cost": "{lost_gpu_hours} GPU-h", "description": "{job_slowdown} of {job}"},
            }
        ],
        "alerts.rules",
    )
    engine = AlertEngine([rule])
    [costed] = engine.evaluate([straggler()], now=1100).to_send
    assert (costed.annotations["cost"], costed.annotations["description"]) == ("2.4 GPU-h", "31% of run-42")
    assert costed.annotations["summary"].startswith("vela-012 slows job run-42 by 31%")  # its kind's default

    [half] = AlertEngine().evaluate([straggler(example("slow_node", job_slowdown=0.3))], now=1100).to_send
    assert half.annotations["summary"] == "slow_node on vela-012"  # uses both figures: falls back
    assert half.annotations["description"].endswith("would be 30% shorter without it")  # uses the one known

    [before] = AlertEngine([rule]).evaluate([straggler(example("slow_node", ratio=1.6))], now=1100).to_send
    assert "cost" not in before.annotations  # no default to fall back to: left out
    assert before.annotations["description"].startswith("detector slow_node reports slow_node")


def test_a_gpu_fault_alert_says_what_to_do_in_its_summary_and_description():
    evidence = example(
        "gpu_fault", xid_codes=(48, 63, 94), action=Action.RESET_GPU, action_text="ignored: ours is shown"
    )
    [alert] = AlertEngine().evaluate([anomaly(evidence=evidence)], now=1010).to_send

    assert alert.annotations["summary"] == (
        "gpu_fault on vela-007 gpu:3: drain the node and reset the GPU, then return it if the GPU stays clean"
    )
    assert alert.annotations["description"] == (
        "detector gpu_fault reports gpu_fault on vela-007 gpu:3, severity critical, score 2; recommended "
        "action: reset_gpu (drain the node and reset the GPU, then return it if the GPU stays clean)"
    )
    unknown = stored("gpu_fault", '{"signals": ["xid"], "action": "reboot"}')  # an action not known here
    [before] = AlertEngine().evaluate([anomaly(evidence=unknown)], now=1010).to_send
    assert before.annotations["summary"] == "gpu_fault on vela-007 gpu:3"  # no action known: as before


def test_application_xids_make_no_alert_under_the_default_rules():
    for severity in ("info", "critical"):  # the detector says info; no default rule covers the kind at all
        restart = example("gpu_app_error", action=Action.RESTART_JOB)
        app_error = anomaly("gpu_app_error", severity=severity, evidence=restart)
        assert AlertEngine().evaluate([app_error], now=1010).changes == []


def test_port_errors_alert_after_a_minute_and_drain_nothing_under_the_defaults():
    engine = AlertEngine()
    errors = anomaly("port_errors", severity="warning", component="mlx5_1:1")
    assert states(engine.evaluate([errors], now=1010).changes) == [("FleetlensPortErrors", "pending")]
    [alert] = engine.evaluate([errors], now=1060).to_send
    assert (alert.alertname, alert.labels["component"]) == ("FleetlensPortErrors", "mlx5_1:1")
    assert DrainPolicy().rule_for("port_errors", "warning") is None
    assert DrainPolicy().rule_for("port_errors", "critical") is None


def test_the_fingerprint_is_alertmanagers():
    # model.LabelSet{"alertname": "TestAlert", "instance": "localhost"} per prometheus/common's FNV-1a scheme,
    # computed independently byte by byte here
    labels = {"alertname": "TestAlert", "instance": "localhost"}
    digest = 14695981039346656037
    for byte in b"alertname\xffTestAlert\xffinstance\xfflocalhost\xff":
        digest = ((digest ^ byte) * 1099511628211) % 2**64
    assert fingerprint(labels) == f"{digest:016x}"
    assert fingerprint(dict(reversed(labels.items()))) == fingerprint(labels)


def test_a_pending_alert_whose_anomaly_closed_is_recorded_but_never_sent():
    engine = AlertEngine([AlertRule("Throttle", ("gpu_throttle",), for_s=120)])
    engine.evaluate([anomaly("gpu_throttle", severity="warning")], now=1010)
    gone = engine.evaluate([], now=1030)
    assert states(gone.changes) == [("Throttle", "resolved")] and gone.to_send == []


def test_a_firing_alert_is_resent_every_resend_interval_and_a_reopened_anomaly_is_the_same_alert():
    engine = AlertEngine(resend_s=60)
    fault = anomaly()
    sent = [len(engine.evaluate([fault], now=1000 + 10 * i).to_send) for i in range(13)]
    assert sent == [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1]

    first = engine.firing[0].fingerprint
    engine.evaluate([], now=2000)
    reopened = engine.evaluate([anomaly(start=2100)], now=2110)
    assert reopened.to_send[0].fingerprint == first


def test_a_silence_mutes_notifications_until_it_ends_then_the_firing_alert_is_sent():
    engine = AlertEngine()
    silence = new_silence(["node=vela-007", "kind=~gpu_.*"], 60, created_by="sre", comment="repair", now=1000)
    muted = engine.evaluate([anomaly()], now=1010, silences=[silence])
    assert states(muted.changes) == [("FleetlensGpuFault", "firing")]
    assert muted.to_send == [] and list(muted.muted.values()) == [silence.id]
    other = engine.evaluate([anomaly(), anomaly(node="vela-008")], now=1020, silences=[silence])
    assert [alert.node for alert in other.to_send] == ["vela-008"]
    after = engine.evaluate([anomaly(), anomaly(node="vela-008")], now=1070, silences=[silence])
    assert [alert.node for alert in after.to_send] == ["vela-007"]


def test_notifications_are_grouped_per_node_and_changes_become_alerts_rows():
    engine = AlertEngine()
    link = anomaly("link_down", component="mlx5_1:1", severity="warning")
    slow = anomaly("slow_node", node="vela-009", component="", severity="warning")  # pending for a minute
    evaluation = engine.evaluate([anomaly(), link, anomaly(node="vela-009"), slow], now=1010)
    groups = evaluation.by_node()
    assert sorted(groups) == ["vela-007", "vela-009"] and len(groups["vela-007"]) == 2

    rows = change_rows(evaluation.changes, 1010)
    assert {row.state for row in rows} == {"pending", "firing"}
    assert all(row.ts == 1010 and row.labels["node"] in ("vela-007", "vela-009") for row in rows)


def test_info_anomalies_make_no_alert_under_the_default_rules():
    assert AlertEngine().evaluate([anomaly("peer_outlier", severity="info")], now=1010).changes == []


def test_rules_from_config_name_the_entry_and_key_that_is_wrong():
    [rule] = parse_rules(
        [{"name": "Hot", "kinds": ["gpu_throttle"], "for_s": 30, "labels": {"team": "gpu"}}], "x"
    )
    assert rule.for_s == 30 and rule.labels == {"team": "gpu"}
    with pytest.raises(AlertConfigError, match=r"alerts.rules\[1\]: unknown key\(s\) \['for'\]"):
        parse_rules(
            [{"name": "A", "kinds": ["link_down"]}, {"name": "B", "kinds": ["link_down"], "for": 3}],
            "alerts.rules",
        )
    with pytest.raises(AlertConfigError, match=r"unknown field\(s\) \['host'\]"):
        parse_rules([{"name": "A", "kinds": ["x"], "annotations": {"summary": "{host}"}}], "alerts.rules")
    with pytest.raises(AlertConfigError, match="min_severity"):
        parse_rules([{"name": "A", "kinds": ["x"], "min_severity": "page"}], "alerts.rules")

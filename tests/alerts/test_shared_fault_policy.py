"""The drain policy's shared-fault settings and the alert of a shared fault, as an operator writes and
reads them: refused values name their key, and a shared fault's alert is routed by layer and parent."""

from __future__ import annotations

import pytest

from alerts.engine import AlertEngine
from alerts.errors import AlertConfigError
from alerts.policy import DrainPolicy, parse_policy
from alerts.rules import parse_rules
from analytics.evidence import SharedFaultEvidence
from analytics.store.records import Anomaly


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"hold_explained_s": -1}, "drain.hold_explained_s: must be >= 0 seconds"),
        ({"limits": {"max_drains_per_parent_per_hour": 0}}, "drain.limits.max_drains_per_parent_per_hour"),
        ({"rules": [{"kinds": ["shared_fault"]}]}, "shared_fault is never drained"),
    ],
)
def test_shared_fault_settings_that_cannot_mean_what_they_say_are_refused(section, message):
    with pytest.raises(AlertConfigError, match=message):
        parse_policy(section)


def test_the_shared_fault_settings_default_to_a_half_hour_hold_and_one_drain_per_parent_an_hour():
    policy = parse_policy({"hold_explained_s": 600, "limits": {"max_drains_per_parent_per_hour": 2}})
    assert (policy.hold_explained_s, policy.limits.max_drains_per_parent_per_hour) == (600, 2)
    assert (DrainPolicy().hold_explained_s, DrainPolicy().limits.max_drains_per_parent_per_hour) == (1800, 1)


def test_an_operator_rule_on_shared_faults_is_accepted_and_labels_by_layer_and_parent():
    [rule] = parse_rules([{"name": "LeafDown", "kinds": ["shared_fault"], "labels": {"team": "net"}}], "r")
    check = "leaf-07: link flaps on 8 of 8 nodes; check optics and switch logs"
    evidence = SharedFaultEvidence(
        layer="leaf", parent="leaf-07", n=8, k=8, fleet_nodes=16, fleet_anomalous=8, p_value=1e-5,
        log10_p_value=-5.0, tested=10, p_corrected=1e-4, children=(), anomalous_children=(), explains=(),
        kinds={"link_flap": 8}, dominant_kind="link_flap", check=check,
    )  # fmt: skip
    fault = Anomaly("f1", 0.0, None, "shared_fault", evidence.parent, evidence.layer, "", "warning", 7.0,
                    evidence, "shared_fault", "1")  # fmt: skip
    engine = AlertEngine([rule])
    engine.evaluate([fault], now=10.0)
    [alert] = engine.firing
    assert alert.labels == {
        "alertname": "LeafDown",
        "kind": "shared_fault",
        "severity": "warning",
        "layer": "leaf",
        "parent": "leaf-07",
        "team": "net",
    }
    assert alert.node == ""  # no drain reads it as a node's
    assert alert.annotations["summary"] == f"shared fault of leaf leaf-07: {check}"

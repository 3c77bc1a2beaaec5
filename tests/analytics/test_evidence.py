"""The evidence contract (analytics.evidence): every kind a detector declares has a class, every value a
class can hold crosses the store and back unchanged, and stored text that is not evidence this code writes
is refused with an error naming the kind and the field, which the readers of the store show in place of
the numbers rather than fail on."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analytics.detectors import registered
from analytics.detectors.runner import store_anomalies
from analytics.errors import AnalyticsError, EvidenceError
from analytics.evidence import (
    EVIDENCE,
    SlowNodeEvidence,
    Unreadable,
    as_dict,
    from_json,
    stored,
    to_json,
)
from analytics.reports import dashboards
from analytics.store import Store
from analytics.store.records import Anomaly
from tests.support.evidence import evidence_of, example

T0 = 1_750_000_000.0


def test_every_kind_a_detector_declares_has_an_evidence_class():
    declared = {kind for cls in registered().values() for kind in cls.kinds}
    assert declared <= set(EVIDENCE), f"kinds without an evidence class: {sorted(declared - set(EVIDENCE))}"
    assert all(kind == EVIDENCE[kind].KIND for kind in EVIDENCE)


@pytest.mark.parametrize("kind", sorted(EVIDENCE))
@settings(max_examples=60)
@given(data=st.data())
def test_any_evidence_crosses_the_store_and_back_unchanged(kind: str, data: st.DataObject) -> None:
    evidence = data.draw(evidence_of(EVIDENCE[kind]))
    text = to_json(evidence)
    assert from_json(kind, text) == evidence
    assert json.loads(text)["version"] == EVIDENCE[kind].VERSION


def test_text_written_before_evidence_was_versioned_reads_as_version_1():
    written = example("slow_node", ratio=1.2, job_slowdown=0.3)
    unversioned = json.dumps({k: v for k, v in json.loads(to_json(written)).items() if k != "version"})
    assert from_json("slow_node", unversioned) == written


def test_a_value_json_cannot_carry_is_refused_when_written():
    with pytest.raises(EvidenceError, match="slow_node"):
        to_json(example("slow_node", ratio=float("nan")))


VALID = to_json(example("slow_node", ratio=1.2))
HOSTILE = {  # stored text -> what the error names
    "truncated": (VALID[:-7], "slow_node evidence is not JSON"),
    "empty": ("", "slow_node evidence is not JSON"),
    "not an object": ("[1.2, 3]", "not a JSON object but list"),
    "wrong type": (VALID.replace('"ratio": 1.2', '"ratio": "1.2"'), "slow_node.ratio"),
    "bool for int": (VALID.replace('"peers": 0', '"peers": true'), "slow_node.peers"),
    "not finite": (VALID.replace('"ratio": 1.2', '"ratio": NaN'), "NaN is not a finite number"),
    "unknown version": (VALID.replace('"version": 1', '"version": 2'), "unknown version 2"),
    "extra field": (VALID.replace("{", '{"rm -rf": 1, ', 1), "slow_node: unknown field 'rm -rf'"),
    "missing field": (VALID.replace('"peers": 0, ', ""), "slow_node: missing field 'peers'"),
    "huge nesting": ("[" * 100_000 + "]" * 100_000, "slow_node evidence is not JSON"),
    "nested in a field": (
        VALID.replace('"ratio": 1.2', '"ratio": ' + "[" * 50 + "]" * 50),
        "slow_node.ratio",
    ),
    "huge text": (" " * 2_000_000 + VALID, "over 1,000,000 characters"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_stored_text_is_refused_naming_the_kind_and_the_field(case: str):
    text, named = HOSTILE[case]
    with pytest.raises(EvidenceError, match=None) as raised:
        from_json("slow_node", text)
    assert named in str(raised.value) and isinstance(raised.value, AnalyticsError)
    assert stored("slow_node", text) == Unreadable(error=str(raised.value))


def test_an_unknown_kind_is_refused_naming_it():
    with pytest.raises(EvidenceError, match="unknown anomaly kind 'volcano'"):
        from_json("volcano", "{}")


def test_a_nested_field_names_where_it_went_wrong():
    text = to_json(example("peer_outlier", peers=4)).replace('"features": []', '"features": [{"z": 1}]')
    with pytest.raises(EvidenceError, match=r"peer_outlier.features\[0\]: missing field 'feature'"):
        from_json("peer_outlier", text)


def test_the_anomalies_pages_show_a_hostile_row_as_its_error_and_the_others_as_they_are(store: Store):
    """The reader behind the Anomalies and Node pages (dashboards.anomalies) meets one good row and one
    row per hostile text: the page's table shows each hostile row's evidence as {"error": why} and no cost,
    the good row's evidence and cost as stored; nothing raises."""
    good = example("slow_node", ratio=1.3, job_slowdown=0.25, lost_gpu_hours=1.5, windows=2)

    def row(key: str, evidence: object) -> Anomaly:
        kind = "slow_node"
        return Anomaly(key, T0, None, kind, "vela-001", "", "llm", "warning", 0.3, evidence, kind, "2")  # type: ignore[arg-type]

    store_anomalies(store, [row("good", good)])
    store.insert_anomalies([row(case, text) for case, (text, _) in HOSTILE.items()], token="hostile")

    found = dashboards.anomalies(store, T0 - 60, T0 + 60).set_index("id")
    assert found.at["good", "evidence"] == good and found.at["good", "job_slowdown"] == 0.25
    hostile = found.drop(index="good")
    assert sorted(hostile.index) == sorted(HOSTILE)
    for case, evidence in hostile["evidence"].items():
        assert isinstance(evidence, Unreadable) and HOSTILE[case][1] in as_dict(evidence)["error"]
    assert hostile["job_slowdown"].isna().all() and pd.isna(hostile["lost_gpu_hours"]).all()


def test_the_fields_shown_leave_out_what_is_unknown():
    evidence = SlowNodeEvidence(**{**as_dict(example("slow_node")), "ratio": 1.5})
    assert "power_w" not in as_dict(evidence) and as_dict(evidence)["ratio"] == 1.5

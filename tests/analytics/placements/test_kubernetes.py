"""A v1 PodList read into placements: real-shaped pods of tests/support/kubeapi.py and hostile variants."""

from __future__ import annotations

import copy
import json
import logging
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics.errors import PlacementError
from analytics.placements.kubernetes import parse_pod_list
from analytics.store.records import Placement
from analytics.topology.model import Source
from tests.support.kubeapi import make_pod

STARTED, FINISHED = "2026-12-05T04:00:00Z", "2026-12-05T05:30:00Z"


def unix(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def pod_list(*pods: dict[str, Any]) -> str:
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(pods)})


def test_each_running_or_ended_pod_on_a_node_is_placed_under_its_workload() -> None:
    pods = [
        make_pod(
            "bert-worker-0", "ml", "vela-001", gpus=8, labels={"training.kubeflow.org/job-name": "bert"}
        ),
        make_pod("sweep-x7k2p", "ml", "vela-002", owner_kind="Job", finished=FINISHED, phase="Succeeded"),
        make_pod("web-5d8f9-abcde", "apps", "vela-003"),
        make_pod("queued-0", "ml", None, phase="Pending"),
        make_pod("bound-but-waiting", "ml", "vela-004", phase="Pending"),
    ]
    assert parse_pod_list(pod_list(*pods)) == [
        Placement(Source.KUBERNETES, "ml/bert", "", "vela-001", (), unix(STARTED), None),
        Placement(
            Source.KUBERNETES, "ml/sweep-x7k2p-owner", "", "vela-002", (), unix(STARTED), unix(FINISHED)
        ),
        Placement(Source.KUBERNETES, "apps/web-5d8f9-abcde", "", "vela-003", (), unix(STARTED), None),
    ]


def test_an_ended_pod_ends_when_its_last_container_finished() -> None:
    pod = make_pod("two", "ml", "vela-001", phase="Failed", finished="2026-12-05T04:10:00Z")
    later = copy.deepcopy(pod["status"]["containerStatuses"][0])
    later["state"]["terminated"]["finishedAt"] = "2026-12-05T04:20:00.5Z"
    pod["status"]["containerStatuses"].append(later)
    [placement] = parse_pod_list(pod_list(pod))
    assert placement.until == unix("2026-12-05T04:20:00.5Z")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("not json", "$"),
        ('{"kind": "NodeList", "items": []}', "$.kind"),
        ('{"kind": "PodList", "items": null}', "$.items"),
        ('[{"kind": "PodList"}]', "$.kind"),
    ],
)
def test_a_document_that_is_not_a_pod_list_is_refused_whole(text: str, where: str) -> None:
    with pytest.raises(PlacementError, match=rf"GET /api/v1/pods: {__import__('re').escape(where)}:"):
        parse_pod_list(text)


def spoil(path: str, value: Any) -> dict[str, Any]:
    pod = make_pod("bad", "ml", "vela-009", owner_kind="Job")
    *parents, last = path.split(".")
    target = pod
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[last] = value
    return pod


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("status.phase", "Exploded", "status.phase"),
        ("status.phase", 3, "status.phase"),
        ("spec.nodeName", "Vela 9; rm -rf /", "spec.nodeName"),
        ("spec.nodeName", ["vela-009"], "spec.nodeName"),
        ("metadata.namespace", "ML", "metadata.namespace"),
        ("metadata.name", "x" * 300, "metadata.name"),
        ("status.startTime", "yesterday", "status.startTime"),
        ("status.startTime", "2026-02-30T00:00:00Z", "status.startTime"),
        ("status.startTime", None, "status.startTime"),
        (
            "metadata.labels",
            {"training.kubeflow.org/job-name": "a b"},
            "metadata.labels[training.kubeflow.org/job-name]",
        ),
        (
            "metadata.ownerReferences",
            [{"kind": "Job", "controller": True, "name": 7}],
            "metadata.ownerReferences[0].name",
        ),
    ],
)
def test_one_pod_not_of_the_api_shape_is_skipped_naming_it_and_the_field_and_the_others_stay(
    path: str, value: Any, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    good = make_pod("good", "ml", "vela-001")
    with caplog.at_level(logging.WARNING, "fleetlens.placements"):
        placements = parse_pod_list(pod_list(spoil(path, value), good))
    assert [p.job for p in placements] == ["ml/good"]
    [warning] = caplog.messages
    assert warning.startswith("GET /api/v1/pods: $.items[0] (pod '") and f"): {field}" in warning


def test_an_ended_pod_that_finished_before_it_started_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    pod = make_pod("late", "ml", "vela-001", phase="Succeeded", finished="2026-12-05T03:00:00Z")
    assert parse_pod_list(pod_list(pod)) == []
    assert "before its start" in caplog.text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


@given(item=JSON, field=st.sampled_from(["metadata", "spec", "status", "name", "phase", "nodeName"]))
def test_any_json_in_place_of_a_pod_or_its_fields_never_costs_the_good_pod_its_placement(
    item: Any, field: str
) -> None:
    good = make_pod("good", "ml", "vela-001")
    hostile = make_pod("hostile", "ml", "vela-002")
    for part in (hostile, hostile["metadata"], hostile["spec"], hostile["status"]):
        if field in part:
            part[field] = item
    placements = parse_pod_list(pod_list(item, hostile, good))
    assert placements[-1].job == "ml/good"
    assert all(p.source is Source.KUBERNETES and p.node.startswith("vela-") for p in placements)

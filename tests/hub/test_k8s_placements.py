"""KubernetesPlacements against the loopback API server of tests/support/kubeapi.py: the pods bound to a
node are placed as the official client reads them, an ended pod ends, and a failed poll keeps what is
stored; a hub started with --k8s-placements finds the cluster through its kubeconfig."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from analytics.store import Store
from analytics.store.records import Placement
from analytics.topology.model import Source
from hub.placements import KubernetesPlacements
from tests.support.hubserver import hub_process, query_hub
from tests.support.kubeapi import FakeKubeApi, make_node, make_pod

STARTED = "2026-12-05T04:00:00Z"
SINCE = datetime.fromisoformat(STARTED).timestamp()
NOW = SINCE + 3600


def cluster() -> FakeKubeApi:
    return FakeKubeApi(
        [make_node("vela-001"), make_node("vela-002")],
        [
            make_pod(
                "bert-worker-0", "ml", "vela-001", gpus=8, labels={"training.kubeflow.org/job-name": "bert"}
            ),
            make_pod(
                "bert-worker-1", "ml", "vela-002", gpus=8, labels={"training.kubeflow.org/job-name": "bert"}
            ),
            make_pod("queued", "ml", None, phase="Pending"),
        ],
    )


def test_the_pods_bound_to_nodes_are_placed_and_one_that_ends_is_ended(store: Store) -> None:
    with cluster() as api:
        poller = KubernetesPlacements(store, api.api_client(), wall_clock=lambda: NOW)
        assert poller.check() is not None
        assert store.placements_between(0, NOW + 60) == [
            Placement(Source.KUBERNETES, "ml/bert", "", "vela-001", (), SINCE, None),
            Placement(Source.KUBERNETES, "ml/bert", "", "vela-002", (), SINCE, None),
        ]
        [listing] = api.calls("GET")
        assert listing.path == "/api/v1/pods" and listing.query["fieldSelector"] == ["spec.nodeName!="]

        api.pods["ml", "bert-worker-1"] = make_pod(
            "bert-worker-1", "ml", "vela-002", phase="Failed", finished="2026-12-05T04:30:00Z"
        )
        assert poller.check() is not None
        ended = {p.node: p.until for p in store.placements_between(0, NOW + 60)}
        assert ended == {"vela-001": None, "vela-002": SINCE + 1800}


@pytest.mark.parametrize(
    "failure",
    [
        lambda api: api.fail_next(
            "GET", "/api/v1/pods", 403, 'pods is forbidden: User "x" cannot list', "Forbidden"
        ),
        lambda api: api.fail_next("GET", "/api/v1/pods", 200, "a Status where a PodList belongs"),
        lambda api: api.__exit__(None, None, None),
    ],
    ids=["forbidden", "not-a-pod-list", "server-gone"],
)
def test_a_poll_that_fails_keeps_the_placements_stored(failure, store: Store) -> None:  # type: ignore[no-untyped-def]
    with cluster() as api:
        poller = KubernetesPlacements(store, api.api_client(), wall_clock=lambda: NOW)
        poller.check()
        before = store.placements_between(0, NOW + 60)
        failure(api)
        assert poller.check() is None
    assert store.placements_between(0, NOW + 60) == before
    assert [p.until for p in before] == [None, None]


def test_a_hub_started_with_k8s_placements_keeps_the_running_pods_in_its_store(tmp_path: Path) -> None:
    with cluster() as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                    "users": [{"name": "fake", "user": {"token": "t"}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
                    "current-context": "fake",
                }
            )
        )
        store = f"chdb://{tmp_path / 'hub-data'}"
        with hub_process(
            tmp_path, "--k8s-placements", store=store, env={"KUBECONFIG": str(kubeconfig)}
        ) as hub:
            deadline = time.monotonic() + 30  # its first poll runs as it starts
            while not (rows := placed_via_hub(hub.url)) and time.monotonic() < deadline:
                time.sleep(0.2)
    assert sorted(rows) == [["ml/bert", "vela-001"], ["ml/bert", "vela-002"]]


def placed_via_hub(url: str) -> list[list[str]]:
    sql = "SELECT job, node FROM placements FINAL WHERE source = 'k8s' AND valid_to IS NULL"
    return [[row["job"], row["node"]] for row in query_hub(url, sql)]


def test_a_hub_with_no_cluster_to_talk_to_fails_the_poll_naming_why(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert KubernetesPlacements(store).check() is None
    assert "k8s placements kept as they were: kubernetes: no cluster to talk to" in caplog.text
    assert str(tmp_path / "absent") in caplog.text

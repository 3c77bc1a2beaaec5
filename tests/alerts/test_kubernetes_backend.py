"""KubernetesBackend through the official kubernetes client.

No API server can be installed here, so the backend is tested against a local HTTP server that records
and answers the real API calls (tests/support/kubeapi.py): the paths, verbs, content types and bodies
asserted below are those a real API server receives, and the answers (409, 429, 404, 500 Status bodies)
are the ones it gives.
"""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import ApiClient, Configuration

from alerts.backends.kubernetes import KubernetesBackend
from alerts.drain import DrainController
from alerts.errors import AlertConfigError, BackendError
from alerts.model import DrainRequest
from alerts.policy import DrainPolicy
from fleetlens.alerting import drain_backends
from fleetlens.config import DrainConfig, load_config
from fleetlens.errors import ConfigError
from tests.alerts.test_drain import anomaly, firing
from tests.support.kubeapi import FakeKubeApi, RecordedRequest, make_node, make_pod
from tests.support.peers import hung_listener

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
FLEETLENS_TAINT_KEY = "fleetlens.io/unhealthy"


def request(node: str = "gpu-01", kind: str = "gpu_fault") -> DrainRequest:
    return DrainRequest(decision_id=uuid.uuid4().hex, node=node, kind=kind, alert_id=uuid.uuid4().hex[:16])


def kubeconfig_for(api: FakeKubeApi, folder: Path) -> Path:
    """A kubeconfig whose current context is `api`, as kubectl would read it."""
    kubeconfig = folder / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: lab\n"
        f"clusters: [{{name: lab, cluster: {{server: '{api.url}'}}}}]\n"
        "users: [{name: ops, user: {token: t}}]\n"
        "contexts: [{name: lab, context: {cluster: lab, user: ops}}]\n"
    )
    return kubeconfig


def node_patches(api: FakeKubeApi) -> list[RecordedRequest]:
    """The PATCHes of the Node object itself, not of its status."""
    return [call for call in api.calls("PATCH") if not call.path.endswith("/status")]


def training_pods() -> list[dict]:
    """What a GPU node runs: two training workers, the GPU DaemonSet, a static pod, a finished job."""
    return [
        make_pod("worker-0", "train", "gpu-01"),
        make_pod("worker-1", "train", "gpu-01", owner_kind="StatefulSet"),
        make_pod("dcgm-exporter-x7k2p", "gpu-operator", "gpu-01", owner_kind="DaemonSet"),
        make_pod("kube-proxy-gpu-01", "kube-system", "gpu-01", owner_kind="Node", mirror=True),
        make_pod("preflight-check", "train", "gpu-01", owner_kind="Job", phase="Succeeded"),
        make_pod("worker-2", "train", "gpu-02"),
    ]


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    nodes = [
        make_node("gpu-01", taints=[GPU_TAINT], labels={"nvidia.com/gpu.product": "H100"}, owner="team-a"),
        make_node("gpu-02"),
    ]
    with FakeKubeApi(nodes, training_pods(), pdb_protected={"worker-1"}) as served:
        yield served


def backend(api: FakeKubeApi, **options: object) -> KubernetesBackend:
    return KubernetesBackend(api_client=api.api_client(), **options)


def test_drain_cordons_taints_labels_and_annotates_with_one_patch_keeping_other_taints(
    api: FakeKubeApi,
) -> None:
    drain = request(kind="gpu_fault")
    backend(api).drain(drain)

    node = api.nodes["gpu-01"]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [
        GPU_TAINT,
        {"key": FLEETLENS_TAINT_KEY, "value": "gpu_fault", "effect": "NoSchedule"},
    ]
    assert node["metadata"]["labels"] == {"nvidia.com/gpu.product": "H100", "fleetlens.io/drained": "true"}
    assert node["metadata"]["annotations"] == {
        "owner": "team-a",
        "fleetlens.io/reason": drain.reason,
        "fleetlens.io/cordoned": "true",
    }
    assert [(call.method, call.path) for call in api.requests] == [
        ("GET", "/api/v1/nodes/gpu-01"),
        ("PATCH", "/api/v1/nodes/gpu-01"),
        ("PATCH", "/api/v1/nodes/gpu-01/status"),
        ("POST", "/api/v1/namespaces/default/events"),
    ]
    patch = api.calls("PATCH")[0]
    assert patch.content_type == "application/strategic-merge-patch+json"
    assert patch.body["metadata"]["resourceVersion"] == "1"


def test_drain_replaces_an_older_fleetlens_taint_and_honours_configured_keys(api: FakeKubeApi) -> None:
    drains = backend(api, taint_key="example.com/sick", label_key="example.com/out")
    drains.drain(request(kind="slow_node"))
    drains.drain(request(kind="gpu_fault"))

    node = api.nodes["gpu-01"]
    assert node["spec"]["taints"] == [
        GPU_TAINT,
        {"key": "example.com/sick", "value": "gpu_fault", "effect": "NoSchedule"},
    ]
    assert node["metadata"]["labels"]["example.com/out"] == "true"
    assert "fleetlens.io/drained" not in node["metadata"]["labels"]


def test_resume_undoes_exactly_what_drains_added(api: FakeKubeApi) -> None:
    before = copy.deepcopy(api.nodes["gpu-01"])
    drains = backend(api)
    drains.drain(request(kind="slow_node"))
    drains.drain(request(kind="gpu_fault"))
    drains.resume(request(kind="gpu_fault"))

    after = copy.deepcopy(api.nodes["gpu-01"])
    assert after["metadata"].pop("resourceVersion") != before["metadata"].pop("resourceVersion")
    assert [c["type"] for c in after.pop("status")["conditions"]] == ["Ready", "FleetlensHealthy"]
    before.pop("status")
    assert after == before
    uncordon = node_patches(api)[-1].body
    assert uncordon["spec"]["unschedulable"] is None  # null clears it, as kubectl uncordon sends


def test_resume_leaves_a_cordon_that_a_person_set_before_the_drain(api: FakeKubeApi) -> None:
    api.nodes["gpu-01"]["spec"]["unschedulable"] = True
    drains = backend(api)
    drains.drain(request())
    drains.resume(request())

    node = api.nodes["gpu-01"]
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == [GPU_TAINT]
    assert node["metadata"]["labels"] == {"nvidia.com/gpu.product": "H100"}
    assert node["metadata"]["annotations"] == {"owner": "team-a"}


def test_a_taint_written_between_read_and_patch_is_kept(api: FakeKubeApi) -> None:
    maintenance = {"key": "example.com/maintenance", "value": "fw-update", "effect": "NoSchedule"}
    api.write_before_next_patch("gpu-01", lambda node: node["spec"]["taints"].append(maintenance))

    backend(api).drain(request())

    assert [taint["key"] for taint in api.nodes["gpu-01"]["spec"]["taints"]] == [
        "nvidia.com/gpu",
        "example.com/maintenance",
        FLEETLENS_TAINT_KEY,
    ]
    assert [call.method for call in api.requests] == ["GET", "PATCH", "GET", "PATCH", "PATCH", "POST"]


def test_eviction_moves_workload_pods_only_through_the_eviction_api(api: FakeKubeApi) -> None:
    api.pdb_protected.clear()
    backend(api, evict=True, grace_period_s=30).drain(request())

    listing = api.calls("GET")[-1]
    assert (listing.path, listing.query) == ("/api/v1/pods", {"fieldSelector": ["spec.nodeName=gpu-01"]})
    evictions = {call.path: call.body for call in api.calls("POST") if call.path.endswith("/eviction")}
    assert evictions == {
        f"/api/v1/namespaces/train/pods/{name}/eviction": {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": "train"},
            "deleteOptions": {"gracePeriodSeconds": 30},
        }
        for name in ("worker-0", "worker-1")
    }
    assert sorted(api.pods) == [
        ("gpu-operator", "dcgm-exporter-x7k2p"),
        ("kube-system", "kube-proxy-gpu-01"),
        ("train", "preflight-check"),
        ("train", "worker-2"),
    ]


def test_a_pod_its_disruption_budget_protects_stays_and_is_reported_while_the_node_stays_cordoned(
    api: FakeKubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="alerts.backends.kubernetes"):
        backend(api, evict=True).drain(request())

    assert ("train", "worker-1") in api.pods
    assert ("train", "worker-0") not in api.pods
    assert api.nodes["gpu-01"]["spec"]["unschedulable"] is True
    [warning] = caplog.records
    assert "gpu-01" in warning.getMessage()
    assert (
        "train/worker-1: Cannot evict pod as it would violate the pod's disruption budget"
        in warning.getMessage()
    )
    assert "worker-0" not in warning.getMessage()


def test_a_pod_gone_before_its_eviction_is_not_an_error(api: FakeKubeApi) -> None:
    api.pdb_protected.clear()
    eviction = "/api/v1/namespaces/train/pods/worker-0/eviction"
    api.fail_next("POST", eviction, 404, 'pods "worker-0" not found', reason="NotFound")

    backend(api, evict=True).drain(request())

    assert ("train", "worker-1") not in api.pods


def test_an_unknown_node_is_a_backend_error_naming_it_and_the_404(api: FakeKubeApi) -> None:
    with pytest.raises(
        BackendError, match=r"gpu-99: GET /api/v1/nodes/gpu-99 at http://127\.0\.0\.1:\d+ answered 404"
    ):
        backend(api).drain(request(node="gpu-99"))
    with pytest.raises(BackendError, match='nodes "gpu-99" not found'):
        backend(api).resume(request(node="gpu-99"))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("PATCH", "/api/v1/nodes/gpu-01"),
        ("GET", "/api/v1/pods"),
        ("POST", "/api/v1/namespaces/train/pods/worker-0/eviction"),
    ],
)
def test_an_api_server_error_is_a_backend_error_naming_the_call_and_the_answer(
    api: FakeKubeApi, method: str, path: str
) -> None:
    api.fail_next(method, path, 500, "etcdserver: request timed out")

    with pytest.raises(
        BackendError, match=rf"gpu-01: {method} {path}.* answered 500 .*: etcdserver: request timed out"
    ):
        backend(api, evict=True).drain(request())


def test_a_hung_api_server_is_a_backend_error_not_a_hang() -> None:
    with hung_listener() as address:
        client = ApiClient(Configuration(host=f"http://{address}"))
        drains = KubernetesBackend(api_client=client, timeout_s=0.3)
        with pytest.raises(
            BackendError, match=rf"gpu-01: GET /api/v1/nodes/gpu-01 at http://{address} got no answer"
        ):
            drains.drain(request())


def test_without_a_client_it_uses_kubeconfig(
    api: FakeKubeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_for(api, tmp_path)))

    KubernetesBackend().drain(request())

    assert api.nodes["gpu-01"]["spec"]["unschedulable"] is True


def test_without_a_client_or_kubeconfig_it_is_a_config_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(missing))

    with pytest.raises(AlertConfigError, match=f"kubeconfig {missing}"):
        KubernetesBackend()


def test_the_lifecycle_labels_gpuhealth_evict_testing_then_pass_as_autopilot_does(api: FakeKubeApi) -> None:
    nodes = backend(api, health_label_prefix="autopilot.ibm.com")
    gpuhealth = lambda: api.nodes["gpu-01"]["metadata"]["labels"].get("autopilot.ibm.com/gpuhealth")  # noqa: E731
    seen = []
    for step in (
        nodes.drain,
        lambda r: nodes.mark(r, "TESTING"),
        lambda r: nodes.mark(r, "EVICT"),
        nodes.resume,
    ):
        step(request())
        seen.append(gpuhealth())

    assert seen == ["EVICT", "TESTING", "EVICT", "PASS"]
    labels = node_patches(api)[1].body["metadata"]["labels"]
    assert labels == {"autopilot.ibm.com/gpuhealth": "TESTING"}  # a mark touches that label alone
    assert "fleetlens.io/drained" not in api.nodes["gpu-01"]["metadata"]["labels"]


def test_without_a_prefix_no_gpuhealth_label_is_written(api: FakeKubeApi) -> None:
    nodes = backend(api)
    nodes.drain(request())
    nodes.mark(request(), "TESTING")

    assert not any(key.endswith("/gpuhealth") for key in api.nodes["gpu-01"]["metadata"]["labels"])
    assert len(node_patches(api)) == 1


def test_holds_tells_whether_fleetlens_s_taint_is_still_on_the_node(api: FakeKubeApi) -> None:
    nodes = backend(api)
    nodes.drain(request())
    assert nodes.holds(request())

    node = api.nodes["gpu-01"]
    node["spec"]["taints"] = [
        t for t in node["spec"]["taints"] if t["key"] != FLEETLENS_TAINT_KEY
    ]  # kubectl taint -
    assert not nodes.holds(request())
    assert not nodes.holds(request("gpu-02"))


@pytest.mark.parametrize("effect", ["NoSchedule", "PreferNoSchedule", "NoExecute"])
def test_the_taint_effect_and_key_come_from_the_config_file(
    api: FakeKubeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, effect: str
) -> None:
    config = tmp_path / "fleetlens.yaml"
    config.write_text(
        "drain: {backend: kubernetes, kubernetes_taint_key: example.com/gpu-sick, "
        f"kubernetes_taint_effect: {effect}}}\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig_for(api, tmp_path)))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    [drains] = drain_backends(load_config(config, env={}).drain)
    drains.drain(request())

    assert api.nodes["gpu-01"]["spec"]["taints"][-1] == {
        "key": "example.com/gpu-sick",
        "value": "gpu_fault",
        "effect": effect,
    }


def test_an_effect_kubernetes_does_not_have_is_refused_naming_the_key(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    config = tmp_path / "fleetlens.yaml"
    config.write_text("drain: {backend: kubernetes, kubernetes_taint_effect: NoEvict}\n")
    with pytest.raises(
        ConfigError, match=r"drain.kubernetes_taint_effect: 'NoEvict' is not one of NoSchedule"
    ):
        load_config(config, env={})
    with pytest.raises(ConfigError, match=r"drain.kubernetes_taint_effect: 'noschedule' is not one of"):
        DrainConfig(backend="kubernetes", kubernetes_taint_effect="noschedule")  # type: ignore[arg-type]
    with pytest.raises(AlertConfigError, match=r"drain.kubernetes_taint_effect: 'Evict' is not one of"):
        backend(api, taint_effect="Evict")
    assert api.requests == []


def test_drain_and_resume_write_the_fleetlens_healthy_condition_and_an_event_on_the_node(
    api: FakeKubeApi,
) -> None:
    drain = DrainRequest(
        "d1", "gpu-01", "gpu_fault", "a1b2c3", "llm", "critical", {"action": "reset_gpu", "xid": "48"}
    )
    nodes = backend(api)
    nodes.drain(drain)

    [status_patch] = [call for call in api.calls("PATCH") if call.path == "/api/v1/nodes/gpu-01/status"]
    assert status_patch.content_type == "application/strategic-merge-patch+json"
    [condition] = status_patch.body["status"]["conditions"]
    evidence = "fleetlens: gpu_fault a1b2c3 (severity critical, action reset_gpu, xid 48)"
    assert {k: condition[k] for k in ("type", "status", "reason", "message")} == {
        "type": "FleetlensHealthy",
        "status": "False",
        "reason": "GpuFault",
        "message": evidence,
    }
    conditions = {c["type"]: c for c in api.nodes["gpu-01"]["status"]["conditions"]}
    assert conditions["Ready"]["status"] == "True"  # merged by type: the kubelet's condition stays
    [(where, drained)] = api.events.items()
    assert where[0] == "default" and where[1].startswith("gpu-01.")
    assert drained["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-01",
        "uid": "gpu-01-uid",
    }
    assert (drained["type"], drained["reason"], drained["message"]) == (
        "Warning",
        "FleetlensDrained",
        evidence,
    )
    assert (drained["source"], drained["count"]) == ({"component": "fleetlens"}, 1)

    nodes.resume(drain)

    healthy = {c["type"]: c for c in api.nodes["gpu-01"]["status"]["conditions"]}["FleetlensHealthy"]
    assert (healthy["status"], healthy["reason"]) == ("True", "FleetlensResumed")
    assert healthy["message"] == "fleetlens: gpu_fault a1b2c3: resumed"
    resumed = [event for event in api.events.values() if event["reason"] == "FleetlensResumed"]
    assert [(event["type"], event["involvedObject"]["kind"]) for event in resumed] == [("Normal", "Node")]


def test_an_event_the_api_refuses_is_a_warning_not_a_failed_drain(
    api: FakeKubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    api.fail_next(
        "POST", "/api/v1/namespaces/default/events", 403, 'events is forbidden: User "x"', "Forbidden"
    )
    with caplog.at_level(logging.WARNING, logger="alerts.backends.kubernetes"):
        assert backend(api).drain(request()) is None

    assert api.nodes["gpu-01"]["spec"]["unschedulable"] is True
    [warning] = caplog.records
    assert "event FleetlensDrained not recorded" in warning.getMessage()
    assert "403 Forbidden" in warning.getMessage()


HOSTILE = "line one\nline two\r\x00\x1b[31m\u202e" + "x" * 10_240


def test_hostile_evidence_is_bounded_and_travels_escaped_in_json(api: FakeKubeApi) -> None:
    drain = DrainRequest("d1", "gpu-01", "gpu_fault\n</script>", "a1", "llm", "critical", {"note": HOSTILE})
    backend(api).drain(drain)

    [condition] = [c for c in api.nodes["gpu-01"]["status"]["conditions"] if c["type"] == "FleetlensHealthy"]
    [event] = api.events.values()
    assert condition["reason"] == "GpuFaultScript"
    for message in (condition["message"], event["message"]):
        assert len(message) == 1024 and message.endswith("\u2026")
        assert "line one\nline two\r\x00\x1b[31m\u202e" in message  # JSON carried each character, escaped


@pytest.mark.parametrize(
    ("labels", "annotations", "holder"),
    [
        (
            {"autopilot.ibm.com/gpuhealth": "EVICT"},
            {},
            "IBM Autopilot (label autopilot.ibm.com/gpuhealth=EVICT)",
        ),
        (
            {"dgxc.nvidia.com/nvsentinel-state": "quarantined"},
            {},
            "NVIDIA NVSentinel (label dgxc.nvidia.com/nvsentinel-state=quarantined)",
        ),
        (
            {
                "k8saas.nvidia.com/cordon-by": "NVSentinel",
                "k8saas.nvidia.com/cordon-reason": "GPU-fatal-error-ruleset",
            },
            {},
            "NVIDIA NVSentinel (label k8saas.nvidia.com/cordon-by=NVSentinel)",
        ),
        (
            {},
            {"quarantineHealthEvent": '{"checkName":"GpuXidError"}'},
            "NVIDIA NVSentinel (annotation quarantineHealthEvent)",
        ),
    ],
)
def test_a_node_another_tool_holds_is_left_alone_and_reported(
    api: FakeKubeApi, caplog: pytest.LogCaptureFixture, labels: dict, annotations: dict, holder: str
) -> None:
    node = api.nodes["gpu-01"]
    node["spec"]["unschedulable"] = True
    node["metadata"]["labels"] |= labels
    node["metadata"]["annotations"] |= annotations
    before = copy.deepcopy(node)

    with caplog.at_level(logging.WARNING, logger="alerts.backends.kubernetes"):
        assert backend(api, evict=True).drain(request()) == holder

    assert api.nodes["gpu-01"] == before
    assert [(call.method, call.path) for call in api.requests] == [("GET", "/api/v1/nodes/gpu-01")]
    [warning] = caplog.records
    assert f"gpu-01 is held already by {holder}" in warning.getMessage()


@pytest.mark.parametrize("gpuhealth", ["PASS", "TESTING", "WARN", ""])
def test_autopilot_labels_that_do_not_hold_the_node_do_not_stop_a_drain(
    api: FakeKubeApi, gpuhealth: str
) -> None:
    api.nodes["gpu-01"]["metadata"]["labels"]["autopilot.ibm.com/gpuhealth"] = gpuhealth
    assert backend(api).drain(request()) is None
    assert api.nodes["gpu-01"]["spec"]["unschedulable"] is True


def test_the_evict_label_fleetlens_s_own_lifecycle_wrote_does_not_count_as_autopilot_s(
    api: FakeKubeApi,
) -> None:
    nodes = backend(api, health_label_prefix="autopilot.ibm.com")
    nodes.drain(request(kind="slow_node"))
    assert nodes.drain(request(kind="gpu_fault")) is None
    assert api.nodes["gpu-01"]["spec"]["taints"][-1]["value"] == "gpu_fault"


def test_the_controller_records_a_node_another_tool_holds_as_drained_by_other_and_asks_again_later(
    api: FakeKubeApi,
) -> None:
    api.nodes["gpu-01"]["metadata"]["labels"]["dgxc.nvidia.com/nvsentinel-state"] = "draining"
    drains = DrainController(DrainPolicy(mode="auto"), [backend(api)], fleet_size=32)
    alerts = firing(anomaly("gpu-01"))

    [held] = drains.step(alerts, now=10)
    assert (held.action, held.outcome) == ("drain", "drained-by-other")
    assert held.reason.endswith(
        ": kubernetes: held by NVIDIA NVSentinel (label dgxc.nvidia.com/nvsentinel-state=draining)"
    )
    assert "gpu-01" not in drains.drained  # not fleetlens's: never resumed by it, not counted as its drain
    [waiting] = drains.step(alerts, now=20)
    assert (waiting.outcome, waiting.reason) == (
        "refused",
        "asking again after 60 s: another tool held the node",
    )

    del api.nodes["gpu-01"]["metadata"]["labels"]["dgxc.nvidia.com/nvsentinel-state"]  # NVSentinel let go
    [drained] = drains.step(alerts, now=80)
    assert drained.outcome == "done" and "gpu-01" in drains.drained

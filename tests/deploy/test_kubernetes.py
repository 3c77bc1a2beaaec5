"""deploy/kubernetes/ as a cluster would take it: each object valid against Kubernetes 1.33's schemas in
strict mode (kubernetes-validate) and the ServiceMonitors against prometheus-operator's CRD schema; the
ClusterRole granting exactly the requests the drain backend and the placement poller make; the pods'
arguments and environment read by the real CLI and config loader, ports and probes on the defaults."""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from alerts.backends.kubernetes import KubernetesBackend
from alerts.model import DrainRequest
from fleetlens.cli import build_parser
from fleetlens.config import Config, ExporterConfig, HubConfig, load_config, load_exporter_config
from hub.placements import KubernetesPlacements
from tests.support.kubeapi import FakeKubeApi, RecordedRequest, make_node, make_pod

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
KUSTOMIZATION = MANIFESTS / "kustomization.yaml"
SERVICE_MONITOR_CRD = Path(__file__).parent / "data" / "monitoring.coreos.com_servicemonitors.yaml"
KUBERNETES_VERSION = "1.33.0"
CUSTOM_API_GROUPS = ("monitoring.coreos.com/",)
# /api/v1[/namespaces/NS]/RESOURCE[/NAME[/SUBRESOURCE]]: the core group's paths, as the API server's
# request info splits them into a verb, a resource and a subresource for RBAC
CORE_PATH = re.compile(
    r"^/api/v1(?:/namespaces/[^/]+)?/(?P<resource>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[a-z]+))?)?$"
)
METHOD_VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
NODE_NAME = "gpu-01"


def manifest_files() -> list[Path]:
    return sorted(path for path in MANIFESTS.glob("*.yaml") if path != KUSTOMIZATION)


def objects() -> list[dict[str, Any]]:
    """Every object in deploy/kubernetes/, in file order."""
    return [doc for path in manifest_files() for doc in yaml.safe_load_all(path.read_text()) if doc]


def one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [doc for doc in objects() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return found


def builtin_objects() -> list[dict[str, Any]]:
    return [doc for doc in objects() if not doc["apiVersion"].startswith(CUSTOM_API_GROUPS)]


def object_id(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def test_kustomization_applies_every_manifest_file() -> None:
    listed = yaml.safe_load(KUSTOMIZATION.read_text())["resources"]
    assert sorted(listed) == [path.name for path in manifest_files()]


@pytest.mark.parametrize("doc", builtin_objects(), ids=object_id)
def test_object_is_valid_kubernetes_1_33_in_strict_mode(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_strict_validation_refuses_a_misspelt_field() -> None:
    """The check above can fail: a field Kubernetes does not know is refused, not ignored."""
    daemonset = copy.deepcopy(one("DaemonSet", "fleetlens-exporter"))
    container(daemonset)["readOnlyRootFilesytem"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFilesytem"):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)


def strict(schema: Any) -> Any:
    """The CRD's schema refusing unknown fields, as the API server's strict field validation does: every
    object schema with properties and no additionalProperties or preserve-unknown-fields is closed."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: strict(value) for key, value in schema.items()}
    if "properties" in schema:
        closed["properties"] = {name: strict(value) for name, value in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            closed["additionalProperties"] = False
    return closed


def service_monitor_validator() -> jsonschema.Validator:
    crd = yaml.safe_load(SERVICE_MONITOR_CRD.read_text())
    (v1,) = [version for version in crd["spec"]["versions"] if version["name"] == "v1"]
    return jsonschema.Draft7Validator(strict(v1["schema"]["openAPIV3Schema"]))


def service_monitors() -> list[dict[str, Any]]:
    return [doc for doc in objects() if doc["kind"] == "ServiceMonitor"]


@pytest.mark.parametrize("doc", service_monitors(), ids=object_id)
def test_service_monitor_is_valid_against_prometheus_operators_crd(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    service_monitor_validator().validate(doc)


def test_crd_validation_refuses_a_misspelt_field() -> None:
    monitor = copy.deepcopy(service_monitors()[0])
    monitor["spec"]["endpoints"][0]["scrapeIntervall"] = "10s"
    with pytest.raises(jsonschema.ValidationError, match="scrapeIntervall"):
        service_monitor_validator().validate(monitor)


@pytest.mark.parametrize("doc", service_monitors(), ids=object_id)
def test_service_monitor_selects_its_service_and_a_named_port(doc: dict[str, Any]) -> None:
    services = [
        service
        for service in objects()
        if service["kind"] == "Service"
        and doc["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    ]
    assert len(services) == 1, f"{object_id(doc)} selects {[object_id(s) for s in services]}"
    port_names = {port["name"] for port in services[0]["spec"]["ports"]}
    assert {endpoint["port"] for endpoint in doc["spec"]["endpoints"]} <= port_names


def rbac_request(request: RecordedRequest) -> tuple[str, str, str]:
    """(verb, resource, subresource) that the API server authorizes `request` as."""
    match = CORE_PATH.match(request.path)
    assert match, f"{request.method} {request.path} is not a core API path this test can map"
    if request.method == "GET":
        verb = "get" if match["name"] else "watch" if request.query.get("watch") else "list"
    else:
        verb = METHOD_VERBS[request.method]
    return verb, match["resource"], match["sub"] or ""


def granted() -> set[tuple[str, str, str]]:
    """What the hub's ClusterRole grants, one (verb, resource, subresource) each; no wildcard, no
    resource names, no other API group."""
    role = one("ClusterRole", "fleetlens-hub")
    grants = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule
        assert rule["apiGroups"] == [""], rule
        for resource in rule["resources"]:
            name, _, sub = resource.partition("/")
            grants |= {(verb, name, sub) for verb in rule["verbs"]}
    assert not any("*" in part for grant in grants for part in grant), grants
    return grants


@pytest.fixture
def cluster() -> Iterator[FakeKubeApi]:
    pods = [
        make_pod("worker-0", "train", NODE_NAME, gpus=8),
        make_pod("dcgm-exporter-x7k2p", "gpu-operator", NODE_NAME, owner_kind="DaemonSet"),
        make_pod("worker-1", "train", "gpu-02", gpus=8),
    ]
    with FakeKubeApi([make_node(NODE_NAME), make_node("gpu-02")], pods) as served:
        yield served


def test_cluster_role_grants_exactly_what_drains_and_placements_request(cluster: FakeKubeApi) -> None:
    """Every call the backend makes (drain with eviction, mark, holds, resume) and a placement poll, on a
    recording API server: a request the role lacks would be a 403 in a cluster, a grant no request uses
    is more than least privilege."""
    backend = KubernetesBackend(api_client=cluster.api_client(), evict=True, health_label_prefix="autopilot")
    drain = DrainRequest(decision_id=uuid.uuid4().hex, node=NODE_NAME, kind="gpu_fault", alert_id="a1")
    backend.drain(drain)
    backend.mark(drain, "TESTING")
    assert backend.holds(drain)
    backend.resume(drain)
    placements = KubernetesPlacements(store=None, api_client=cluster.api_client()).read()

    # worker-0 was evicted; the DaemonSet's pod stays, as kubectl drain leaves it
    assert {placement.job for placement in placements} == {
        "train/worker-1",
        "gpu-operator/dcgm-exporter-x7k2p",
    }
    assert {rbac_request(request) for request in cluster.requests} == granted()


def test_cluster_role_is_bound_to_the_hubs_service_account() -> None:
    binding = one("ClusterRoleBinding", "fleetlens-hub")
    account = one("ServiceAccount", "fleetlens-hub")
    hub = one("StatefulSet", "fleetlens-hub")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "fleetlens-hub",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "fleetlens"}
    ]
    assert hub["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


def pod_env(workload: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet sets it: a field or secret reference stands for a value."""
    return {
        item["name"]: item.get("value", f"<{item['name'].lower()}>") for item in container(workload)["env"]
    }


def container_port(workload: dict[str, Any], name: str) -> int:
    (port,) = [port["containerPort"] for port in container(workload)["ports"] if port["name"] == name]
    return port


def mount_path(workload: dict[str, Any], volume: str) -> Path:
    (path,) = [mount["mountPath"] for mount in container(workload)["volumeMounts"] if mount["name"] == volume]
    return Path(path)


def command_flags(workload: dict[str, Any], command: str, section: type) -> dict[str, Any]:
    """The container's arguments parsed by `fleetlens`'s own parser, as the CLI hands them to the config
    loader: every flag that is a key of `section`."""
    args = build_parser().parse_args(container(workload)["args"])
    assert args.command == command
    return {f.name: getattr(args, f.name) for f in fields(section) if hasattr(args, f.name)}


def exporter_config() -> ExporterConfig:
    """The config `fleetlens exporter` builds in the DaemonSet's pod, from its real parser and loader."""
    daemonset = one("DaemonSet", "fleetlens-exporter")
    flags = command_flags(daemonset, "exporter", ExporterConfig)
    return load_exporter_config(None, env=pod_env(daemonset), overrides=flags)


def hub_config() -> Config:
    """The config `fleetlens hub` builds in the StatefulSet's pod, from its real parser and loader."""
    statefulset = one("StatefulSet", "fleetlens-hub")
    flags = command_flags(statefulset, "hub", HubConfig)
    return load_config(None, env=pod_env(statefulset), overrides={"hub": flags})


def test_exporter_listens_on_the_default_port_everywhere_it_is_named() -> None:
    config = exporter_config()
    default_port = ExporterConfig().host_port[1]
    daemonset = one("DaemonSet", "fleetlens-exporter")
    assert config.host_port == ("0.0.0.0", default_port)
    assert container_port(daemonset, "metrics") == default_port
    (service_port,) = one("Service", "fleetlens-exporter")["spec"]["ports"]
    assert (service_port["port"], service_port["targetPort"]) == (default_port, "metrics")
    for probe in ("readinessProbe", "livenessProbe"):
        assert container(daemonset)[probe]["httpGet"] == {"path": "/", "port": "metrics"}


def test_exporter_reads_host_sysfs_read_only_and_the_kubelets_pod_resources() -> None:
    config = exporter_config()
    daemonset = one("DaemonSet", "fleetlens-exporter")
    volumes = {volume["name"]: volume for volume in daemonset["spec"]["template"]["spec"]["volumes"]}
    assert volumes["host-sys"]["hostPath"]["path"] == "/sys"
    assert config.sysfs_root == mount_path(daemonset, "host-sys")
    assert config.kubernetes
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert config.pod_resources_socket.parent == mount_path(daemonset, "pod-resources")
    assert config.node == "<fleetlens_exporter_node>"  # the node's name, from spec.nodeName
    assert all(mount["readOnly"] for mount in container(daemonset)["volumeMounts"])
    assert daemonset["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert pod_env(daemonset)["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_hub_listens_on_the_default_port_and_stores_on_its_volume() -> None:
    config = hub_config()
    default_port = HubConfig().host_port[1]
    statefulset = one("StatefulSet", "fleetlens-hub")
    assert config.hub.host_port == ("0.0.0.0", default_port)
    assert container_port(statefulset, "api") == default_port
    (service_port,) = one("Service", "fleetlens-hub")["spec"]["ports"]
    assert (service_port["port"], service_port["targetPort"]) == (default_port, "api")
    for probe in ("readinessProbe", "livenessProbe"):
        assert container(statefulset)[probe]["httpGet"] == {"path": "/healthz", "port": "api"}
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    volume = mount_path(statefulset, claim["metadata"]["name"])
    assert config.hub.store == f"chdb://{volume / 'data'}"
    assert config.hub.spool_dir.is_relative_to(volume)
    assert config.hub.k8s_placements
    assert config.drain.backend == "kubernetes"


def workloads() -> list[dict[str, Any]]:
    return [doc for doc in objects() if doc["kind"] in ("DaemonSet", "StatefulSet")]


@pytest.mark.parametrize("workload", workloads(), ids=object_id)
def test_containers_are_locked_down(workload: dict[str, Any]) -> None:
    pod = workload["spec"]["template"]["spec"]
    context = container(workload)["securityContext"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")


def test_hub_runs_as_a_non_root_user() -> None:
    pod = one("StatefulSet", "fleetlens-hub")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0


def test_exporter_port_admits_only_the_hub_and_prometheus() -> None:
    policy = one("NetworkPolicy", "fleetlens-exporter")["spec"]
    assert policy["podSelector"] == one("DaemonSet", "fleetlens-exporter")["spec"]["selector"]
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"] == [
        {"podSelector": one("StatefulSet", "fleetlens-hub")["spec"]["selector"]},
        {"namespaceSelector": {"matchLabels": {"fleetlens.io/prometheus": "true"}}},
    ]


def test_hub_api_admits_prometheus_its_clients_and_its_own_namespace() -> None:
    policy = one("NetworkPolicy", "fleetlens-hub")["spec"]
    assert policy["podSelector"] == one("StatefulSet", "fleetlens-hub")["spec"]["selector"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "api", "protocol": "TCP"}]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"fleetlens.io/prometheus": "true"}}},
        {"namespaceSelector": {"matchLabels": {"fleetlens.io/hub-client": "true"}}},
        {"podSelector": {}},
    ]

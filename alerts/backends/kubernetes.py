"""The Kubernetes drain backend: cordon, taint and label a node through the API server, and optionally
evict its pods through the Eviction API, so that PodDisruptionBudgets hold.

Drain and resume are each one strategic merge patch of the node (spec.unschedulable, the taint, the label
and the reason annotation), so a node is never left half-marked. spec.taints is an atomic list, so the
patch carries the node's other taints and the resourceVersion they were read at: when the kubelet or
another controller wrote the node in between (409 Conflict), it is read again instead of losing theirs.

Pods that a PodDisruptionBudget protects right now are not a failure of the drain: the node stays
cordoned and tainted, and a warning on this module's logger names each such pod with the API's answer.
The controller records the drain as done; nothing here retries those evictions.

As node-problem-detector does, the node's status carries condition `FleetlensHealthy` (False with the
drain's kind and evidence, True once resumed), written by a PATCH of nodes/status; an Event on the Node
records each drain and resume. Events are best effort, as client-go's recorder makes them: one the API
refuses is a warning, not a failed drain. A node another tool's mark already holds (IBM Autopilot's
gpuhealth EVICT, NVIDIA NVSentinel's quarantine labels: OTHER_HOLDS) is left as it is, and drain says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import kubernetes.config
import urllib3
from kubernetes.client import (
    ApiClient,
    Configuration,
    CoreV1Api,
    CoreV1Event,
    V1DeleteOptions,
    V1EventSource,
    V1Eviction,
    V1Node,
    V1ObjectMeta,
    V1ObjectReference,
    V1Pod,
    V1Taint,
)
from kubernetes.client.exceptions import ApiException

from alerts.errors import AlertConfigError, BackendError
from alerts.model import DrainRequest

log = logging.getLogger(__name__)

REASON_ANNOTATION = "fleetlens.io/reason"
CORDONED_ANNOTATION = "fleetlens.io/cordoned"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
CONFLICT_ATTEMPTS = 3
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
CONDITION_TYPE = "FleetlensHealthy"
EVENT_NAMESPACE = "default"  # where the API keeps the Events of cluster-scoped objects such as a Node
MESSAGE_LIMIT = 1024  # characters of a condition's or Event's message (events.k8s.io/v1's note limit)
REASON_LIMIT = 128  # characters of a reason, the API's limit for an Event's

# The marks by which another tool holds a node out of service already: label key -> (tool, the values
# that hold it), or annotation key -> (tool, None: any value). Read in their sources:
# - IBM Autopilot (IBM/autopilot@09a177d184a7a462a2e2896864f653ae8c535fdf): autopilot-daemon/gpu-dcgm/
#   entrypoint.py labels `autopilot.ibm.com/gpuhealth=EVICT` on a fatal DCGM error, and pkg/utils/
#   functions.go (PatchNode) keeps EVICT against later results; Autopilot neither cordons nor taints.
# - NVIDIA NVSentinel: commons/pkg/statemanager/statemanager.go (@20fe8e028ff2bab765bc164fed20615a66d78131)
#   walks label `dgxc.nvidia.com/nvsentinel-state` from quarantined to remediation-*;
#   fault-quarantine/pkg/reconciler/reconciler.go (@b7e4a8c71c990791a4ab4fb313f21972003c605c) labels
#   `<labelPrefix>cordon-by=NVSentinel` (prefix `k8saas.nvidia.com/` by default) when it cordons; and
#   fault-quarantine/pkg/common/common.go (@569d1eb25704ca12e3e1b16276ecdbbeabe72497) annotates the
#   event that quarantined the node as `quarantineHealthEvent`. Its taints are chosen per ruleset and off
#   by default, and its node conditions (GpuXidError, GpuMemWatch, ...) report faults, not a quarantine.
OTHER_HOLDS: dict[str, tuple[str, frozenset[str] | None]] = {
    "label autopilot.ibm.com/gpuhealth": ("IBM Autopilot", frozenset({"EVICT"})),
    "label dgxc.nvidia.com/nvsentinel-state": (
        "NVIDIA NVSentinel",
        frozenset(
            {
                "quarantined",
                "draining",
                "drain-succeeded",
                "drain-failed",
                "remediating",
                "remediation-succeeded",
                "remediation-failed",
            }
        ),
    ),
    "label k8saas.nvidia.com/cordon-by": ("NVIDIA NVSentinel", frozenset({"NVSentinel"})),
    "annotation quarantineHealthEvent": ("NVIDIA NVSentinel", None),
}


class KubernetesBackend:
    """Drains a node by cordoning it, tainting `<taint_key>=<kind>:<taint_effect>` (one of TAINT_EFFECTS),
    labelling `<label_key>=true` and annotating `fleetlens.io/reason`, then setting its FleetlensHealthy
    condition and recording an Event; with `evict`, also evicts its pods. Resume removes exactly what
    drain added. With `health_label_prefix` (the lifecycle's), `<prefix>/gpuhealth` is EVICT once drained,
    TESTING while tested (mark), PASS once resumed, as IBM Autopilot labels nodes."""

    name = "kubernetes"

    def __init__(
        self,
        *,
        api_client: ApiClient | None = None,
        evict: bool = False,
        taint_key: str = "fleetlens.io/unhealthy",
        taint_effect: str = "NoSchedule",
        label_key: str = "fleetlens.io/drained",
        health_label_prefix: str | None = None,
        grace_period_s: int | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        if taint_effect not in TAINT_EFFECTS:
            raise AlertConfigError(
                f"drain.kubernetes_taint_effect: {taint_effect!r} is not one of {', '.join(TAINT_EFFECTS)}"
            )
        self._api_client = api_client or _client_from_environment()
        self._core = CoreV1Api(self._api_client)
        self._evict = evict
        self._taint_key = taint_key
        self._taint_effect = taint_effect
        self._label_key = label_key
        self._health_key = f"{health_label_prefix}/gpuhealth" if health_label_prefix else None
        self._delete_options = (
            None if grace_period_s is None else V1DeleteOptions(grace_period_seconds=grace_period_s)
        )
        self._timeout_s = timeout_s

    def drain(self, request: DrainRequest) -> str | None:
        """Mark the node unschedulable for new pods and unhealthy, then (with `evict`) evict the pods it
        runs. When another tool's mark holds the node already, nothing is written: returns that tool and
        its mark, e.g. `IBM Autopilot (label autopilot.ibm.com/gpuhealth=EVICT)`."""
        node = self._patch_node(request.node, lambda node: self._drain_patch(node, request))
        if (holder := self._other_holder(node)) is not None:
            log.warning(
                "kubernetes node %s is held already by %s: not cordoned or tainted again",
                request.node,
                holder,
            )
            return holder
        evidence = _bounded(_evidence(request))
        self._set_condition(node, healthy=False, reason=_camel_case(request.kind), message=evidence)
        self._record_event(node, "Warning", "FleetlensDrained", evidence)
        if self._evict:
            self._evict_pods(request.node)
        return None

    def resume(self, request: DrainRequest) -> None:
        """Remove fleetlens's taint, label and annotations, uncordon the node if fleetlens cordoned it, and
        set its FleetlensHealthy condition back to True."""
        node = self._patch_node(request.node, self._resume_patch)
        message = _bounded(f"{request.reason}: resumed")
        self._set_condition(node, healthy=True, reason="FleetlensResumed", message=message)
        self._record_event(node, "Normal", "FleetlensResumed", message)

    def holds(self, request: DrainRequest) -> bool:
        """Whether fleetlens's taint is still on the node: someone who removed it took the node over."""
        with self._api_errors(request.node, f"GET /api/v1/nodes/{request.node}"):
            node = self._core.read_node(request.node, _request_timeout=self._timeout_s)
        return any(taint.key == self._taint_key for taint in node.spec.taints or [])

    def mark(self, request: DrainRequest, health: str) -> None:
        """Set `<prefix>/gpuhealth` to `health` (TESTING, PASS, EVICT), when the backend has a prefix."""
        if self._health_key is not None:
            self._patch_node(request.node, lambda node: self._labels_patch(node, {self._health_key: health}))

    def _labels_patch(self, node: V1Node, labels: dict[str, str | None]) -> dict[str, Any]:
        """Labels alone, valid only at the version of `node` that was read."""
        return {"metadata": {"resourceVersion": node.metadata.resource_version, "labels": labels}}

    def _drain_patch(self, node: V1Node, request: DrainRequest) -> dict[str, Any] | None:
        """Cordon, taint, label and annotate; None (no patch) when another tool holds the node. A cordon
        that someone else set first stays theirs: only a cordon fleetlens set is marked
        `fleetlens.io/cordoned`, so that resume lifts no one else's."""
        if self._other_holder(node) is not None:
            return None
        ours = not node.spec.unschedulable or CORDONED_ANNOTATION in (node.metadata.annotations or {})
        taint = V1Taint(key=self._taint_key, value=request.kind, effect=self._taint_effect)
        return self._node_patch(
            node,
            label="true",
            annotations={REASON_ANNOTATION: request.reason, CORDONED_ANNOTATION: "true" if ours else None},
            spec={"unschedulable": True, "taints": [*self._other_taints(node), taint]},
        )

    def _resume_patch(self, node: V1Node) -> dict[str, Any]:
        """Remove fleetlens's marks, and its cordon only. Nulls delete, as `kubectl uncordon` sends them."""
        spec: dict[str, Any] = {"taints": self._other_taints(node)}
        if CORDONED_ANNOTATION in (node.metadata.annotations or {}):
            spec["unschedulable"] = None
        annotations = {REASON_ANNOTATION: None, CORDONED_ANNOTATION: None}
        return self._node_patch(node, label=None, annotations=annotations, spec=spec)

    def _node_patch(
        self, node: V1Node, *, label: str | None, annotations: dict[str, str | None], spec: dict[str, Any]
    ) -> dict[str, Any]:
        """A strategic merge patch valid only at the version of `node` that was read."""
        labels = {self._label_key: label}
        if self._health_key is not None:
            labels[self._health_key] = "EVICT" if label else "PASS"
        patch = self._labels_patch(node, labels)
        return {"metadata": {**patch["metadata"], "annotations": annotations}, "spec": spec}

    def _other_taints(self, node: V1Node) -> list[V1Taint]:
        return [taint for taint in node.spec.taints or [] if taint.key != self._taint_key]

    def _other_holder(self, node: V1Node) -> str | None:
        """`<tool> (<mark>)` when one of OTHER_HOLDS is on `node` and fleetlens's own label is not (the
        lifecycle writes Autopilot's gpuhealth label itself); else None."""
        labels, annotations = node.metadata.labels or {}, node.metadata.annotations or {}
        if self._label_key in labels:
            return None
        for mark, (tool, values) in OTHER_HOLDS.items():
            where, key = mark.split(" ", 1)
            value = (labels if where == "label" else annotations).get(key)
            if value is not None and (values is None or value in values):
                return f"{tool} ({mark}={value})" if values else f"{tool} ({mark})"
        return None

    def _set_condition(self, node: V1Node, *, healthy: bool, reason: str, message: str) -> None:
        """Merge condition FleetlensHealthy into the node's status (the API merges conditions by type);
        its transition time moves only when its status changes."""
        name, status, now = node.metadata.name, "True" if healthy else "False", datetime.now(UTC)
        before = next(
            (c for c in (node.status and node.status.conditions) or [] if c.type == CONDITION_TYPE), None
        )
        since = before.last_transition_time if before and before.status == status else now
        condition = {
            "type": CONDITION_TYPE,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": _rfc3339(now),
            "lastTransitionTime": _rfc3339(since),
        }
        with self._api_errors(name, f"PATCH /api/v1/nodes/{name}/status"):
            self._core.patch_node_status(
                name, {"status": {"conditions": [condition]}}, _request_timeout=self._timeout_s
            )

    def _record_event(self, node: V1Node, kind: str, reason: str, message: str) -> None:
        """Create a core/v1 Event on the Node, named as client-go's recorder names it; a refusal is logged."""
        name, now = node.metadata.name, datetime.now(UTC)
        event = CoreV1Event(
            api_version="v1",
            kind="Event",
            metadata=V1ObjectMeta(name=f"{name}.{time.time_ns():x}", namespace=EVENT_NAMESPACE),
            involved_object=V1ObjectReference(
                api_version="v1", kind="Node", name=name, uid=node.metadata.uid
            ),
            reason=reason,
            message=message,
            type=kind,
            source=V1EventSource(component="fleetlens"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            reporting_component="fleetlens",
        )
        try:
            with self._api_errors(name, f"POST /api/v1/namespaces/{EVENT_NAMESPACE}/events"):
                self._core.create_namespaced_event(EVENT_NAMESPACE, event, _request_timeout=self._timeout_s)
        except BackendError as error:
            log.warning("event %s not recorded: %s", reason, error)

    def _patch_node(self, node_name: str, patch_for: Callable[[V1Node], dict[str, Any] | None]) -> V1Node:
        """Read the node and patch it, unless `patch_for` has nothing to write; read it again when another
        writer got there first (409). Returns the node as read."""
        for _ in range(CONFLICT_ATTEMPTS):
            with self._api_errors(node_name, f"GET /api/v1/nodes/{node_name}"):
                node = self._core.read_node(node_name, _request_timeout=self._timeout_s)
            if (patch := patch_for(node)) is None:
                return node
            with self._api_errors(node_name, f"PATCH /api/v1/nodes/{node_name}"):
                try:
                    self._core.patch_node(node_name, patch, _request_timeout=self._timeout_s)
                    return node
                except ApiException as error:
                    if error.status != 409:
                        raise
        raise BackendError(
            f"kubernetes node {node_name}: PATCH /api/v1/nodes/{node_name} at {self._host} answered "
            f"409 Conflict {CONFLICT_ATTEMPTS} times: other writers keep changing the node"
        )

    def _evict_pods(self, node_name: str) -> None:
        """Evict every pod that a drain should move; warn about those a disruption budget keeps for now."""
        selector = f"spec.nodeName={node_name}"
        with self._api_errors(node_name, f"GET /api/v1/pods?fieldSelector={selector}"):
            pods = self._core.list_pod_for_all_namespaces(
                field_selector=selector, _request_timeout=self._timeout_s
            )
        refusals = []
        for pod in pods.items:
            if _should_evict(pod) and (refusal := self._evict_pod(node_name, pod)):
                refusals.append(refusal)
        if refusals:
            log.warning(
                "kubernetes node %s stays cordoned with %d pod(s) not evicted yet: %s",
                node_name,
                len(refusals),
                "; ".join(refusals),
            )

    def _evict_pod(self, node_name: str, pod: V1Pod) -> str | None:
        """Evict one pod; returns `namespace/name: the API's message` when it was refused for now (429)."""
        name, namespace = pod.metadata.name, pod.metadata.namespace
        eviction = V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=V1ObjectMeta(name=name, namespace=namespace),
            delete_options=self._delete_options,
        )
        with self._api_errors(node_name, f"POST /api/v1/namespaces/{namespace}/pods/{name}/eviction"):
            try:
                self._core.create_namespaced_pod_eviction(
                    name, namespace, eviction, _request_timeout=self._timeout_s
                )
            except ApiException as error:
                if error.status == 429:
                    return f"{namespace}/{name}: {_api_message(error)}"
                if error.status != 404:  # 404: the pod is gone already, which is what eviction wants
                    raise
        return None

    @property
    def _host(self) -> str:
        return self._api_client.configuration.host

    @contextlib.contextmanager
    def _api_errors(self, node_name: str, call: str) -> Iterator[None]:
        """Turn the client's errors into a BackendError naming the node, the call and what answered."""
        try:
            yield
        except ApiException as error:
            raise BackendError(
                f"kubernetes node {node_name}: {call} at {self._host} answered "
                f"{error.status} {error.reason}: {_api_message(error)}"
            ) from error
        except urllib3.exceptions.HTTPError as error:
            raise BackendError(
                f"kubernetes node {node_name}: {call} at {self._host} got no answer: {error}"
            ) from error


def _should_evict(pod: V1Pod) -> bool:
    """kubectl drain's rules: a DaemonSet's pod would come straight back, a mirror pod belongs to the
    kubelet (the API cannot remove a static pod), and a finished pod holds nothing."""
    daemon = any(
        owner.controller and owner.kind == "DaemonSet" for owner in pod.metadata.owner_references or []
    )
    mirror = MIRROR_ANNOTATION in (pod.metadata.annotations or {})
    return not (daemon or mirror or pod.status.phase in FINISHED_PHASES)


def _evidence(request: DrainRequest) -> str:
    """What led to the drain, for people reading the node: its reason, severity and figures."""
    figures = [f"severity {request.severity}"] if request.severity else []
    figures += [f"{name} {value}" for name, value in request.details.items()]
    return f"{request.reason} ({', '.join(figures)})" if figures else request.reason


def _bounded(text: str) -> str:
    """`text` cut to MESSAGE_LIMIT characters, marked with an ellipsis where cut."""
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "\u2026"


def _camel_case(kind: str) -> str:
    """An anomaly kind as a condition reason, in the API's UpperCamelCase: gpu_fault -> GpuFault."""
    words = re.findall(r"[A-Za-z0-9]+", kind)
    return "".join(word[:1].upper() + word[1:] for word in words)[:REASON_LIMIT] or "Unknown"


def _rfc3339(moment: datetime) -> str:
    """A time as the API writes it: UTC, in seconds, with Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _api_message(error: ApiException) -> str:
    """The message of the API's Status answer, else its raw body."""
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return error.body or ""


def _client_from_environment() -> ApiClient:
    """What kubectl would use: inside a pod its service account, elsewhere $KUBECONFIG or ~/.kube/config."""
    configuration = Configuration()
    kubeconfig = os.environ.get("KUBECONFIG", "~/.kube/config")
    in_pod = "KUBERNETES_SERVICE_HOST" in os.environ
    try:
        if in_pod:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        else:
            kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except kubernetes.config.ConfigException as error:
        source = "the pod's service account" if in_pod else f"kubeconfig {kubeconfig}"
        raise AlertConfigError(
            f"drain backend kubernetes: no cluster to talk to through {source}: {error}"
        ) from error
    return ApiClient(configuration)

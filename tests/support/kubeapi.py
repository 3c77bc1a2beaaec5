"""A loopback stand-in for the Kubernetes API server, for nodes (and their status), pods, evictions
and core/v1 Events only.

No API server can be installed here, so drain backends are tested against this one: it answers the
calls the official client makes with the real API's paths, verbs, content types and Status bodies,
and records every request so that tests can assert what a real cluster would have received.

Patches: the client sends a dict body as a strategic merge patch. For the node fields a drain touches
(labels and annotations are maps, unschedulable a scalar, spec.taints an atomic list) strategic merge
is JSON merge patch (RFC 7386): maps merge, null deletes, lists are replaced whole. A
metadata.resourceVersion in a patch is a precondition, answered 409 Conflict when the node moved on.
A strategic merge patch of nodes/status merges status.conditions by their `type`, as the Node schema's
patchMergeKey says; a JSON merge patch replaces the list. Events are checked as the API's legacy
validation does: a name, the namespace of the URL, and for a cluster-scoped object (a Node) the
namespace `default` with an empty involvedObject.namespace; 422 Invalid otherwise.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes.client import ApiClient, Configuration

PATCH_TYPES = ("application/strategic-merge-patch+json", "application/merge-patch+json")
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

NODE_PATH = re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)$")
NODE_STATUS_PATH = re.compile(r"^/api/v1/nodes/(?P<name>[^/]+)/status$")
EVENTS_PATH = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/events$")
EVICTION_PATH = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/pods/(?P<name>[^/]+)/eviction$")


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it; `body` is the parsed JSON, None when there was none."""

    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any


@dataclass(frozen=True)
class _Answer:
    code: int
    body: dict[str, Any]


def make_node(
    name: str, *, taints: Iterable[dict] = (), labels: dict | None = None, **annotations: str
) -> dict:
    """A schedulable, Ready node as the API stores it."""
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": "2026-12-05T04:00:00Z",
        "lastTransitionTime": "2026-12-01T09:00:00Z",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"{name}-uid",
            "resourceVersion": "1",
            "labels": labels or {},
            "annotations": annotations,
        },
        "spec": {"taints": list(taints)},
        "status": {"conditions": [ready]},
    }


def make_pod(
    name: str,
    namespace: str,
    node: str,
    *,
    owner_kind: str = "ReplicaSet",
    phase: str = "Running",
    mirror: bool = False,
    labels: dict | None = None,
    gpus: int = 0,
    started: str = "2026-12-05T04:00:00Z",
    finished: str | None = None,
) -> dict:
    """A pod on `node` (None: not yet bound) as the API serves it: an owner of `owner_kind` controls it,
    `mirror` makes it a static pod's mirror, `gpus` the nvidia.com/gpu it asks for, started at
    `started` (RFC 3339) and, where `finished`, its one container terminated then."""
    owner_api = "batch/v1" if owner_kind == "Job" else "apps/v1"
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}}
    if finished is None:
        state: dict = {"running": {"startedAt": started}}
    else:
        state = {
            "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": finished}
        }
    pod_status: dict = {"phase": phase, "qosClass": "BestEffort"}
    if phase != "Pending":
        pod_status |= {
            "hostIP": "10.0.0.7",
            "podIP": "10.244.1.9",
            "startTime": started,
            "containerStatuses": [
                {
                    "name": "main",
                    "state": state,
                    "ready": finished is None,
                    "restartCount": 0,
                    "image": "docker.io/library/busybox:latest",
                    "imageID": "docker.io/library/busybox@sha256:" + "0" * 64,
                    "containerID": "containerd://" + "1" * 64,
                    "started": finished is None,
                }
            ],
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"{namespace}-{name}-uid",
            "resourceVersion": "1",
            "creationTimestamp": started,
            "labels": labels or {},
            "annotations": {MIRROR_ANNOTATION: "checksum"} if mirror else {},
            "ownerReferences": [
                {
                    "apiVersion": owner_api,
                    "kind": owner_kind,
                    "name": f"{name}-owner",
                    "uid": "u",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never" if owner_kind == "Job" else "Always",
            "schedulerName": "default-scheduler",
            "containers": [{"name": "main", "image": "busybox", "resources": resources if gpus else {}}],
        },
        "status": pod_status,
    }


def status(code: int, reason: str, message: str, **details: Any) -> _Answer:
    """The API's Status object for a failed call."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code,
    }
    return _Answer(code, body)


def invalid(kind: str, name: str, field: str, value: Any, detail: str) -> _Answer:
    """The API's 422 Status for an object its validation refused, naming the field."""
    message = f'{kind} "{name}" is invalid: {field}: Invalid value: {json.dumps(value)}: {detail}'
    cause = {
        "reason": "FieldValueInvalid",
        "message": f"Invalid value: {json.dumps(value)}: {detail}",
        "field": field,
    }
    return status(422, "Invalid", message, name=name, kind=kind.lower() + "s", causes=[cause])


def merge_patch(target: dict, patch: dict) -> dict:
    """RFC 7386: maps merge recursively, null deletes a key, anything else replaces."""
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_patch(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class FakeKubeApi:
    """Serves nodes and pods on 127.0.0.1 and a free port between `with` and its end.

    `nodes` (by name) and `pods` (by (namespace, name)) are the cluster's state and change as the API
    would; pods named in `pdb_protected` are refused eviction with 429, as a PodDisruptionBudget does.
    """

    def __init__(
        self, nodes: Iterable[dict], pods: Iterable[dict] = (), pdb_protected: Iterable[str] = ()
    ) -> None:
        self.nodes = {node["metadata"]["name"]: node for node in nodes}
        self.pods = {(pod["metadata"]["namespace"], pod["metadata"]["name"]): pod for pod in pods}
        self.pdb_protected = set(pdb_protected)
        self.events: dict[tuple[str, str], dict] = {}  # (namespace, name) -> the Event as stored
        self.requests: list[RecordedRequest] = []
        self._failures: dict[tuple[str, str], _Answer] = {}
        self._writes_before_patch: dict[str, Callable[[dict], None]] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def api_client(self) -> ApiClient:
        """An official client pointed at this server."""
        return ApiClient(Configuration(host=self.url))

    def fail_next(
        self, method: str, path: str, code: int, message: str, reason: str = "InternalError"
    ) -> None:
        """Answer the next `method` on `path` with a Status of `code` instead of serving it."""
        self._failures[(method, path)] = status(code, reason, message)

    def write_before_next_patch(self, node: str, change: Callable[[dict], None]) -> None:
        """Another client changes `node` after it was read and before the next patch to it lands."""
        self._writes_before_patch[node] = change

    def calls(self, method: str) -> list[RecordedRequest]:
        return [request for request in self.requests if request.method == method]

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, request: RecordedRequest) -> tuple[int, bytes]:
        """Record `request` and answer it as the API would: status code and JSON body."""
        with self._lock:
            self.requests.append(request)
            answer = self._failures.pop((request.method, request.path), None) or self._serve(request)
            return answer.code, json.dumps(answer.body).encode()

    def _serve(self, request: RecordedRequest) -> _Answer:
        method, path = request.method, request.path
        if node := NODE_PATH.match(path):
            if method == "GET":
                return self._read_node(node["name"])
            if method == "PATCH":
                return self._patch_node(node["name"], request.content_type, request.body)
        if (node := NODE_STATUS_PATH.match(path)) and method == "PATCH":
            return self._patch_node_status(node["name"], request.content_type, request.body)
        if (events := EVENTS_PATH.match(path)) and method == "POST":
            return self._create_event(events["namespace"], request.body)
        if method == "GET" and path == "/api/v1/pods":
            return self._list_pods(request.query)
        if (eviction := EVICTION_PATH.match(path)) and method == "POST":
            # the API server reads a POST without Content-Type as JSON, and the client sends none
            if request.content_type not in ("", "application/json"):
                return status(415, "UnsupportedMediaType", f"an Eviction is JSON, not {request.content_type}")
            return self._evict(eviction["namespace"], eviction["name"], request.body)
        return status(404, "NotFound", f"the server could not find the requested resource ({method} {path})")

    def _read_node(self, name: str) -> _Answer:
        if name not in self.nodes:
            return status(404, "NotFound", f'nodes "{name}" not found', name=name, kind="nodes")
        return _Answer(200, self.nodes[name])

    def _patch_refusal(self, name: str, content_type: str) -> _Answer | None:
        """Why a PATCH of node `name` in `content_type` cannot be served, or None."""
        if content_type not in PATCH_TYPES:
            return status(
                415, "UnsupportedMediaType", f"the fake serves only {PATCH_TYPES}, not {content_type}"
            )
        if name not in self.nodes:
            return status(404, "NotFound", f'nodes "{name}" not found', name=name, kind="nodes")
        return None

    def _patch_node(self, name: str, content_type: str, patch: dict) -> _Answer:
        if refusal := self._patch_refusal(name, content_type):
            return refusal
        if name in self._writes_before_patch:
            self._writes_before_patch.pop(name)(self.nodes[name])
            self._bump_version(name)
        wanted_version = patch.get("metadata", {}).get("resourceVersion")
        if wanted_version not in (None, self.nodes[name]["metadata"]["resourceVersion"]):
            message = (
                f'Operation cannot be fulfilled on nodes "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again"
            )
            return status(409, "Conflict", message, name=name, kind="nodes")
        self.nodes[name] = merge_patch(self.nodes[name], patch)
        self._bump_version(name)
        return _Answer(200, self.nodes[name])

    def _patch_node_status(self, name: str, content_type: str, patch: dict) -> _Answer:
        """PATCH nodes/NAME/status: only the status changes; strategic merge merges conditions by type."""
        if refusal := self._patch_refusal(name, content_type):
            return refusal
        changes = dict(patch.get("status") or {})
        conditions = changes.pop("conditions", None)
        node_status = merge_patch(self.nodes[name].get("status", {}), changes)
        if conditions is not None and content_type == PATCH_TYPES[0]:
            by_type = {condition["type"]: condition for condition in node_status.get("conditions", [])}
            for condition in conditions:
                by_type[condition["type"]] = merge_patch(by_type.get(condition["type"], {}), condition)
            conditions = list(by_type.values())
        if conditions is not None:
            node_status["conditions"] = conditions
        self.nodes[name]["status"] = node_status
        self._bump_version(name)
        return _Answer(200, self.nodes[name])

    def _create_event(self, namespace: str, event: dict) -> _Answer:
        """POST a core/v1 Event, checked as the API's legacy Event validation does."""
        # a body without apiVersion and kind takes the URL's, as the API server decodes it
        if (event.get("apiVersion", "v1"), event.get("kind", "Event")) != ("v1", "Event"):
            return status(400, "BadRequest", f"not a v1 Event: {event.get('apiVersion')}/{event.get('kind')}")
        metadata, involved = event.get("metadata") or {}, event.get("involvedObject") or {}
        name = metadata.get("name", "")
        if metadata.get("namespace", namespace) != namespace:
            return status(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        if not name:
            return invalid("Event", name, "metadata.name", name, "name or generateName is required")
        if not involved.get("namespace") and namespace != "default":
            return invalid(
                "Event",
                name,
                "involvedObject.namespace",
                involved.get("namespace", ""),
                "does not match event.namespace",
            )
        if (namespace, name) in self.events:
            return status(409, "AlreadyExists", f'events "{name}" already exists', name=name, kind="events")
        stored = merge_patch(
            event, {"metadata": {"namespace": namespace, "uid": f"{name}-uid", "resourceVersion": "1"}}
        )
        self.events[(namespace, name)] = stored
        return _Answer(201, stored)

    def _bump_version(self, name: str) -> None:
        metadata = self.nodes[name]["metadata"]
        metadata["resourceVersion"] = str(int(metadata["resourceVersion"]) + 1)

    def _list_pods(self, query: dict[str, list[str]]) -> _Answer:
        """GET /api/v1/pods, unfiltered, or by spec.nodeName=NODE (the pods on NODE) or spec.nodeName!=
        (every pod bound to a node), as a real PodList."""
        selector = query.get("fieldSelector", [""])[0]
        if selector in ("", "spec.nodeName!="):
            items = [pod for pod in self.pods.values() if selector == "" or pod["spec"].get("nodeName")]
        elif selector.startswith("spec.nodeName="):
            node = selector.removeprefix("spec.nodeName=")
            items = [pod for pod in self.pods.values() if pod["spec"].get("nodeName") == node]
        else:
            return status(400, "BadRequest", f"the fake filters pods by spec.nodeName only, not {selector!r}")
        return _Answer(
            200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": items}
        )

    def _evict(self, namespace: str, name: str, eviction: dict) -> _Answer:
        if (eviction.get("apiVersion"), eviction.get("kind")) != ("policy/v1", "Eviction"):
            return status(400, "BadRequest", f"not a policy/v1 Eviction: {eviction}")
        if (eviction["metadata"].get("namespace"), eviction["metadata"].get("name")) != (namespace, name):
            return status(400, "BadRequest", "name or namespace in the Eviction does not match the URL")
        if (namespace, name) not in self.pods:
            return status(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        if name in self.pdb_protected:
            return status(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                causes=[
                    {"reason": "DisruptionBudget", "message": f"The disruption budget {name}-pdb needs 1"}
                ],
            )
        del self.pods[(namespace, name)]
        return _Answer(
            201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        )

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                content_type = self.headers.get("Content-Type", "")
                request = RecordedRequest(self.command, url.path, parse_qs(url.query), content_type, body)
                code, payload = api._answer(request)
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PATCH = do_POST = _answer

            def log_message(self, format: str, *args: object) -> None:
                """Keep the test output free of access logs."""

        return Handler

"""What runs where, from the Kubernetes API server's pod list (GET /api/v1/pods, a v1 PodList).

A pod bound to a node (spec.nodeName) that runs (phase Running) is one placement from its
status.startTime; one that ended (Succeeded, Failed) and is still listed ends when its last container
finished. A Pending or Unknown pod has none. Its job is the workload that owns it: a Kubeflow training job
(PyTorchJob, MPIJob... label `training.kubeflow.org/job-name`), a JobSet, a batch Job, else the pod itself;
every job is named "<namespace>/<name>". The API records no user, so `user` is "". Which GPUs it holds is
not in the pod (only how many: the kubelet assigns them), so `gpus` is () here; the exporter reads the
kubelet's PodResources API for that (collectors.podresources).

Every field read is checked against the API's shape (names on their DNS grammar, times RFC 3339). A
document that is not a PodList refuses the whole answer with a PlacementError; one pod that is not of the
API's shape is skipped with a warning naming it and the field, so it never costs the other pods theirs.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from analytics.errors import PlacementError
from analytics.store.records import Placement
from analytics.topology.model import Source

log = logging.getLogger("fleetlens.placements")

RUNNING_PHASES = frozenset({"Running"})
ENDED_PHASES = frozenset({"Succeeded", "Failed"})
WAITING_PHASES = frozenset({"Pending", "Unknown"})
# The labels naming a pod's job, most specific first: Kubeflow's training operator and mpi-operator v2,
# JobSet, then the label a batch Job sets on its pods (1.27+, and "job-name" before).
JOB_LABELS = (
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "batch.kubernetes.io/job-name",
    "job-name",
)
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}\Z)[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")  # node and pod names
_DNS_LABEL = re.compile(r"(?=.{1,63}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")  # namespaces
_LABEL_VALUE = re.compile(r"(?=.{1,63}\Z)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
# The API writes times as RFC 3339 in UTC to the second ("2026-12-05T04:06:30Z").
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z\Z")


def parse_pod_list(text: str | bytes, source: str = "GET /api/v1/pods") -> list[Placement]:
    """The placements of the pods a PodList (`text`, the API's JSON) lists; PlacementError (naming
    `source` and the JSON path) when it is not a PodList, a warning for each pod skipped."""
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PlacementError(source, "$", f"not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("kind") != "PodList":
        raise PlacementError(source, "$.kind", "not a v1 PodList")
    items = document.get("items")
    if not isinstance(items, list):  # the API writes "items": [] for no pods, never null
        raise PlacementError(source, "$.items", "missing or not a list")
    return list(_placements(source, items))


def _placements(source: str, items: list[Any]) -> Iterator[Placement]:
    for index, pod in enumerate(items):
        try:
            placement = _pod(pod)
        except _PodRefused as refused:
            name = _pod_name(pod)
            log.warning(
                "%s: $.items[%d] (pod %s): %s: %s; skipped", source, index, name, refused.where, refused.what
            )
            continue
        if placement is not None:
            yield placement


class _PodRefused(PlacementError):
    """One pod not of the API's shape: the field and what is wrong with it."""

    def __init__(self, field: str, what: str) -> None:
        super().__init__("pod", field, what)


def _pod_name(pod: Any) -> str:
    """ "<namespace>/<name>" as far as `pod` says it, for a warning."""
    metadata = pod.get("metadata") if isinstance(pod, dict) else None
    if not isinstance(metadata, dict):
        return "?"
    return f"{metadata.get('namespace')!r:.70}/{metadata.get('name')!r:.80}"


def _field(document: Any, path: str, kind: type, required: bool = True, within: str = "") -> Any:
    """The value at dotted `path` in `document` (itself at `within` in the pod), which must be a `kind`;
    None where an optional field (or an object on its way) is missing or null, as the API omits empty
    fields."""
    value = document
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            if required:
                raise _PodRefused(within + path, "missing")
            return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _PodRefused(within + path, f"{value!r:.80} is not a {kind.__name__}")
    return value


def _checked(value: str, pattern: re.Pattern[str], field: str) -> str:
    if not pattern.match(value):
        raise _PodRefused(field, f"{value!r:.80} is not of the API's grammar")
    return value


def _pod(pod: Any) -> Placement | None:
    if not isinstance(pod, dict):
        raise _PodRefused("$", "not an object")
    phase = _field(pod, "status.phase", str)
    if phase not in RUNNING_PHASES | ENDED_PHASES | WAITING_PHASES:
        raise _PodRefused("status.phase", f"{phase!r:.80} is not a pod phase")
    node = _field(pod, "spec.nodeName", str, required=False)
    if phase in WAITING_PHASES or not node:
        return None
    namespace = _checked(_field(pod, "metadata.namespace", str), _DNS_LABEL, "metadata.namespace")
    name = _checked(_field(pod, "metadata.name", str), _DNS_SUBDOMAIN, "metadata.name")
    since = _time(_field(pod, "status.startTime", str), "status.startTime")
    until = _ended(pod, since) if phase in ENDED_PHASES else None
    return Placement(
        Source.KUBERNETES,
        f"{namespace}/{_job(pod, name)}",
        "",
        _checked(node, _DNS_SUBDOMAIN, "spec.nodeName"),
        (),
        since,
        until,
    )


def _job(pod: dict[str, Any], name: str) -> str:
    """The name of the workload the pod belongs to: a job label, the Job owning it, else the pod."""
    labels = _field(pod, "metadata.labels", dict, required=False) or {}
    for label in JOB_LABELS:
        if (value := labels.get(label)) is not None:
            if not isinstance(value, str):
                raise _PodRefused(f"metadata.labels[{label}]", f"{value!r:.80} is not a string")
            return _checked(value, _LABEL_VALUE, f"metadata.labels[{label}]")
    owners = _field(pod, "metadata.ownerReferences", list, required=False) or []
    for index, owner in enumerate(owners):
        field = f"metadata.ownerReferences[{index}]."
        if _field(owner, "kind", str, False, field) == "Job" and owner.get("controller") is True:
            return _checked(_field(owner, "name", str, True, field), _DNS_SUBDOMAIN, f"{field}name")
    return name


def _ended(pod: dict[str, Any], since: float) -> float:
    """When an ended pod's last container finished."""
    finished = []
    for index, entry in enumerate(_field(pod, "status.containerStatuses", list)):
        within = f"status.containerStatuses[{index}]."
        at = _field(entry, "state.terminated.finishedAt", str, True, within)
        finished.append(_time(at, f"{within}state.terminated.finishedAt"))
    if not finished:
        raise _PodRefused("status.containerStatuses", "an ended pod with no container status")
    until = max(finished)
    if until < since:
        raise _PodRefused("status.containerStatuses", f"finished at {until}, before its start {since}")
    return until


def _time(value: str, field: str) -> float:
    """Unix seconds of an RFC 3339 UTC time as the API writes it."""
    if not _TIME.match(value):
        raise _PodRefused(field, f"{value!r:.80} is not an RFC 3339 UTC time")
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError as error:  # a month 13, a day 31 of a 30-day month
        raise _PodRefused(field, f"{value!r:.80}: {error}") from None

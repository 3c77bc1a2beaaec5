"""Alert rules: which anomalies become alerts, after how long, and with which labels and annotations.

A rule covers anomaly kinds at or above a severity. Its alert's labels identify it, as Prometheus'
do: `alertname` (the rule's name), `node`, `kind`, `severity`, and `component` and `job` when the
anomaly has them, plus the rule's own labels. Annotations are templates over the anomaly's fields:

    {kind} {node} {component} {job} {severity} {score} {evidence} {detector} {where}
    {job_slowdown} {lost_gpu_hours} {action} {action_text} {layer} {parent} {check}

where `where` is "vela-007 gpu:3" (node and component) and `evidence` the anomaly's evidence as the store
holds it (analytics.evidence.to_json). `job_slowdown` and `lost_gpu_hours` are what a straggler costs its
job (analytics.reports.straggler), as people read them ("31%", "2.4"); `action` and `action_text` what a
GPU fault asks an operator to do (analytics.reports.remedy: "reset_gpu", "drain the node and reset the
GPU, ..."); `layer`, `parent` and `check` where a shared fault is and what to look at there
(analytics.evidence.SharedFaultEvidence: "leaf", "leaf-07", "leaf-07: link flaps on 8 of 8 nodes; check
optics and switch logs"). Only some anomalies carry them (slow_node, gpu_fault, shared_fault), so an
annotation that uses one falls back, for an anomaly without it, to the default annotation of the same name
(left out when there is none).
A rule's annotations override the defaults for its kinds (`default_annotations`): a slow_node rule
states the cost, "vela-012 slows job run-42 by 31% (2.4 GPU-hours lost so far)", a gpu_fault rule the
action in the summary and the description Alertmanager receives, and both today's text for anomalies
written before the detector reported them.

A shared_fault's alert (analytics.detectors.shared_faults) is labelled `layer` and `parent` in place of
`node` and `component`, so Alertmanager routes it to the network or rack team and no drain reads it as
a node's; a per-node alert it explains carries the annotation `explained_by` (not a label: labels make
the fingerprint, and an alert explained halfway through its life stays the same alert). The
fingerprint is Alertmanager's (FNV-1a over the sorted labels), so an alert has the same id here, in
Alertmanager's API and in its UI.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from alerts.errors import AlertConfigError
from analytics.evidence import SharedFaultEvidence, to_json
from analytics.reports.remedy import ACTION, ACTION_KINDS, ACTION_TEXT_KEY, shown_action
from analytics.reports.straggler import (
    COSTED_KINDS,
    JOB_SLOWDOWN,
    LOST_GPU_HOURS,
    shown_figures,
    straggler_cost,
)
from analytics.store.records import Anomaly

SEVERITIES = ("info", "warning", "critical")
SHARED_FAULT = SharedFaultEvidence.KIND  # the kind of a shared fault's anomaly (no detector's own kind)
COST_FIELDS = (JOB_SLOWDOWN, LOST_GPU_HOURS)  # only in the evidence of some anomalies: see the module doc
ACTION_FIELDS = (ACTION, ACTION_TEXT_KEY)  # likewise
SHARED_FAULT_FIELDS = ("layer", "parent", "check")  # likewise: a shared fault's evidence
TEMPLATE_FIELDS = (
    "kind", "node", "component", "job", "severity", "score", "evidence", "detector", "where", *COST_FIELDS,
    *ACTION_FIELDS, *SHARED_FAULT_FIELDS,
)  # fmt: skip
EXPLAINED_BY = "explained_by"  # the annotation naming the shared fault that explains a per-node alert
DEFAULT_ANNOTATIONS = {
    "summary": "{kind} on {where}",
    "description": "detector {detector} reports {kind} on {where}, severity {severity}, score {score}",
    "evidence": "{evidence}",
}
COST_ANNOTATIONS = {  # the defaults of a rule that covers a kind whose anomalies say what they cost
    "summary": "{node} slows job {job} by {job_slowdown} ({lost_gpu_hours} GPU-hours lost so far)",
    "description": DEFAULT_ANNOTATIONS["description"]
    + "; the job's steps would be {job_slowdown} shorter without it",
}
ACTION_ANNOTATIONS = {  # the defaults of a rule that covers a kind whose anomalies recommend an action
    "summary": "{kind} on {where}: {action_text}",
    "description": DEFAULT_ANNOTATIONS["description"] + "; recommended action: {action} ({action_text})",
}
SHARED_FAULT_ANNOTATIONS = {  # the defaults of a rule over shared faults
    "summary": "shared fault of {layer} {parent}: {check}",
    "description": "{check} (detector {detector}, severity {severity}, score {score}: -log10 of the"
    " corrected p-value)",
}

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEPARATOR = 0xFF


@functools.cache
def detector_kinds() -> tuple[str, ...]:
    """The anomaly kinds the registered detectors report (analytics.detectors), sorted: what a rule may
    name. Read on first use, as the registry imports every detector, which a reader of silences or alerts
    does not need."""
    from analytics.detectors import registered

    kinds = {kind for detector in registered().values() for kind in detector.kinds}
    return tuple(sorted(kinds | {SHARED_FAULT}))


def check_kinds(kinds: Sequence[str], where: str) -> None:
    """AlertConfigError naming `where` when a kind is none a detector reports: its rule would never match."""
    known = detector_kinds()
    if unknown := [kind for kind in kinds if kind not in known]:
        raise AlertConfigError(
            f"{where}: unknown kind(s) {unknown}, which no detector reports; known: {', '.join(known)}"
        )


def default_annotations(kinds: Sequence[str]) -> dict[str, str]:
    """The annotations of a rule over `kinds` that sets none: the cost sentence when a kind may carry its
    cost, else the recommended action when a kind may carry one (the fallback covers the kinds that do
    not), the shared fault's sentence for shared faults, the generic text otherwise."""
    if SHARED_FAULT in kinds:
        return {**DEFAULT_ANNOTATIONS, **SHARED_FAULT_ANNOTATIONS}
    if any(kind in COSTED_KINDS for kind in kinds):
        return {**DEFAULT_ANNOTATIONS, **COST_ANNOTATIONS}
    if any(kind in ACTION_KINDS for kind in kinds):
        return {**DEFAULT_ANNOTATIONS, **ACTION_ANNOTATIONS}
    return dict(DEFAULT_ANNOTATIONS)


def template_fields(template: str) -> set[str]:
    """The field names a template uses: "{node} at {score}" -> {"node", "score"}."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's fingerprint of a label set: FNV-1a 64 over name, 0xff, value, 0xff in name order."""
    digest = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in (*part.encode(), _SEPARATOR):
                digest = ((digest ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{digest:016x}"


@dataclass(frozen=True)
class AlertRule:
    """Anomalies of `kinds` at `min_severity` or above become alert `name`, firing once they have lasted
    `for_s` seconds (pending until then). `annotations` override default_annotations(kinds), key by key."""

    name: str
    kinds: tuple[str, ...]
    min_severity: str = "warning"
    for_s: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"alert rule {self.name!r}"
        if not self.name or not self.kinds:
            raise AlertConfigError(f"{where}: needs a name and at least one kind")
        if self.min_severity not in SEVERITIES:
            raise AlertConfigError(f"{where}: min_severity must be one of {', '.join(SEVERITIES)}")
        if not self.for_s >= 0:
            raise AlertConfigError(f"{where}: for_s must be >= 0 seconds, got {self.for_s}")
        object.__setattr__(self, "annotations", {**default_annotations(self.kinds), **self.annotations})
        for key, template in self.annotations.items():
            unknown = template_fields(template) - set(TEMPLATE_FIELDS)
            if unknown:
                raise AlertConfigError(
                    f"{where}: annotation {key!r} uses unknown field(s) {sorted(unknown)}; "
                    f"known: {', '.join(TEMPLATE_FIELDS)}"
                )

    def covers(self, anomaly: Anomaly) -> bool:
        return anomaly.kind in self.kinds and SEVERITIES.index(anomaly.severity) >= SEVERITIES.index(
            self.min_severity
        )

    def alert_labels(self, anomaly: Anomaly) -> dict[str, str]:
        """alertname, kind, severity, job when known, and where: `node` and `component` (when known) for
        a node's anomaly, `layer` and `parent` for a shared fault's; then the rule's own labels."""
        labels = {"alertname": self.name, "kind": anomaly.kind, "severity": anomaly.severity}
        if isinstance(anomaly.evidence, SharedFaultEvidence):
            labels.update(layer=anomaly.evidence.layer, parent=anomaly.evidence.parent)
        else:
            labels["node"] = anomaly.node
            labels.update({name: value for name in ("component",) if (value := anomaly.component)})
        labels.update({name: value for name in ("job",) if (value := anomaly.job)})
        return {**labels, **self.labels}

    def alert_annotations(self, anomaly: Anomaly) -> dict[str, str]:
        """The annotations rendered for `anomaly`; one that uses a field the anomaly lacks (its cost) is
        rendered from the default of the same name instead, or left out when there is none."""
        values = _template_values(anomaly)
        rendered = {}
        for key, template in self.annotations.items():
            if template_fields(template) <= values.keys():
                rendered[key] = template.format_map(values)
            elif key in DEFAULT_ANNOTATIONS:
                rendered[key] = DEFAULT_ANNOTATIONS[key].format_map(values)
        if anomaly.explained_by:
            rendered[EXPLAINED_BY] = anomaly.explained_by
        return rendered


def _template_values(anomaly: Anomaly) -> dict[str, str]:
    """What an annotation template may use for `anomaly`; the cost and action fields only when its evidence
    has them."""
    values = {name: getattr(anomaly, name) for name in TEMPLATE_FIELDS if hasattr(anomaly, name)}
    values.update(
        evidence=to_json(anomaly.evidence),
        score=f"{anomaly.score:.3g}",
        where=" ".join(part for part in (anomaly.node, anomaly.component) if part),
    )
    shared = anomaly.evidence if isinstance(anomaly.evidence, SharedFaultEvidence) else None
    located = {name: getattr(shared, name) for name in SHARED_FAULT_FIELDS} if shared else {}
    return {
        **values,
        **shown_figures(straggler_cost(anomaly.evidence)),
        **shown_action(anomaly.evidence),
        **located,
    }


DEFAULT_RULES = (
    AlertRule("FleetlensGpuFault", ("gpu_fault",), min_severity="critical"),
    AlertRule("FleetlensLinkDown", ("link_down",), min_severity="warning"),
    AlertRule("FleetlensLinkFlap", ("link_flap",), min_severity="warning"),
    AlertRule("FleetlensSlowNode", ("slow_node",), min_severity="warning", for_s=60),
    AlertRule("FleetlensDmaDegraded", ("dma_degraded",), min_severity="warning", for_s=60),
    AlertRule("FleetlensGpuThrottle", ("gpu_throttle",), min_severity="warning", for_s=120),
    AlertRule("FleetlensCongestion", ("congestion",), min_severity="warning", for_s=300),
    AlertRule("FleetlensPortErrors", ("port_errors",), min_severity="warning", for_s=60),
    AlertRule("FleetlensSharedFault", (SHARED_FAULT,), min_severity="warning"),
)


def parse_rules(entries: Sequence[Mapping[str, Any]], where: str) -> tuple[AlertRule, ...]:
    """Rules from config entries ({name, kinds, min_severity, for_s, labels, annotations}); an unknown key,
    a kind no detector reports (check_kinds) or a bad value raises AlertConfigError naming `where` and the
    entry."""
    known = {"name", "kinds", "min_severity", "for_s", "labels", "annotations"}
    rules = []
    for index, entry in enumerate(entries):
        at = f"{where}[{index}]"
        if not isinstance(entry, Mapping):
            raise AlertConfigError(f"{at}: expected a mapping with {', '.join(sorted(known))}")
        if unknown := set(entry) - known:
            raise AlertConfigError(
                f"{at}: unknown key(s) {sorted(unknown)}; known: {', '.join(sorted(known))}"
            )
        try:
            rules.append(
                AlertRule(
                    name=str(entry.get("name", "")),
                    kinds=tuple(str(kind) for kind in entry.get("kinds", ())),
                    min_severity=str(entry.get("min_severity", "warning")),
                    for_s=float(entry.get("for_s", 0.0)),
                    labels={str(k): str(v) for k, v in dict(entry.get("labels", {})).items()},
                    annotations={str(k): str(v) for k, v in dict(entry.get("annotations", {})).items()},
                )
            )
        except AlertConfigError as error:
            raise AlertConfigError(f"{at}: {error}") from None
        except (TypeError, ValueError) as error:
            raise AlertConfigError(f"{at}: {error}") from None
        check_kinds(rules[-1].kinds, at)
    return tuple(rules)

"""Alert rules: which anomalies become alerts, after how long, and with which labels and annotations.

A rule covers anomaly kinds at or above a severity. Its alert's labels identify it, as Prometheus'
do: `alertname` (the rule's name), `node`, `kind`, `severity`, and `component` and `job` when the
anomaly has them, plus the rule's own labels. Annotations are templates over the anomaly's fields:

    {kind} {node} {component} {job} {severity} {score} {evidence} {detector} {where}

where `where` is "vela-007 gpu:3" (node and component) and `evidence` the anomaly's JSON. The
fingerprint is Alertmanager's (FNV-1a over the sorted labels), so an alert has the same id here, in
Alertmanager's API and in its UI.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from alerts.errors import AlertConfigError
from analytics.store.records import Anomaly

SEVERITIES = ("info", "warning", "critical")
TEMPLATE_FIELDS = ("kind", "node", "component", "job", "severity", "score", "evidence", "detector", "where")
DEFAULT_ANNOTATIONS = {
    "summary": "{kind} on {where}",
    "description": "detector {detector} reports {kind} on {where}, severity {severity}, score {score}",
    "evidence": "{evidence}",
}

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_SEPARATOR = 0xFF


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
    `for_s` seconds (pending until then)."""

    name: str
    kinds: tuple[str, ...]
    min_severity: str = "warning"
    for_s: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ANNOTATIONS))

    def __post_init__(self) -> None:
        where = f"alert rule {self.name!r}"
        if not self.name or not self.kinds:
            raise AlertConfigError(f"{where}: needs a name and at least one kind")
        if self.min_severity not in SEVERITIES:
            raise AlertConfigError(f"{where}: min_severity must be one of {', '.join(SEVERITIES)}")
        if not self.for_s >= 0:
            raise AlertConfigError(f"{where}: for_s must be >= 0 seconds, got {self.for_s}")
        for key, template in self.annotations.items():
            unknown = {name for _, name, _, _ in string.Formatter().parse(template) if name} - set(
                TEMPLATE_FIELDS
            )
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
        labels = {
            "alertname": self.name,
            "node": anomaly.node,
            "kind": anomaly.kind,
            "severity": anomaly.severity,
        }
        labels.update({name: value for name in ("component", "job") if (value := getattr(anomaly, name))})
        return {**labels, **self.labels}

    def alert_annotations(self, anomaly: Anomaly) -> dict[str, str]:
        values = {name: getattr(anomaly, name) for name in TEMPLATE_FIELDS if hasattr(anomaly, name)}
        values.update(
            score=f"{anomaly.score:.3g}",
            where=" ".join(part for part in (anomaly.node, anomaly.component) if part),
        )
        return {key: template.format_map(values) for key, template in self.annotations.items()}


DEFAULT_RULES = (
    AlertRule("FleetlensGpuFault", ("gpu_fault",), min_severity="critical"),
    AlertRule("FleetlensLinkDown", ("link_down",), min_severity="warning"),
    AlertRule("FleetlensLinkFlap", ("link_flap",), min_severity="warning"),
    AlertRule("FleetlensSlowNode", ("slow_node",), min_severity="warning", for_s=60),
    AlertRule("FleetlensDmaDegraded", ("dma_degraded",), min_severity="warning", for_s=60),
    AlertRule("FleetlensGpuThrottle", ("gpu_throttle",), min_severity="warning", for_s=120),
    AlertRule("FleetlensCongestion", ("congestion",), min_severity="warning", for_s=300),
)


def parse_rules(entries: Sequence[Mapping[str, Any]], where: str) -> tuple[AlertRule, ...]:
    """Rules from config entries ({name, kinds, min_severity, for_s, labels, annotations}); an unknown key
    or a bad value raises AlertConfigError naming `where` and the entry."""
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
                    annotations={
                        **DEFAULT_ANNOTATIONS,
                        **{str(k): str(v) for k, v in dict(entry.get("annotations", {})).items()},
                    },
                )
            )
        except AlertConfigError as error:
            raise AlertConfigError(f"{at}: {error}") from None
        except (TypeError, ValueError) as error:
            raise AlertConfigError(f"{at}: {error}") from None
    return tuple(rules)

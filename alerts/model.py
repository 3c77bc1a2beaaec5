"""What alerts and drain decisions are, shared by the engine, the notifiers, the controller and its
backends. Times are unix seconds (float), UTC."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from analytics.evidence import Evidence

ALERT_STATES = ("pending", "firing", "resolved")


@dataclass(frozen=True)
class Alert:
    """One alert as notifiers send it and the `alerts` table stores its state changes.

    Labels identify it (Alertmanager's fingerprint is a hash of them) and always hold `alertname`;
    fleetlens alerts also carry `node`, `kind`, `severity`, and `component` and `job` when known.
    Annotations hold `summary`, `description` and `evidence` (the anomaly's numbers, as JSON). `evidence`
    holds the same numbers typed (analytics.evidence), for the drain policy (a rule may require a minimum
    job_slowdown); it is neither sent nor stored, since a rule's annotations may leave the JSON out.
    """

    fingerprint: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    state: str  # one of ALERT_STATES
    starts_at: float  # when it started firing (while pending: when it became pending)
    ends_at: float | None = None  # when it resolved; None while pending or firing
    generator_url: str = ""  # where a person can see what raised it
    evidence: Evidence | None = None  # its anomaly's evidence; None for an alert raised without one

    @property
    def alertname(self) -> str:
        return self.labels["alertname"]

    @property
    def node(self) -> str:
        return self.labels.get("node", "")


@dataclass(frozen=True)
class DrainRequest:
    """What a drain backend is asked to do about one node, and why (for its reason fields)."""

    decision_id: str
    node: str
    kind: str  # the anomaly kind that led to it, e.g. "gpu_fault"
    alert_id: str  # the fingerprint of the alert behind it
    job: str = ""
    severity: str = ""
    details: Mapping[str, str] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        """The reason a scheduler shows for the drain: `fleetlens: <kind> <alert id>`."""
        return f"fleetlens: {self.kind} {self.alert_id}"

"""The alert lifecycle: open anomalies in, alert state changes and notifications out.

Each evaluation takes the anomalies open at `now`. An anomaly a rule covers makes an alert (one per
fingerprint: the same node, component, kind and job is the same alert however often it reopens):

    pending   the anomaly is open, for less than the rule's `for_s`
    firing    it has been open for `for_s`; sent to receivers, and again every `resend_s` while it
              fires (Alertmanager forgets alerts that are not re-sent)
    resolved  its anomaly closed; sent once, then forgotten (a pending alert that never fired is
              recorded as resolved but never sent)

Every state change is returned for the `alerts` table. Notifications leave out alerts a silence
mutes; when the silence ends, a still-firing alert is sent on the next evaluation. Notifications
are grouped per node, so a node with several problems makes one delivery.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from alerts.model import Alert
from alerts.rules import DEFAULT_RULES, AlertRule, fingerprint
from alerts.silences import Silence, muted_by
from analytics.store.records import AlertChange, Anomaly


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation changed and what should be sent."""

    changes: list[Alert] = field(default_factory=list)  # state changes, for the alerts table
    to_send: list[Alert] = field(default_factory=list)  # firing (new or due again) and resolved, unmuted
    muted: dict[str, str] = field(default_factory=dict)  # fingerprint -> silence id, of alerts not sent

    def by_node(self) -> dict[str, list[Alert]]:
        """`to_send` grouped per node (the fleet-level alerts under "")."""
        groups: dict[str, list[Alert]] = defaultdict(list)
        for alert in self.to_send:
            groups[alert.node].append(alert)
        return dict(groups)


@dataclass
class _Tracked:
    alert: Alert
    active_since: float  # when its anomaly opened: `for_s` counts from here
    sent_at: float | None = None  # when it was last sent while firing


class AlertEngine:
    """Turns the open anomalies of each evaluation into alerts; keeps their state between evaluations."""

    def __init__(
        self, rules: Sequence[AlertRule] = DEFAULT_RULES, *, resend_s: float = 60.0, generator_url: str = ""
    ) -> None:
        self.rules = tuple(rules)
        self.resend_s = resend_s
        self.generator_url = generator_url
        self._tracked: dict[str, _Tracked] = {}

    @property
    def firing(self) -> list[Alert]:
        """The alerts firing now, muted or not."""
        return [tracked.alert for tracked in self._tracked.values() if tracked.alert.state == "firing"]

    def evaluate(
        self,
        anomalies: Iterable[Anomaly],
        now: float,
        silences: Sequence[Silence] = (),
        extra: Iterable[Alert] = (),
    ) -> Evaluation:
        """Advance every alert to `now` given the anomalies open now; `extra` are alerts raised outside the
        rules (the drain controller's fleet-level alert), firing while they are passed in."""
        result = Evaluation()
        current = {alert.fingerprint: (alert, alert.starts_at, None) for alert in extra}
        for anomaly in anomalies:
            rule = next((rule for rule in self.rules if rule.covers(anomaly)), None)
            if rule is not None:
                alert = self._alert_for(rule, anomaly)
                current.setdefault(alert.fingerprint, (alert, anomaly.start, rule))
        for key, (alert, active_since, rule) in current.items():
            due = now - active_since >= (rule.for_s if rule else 0.0)
            tracked = self._tracked.get(key)
            if tracked is None:  # new: pending, or firing at once when it already lasted long enough
                state = "firing" if due else "pending"
                tracked = self._tracked[key] = _Tracked(
                    replace(alert, state=state, starts_at=now), active_since
                )
                result.changes.append(tracked.alert)
            elif tracked.alert.state == "pending" and due:
                tracked.alert = replace(tracked.alert, state="firing", starts_at=now)
                result.changes.append(tracked.alert)
            tracked.alert = replace(tracked.alert, annotations=alert.annotations, evidence=alert.evidence)
        for key in [key for key in self._tracked if key not in current]:
            tracked = self._tracked.pop(key)
            resolved = replace(tracked.alert, state="resolved", ends_at=now)
            result.changes.append(resolved)
            if tracked.alert.state == "firing":
                self._send(result, resolved, silences, now)
        for tracked in self._tracked.values():
            due = tracked.sent_at is None or now - tracked.sent_at >= self.resend_s
            if tracked.alert.state == "firing" and due and self._send(result, tracked.alert, silences, now):
                tracked.sent_at = now
        return result

    def _alert_for(self, rule: AlertRule, anomaly: Anomaly) -> Alert:
        labels = rule.alert_labels(anomaly)
        return Alert(
            fingerprint=fingerprint(labels),
            labels=labels,
            annotations=rule.alert_annotations(anomaly),
            state="pending",
            starts_at=anomaly.start,
            generator_url=self.generator_url,
            evidence=anomaly.evidence,
        )

    @staticmethod
    def _send(result: Evaluation, alert: Alert, silences: Sequence[Silence], now: float) -> bool:
        """Queue `alert` for receivers unless a silence mutes it; says whether it was queued."""
        silence = muted_by(silences, alert.labels, now)
        if silence is not None:
            result.muted[alert.fingerprint] = silence
            return False
        result.to_send.append(alert)
        return True


def change_rows(alerts: Iterable[Alert], now: float) -> list[AlertChange]:
    """Rows of the `alerts` table for state changes made at `now`."""
    return [
        AlertChange(
            now,
            alert.fingerprint,
            alert.alertname,
            alert.state,
            dict(alert.labels),
            dict(alert.annotations),
            alert.starts_at,
            alert.ends_at,
        )
        for alert in alerts
    ]

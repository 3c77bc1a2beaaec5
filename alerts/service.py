"""One alerting and draining cycle per detection window: what the hub runs after its detectors.

    anomalies that changed ─▶ open anomalies ─▶ AlertEngine ─▶ alerts table
                                                   │  └─▶ DeliveryQueue per receiver ─▶ notifications table
                                                   ▼
                     requests (approve, deny, undrain) ─▶ DrainController ─▶ backends, actions table
                     requests (test), checks table ─▶ Lifecycle ─▶ CheckTrigger, controller's resume

Silences and people's requests are read from the store each cycle, so that those made through the
CLI, the UI or another hub reach this one; a stored silence that is not valid is skipped (and logged
once), never a failed cycle (alerts.commands.silences). The controller is told, for every alert firing,
the silence muting it now (not only for the alerts due to be sent this cycle), and approvals are checked
on those same alerts and silences (alerts.drain). The node lifecycle (alerts.lifecycle), when on, steps
after the controller on the same alerts. The drain controller's fleet-level alert (breaker open) and the
lifecycle's alerts on failed nodes go through the engine on the next cycle, like any alert. A receiver
that fails never stops a cycle: deliveries run on their own threads and are recorded when they end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from alerts import commands
from alerts.drain import DrainController
from alerts.engine import AlertEngine, change_rows
from alerts.errors import DecisionError
from alerts.lifecycle import Lifecycle
from alerts.model import Alert
from alerts.notifiers import Delivery, DeliveryQueue, Notifier
from alerts.silences import Silence, muted_by
from analytics.store.records import ActionRow, Anomaly, NotificationRow

log = logging.getLogger(__name__)

JOBS_SQL = """
SELECT node, argMax(job, ts) AS job FROM steps
WHERE ts >= fromUnixTimestamp64Milli(toInt64({since:Float64} * 1000)) GROUP BY node
"""
FLEET_SQL = """
SELECT uniqExact(node) FROM targets WHERE ts >= fromUnixTimestamp64Milli(toInt64({since:Float64} * 1000))
"""
JOB_MEMORY_S = 600.0  # a node's job is the one it last reported a step for within this long
FLEET_MEMORY_S = 600.0  # the fleet is the nodes scraped within this long


class AlertService:
    """Runs the engine and the drain controller on the hub's store, one cycle per detection window."""

    def __init__(
        self,
        store: Any,
        engine: AlertEngine,
        notifiers: Sequence[Notifier] = (),
        controller: DrainController | None = None,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        self.store = store
        self.engine = engine
        self.controller = controller
        self.lifecycle = lifecycle
        self.open: dict[str, Anomaly] = {}
        self._deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        self._requests_seen = 0.0
        self.queues = [DeliveryQueue(notifier, on_delivery=self._delivered) for notifier in notifiers]

    def _delivered(self, delivery: Delivery) -> None:
        """Called by the receivers' queues, from their own threads."""
        with self._lock:
            self._deliveries.append(delivery)

    def restore(self, now: float) -> None:
        """Take up the drain controller's state from the audit, as a restarted hub must; requests made
        before its last decision count as answered."""
        if self.controller is not None:
            history = commands.actions(self.store)
            self.controller.restore(history, now)
            if self.lifecycle is not None:
                self.lifecycle.restore(history, now)
            self._requests_seen = max((row.ts for row in history if row.outcome != "requested"), default=0.0)

    def cycle(self, changed: Iterable[Anomaly], now: float) -> None:
        """Advance alerts and drains to `now`, given the anomalies that opened, changed or closed."""
        for anomaly in changed:
            if anomaly.end is None:
                self.open[anomaly.id] = anomaly
            else:
                self.open.pop(anomaly.id, None)
        silences = commands.silences(self.store, now)
        fleet_alert = self.controller.fleet_alert if self.controller else None
        extra = ([fleet_alert] if fleet_alert else []) + (self.lifecycle.alerts if self.lifecycle else [])
        evaluation = self.engine.evaluate(self.open.values(), now, silences, extra=extra)
        self.store.insert_alert_changes(change_rows(evaluation.changes, now), token=f"alerts/{now}")
        for group in evaluation.by_node().values():
            for queue in self.queues:
                queue.submit(group)
        if self.controller is not None:
            [(scraped,)] = self.store.query(FLEET_SQL, parameters={"since": now - FLEET_MEMORY_S}).rows
            self.controller.fleet_size = scraped or self.controller.fleet_size
            firing = self.engine.firing
            muted = _muted(firing, silences, now)
            actions = self._requests(now, firing, muted)
            actions += self.controller.step(firing, now, muted, self._node_jobs(now))
            if self.lifecycle is not None:
                actions += self.lifecycle.step(firing, now)
            self.store.insert_actions(actions, token=f"actions/{now}")
        self._record_deliveries(now)

    def _requests(self, now: float, firing: Sequence[Alert], muted: Mapping[str, str]) -> list[ActionRow]:
        """Carry out the approvals, denials, undrains and tests people asked for since the last cycle;
        approvals on the alerts `firing` now and the silences `muted` maps them to."""
        assert self.controller is not None
        done: list[ActionRow] = []
        requests = [
            row
            for row in commands.actions(self.store, since=self._requests_seen)
            if row.outcome == "requested"
        ]
        for row in requests:
            if row.ts <= self._requests_seen:
                continue
            by = row.reason.removeprefix("requested by ")
            at = max(now, row.ts)  # the answer never precedes the request in the audit
            try:
                if row.action == "undrain":
                    done += self.controller.undrain(row.node, by, at)
                elif row.action == "test":
                    done += self._lifecycle().test(row.node, by, at)
                elif row.action == "approve":
                    done += self.controller.approve(row.decision_id, by, at, firing, muted)
                else:
                    done += self.controller.deny(row.decision_id, by, at)
            except DecisionError as error:
                mode = self.controller.policy.mode
                done.append(replace(row, ts=at, reason=str(error), mode=mode, outcome="refused"))
        self._requests_seen = max((row.ts for row in requests), default=self._requests_seen)
        return done

    def _lifecycle(self) -> Lifecycle:
        if self.lifecycle is None:
            raise DecisionError("the node lifecycle is off: no `lifecycle:` section in the hub's config")
        return self.lifecycle

    def _node_jobs(self, now: float) -> Mapping[str, str]:
        result = self.store.query(JOBS_SQL, parameters={"since": now - JOB_MEMORY_S}, max_rows=1_000_000)
        return {node: job for node, job in result.rows}

    def _record_deliveries(self, now: float) -> None:
        with self._lock:
            deliveries, self._deliveries = self._deliveries, []
        rows = [
            NotificationRow(
                d.at, d.receiver, d.ok, d.attempts, d.status, d.error, list(d.fingerprints), list(d.states)
            )
            for d in deliveries
        ]
        self.store.insert_notifications(rows, token=f"notifications/{now}/{len(rows)}")

    def close(self, timeout_s: float = 5.0) -> None:
        """Let the receivers' queues deliver what they hold, then record it."""
        for queue in self.queues:
            queue.close(timeout_s)
        self._record_deliveries(0.0)


def _muted(firing: Iterable[Alert], silences: Sequence[Silence], now: float) -> dict[str, str]:
    """Fingerprint -> the silence muting it at `now`, for every alert `firing`."""
    return {
        alert.fingerprint: silence
        for alert in firing
        if (silence := muted_by(silences, alert.labels, now)) is not None
    }

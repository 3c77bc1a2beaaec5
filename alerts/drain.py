"""The drain controller: firing alerts in, drain decisions out, within the policy's safety limits.

Each step looks at the alerts firing now. A node with an alert the policy covers (policy.DrainRule: kind,
severity, a straggler's cost, a GPU fault's action) is a candidate once corroborated; before anything is
called, the controller checks, in order: a silence on the node's alert, the hold of a shared fault, the
node's cooldown, the circuit breaker, then the limits (drained at once, share of the fleet, per job, per
hour, per parent per hour), counting drains waiting for approval as drained. What passes is

    dry-run   recorded as `dry-run`: no backend is called; the controller's state moves as if drained,
              so the audit shows what `auto` would have done
    approve   recorded as `pending` until approve() or deny(); approve() calls the backends
    auto      the backends are called at once: `done`, `failed` with their answer (retried later), or
              `drained-by-other` when another tool holds the node (not fleetlens's; asked again after retry_s)

Drains follow the shared-fault diagnosis (analytics.detectors.shared_faults; docs/alerts.md "Shared
faults"): a shared fault's own alert has no node and drains nothing; a drain its fault explains, on a node
with no GPU fault of its own, is held for policy.hold_explained_s, then decided under every limit, the
per-parent one (nodes sharing a host, PF, leaf or rack in the topology: `parents`) included.

No backend is called on a decision made earlier: approve() checks the drain again when it is asked, on
the alerts firing and the silences in force then, as the step would, whoever decided it (this controller,
or the one it restored from the audit after a restart). An approval refused is recorded (action
`approve`, outcome `refused`, the reason) and the decision stays pending. A node goes back into
scheduling (after return_after_healthy_s without an alert, when a person asks, or when the node
lifecycle's checks pass: return_tested, alerts.lifecycle) only while this controller holds it drained,
through one resume path; its cooldown then keeps a still-firing alert from draining it again at once.

Every decision goes to the `actions` table, refusals included (again only when its reason changes).
When more than breaker_fraction of the fleet turns anomalous within breaker_window_s (nodes a shared
fault explains count as that fault), the breaker opens: no drains, one fleet-level critical alert.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from alerts.backends import DrainBackend
from alerts.commands import standing
from alerts.errors import BackendError, DecisionError
from alerts.model import Alert, DrainRequest
from alerts.policy import DrainPolicy, DrainRule
from alerts.rules import EXPLAINED_BY, fingerprint
from analytics.reports.remedy import ACTION, recommended_action
from analytics.reports.straggler import shown_figures, straggler_cost
from analytics.store.records import ActionRow

log = logging.getLogger(__name__)

DECISION_NAMESPACE = uuid.UUID("0b8f6d4e-93a1-4c2e-8f57-6a1d2c3b4e5f")
FLEET_ALERT = "FleetlensFleetWideEvent"
HOUR_S = 3600.0
OWN_EVIDENCE_KINDS = ("gpu_fault", "gpu_app_error")  # a node's own fault: never held, never capped by parent
CAPPED_LAYERS = ("host", "pf", "leaf", "rack")  # the parents whose nodes the per-parent limit counts
Parents = Callable[[str, float], Collection[tuple[str, str]]]  # node, now -> its (layer, name) parents


def no_parents(node: str, now: float) -> Collection[tuple[str, str]]:
    """The parents of a fleet without a topology: none, so the per-parent limit never applies."""
    return ()


@dataclass
class _Drained:
    request: DrainRequest
    at: float
    healthy_since: float | None = None


class DrainController:
    """Decides and carries out drains for one fleet of `fleet_size` nodes; see the module doc."""

    def __init__(
        self,
        policy: DrainPolicy,
        backends: Sequence[DrainBackend],
        fleet_size: int,
        parents: Parents = no_parents,
    ) -> None:
        self.policy = policy
        self.backends = list(backends)
        self.fleet_size = fleet_size
        self.parents = parents
        self.drained: dict[str, _Drained] = {}
        self.pending: dict[str, DrainRequest] = {}  # decision id -> drain waiting for approval
        self.breaker_open = False
        self._last_drain: dict[str, float] = {}  # node -> when it was last drained (cooldown)
        self._failed_at: dict[str, float] = {}  # node -> when a backend last failed on it
        self._held_by_other_at: dict[str, float] = {}  # node -> when a backend found another tool holding it
        self._recent_drains: deque[float] = deque()
        self._first_seen: dict[str, float] = {}  # anomalous node -> since when, for the breaker
        self._refused: dict[str, str] = {}  # node -> the last refusal recorded
        self._explained_since: dict[str, float] = {}  # node -> since when its drain is held (shared fault)
        self._parent_capped: deque[tuple[float, str]] = (
            deque()
        )  # (when, node): drains the parent limit counts

    # -- the step -------------------------------------------------------------------------------------

    def step(
        self,
        firing: Sequence[Alert],
        now: float,
        muted: Mapping[str, str] | None = None,
        node_jobs: Mapping[str, str] | None = None,
    ) -> list[ActionRow]:
        """Decide on the alerts firing at `now` (`muted`: fingerprint -> silence id; `node_jobs`: the job
        each node runs, for the per-job limit); returns the decisions made."""
        muted, node_jobs = muted or {}, node_jobs or {}
        by_node = _by_node(firing)
        actions = self._watch_breaker(by_node, now)
        for node, alerts in sorted(by_node.items()):
            request = self._candidate(node, alerts, now, node_jobs)
            if request is not None:
                actions += self._decide(request, alerts, now, muted)
        actions += self._return_healthy(by_node, now)
        self._refused = {node: reason for node, reason in self._refused.items() if node in by_node}
        self._explained_since = {n: t for n, t in self._explained_since.items() if n in by_node}
        return actions

    @property
    def fleet_alert(self) -> Alert | None:
        """The fleet-level critical alert while the breaker is open."""
        if not self.breaker_open:
            return None
        labels = {"alertname": FLEET_ALERT, "severity": "critical", "kind": "fleet_event"}
        count = len(self._first_seen)
        summary = (
            f"{count} of {self.fleet_size} nodes turned anomalous within "
            f"{self.policy.limits.breaker_window_s:g} s: likely a switch or fabric event; drains stopped"
        )
        return Alert(
            fingerprint(labels), labels, {"summary": summary}, "firing", min(self._first_seen.values())
        )

    def _watch_breaker(self, by_node: Mapping[str, list[Alert]], now: float) -> list[ActionRow]:
        """Open or close the breaker on the nodes anomalous now; a node whose every alert a shared fault
        explains counts as that fault, not as one more node (a leaf's flaps are one event, and its eight
        nodes must not stop the drain of a lost GPU elsewhere)."""
        by_node = {
            node: alerts
            for node, alerts in by_node.items()
            if not all(alert.annotations.get(EXPLAINED_BY) for alert in alerts)
        }
        for node in list(self._first_seen):
            if node not in by_node:
                del self._first_seen[node]
        for node in by_node:
            self._first_seen.setdefault(node, now)
        limits = self.policy.limits
        threshold = limits.breaker_fraction * self.fleet_size
        recent = sum(1 for since in self._first_seen.values() if now - since <= limits.breaker_window_s)
        if not self.breaker_open and recent > threshold:
            self.breaker_open = True
            reason = (
                f"{recent} of {self.fleet_size} nodes turned anomalous within {limits.breaker_window_s:g} s"
            )
            return [self._row(now, "breaker", "", "", reason, "open", "breaker")]
        if self.breaker_open and len(self._first_seen) <= threshold:
            self.breaker_open = False
            reason = f"{len(self._first_seen)} of {self.fleet_size} nodes anomalous"
            return [self._row(now, "breaker", "", "", reason, "closed", "breaker")]
        return []

    def _candidate(
        self, node: str, alerts: list[Alert], now: float, node_jobs: Mapping[str, str]
    ) -> DrainRequest | None:
        """The drain the policy asks for on `node`, if its alerts are corroborated enough."""
        if node in self.drained or any(request.node == node for request in self.pending.values()):
            return None
        kinds = {alert.labels.get("kind", "") for alert in alerts}
        for alert in sorted(alerts, key=lambda a: a.starts_at):
            rule = self._rule_for(alert)
            if rule is None:
                continue
            kind, severity = alert.labels.get("kind", ""), alert.labels.get("severity", "")
            corroborated = not rule.needs_corroboration or (
                (rule.second_signal and len(kinds - {kind}) > 0)
                or (rule.after_s is not None and now - alert.starts_at >= rule.after_s)
            )
            if corroborated:
                job = alert.labels.get("job") or node_jobs.get(node, "")
                decision = uuid.uuid5(DECISION_NAMESPACE, f"{node}/{alert.fingerprint}/{alert.starts_at}")
                cost, action = straggler_cost(alert.evidence), recommended_action(alert.evidence)
                details = {**shown_figures(cost), **({ACTION: action.value} if action else {})}
                return DrainRequest(str(decision), node, kind, alert.fingerprint, job, severity, details)
        return None

    def _rule_for(self, alert: Alert) -> DrainRule | None:
        """The drain rule that covers `alert` (by its kind, severity, cost and recommended action), if any."""
        kind, severity = alert.labels.get("kind", ""), alert.labels.get("severity", "")
        cost, action = straggler_cost(alert.evidence), recommended_action(alert.evidence)
        return self.policy.rule_for(kind, severity, cost.job_slowdown, action)

    def _unwarranted(self, request: DrainRequest, alerts: Sequence[Alert]) -> str | None:
        """Why `request` no longer stands on its node's alerts firing now (`alerts`), or None."""
        if request.node in self.drained:
            return f"{request.node} is drained already"
        if not alerts:
            return f"{request.node} is no longer anomalous: no alert fires on it"
        if not any(self._rule_for(alert) for alert in alerts):
            return f"no drain rule covers the alerts firing on {request.node} now"
        return None

    def _decide(
        self, request: DrainRequest, alerts: list[Alert], now: float, muted: Mapping[str, str]
    ) -> list[ActionRow]:
        refusal = self._refusal(request, alerts, now, muted)
        if refusal is not None:
            if self._refused.get(request.node) == refusal:
                return []
            self._refused[request.node] = refusal
            return [
                self._row(now, "drain", request.node, request.job, refusal, "refused", request.decision_id)
            ]
        self._refused.pop(request.node, None)
        if self.policy.mode == "approve":
            self.pending[request.decision_id] = request
            return [self._drain_row(now, request, "pending", "waiting for approval")]
        return self._drain(request, now)

    def _refusal(
        self, request: DrainRequest, alerts: list[Alert], now: float, muted: Mapping[str, str]
    ) -> str | None:
        """Why `request` may not go ahead now, or None."""
        silences = sorted({muted[a.fingerprint] for a in alerts if a.fingerprint in muted})
        if silences:
            return f"silenced by {', '.join(silences)}"
        if (held := self._hold(request, alerts, now)) is not None:
            return held
        last = self._last_drain.get(request.node)
        if last is not None and now - last < self.policy.cooldown_s:
            return f"cooldown: drained {now - last:.0f} s ago, cooldown {self.policy.cooldown_s:g} s"
        if now - self._failed_at.get(request.node, -float("inf")) < self.policy.retry_s:
            return f"retrying after {self.policy.retry_s:g} s: the last attempt failed"
        if now - self._held_by_other_at.get(request.node, -float("inf")) < self.policy.retry_s:
            return f"asking again after {self.policy.retry_s:g} s: another tool held the node"
        if self.breaker_open:
            return "circuit breaker open: too many nodes anomalous at once (a fabric event?)"
        limits = self.policy.limits
        held = [d.request for d in self.drained.values()] + list(self.pending.values())
        while self._recent_drains and now - self._recent_drains[0] >= HOUR_S:
            self._recent_drains.popleft()
        if len(held) + 1 > limits.max_nodes:
            return f"limit: at most {limits.max_nodes} nodes drained at once ({len(held)} are)"
        if len(held) + 1 > limits.max_fraction * self.fleet_size:
            share = f"{limits.max_fraction:.0%} of {self.fleet_size}"
            return f"limit: at most {share} nodes drained at once ({len(held)} are)"
        same_job = [held_request for held_request in held if request.job and held_request.job == request.job]
        if len(same_job) + 1 > limits.max_per_job:
            return f"limit: at most {limits.max_per_job} per job ({len(same_job)} of job {request.job} are)"
        if len(self._recent_drains) + 1 > limits.max_per_hour:
            return (
                f"limit: at most {limits.max_per_hour} new drains per hour ({len(self._recent_drains)} made)"
            )
        return self._parent_limit(request, now)

    def _hold(self, request: DrainRequest, alerts: Sequence[Alert], now: float) -> str | None:
        """Why `request` waits for the shared fault that explains its alert, or None: when nothing
        explains it, the node has a GPU fault of its own, or the hold (from the first cycle it applied)
        has ended."""
        alert = next((a for a in alerts if a.fingerprint == request.alert_id), None)
        explained_by = alert.annotations.get(EXPLAINED_BY, "") if alert else ""
        own = any(a.labels.get("kind") in OWN_EVIDENCE_KINDS for a in alerts)
        if not explained_by or own:
            self._explained_since.pop(request.node, None)
            return None
        since = self._explained_since.setdefault(request.node, now)
        hold = self.policy.hold_explained_s
        if now - since >= hold:
            return None
        return (
            f"held: its {request.kind} is explained by shared fault {explained_by} and it has no GPU fault"
            f" of its own; decided again {hold:g} s after {since:.0f} (hold_explained_s)"
        )

    def _parent_limit(self, request: DrainRequest, now: float) -> str | None:
        """Why `request` would drain too many nodes under one of its parents this hour, or None."""
        if request.kind in OWN_EVIDENCE_KINDS:
            return None
        mine = {parent for parent in self.parents(request.node, now) if parent[0] in CAPPED_LAYERS}
        if not mine:
            return None
        while self._parent_capped and now - self._parent_capped[0][0] >= HOUR_S:
            self._parent_capped.popleft()
        counted = [node for _, node in self._parent_capped] + [
            pending.node for pending in self.pending.values() if pending.kind not in OWN_EVIDENCE_KINDS
        ]
        cap = self.policy.limits.max_drains_per_parent_per_hour
        for layer, name in sorted(mine):
            under = sorted({node for node in counted if (layer, name) in self.parents(node, now)})
            if len(under) + 1 > cap:
                return (
                    f"limit: at most {cap} drains per hour under one parent; {layer} {name} had"
                    f" {', '.join(under)}"
                )
        return None

    def _drain(self, request: DrainRequest, now: float) -> list[ActionRow]:
        """Carry out `request` (or, in dry-run, record that it would have been)."""
        if self.policy.mode != "dry-run":
            error, held_by = self._call(request, "drain")
            if error:
                self._failed_at[request.node] = now
                return [self._drain_row(now, request, "failed", error)]
            if held_by:  # another tool drained it: not fleetlens's to hold, resume or count
                self._held_by_other_at[request.node] = now
                return [self._drain_row(now, request, "drained-by-other", held_by)]
        self.drained[request.node] = _Drained(request, now)
        self._last_drain[request.node] = now
        self._recent_drains.append(now)
        if request.kind not in OWN_EVIDENCE_KINDS:
            self._parent_capped.append((now, request.node))
        outcome = "dry-run" if self.policy.mode == "dry-run" else "done"
        return [self._drain_row(now, request, outcome, "")]

    def _return_healthy(self, by_node: Mapping[str, list[Alert]], now: float) -> list[ActionRow]:
        """Undrain the nodes healthy for return_after_healthy_s, when the policy returns nodes itself."""
        wait = self.policy.return_after_healthy_s
        actions: list[ActionRow] = []
        for node, drained in list(self.drained.items()):
            if node in by_node:
                drained.healthy_since = None
                continue
            drained.healthy_since = drained.healthy_since or now
            if wait is not None and now - drained.healthy_since >= wait:
                actions += self._undrain(node, now, f"healthy for {now - drained.healthy_since:.0f} s")
        return actions

    # -- people ---------------------------------------------------------------------------------------

    def approve(
        self,
        decision_id: str,
        by: str,
        now: float,
        firing: Sequence[Alert],
        muted: Mapping[str, str] | None = None,
    ) -> list[ActionRow]:
        """Carry out a drain that waits for approval if the policy allows it now, given the alerts `firing`
        and `muted` (fingerprint -> silence id) now; else record the approval as refused, with the reason,
        and keep the decision pending (module doc). DecisionError when none waits under that id."""
        request = self._take_pending(decision_id)  # out of `pending`, so that it is not counted twice
        by_node = _by_node(firing)
        actions = self._watch_breaker(by_node, now)
        node, job, alerts = request.node, request.job, by_node.get(request.node, [])
        refusal = self._unwarranted(request, alerts) or self._refusal(request, alerts, now, muted or {})
        if refusal is not None:
            self.pending[decision_id] = request
            reason = f"approved by {by}, refused: {refusal}"
            return [*actions, self._row(now, "approve", node, job, reason, "refused", decision_id)]
        approval = self._row(now, "approve", node, job, f"approved by {by}", "approved", decision_id)
        return [*actions, approval, *self._drain(request, now)]

    def deny(self, decision_id: str, by: str, now: float) -> list[ActionRow]:
        """Drop a drain that waits for approval; DecisionError when there is none under that id."""
        request = self._take_pending(decision_id)
        return [self._row(now, "deny", request.node, request.job, f"denied by {by}", "denied", decision_id)]

    def undrain(self, node: str, by: str, now: float) -> list[ActionRow]:
        """Put a node fleetlens drained back into scheduling; DecisionError when it drained no such node."""
        if node not in self.drained:
            raise DecisionError(
                f"fleetlens has not drained {node}; drained now: {sorted(self.drained) or 'none'}"
            )
        return self._undrain(node, now, f"requested by {by}")

    def return_tested(self, node: str, why: str, now: float) -> list[ActionRow]:
        """The lifecycle's return of a node whose checks passed (action `return`): each backend first
        confirms fleetlens still holds the node drained; when one says it does not (a person drained it
        again with their own reason, or resumed it), the return is `refused` and fleetlens lets go of the
        node. Then the one resume path, as undrain's."""
        request = self.drained[node].request
        if self.policy.mode != "dry-run":
            try:
                lost = [backend.name for backend in self.backends if not backend.holds(request)]
            except BackendError as error:
                return [
                    self._row(now, "return", node, request.job, str(error), "failed", request.decision_id)
                ]
            if lost:
                del self.drained[node]
                reason = f"{why}; not returned: {', '.join(lost)} shows {node} no longer drained by fleetlens"
                return [self._row(now, "return", node, request.job, reason, "refused", request.decision_id)]
        return self._undrain(node, now, why, action="return")

    def mark(self, node: str, health: str) -> str:
        """Show `health` (TESTING, PASS, EVICT) on a node fleetlens drained, where its backends can; the
        errors, joined ("" when all succeeded)."""
        return self._call(self.drained[node].request, "mark", health)[0]

    def _take_pending(self, decision_id: str) -> DrainRequest:
        if decision_id not in self.pending:
            raise DecisionError(
                f"no drain decision {decision_id} waits for approval; "
                f"waiting: {sorted(self.pending) or 'none'}"
            )
        return self.pending.pop(decision_id)

    def _undrain(self, node: str, now: float, why: str, action: str = "undrain") -> list[ActionRow]:
        """Resume `node` through every backend; recorded as `action` (undrain, or the lifecycle's return)."""
        request = self.drained[node].request
        if self.policy.mode != "dry-run":
            error, _ = self._call(request, "resume")
            if error:
                return [self._row(now, action, node, request.job, error, "failed", request.decision_id)]
        del self.drained[node]
        outcome = "dry-run" if self.policy.mode == "dry-run" else "done"
        return [self._row(now, action, node, request.job, why, outcome, request.decision_id)]

    # -- plumbing -------------------------------------------------------------------------------------

    def _call(self, request: DrainRequest, verb: str, *args: str) -> tuple[str, str]:
        """Call `verb` on every backend; the errors, and the answers (a drain's: which other tool holds
        the node), each joined ("" when none)."""
        errors, answers = [], []
        for backend in self.backends:
            try:
                if answer := getattr(backend, verb)(request, *args):
                    answers.append(f"{backend.name}: held by {answer}")
            except BackendError as error:
                log.warning("%s %s on %s failed: %s", backend.name, verb, request.node, error)
                errors.append(f"{backend.name}: {error}")
        return "; ".join(errors), "; ".join(answers)

    def _drain_row(self, now: float, request: DrainRequest, outcome: str, detail: str) -> ActionRow:
        details = (f"{name} {value}" for name, value in request.details.items())  # e.g. job_slowdown 31%
        context = ", ".join([f"severity {request.severity}", *details])
        reason = f"{request.reason} ({context})" + (f": {detail}" if detail else "")
        return self._row(now, "drain", request.node, request.job, reason, outcome, request.decision_id)

    def _row(
        self, now: float, action: str, node: str, job: str, reason: str, outcome: str, decision_id: str
    ) -> ActionRow:
        return ActionRow(now, action, node, job, reason, self.policy.mode, outcome, decision_id)

    def restore(self, rows: Iterable[ActionRow], now: float) -> None:
        """Take up where an earlier controller left off, from its `actions` rows in time order: which
        nodes it drained, what waits for approval, the cooldowns, the drains of the last hour and the retry
        wait of a drain that failed."""
        history = list(rows)
        drained, pending = standing(history)
        self.drained = {node: _Drained(_request(row), row.ts) for node, row in drained.items()}
        self.pending = {decision: _request(row) for decision, row in pending.items()}
        for row in history:
            if row.action == "drain" and row.outcome in ("done", "dry-run"):
                self._last_drain[row.node] = row.ts
                if now - row.ts < HOUR_S:
                    self._recent_drains.append(row.ts)
                    if _request(row).kind not in OWN_EVIDENCE_KINDS:
                        self._parent_capped.append((row.ts, row.node))
            elif row.action == "drain" and row.outcome == "failed":
                self._failed_at[row.node] = row.ts


def _by_node(firing: Iterable[Alert]) -> dict[str, list[Alert]]:
    """The firing alerts of each node (the fleet-level alert, which has none, left out)."""
    by_node: dict[str, list[Alert]] = {}
    for alert in firing:
        if alert.node and alert.alertname != FLEET_ALERT:
            by_node.setdefault(alert.node, []).append(alert)
    return by_node


def _request(row: ActionRow) -> DrainRequest:
    """The request behind an audited drain, from its reason `fleetlens: <kind> <alert id> ...`."""
    words = row.reason.split()
    kind, alert = (words[1], words[2]) if len(words) > 2 and words[0] == "fleetlens:" else ("", "")
    return DrainRequest(row.decision_id, row.node, kind, alert, row.job)

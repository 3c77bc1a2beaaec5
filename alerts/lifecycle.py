"""The node lifecycle: a node fleetlens drained is tested with heavy checks and returned, or failed.

    in_service ─(a detector's drain)─▶ drained ─(test_after_s)─▶ testing ─(all checks PASS/WARN,
        ▲                                                           │        no alert firing)─▶ in_service
        └──────────────── return ◀───────── testing ◀─(retest_after_s)─ failed ◀─(a FAIL or ERROR,
                                                                                  or results missing
                                                                                  test_timeout_s)

Only nodes the DrainController holds drained enter it: a node a person or another tool drained is never
tested or resumed. Returns go through the controller (DrainController.return_tested), which asks each
backend first whether the node is still drained by fleetlens; when it is not, the return is `refused` and
fleetlens lets go of the node. A test is asked for through a CheckTrigger; its results are read back
from the `checks` table through a ResultsReader. Only results that started after the test began count.

Modes follow the drain policy: `auto` tests and returns at once; `dry-run` calls no trigger and no
backend, the states move as if done and the audit says `dry-run`; `approve` tests only when a person asks
(`fleetlens alerts test NODE`: the request is the approval) and returns the node when its checks pass.
A failed node raises one ticket-style critical alert (FAILED_ALERT) carrying the failing checks as
evidence, until it is tested again. Every transition is an `actions` row (`test`, `return`, `fail`),
from which lifecycle_states rebuilds the states after a hub restart.

The lifecycle replaces return_after_healthy_s: a drain policy that sets it is refused with the lifecycle.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Protocol

from alerts.drain import FLEET_ALERT, DrainController
from alerts.errors import AlertConfigError, BackendError, DecisionError
from alerts.model import Alert
from alerts.rules import fingerprint
from analytics.reports.lifecycle import NodeState, lifecycle_states
from analytics.store.records import ActionRow, CheckRow

log = logging.getLogger(__name__)

PASSING = ("PASS", "WARN")
FAILED_ALERT = "FleetlensNodeFailedChecks"
MAX_ANSWER_BYTES = 2000  # of a failed command's stderr, in the failure's reason


class CheckTrigger(Protocol):
    """Asks a node to run checks; their results reach the store (`checks`) later."""

    name: str

    def start(self, node: str, checks: Sequence[str], now: float) -> None:
        """Ask `node` to run `checks` (result names, e.g. "dcgm_diag", "remapped_rows", as `fleetlens checks
        run --checks` takes them), whose results reach the store later; raises alerts.errors.BackendError
        when the request could not be made."""


ResultsReader = Callable[[str, float, float], Sequence[CheckRow]]  # node, since, until -> its checks rows


@dataclass(frozen=True)
class LifecyclePolicy:
    """The `lifecycle:` section beside `drain:` in the config (parse_lifecycle_policy: strict keys)."""

    test_after_s: float = 600.0  # a drained node is first tested this long after its drain
    retest_after_s: float = 3600.0  # a failed node is tested again this long after it failed
    test_timeout_s: float = 3600.0  # results missing this long after the test began: failed (ERROR)
    max_testing: int = 2  # nodes in `testing` at once
    # the results that must all report PASS or WARN, by the `check` name they carry, which is also what
    # the node is asked to run (`checks run --checks` takes result names: collectors.checks.catalog)
    checks: tuple[str, ...] = ("dcgm_diag", "remapped_rows", "power_slowdown")
    label_prefix: str = "autopilot.ibm.com"  # Kubernetes label <prefix>/gpuhealth

    def __post_init__(self) -> None:
        for name in ("test_after_s", "retest_after_s"):
            if isinstance(getattr(self, name), bool) or not getattr(self, name) >= 0:
                raise AlertConfigError(f"lifecycle.{name}: must be >= 0 seconds, got {getattr(self, name)!r}")
        if isinstance(self.test_timeout_s, bool) or not self.test_timeout_s > 0:
            raise AlertConfigError(
                f"lifecycle.test_timeout_s: must be > 0 seconds, got {self.test_timeout_s!r}"
            )
        if (
            isinstance(self.max_testing, bool)
            or not isinstance(self.max_testing, int)
            or self.max_testing < 1
        ):
            raise AlertConfigError(
                f"lifecycle.max_testing: must be an integer >= 1, got {self.max_testing!r}"
            )
        if (
            isinstance(self.checks, str)
            or not self.checks
            or not all(isinstance(check, str) and check for check in self.checks)
        ):
            raise AlertConfigError(
                f"lifecycle.checks: must be a non-empty list of check names, got {self.checks!r}"
            )
        if not isinstance(self.label_prefix, str) or not self.label_prefix:
            raise AlertConfigError(
                f"lifecycle.label_prefix: must be a label prefix, got {self.label_prefix!r}"
            )
        object.__setattr__(self, "checks", tuple(self.checks))


def parse_lifecycle_policy(section: Mapping[str, Any], where: str = "lifecycle") -> LifecyclePolicy:
    """A LifecyclePolicy from the config's `lifecycle:` mapping; AlertConfigError naming the key otherwise."""
    known = {f.name for f in fields(LifecyclePolicy)}
    if unknown := set(section) - known:
        raise AlertConfigError(
            f"{where}: unknown key(s) {sorted(unknown)}; known: {', '.join(sorted(known))}"
        )
    try:
        return LifecyclePolicy(**section)
    except TypeError as error:
        raise AlertConfigError(f"{where}: {error}") from None


class CommandTrigger:
    """Starts the operator's argument list with `{node}` and `{checks}` (comma-separated) substituted in
    each argument, never through a shell, e.g.
    ["ssh", "{node}", "fleetlens", "checks", "run", "--checks", "{checks}", "--hub", "http://hub:9500"],
    and does not wait for it: heavy checks run for half an hour (`dcgmi diag -r 3`), and their results
    reach the store on their own. A command that cannot start, or ends within START_GRACE_S with a status
    other than RAN (`checks run`'s 0 PASS/WARN, 1 FAIL, 2 ERROR: the checks ran and said so), is a failed
    request; one still running after `timeout_s` is killed with its process group (the test's own timeout
    then judges the missing results). Ended commands are reaped at the next start."""

    name = "command"
    START_GRACE_S = 5.0
    RAN = (0, 1, 2)

    def __init__(self, command: Sequence[str], *, timeout_s: float = 3600.0) -> None:
        self.command = list(command)
        self.timeout_s = timeout_s
        self._running: list[tuple[subprocess.Popen[bytes], float]] = []  # (process, deadline)

    def start(self, node: str, checks: Sequence[str], now: float) -> None:
        """Start the command; BackendError when there is none (dry-run needs none), it cannot start, or it
        ends at once with a status outside RAN."""
        self._reap()
        if not self.command:
            raise BackendError(f"cannot test {node}: no lifecycle.command is configured")
        argv = [arg.replace("{node}", node).replace("{checks}", ",".join(checks)) for arg in self.command]
        shown = shlex.join(argv)
        with tempfile.TemporaryFile() as stderr:
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    start_new_session=True,
                )
            except OSError as error:
                raise BackendError(f"cannot test {node}: cannot run `{shown}`: {error}") from error
            try:
                status = process.wait(self.START_GRACE_S)
            except subprocess.TimeoutExpired:
                self._running.append((process, time.monotonic() + self.timeout_s))
                return
            if status not in self.RAN:
                stderr.seek(0)
                answer = stderr.read(MAX_ANSWER_BYTES).decode(errors="replace").strip() or "no output"
                raise BackendError(f"cannot test {node}: `{shown}` exited with status {status}: {answer}")

    def _reap(self) -> None:
        """Forget the commands that ended; kill those past their deadline."""
        running = []
        for process, deadline in self._running:
            if process.poll() is not None:
                continue
            if time.monotonic() > deadline:
                log.warning(
                    "lifecycle: killing `%s`, still running after %g s",
                    shlex.join(process.args),
                    self.timeout_s,
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                continue
            running.append((process, deadline))
        self._running = running


class Lifecycle:
    """Moves the nodes `controller` drained through testing back into service, or to failed."""

    def __init__(
        self,
        policy: LifecyclePolicy,
        controller: DrainController,
        trigger: CheckTrigger,
        results: ResultsReader,
    ) -> None:
        if controller.policy.return_after_healthy_s is not None:
            raise AlertConfigError(
                "drain.return_after_healthy_s: must be null while the lifecycle is on; the lifecycle returns "
                "nodes only after their checks pass"
            )
        self.policy = policy
        self.controller = controller
        self.trigger = trigger
        self.results = results
        self.states: dict[str, NodeState] = {}
        self._evidence: dict[str, list[dict[str, Any]]] = {}  # failed node -> its failing checks
        self._refused: dict[str, str] = {}  # node -> the last refusal or failed return recorded

    @property
    def mode(self) -> str:
        return self.controller.policy.mode

    def step(self, firing: Sequence[Alert], now: float) -> list[ActionRow]:
        """Judge the tests under way on their results and the alerts `firing`, then start the tests due."""
        self._follow_controller()
        by_node: dict[str, list[Alert]] = {}
        for alert in firing:
            if alert.node and alert.alertname not in (FAILED_ALERT, FLEET_ALERT):
                by_node.setdefault(alert.node, []).append(alert)
        actions: list[ActionRow] = []
        for node, state in sorted(self.states.items()):
            if state.state == "testing":
                actions += self._judge(node, state, by_node.get(node, []), now)
        if self.mode != "approve":
            for node, state in sorted(self.states.items()):
                wait = {"drained": self.policy.test_after_s, "failed": self.policy.retest_after_s}.get(
                    state.state
                )
                if wait is not None and now - state.since >= wait:
                    actions += self._start(node, now, f"{state.state} for {now - state.since:.0f} s")
        self._refused = {node: why for node, why in self._refused.items() if node in self.states}
        return actions

    def test(self, node: str, by: str, now: float) -> list[ActionRow]:
        """A person asks for `node` to be tested now; DecisionError when fleetlens holds no such node
        drained, or it is being tested."""
        self._follow_controller()
        if node not in self.states:
            raise DecisionError(
                f"fleetlens has not drained {node}; drained now: {sorted(self.controller.drained) or 'none'}"
            )
        if self.states[node].state == "testing":
            raise DecisionError(f"{node} is being tested already, since {self.states[node].since:.0f}")
        self._refused.pop(node, None)
        return self._start(node, now, f"requested by {by}")

    @property
    def alerts(self) -> list[Alert]:
        """The ticket-style alert of each failed node, its failing checks as evidence."""
        found = []
        for node, state in sorted(self.states.items()):
            if state.state != "failed":
                continue
            labels = {"alertname": FAILED_ALERT, "node": node, "severity": "critical", "kind": "node_failed"}
            annotations = {
                "summary": f"{node} failed its checks after a drain; it stays out of service",
                "description": state.reason,
                "evidence": json.dumps(self._evidence.get(node, [])),
            }
            found.append(Alert(fingerprint(labels), labels, annotations, "firing", state.since))
        return found

    def restore(self, history: Iterable[ActionRow], now: float) -> None:
        """Take up the states an earlier lifecycle left in the audit (after the controller restored)."""
        self.states = {
            node: state
            for node, state in lifecycle_states(history).items()
            if node in self.controller.drained
        }
        self._follow_controller()

    # -- transitions ----------------------------------------------------------------------------------

    def _follow_controller(self) -> None:
        """Nodes the controller drained enter as `drained`; nodes it let go of (a person's undrain) leave."""
        for node, drained in self.controller.drained.items():
            if node not in self.states:
                self.states[node] = NodeState("drained", drained.at, drained.request.reason)
        for node in [node for node in self.states if node not in self.controller.drained]:
            del self.states[node]
            self._evidence.pop(node, None)

    def _start(self, node: str, now: float, why: str) -> list[ActionRow]:
        testing = sum(1 for state in self.states.values() if state.state == "testing")
        if testing >= self.policy.max_testing:
            limit = f"limit: at most {self.policy.max_testing} nodes testing at once ({testing} are)"
            if self._refused.get(node) == limit:
                return []
            self._refused[node] = limit
            return [self._row(now, "test", node, f"{why}; {limit}", "refused")]
        checks = ", ".join(self.policy.checks)
        if self.mode != "dry-run":
            try:
                self.trigger.start(node, self.policy.checks, now)
            except BackendError as error:
                self.states[node] = replace(self.states[node], since=now)  # tried again after the same wait
                return [self._row(now, "test", node, f"{why}; {self.trigger.name}: {error}", "failed")]
            self._mark(node, "TESTING")
        reason = f"{why}; checks {checks} asked"
        self.states[node] = NodeState("testing", now, reason)
        self._evidence.pop(node, None)
        return [self._row(now, "test", node, reason, self._outcome)]

    def _judge(self, node: str, state: NodeState, alerts: Sequence[Alert], now: float) -> list[ActionRow]:
        """Fail on any FAIL or ERROR, or on results missing past the timeout; return when every check
        passed and no alert fires on the node; else keep waiting."""
        latest: dict[tuple[str, str], CheckRow] = {}
        for row in sorted(self.results(node, state.since, now), key=lambda row: row.started):
            if row.started >= state.since:
                latest[(row.check, row.target)] = row
        bad = [row for row in latest.values() if row.status not in PASSING]
        if bad:
            return self._fail(node, now, "checks failed: " + "; ".join(map(_shown, bad)), bad)
        reported = {check for check, _ in latest}
        missing = [check for check in self.policy.checks if check not in reported]
        if missing:
            if now - state.since < self.policy.test_timeout_s:
                return []
            timeout = f"{self.policy.test_timeout_s:g} s"
            return self._fail(node, now, f"ERROR: no result from {', '.join(missing)} within {timeout}", [])
        if alerts:
            names = ", ".join(sorted({alert.alertname for alert in alerts}))
            return self._fail(node, now, f"checks passed but alert(s) firing on {node}: {names}", [])
        passed = "; ".join(map(_shown, latest.values()))
        rows = self.controller.return_tested(node, f"checks passed ({state.reason}): {passed}", now)
        if node not in self.controller.drained:
            del self.states[node]
        elif failed := [row.reason for row in rows if row.outcome == "failed"]:  # tried again each step,
            if self._refused.get(node) == failed[0]:  # recorded once per answer
                return []
            self._refused[node] = failed[0]
        return rows

    def _fail(self, node: str, now: float, reason: str, bad: Sequence[CheckRow]) -> list[ActionRow]:
        if self.mode != "dry-run":
            self._mark(node, "EVICT")
        self.states[node] = NodeState("failed", now, reason)
        self._evidence[node] = [asdict(row) for row in bad]
        return [self._row(now, "fail", node, reason, self._outcome)]

    def _mark(self, node: str, health: str) -> None:
        """Show `health` on the node where its backends can; a failure is logged, never fatal: the
        label is for other schedulers, and the controller's drain still holds the node."""
        if error := self.controller.mark(node, health):
            log.warning("lifecycle: cannot mark %s %s: %s", node, health, error)

    @property
    def _outcome(self) -> str:
        return "dry-run" if self.mode == "dry-run" else "done"

    def _row(self, now: float, action: str, node: str, reason: str, outcome: str) -> ActionRow:
        drained = self.controller.drained.get(node)
        job, decision = (drained.request.job, drained.request.decision_id) if drained else ("", "")
        return ActionRow(now, action, node, job, reason, self.mode, outcome, decision)


def _shown(row: CheckRow) -> str:
    """One check's verdict for a reason: `dcgm_diag gpu:3 FAIL 1 (threshold 0)`."""
    target = f" {row.target}" if row.target else ""
    value = "" if row.value is None else f" {row.value:g}{row.unit and ' ' + row.unit}"
    threshold = "" if row.threshold is None else f" (threshold {row.threshold:g})"
    return f"{row.check}{target} {row.status}{value}{threshold}"

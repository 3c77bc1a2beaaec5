"""No drain backend is called that the policy would refuse at that moment, whoever asks: the step, an
approval of a decision made earlier (by this controller or one restored from the audit), an undrain.

The property test drives random sequences of alerts firing and resolving on random nodes, silences made
and expired, approvals, denials, undrain requests, backend failures, restarts and clock steps through a
controller in approve and auto mode. Its backend judges every call as it is made by the policy written
again here from its documentation (`Oracle`), on what the test knows is true then, not on the controller's
state: the alerts firing, the silences in force, and what the backend itself has done. The regression
tests replay the issue's cases with the exec hook backend, a real command that records its calls."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from alerts import commands
from alerts.backends.exec_hook import ExecBackend
from alerts.drain import DrainController
from alerts.engine import AlertEngine
from alerts.errors import BackendError, DecisionError
from alerts.model import Alert, DrainRequest
from alerts.policy import DrainLimits, DrainPolicy
from alerts.rules import fingerprint
from alerts.service import AlertService
from analytics.store import Store
from analytics.store.records import ActionRow
from analytics.xid_catalog import Action
from tests.alerts.test_drain import anomaly, firing
from tests.support.evidence import example

NODES = tuple(f"vela-{i:03d}" for i in range(1, 11))
JOBS = {node: f"job-{i % 3}" for i, node in enumerate(NODES)}
HOUR_S = 3600.0
RESET, RESTART = (example("gpu_fault", action=action) for action in (Action.RESET_GPU, Action.RESTART_JOB))
# (kind, severity, component, evidence, whether the default drain rules cover it)
VARIANTS = (
    ("gpu_fault", "critical", "gpu:0", RESET, True),  # drained at once
    ("gpu_fault", "critical", "gpu:1", RESTART, False),  # the job restarts, not the node
    ("link_down", "warning", "mlx5_0:1", example("link_down"), True),  # with a second signal, or after 300 s
    ("gpu_throttle", "warning", "gpu:2", example("gpu_throttle"), False),  # alerted, never drained
)


def alert(node: str, variant: int, since: float) -> Alert:
    kind, severity, component, evidence, _ = VARIANTS[variant]
    labels = {"alertname": f"Fleetlens-{kind}", "node": node, "kind": kind, "severity": severity}
    labels["component"] = component
    return Alert(fingerprint(labels), labels, {}, "firing", since, evidence=evidence)


def covered(alert: Alert) -> bool:
    return next(v[4] for v in VARIANTS if v[2] == alert.labels["component"])


@dataclass
class Silence:
    node: str
    starts_at: float
    ends_at: float
    id: str

    def mutes(self, node: str, now: float) -> bool:
        return self.node == node and self.starts_at <= now < self.ends_at


@dataclass
class Oracle:
    """What is true now and what the policy (alerts.drain's and alerts.policy's docs) allows on it; also
    the recording backend, which asks it about every call and fails for the nodes in `failing`."""

    policy: DrainPolicy
    fleet_size: int = len(NODES)
    now: float = 1_000_000.0
    alerts: dict[tuple[str, int], Alert] = field(default_factory=dict)
    silences: list[Silence] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)
    drained: dict[str, float] = field(default_factory=dict)  # node -> when its drain succeeded
    drains: list[tuple[str, float]] = field(default_factory=list)  # every drain that succeeded
    failed_at: dict[str, float] = field(default_factory=dict)
    first_seen: dict[str, float] = field(default_factory=dict)  # anomalous node -> since when (breaker)
    breaker_open: bool = False
    calls: list[tuple[str, str, float]] = field(default_factory=list)
    name: str = "recording"

    # -- the world ---------------------------------------------------------------------------------

    @property
    def firing(self) -> list[Alert]:
        return list(self.alerts.values())

    @property
    def muted(self) -> dict[str, str]:
        return {a.fingerprint: s.id for a in self.firing for s in self.silences if s.mutes(a.node, self.now)}

    def observe(self) -> None:
        """The breaker as the docs put it, at each moment the controller is shown the alerts: open once
        more than breaker_fraction of the fleet turned anomalous within breaker_window_s, closed once no
        more than that share is anomalous."""
        anomalous = {a.node for a in self.firing}
        self.first_seen = {node: self.first_seen.get(node, self.now) for node in anomalous}
        limits = self.policy.limits
        share = limits.breaker_fraction * self.fleet_size
        recent = [n for n, since in self.first_seen.items() if self.now - since <= limits.breaker_window_s]
        if len(recent) > share:
            self.breaker_open = True
        elif len(anomalous) <= share:
            self.breaker_open = False

    # -- the backend -------------------------------------------------------------------------------

    def drain(self, request: DrainRequest) -> None:
        node, now, limits = request.node, self.now, self.policy.limits
        refusal = [
            (self.breaker_open, "the breaker is open"),
            (not any(covered(a) for a in self.firing if a.node == node), "no alert a rule covers fires"),
            (any(s.mutes(node, now) for s in self.silences), "a silence mutes the node"),
            (node in self.drained, "the node is drained already"),
            (
                any(n == node and now - at < self.policy.cooldown_s for n, at in self.drains),
                "inside the cooldown",
            ),
            (now - self.failed_at.get(node, -HOUR_S) < self.policy.retry_s, "before the retry time"),
            (len(self.drained) + 1 > limits.max_nodes, "over max_nodes"),
            (len(self.drained) + 1 > limits.max_fraction * self.fleet_size, "over max_fraction"),
            (
                sum(JOBS[n] == JOBS[node] for n in self.drained) + 1 > limits.max_per_job,
                "over max_per_job",
            ),
            (sum(now - at < HOUR_S for _, at in self.drains) + 1 > limits.max_per_hour, "over max_per_hour"),
        ]
        broken = [why for refused, why in refusal if refused]
        assert not broken, f"drain of {node} at {now}: the policy refuses it now: {', '.join(broken)}"
        self.calls.append(("drain", node, now))
        if node in self.failing:
            self.failed_at[node] = now
            raise BackendError(f"{node} unreachable")
        self.drained[node] = now
        self.drains.append((node, now))

    def resume(self, request: DrainRequest) -> None:
        assert request.node in self.drained, f"resume of {request.node}, which no drain took out"
        self.calls.append(("resume", request.node, self.now))
        if request.node in self.failing:
            raise BackendError(f"{request.node} unreachable")
        del self.drained[request.node]


KINDS_OF_OPERATION = {  # each with how often it comes, relative to the others
    "fire": (4, st.tuples(st.sampled_from(NODES[:6]), st.integers(0, len(VARIANTS) - 1))),
    "step": (4, st.tuples(st.sampled_from([0.0, 10.0, 60.0, 310.0, 1800.0]))),
    "approve": (3, st.tuples(st.integers(0, 20))),
    "resolve": (2, st.tuples(st.sampled_from(NODES[:6]), st.integers(0, len(VARIANTS) - 1))),
    "silence": (1, st.tuples(st.sampled_from(NODES[:6]), st.sampled_from([30.0, 600.0, 7200.0]))),
    "expire": (1, st.tuples(st.integers(0, 20))),
    "deny": (1, st.tuples(st.integers(0, 20))),
    "undrain": (1, st.tuples(st.sampled_from(NODES[:6]))),
    "flaky": (1, st.tuples(st.sampled_from(NODES[:6]))),
    "restart": (1, st.tuples()),
}
OPERATIONS = st.sampled_from(
    [kind for kind, (weight, _) in KINDS_OF_OPERATION.items() for _ in range(weight)]
).flatmap(lambda kind: KINDS_OF_OPERATION[kind][1].map(lambda arguments: (kind, *arguments)))
POLICIES = st.builds(
    DrainPolicy,
    mode=st.sampled_from(["approve", "auto"]),
    limits=st.builds(
        DrainLimits,
        max_nodes=st.integers(1, 4),
        max_fraction=st.sampled_from([0.1, 0.2, 0.3, 1.0]),
        max_per_job=st.integers(1, 3),
        max_per_hour=st.integers(1, 5),
        breaker_fraction=st.sampled_from([0.2, 0.3, 0.5, 0.8]),
        breaker_window_s=st.sampled_from([60.0, 300.0, 3600.0]),
    ),
    cooldown_s=st.sampled_from([0.0, 60.0, 600.0]),
    return_after_healthy_s=st.sampled_from([None, 0.0, 30.0, 300.0]),
    retry_s=st.sampled_from([10.0, 60.0]),
)


def play(policy: DrainPolicy, operations: Sequence[tuple]) -> Oracle:
    """Run `operations` through a controller whose backend is the oracle; the oracle, at the end."""
    world = Oracle(policy)
    controller = DrainController(policy, [world], len(NODES))
    audit: list[ActionRow] = []
    for operation in operations:
        match operation:
            case ("fire", node, variant):
                world.alerts.setdefault((node, variant), alert(node, variant, world.now))
            case ("resolve", node, variant):
                world.alerts.pop((node, variant), None)
            case ("silence", node, duration):
                world.silences.append(
                    Silence(node, world.now, world.now + duration, f"s{len(world.silences)}")
                )
            case ("expire", index) if world.silences:
                silence = world.silences[index % len(world.silences)]
                silence.ends_at = min(silence.ends_at, world.now)
            case ("step", seconds):
                world.now += seconds
                world.observe()
                audit += controller.step(world.firing, world.now, world.muted, JOBS)
            case ("approve", index) if controller.pending:
                decision = sorted(controller.pending)[index % len(controller.pending)]
                world.observe()
                audit += controller.approve(decision, "sre", world.now, world.firing, world.muted)
            case ("deny", index) if controller.pending:
                decision = sorted(controller.pending)[index % len(controller.pending)]
                audit += controller.deny(decision, "sre", world.now)
            case ("undrain", node) if node in controller.drained:
                audit += controller.undrain(node, "sre", world.now)
            case ("flaky", node):
                world.failing ^= {node}
            case ("restart",):
                controller = DrainController(policy, [world], len(NODES))
                controller.restore(audit, world.now)
    with pytest.raises(DecisionError):
        controller.approve("no-such-decision", "sre", world.now, world.firing, world.muted)
    return world


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=POLICIES, operations=st.lists(OPERATIONS, min_size=20, max_size=80))
def test_no_backend_call_is_one_the_policy_refuses_at_that_moment(
    policy: DrainPolicy, operations: list[tuple]
) -> None:
    world = play(policy, operations)
    target(float(sum(verb == "drain" for verb, _, _ in world.calls)), label="drain calls")


def test_the_random_sequences_reach_drains_approvals_and_returns() -> None:
    """The property is not met by calling nothing: a plain sequence drains, returns and drains again."""
    policy = DrainPolicy(mode="approve", limits=DrainLimits(max_fraction=1), return_after_healthy_s=0.0)
    world = play(
        policy,
        [
            ("fire", "vela-001", 0),
            ("step", 10.0),
            ("approve", 0),
            ("resolve", "vela-001", 0),
            ("step", 10.0),
            ("fire", "vela-002", 0),
            ("step", 10.0),
            ("restart",),
            ("approve", 0),
        ],
    )
    assert [(verb, node) for verb, node, _ in world.calls] == [
        ("drain", "vela-001"),
        ("resume", "vela-001"),
        ("drain", "vela-002"),
    ]


# -- the cases, with the exec hook -------------------------------------------------------------

RECORDER = """
import json, sys
with open(sys.argv[1], "a") as out:
    out.write(json.dumps(json.load(sys.stdin)) + "\\n")
"""


@dataclass
class Hook:
    """The exec hook backend running a command that records each call in a file."""

    log: Path

    @property
    def backend(self) -> ExecBackend:
        return ExecBackend([sys.executable, "-c", RECORDER, str(self.log)])

    @property
    def calls(self) -> list[tuple[str, str]]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [(call["action"], call["node"]) for call in map(json.loads, lines)]


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[Hook]:
    yield Hook(tmp_path / "calls.jsonl")


def approving(hook: Hook, fleet_size: int = 10) -> DrainController:
    limits = DrainLimits(max_nodes=4, max_fraction=0.5, max_per_job=4, breaker_fraction=0.3)
    return DrainController(DrainPolicy(mode="approve", limits=limits), [hook.backend], fleet_size)


def test_after_4_of_10_nodes_fail_and_the_breaker_opens_approving_the_first_decision_calls_no_hook(
    hook: Hook,
) -> None:
    drains = approving(hook)
    first = firing(anomaly("vela-001"))
    [decision] = drains.step(first, now=10)
    storm = firing(*(anomaly(f"vela-00{i}") for i in range(1, 5)), now=20)
    opened = drains.step(storm, now=20)
    assert (opened[0].action, opened[0].outcome) == ("breaker", "open")

    [answer] = drains.approve(decision.decision_id, "alice", now=30, firing=storm)

    assert hook.calls == []
    assert (answer.action, answer.outcome) == ("approve", "refused")
    assert "approved by alice, refused: circuit breaker open" in answer.reason
    assert list(drains.pending) == [decision.decision_id], "it stays pending, for once the breaker closes"


def test_three_pending_drains_approved_after_the_breaker_opened_call_the_hook_0_times(hook: Hook) -> None:
    drains = approving(hook)
    three = firing(*(anomaly(f"vela-00{i}") for i in range(1, 4)))
    decisions = drains.step(three, now=10)
    assert [row.outcome for row in decisions] == ["pending"] * 3
    five = firing(*(anomaly(f"vela-00{i}") for i in range(1, 6)), now=20)
    drains.step(five, now=20)

    answers = [row for d in decisions for row in drains.approve(d.decision_id, "alice", 30, five)]

    assert hook.calls == []
    assert [a.outcome for a in answers] == ["refused"] * 3
    assert all("circuit breaker open" in a.reason for a in answers)


def test_a_node_silenced_after_its_decision_is_not_drained_on_approval_until_the_silence_ends(
    hook: Hook,
) -> None:
    drains = approving(hook)
    alerts = firing(anomaly("vela-001"))
    [decision] = drains.step(alerts, now=10)
    muted = {alerts[0].fingerprint: "swap-1"}  # a silence made after the decision

    [answer] = drains.approve(decision.decision_id, "alice", now=20, firing=alerts, muted=muted)
    assert hook.calls == [] and answer.outcome == "refused" and "silenced by swap-1" in answer.reason

    approval, drain = drains.approve(decision.decision_id, "alice", now=30, firing=alerts)  # it ended
    assert (approval.outcome, drain.outcome) == ("approved", "done")
    assert hook.calls == [("drain", "vela-001")]


def test_approving_a_decision_whose_node_recovered_or_is_covered_no_more_calls_no_hook(hook: Hook) -> None:
    drains = approving(hook)
    [decision] = drains.step(firing(anomaly("vela-001")), now=10)
    [recovered] = drains.approve(decision.decision_id, "alice", now=20, firing=[])
    restart_only = firing(anomaly("vela-001", evidence=RESTART), now=30)
    [uncovered] = drains.approve(decision.decision_id, "alice", now=30, firing=restart_only)

    assert hook.calls == []
    assert "vela-001 is no longer anomalous" in recovered.reason
    assert "no drain rule covers the alerts firing on vela-001" in uncovered.reason


def test_a_restarted_controller_checks_restored_decisions_and_waits_out_a_failed_drains_retry(
    hook: Hook, tmp_path: Path
) -> None:
    failing = ExecBackend([sys.executable, "-c", "import sys; sys.exit(1)"])
    auto = DrainPolicy(mode="auto", limits=DrainLimits(max_fraction=1), retry_s=60)
    alerts = firing(anomaly("vela-001"))
    audit = DrainController(auto, [failing], 10).step(alerts, now=10)
    assert [row.outcome for row in audit] == ["failed"]

    restarted = DrainController(auto, [hook.backend], 10)
    restarted.restore(audit, now=20)
    assert [row.outcome for row in restarted.step(alerts, now=20)] == ["refused"]
    assert hook.calls == []
    assert [row.outcome for row in restarted.step(alerts, now=70)] == ["done"]


def test_an_approval_through_the_hub_cycle_is_checked_on_the_alerts_and_breaker_of_that_cycle(
    store: Store, hook: Hook
) -> None:
    service, now = AlertService(store, AlertEngine(), controller=approving(hook)), time.time()
    service.cycle([anomaly("vela-001", start=now)], now=now + 10)
    [decision] = commands.drain_status(store)["pending"]
    storm = [anomaly(f"vela-00{i}", start=now + 15) for i in range(2, 5)]
    service.cycle(storm, now=now + 20)  # 4 of 10 nodes: the breaker opens
    commands.request(store, "approve", decision.decision_id, "alice", now=now + 25)
    service.cycle([], now=now + 30)

    assert hook.calls == []
    answer = [
        row for row in commands.actions(store) if row.action == "approve" and row.outcome != "requested"
    ]
    assert [(row.outcome, row.decision_id) for row in answer] == [("refused", decision.decision_id)]
    assert "circuit breaker open" in answer[0].reason
    assert [row.decision_id for row in commands.drain_status(store)["pending"]] == [decision.decision_id]

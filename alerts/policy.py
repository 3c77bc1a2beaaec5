"""The drain policy: which alerts lead to a drain, how sure fleetlens must be first, and the safety
limits no decision may cross. Parsed from the `drain:` section of the config file.

    drain:
      mode: dry-run                 # dry-run (default): record decisions, call nothing
                                    # approve: decisions wait for a person; auto: act at once
      cooldown_s: 3600              # a node is drained at most once per cooldown
      return_after_healthy_s: null  # put a node back after this long without alerts (null: by hand)
      hold_explained_s: 1800        # a drain on alerts a shared fault explains waits this long
      rules:
        - {kinds: [gpu_fault], min_severity: critical,                             # at once, when
           actions: [reset_gpu, reboot_node, drain_for_inspection]}                # the GPU needs it
        - {kinds: [slow_node], second_signal: true, after_s: 600,                  # either suffices,
           min_job_slowdown: 0.05}                                                 # when it costs >= 5%
      limits: {max_nodes: 4, max_fraction: 0.05, max_per_job: 1, max_per_hour: 4,
               max_drains_per_parent_per_hour: 1, breaker_fraction: 0.2, breaker_window_s: 300}

A rule's `actions` match the action a gpu_fault's evidence recommends (analytics.reports.remedy: the
most disruptive of what its Xids, per NVIDIA's catalog, and its other signals ask for), one of
none, restart_job, reset_gpu, reboot_node, drain_for_inspection. So a critical Xid that a restart of the
job clears leaves the node in service. gpu_app_error (Xids the application caused) and shared_fault (a
leaf's, a host's... fault: no node of its own) are never drained: a rule that lists either is refused,
and so is one naming a kind no detector reports (alerts.rules.check_kinds).

Values that cannot mean what they say are refused, naming the key: a limit of 0 (max_nodes,
max_fraction, max_per_job, max_per_hour, max_drains_per_parent_per_hour, breaker_fraction), which
would allow no drain at all, in any mode (to decide without acting, use mode dry-run: its audit shows
what the limits allow); a negative cooldown_s, return_after_healthy_s or hold_explained_s; a retry_s
that is not positive.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from alerts.errors import AlertConfigError
from alerts.rules import SEVERITIES, check_kinds
from analytics.reports.remedy import ACTION_KINDS
from analytics.reports.straggler import COSTED_KINDS
from analytics.xid_catalog import Action

MODES = ("dry-run", "approve", "auto")
ACTIONS = tuple(action.value for action in Action)
DRAINING_ACTIONS = tuple(action.value for action in Action if action.drains)
NEVER_DRAINED = {  # anomaly kinds no drain rule may list, and why
    "gpu_app_error": "its Xids are the application's doing: restart the job; draining the node would "
    "turn one crashing job into nodes lost to every job",
    "shared_fault": "it is a leaf's, a host's or a rack's fault, no node's: draining its nodes one by one "
    "would empty the layer and mend nothing",
}
DRAINABLE_ACTION_KINDS = tuple(kind for kind in ACTION_KINDS if kind not in NEVER_DRAINED)


@dataclass(frozen=True)
class DrainRule:
    """Firing alerts of `kinds` at `min_severity` or above lead to a drain, at once, or when corroborated:
    by an alert of another kind on the same node (`second_signal`), or by firing for `after_s` seconds.

    `min_job_slowdown` keeps a straggler that costs its job little in service: the rule covers an alert
    only when its anomaly's evidence says the job's steps would be at least that fraction shorter without
    the node (analytics.reports.straggler); an anomaly that does not say (written before the detector
    reported it) does not meet a minimum. Only the COSTED_KINDS (slow_node) carry the figure, so a rule
    with a minimum may list those kinds alone.

    `actions` likewise covers an alert only when its anomaly's evidence recommends one of them
    (analytics.reports.remedy; ACTIONS), so only gpu_fault may have them; evidence without one matches
    none."""

    kinds: tuple[str, ...]
    min_severity: str = "warning"
    second_signal: bool = False
    after_s: float | None = None
    min_job_slowdown: float | None = None
    actions: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.kinds:
            raise AlertConfigError("drain rule: needs at least one kind")
        for kind in self.kinds:
            if kind in NEVER_DRAINED:
                raise AlertConfigError(
                    f"drain rule {self.kinds}: {kind} is never drained: {NEVER_DRAINED[kind]}"
                )
        if self.min_severity not in SEVERITIES:
            raise AlertConfigError(
                f"drain rule {self.kinds}: min_severity must be one of {', '.join(SEVERITIES)}"
            )
        if self.after_s is not None and not self.after_s >= 0:
            raise AlertConfigError(f"drain rule {self.kinds}: after_s must be >= 0, got {self.after_s}")
        if self.min_job_slowdown is not None:
            self._check_min_job_slowdown(self.min_job_slowdown)
        if self.actions is not None:
            object.__setattr__(self, "actions", self._checked_actions(self.actions))

    def _check_min_job_slowdown(self, minimum: object) -> None:
        """A fraction in [0, 1), on a rule whose kinds all report job_slowdown (else it never matches)."""
        if isinstance(minimum, bool) or not isinstance(minimum, int | float) or not 0 <= minimum < 1:
            raise AlertConfigError(
                f"drain rule {self.kinds}: min_job_slowdown must be a fraction in [0, 1) "
                f"(0.05: the job's steps 5% shorter without the node), got {minimum!r}"
            )
        if uncosted := [kind for kind in self.kinds if kind not in COSTED_KINDS]:
            raise AlertConfigError(
                f"drain rule {self.kinds}: min_job_slowdown applies to {', '.join(COSTED_KINDS)} only, "
                f"whose anomalies report job_slowdown; {', '.join(uncosted)} would never match: "
                "give them a rule of their own"
            )

    def _checked_actions(self, actions: object) -> tuple[str, ...]:
        """A list of known action names, on a rule whose kinds all carry an action (else it never matches)."""
        if isinstance(actions, str) or not isinstance(actions, Iterable):
            raise AlertConfigError(
                f"drain rule {self.kinds}: actions must be a list of {', '.join(ACTIONS)}, got {actions!r}"
            )
        listed = tuple(actions)
        if unknown := [action for action in listed if action not in ACTIONS]:
            raise AlertConfigError(
                f"drain rule {self.kinds}: unknown action(s) {unknown}; known: {', '.join(ACTIONS)}"
            )
        if without := [kind for kind in self.kinds if kind not in ACTION_KINDS]:
            raise AlertConfigError(
                f"drain rule {self.kinds}: actions apply to {', '.join(DRAINABLE_ACTION_KINDS)} only, whose "
                "anomalies "
                f"recommend an action; {', '.join(without)} would never match: give them a rule of their own"
            )
        return listed

    @property
    def needs_corroboration(self) -> bool:
        return self.second_signal or self.after_s is not None

    def covers(
        self, kind: str, severity: str, job_slowdown: float | None = None, action: str | None = None
    ) -> bool:
        """Whether the rule applies to an alert of `kind` and `severity` whose anomaly costs its job
        `job_slowdown` and recommends `action` (None: not known, which meets no minimum and no actions)."""
        if kind not in self.kinds or SEVERITIES.index(severity) < SEVERITIES.index(self.min_severity):
            return False
        if self.actions is not None and action not in self.actions:
            return False
        return self.min_job_slowdown is None or (
            job_slowdown is not None and job_slowdown >= self.min_job_slowdown
        )


@dataclass(frozen=True)
class DrainLimits:
    """Checked before any call: drained at once (count and share of the fleet), per job, new drains per
    hour, new drains per hour under one parent (a host, PF, leaf or rack, for a drain on anything but a
    GPU's own fault: alerts.drain); and the circuit breaker: more than `breaker_fraction` of the fleet
    turning anomalous within `breaker_window_s` is a switch or fabric event, not many bad nodes, so
    drains stop."""

    max_nodes: int = 4
    max_fraction: float = 0.05
    max_per_job: int = 1
    max_per_hour: int = 4
    max_drains_per_parent_per_hour: int = 1
    breaker_fraction: float = 0.2
    breaker_window_s: float = 300.0

    def __post_init__(self) -> None:
        for name in ("max_nodes", "max_per_job", "max_per_hour", "max_drains_per_parent_per_hour"):
            if not getattr(self, name) >= 1:
                raise AlertConfigError(
                    f"drain.limits.{name}: must be >= 1 (0 allows no drain: use mode dry-run), "
                    f"got {getattr(self, name)}"
                )
        for name in ("max_fraction", "breaker_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise AlertConfigError(
                    f"drain.limits.{name}: must be a fraction in (0, 1] (0 allows no drain: use mode "
                    f"dry-run), got {getattr(self, name)}"
                )
        if not self.breaker_window_s > 0:
            raise AlertConfigError(f"drain.limits.breaker_window_s: must be > 0, got {self.breaker_window_s}")


# No default rule drains on port_errors (nor congestion): a port's errors are its link's, and the bad end
# is as often the leaf's optic or port as the VM's NIC, so draining the VM mends nothing and empties the
# leaf one VM at a time; FleetlensPortErrors sends them to whoever mends the fabric. An operator who knows
# a NIC at fault may still add a rule.
DEFAULT_DRAIN_RULES = (
    DrainRule(("gpu_fault",), min_severity="critical", actions=DRAINING_ACTIONS),
    DrainRule(("link_down",), second_signal=True, after_s=300),
    DrainRule(("slow_node",), second_signal=True, after_s=600, min_job_slowdown=0.05),
    DrainRule(("dma_degraded", "link_flap"), second_signal=True, after_s=900),
)


@dataclass(frozen=True)
class DrainPolicy:
    mode: str = "dry-run"
    rules: tuple[DrainRule, ...] = DEFAULT_DRAIN_RULES
    limits: DrainLimits = field(default_factory=DrainLimits)
    cooldown_s: float = 3600.0
    return_after_healthy_s: float | None = None
    retry_s: float = 60.0  # how long after a failed backend call the same drain is tried again
    hold_explained_s: float = 1800.0  # how long a drain on alerts a shared fault explains waits

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise AlertConfigError(f"drain.mode: must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not self.cooldown_s >= 0:
            raise AlertConfigError(f"drain.cooldown_s: must be >= 0, got {self.cooldown_s}")
        if self.return_after_healthy_s is not None and not self.return_after_healthy_s >= 0:
            raise AlertConfigError(
                "drain.return_after_healthy_s: must be >= 0 seconds (null: nodes are returned by hand), "
                f"got {self.return_after_healthy_s}"
            )
        if not self.hold_explained_s >= 0:
            raise AlertConfigError(
                f"drain.hold_explained_s: must be >= 0 seconds (0: no hold), got {self.hold_explained_s}"
            )
        if not self.retry_s > 0:
            raise AlertConfigError(f"drain.retry_s: must be > 0 seconds, got {self.retry_s}")

    def rule_for(
        self, kind: str, severity: str, job_slowdown: float | None = None, action: str | None = None
    ) -> DrainRule | None:
        """The first rule that covers an alert of `kind` and `severity` costing its job `job_slowdown` and
        recommending `action`."""
        return next((rule for rule in self.rules if rule.covers(kind, severity, job_slowdown, action)), None)


def parse_policy(section: Mapping[str, Any], where: str = "drain") -> DrainPolicy:
    """A DrainPolicy from the config file's `drain:` mapping; AlertConfigError naming the key otherwise."""
    section = dict(section)
    try:
        rules = section.pop("rules", None)
        limits = section.pop("limits", {})
        _no_unknown(section, {f.name for f in fields(DrainPolicy)} - {"rules", "limits"}, where)
        _no_unknown(limits, {f.name for f in fields(DrainLimits)}, f"{where}.limits")
        parsed_rules = (
            DEFAULT_DRAIN_RULES
            if rules is None
            else tuple(_rule(e, f"{where}.rules[{i}]") for i, e in enumerate(rules))
        )
        return DrainPolicy(rules=parsed_rules, limits=DrainLimits(**limits), **section)
    except (TypeError, ValueError) as error:
        raise AlertConfigError(f"{where}: {error}") from None


def _rule(entry: Any, where: str) -> DrainRule:
    if not isinstance(entry, Mapping):
        known = ", ".join(f.name for f in fields(DrainRule))
        raise AlertConfigError(f"{where}: expected a mapping with {known}")
    _no_unknown(entry, {f.name for f in fields(DrainRule)}, where)
    try:
        rule = DrainRule(**{**entry, "kinds": tuple(entry.get("kinds", ()))})
    except AlertConfigError as error:
        raise AlertConfigError(f"{where}: {error}") from None
    check_kinds(rule.kinds, where)
    return rule


def _no_unknown(entry: Mapping[str, Any], known: set[str], where: str) -> None:
    if unknown := set(entry) - known:
        raise AlertConfigError(
            f"{where}: unknown key(s) {sorted(unknown)}; known: {', '.join(sorted(known))}"
        )

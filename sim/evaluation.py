"""Scores detectors against the faults a scenario injected, as `fleetlens eval` reports them.

Event level, without point adjustment: an operator acts on reports, not on windows, so one report that
covers a fault is a detection however short, and a report that covers no fault is a false alarm however
long. A report matches a fault when it names the same node, the same component where the fault has one
(Fault.component; a node-level fault takes any), and its span [start, end, or the scenario end while open]
meets [fault start, fault end + GRACE_INTERVALS scrape intervals]. Each fault is detected by exactly one
anomaly kind (expected_kind: DETECTED_BY, and for an Xid what NVIDIA's catalog says caused its code),
strictly: a link_flap report on a port that went down does not detect the link_down.

What the reports lead to is judged too, where a fault asks for it (expected_consequences): the anomalies
are replayed, window by window, through the default alert rules and the drain policy with its safety
limits lifted, in dry-run. Reports that detect nothing are classed `other_fault`, `confounder` or
`false`, in that order; latency runs from a fault's onset; a scenario played by stock exporters keeps
the faults they cannot show (sim.stock.UNOBSERVABLE) out of the recall; a slow node's truth includes what
it costs its job (true_job_slowdown). docs/detectors.md defines each.

A fault of a shared layer (Scenario.layer_faults) is one truth, about its parent, which only a
`shared_fault` report naming the same layer (its component) and parent (its node) detects; its per-node
effects are not truths. During it, a child's per-node report is `explained` (out of every row) when
the runner ever set its `explained_by`, and false when it did not, unless it detects a fault of its own
node. A child the replayed drain policy drains during its parent's fault, with no fault of its own
that must drain, is a wrong action (FaultOutcome.drained_children).

Where a scenario repairs nodes (sim.scenario, `repair`), the node lifecycle's returns to service are
judged too (return_figures): every node repaired of a fault that must drain should be returned after
its repair, within the scenario, and no node may be returned while a fault of its own is active.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

import numpy as np

from alerts.drain import DrainController
from alerts.engine import AlertEngine
from alerts.lifecycle import Lifecycle, LifecyclePolicy
from alerts.policy import DrainLimits, DrainPolicy
from analytics.evidence import SlowNodeEvidence, as_dict
from analytics.reports.lifecycle import DONE
from analytics.store.records import Anomaly
from analytics.xid_catalog import lookup
from sim.checks import SIM_HEAVY_REPORTS, SimulatedChecks
from sim.jobs import JobModel
from sim.scenario import LAYER_FAULT_KINDS, Confounder, Fault, JobSpec, LayerFault, Scenario
from sim.stock import Unobservable, unobservable

DETECTED_BY: Mapping[str, tuple[str, ...]] = MappingProxyType(  # the anomaly kinds that may detect each
    {
        "slow_node": ("slow_node",),
        "thermal_throttle": ("gpu_throttle",),
        "power_brake": ("gpu_throttle",),
        "link_flap": ("link_flap",),
        "link_down": ("link_down",),
        "dma_degraded": ("dma_degraded",),
        "gpu_lost": ("gpu_fault",),
        "xid": ("gpu_fault", "gpu_app_error"),  # by the code's cause: expected_kind
        "xid_storm": ("gpu_app_error",),
        "dbe_remap": ("gpu_fault",),
        "congestion": ("congestion",),
        "port_errors": ("port_errors",),
        **{kind: ("shared_fault",) for kind in LAYER_FAULT_KINDS},
    }
)
# the layer each layer fault kind's row takes shared_fault reports of (a PF is its host's PCIe, a PDU its
# rack's power); sim.scenario.LAYER_FAULT_KINDS gives each kind's own layer
ROW_OF_LAYER: Mapping[str, str] = MappingProxyType(
    {
        **{str(layer): kind for kind, (layer, _) in LAYER_FAULT_KINDS.items()},
        "pf": "host_pcie_degraded",
        "pdu": "rack_power",
    }
)
DETECTING_KINDS = frozenset(kind for kinds in DETECTED_BY.values() for kind in kinds)
GRACE_INTERVALS = 2
NODE_DAY_S = 86_400.0

# the goals over the whole suite
PRECISION_GOAL = 0.95
RECALL_GOAL = 0.95
SLOW_NODE_GOAL_SEVERITY = 0.10
SLOW_NODE_GOAL_WINDOWS = 3
SLOW_NODE_GOAL_STEPS = 5  # where a step outlasts the window: within 5 of the job's steps instead
SLOWDOWN_TOLERANCE = 0.2  # the check of the detector's job_slowdown: within 20% of the truth,
SLOWDOWN_FLOOR = 0.01  # or within 1% of the step where the truth is next to nothing (hidden by a slower rank)

TRUE, CONFOUNDER, OTHER_FAULT, FALSE = "true", "confounder", "other_fault", "false"
EXPLAINED = "explained"  # a child's report its parent's shared fault explains: in no row


@dataclass(frozen=True)
class Report:
    """An anomaly on the scenario's clock: seconds from its start; `end_s` is the scenario end while open."""

    anomaly: Anomaly
    start_s: float
    end_s: float


@dataclass(frozen=True)
class FaultOutcome:
    """Whether an injected fault was detected, how fast, and by which reports (anomaly ids)."""

    fault: Fault
    latency_s: float | None  # None: missed
    window_s: float
    interval_s: float
    report_ids: tuple[str, ...] = ()
    cost: JobCost | None = None  # a slow node in a job: what it costs the job
    estimated_job_slowdown: float | None = None  # the detector's, from its first report's evidence
    alerted: bool = False  # its reports raised an alert under the default rules (module doc)
    drained: bool = False  # ... and its node was drained while one fired
    drained_children: tuple[str, ...] = ()  # a layer fault: children drained during it (module doc)

    @property
    def detected(self) -> bool:
        return self.latency_s is not None

    @property
    def latency_windows(self) -> float | None:
        return None if self.latency_s is None else self.latency_s / self.window_s

    @property
    def latency_steps(self) -> float | None:
        """The latency in the job's steps (as slow as they were during the fault)."""
        if self.latency_s is None or self.cost is None:
            return None
        return self.latency_s / self.cost.step_s

    @property
    def true_job_slowdown(self) -> float | None:
        return None if self.cost is None else self.cost.job_slowdown


@dataclass(frozen=True)
class JobCost:
    """A slow node's job during the fault: its mean step time, and the same steps without the fault."""

    step_s: float
    step_s_without: float

    @property
    def job_slowdown(self) -> float:
        """The share of the job's step time due to the node: (with - without) / with."""
        return 1 - self.step_s_without / self.step_s


@dataclass(frozen=True)
class Excluded:
    """A fault kept out of the recall because the scenario's exporters cannot show it, and why."""

    outcome: FaultOutcome
    unobservable: Unobservable


@dataclass(frozen=True)
class ReportOutcome:
    """A report's verdict (TRUE, CONFOUNDER, OTHER_FAULT or FALSE), the fault kinds it detected and what
    explains it, in words."""

    report: Report
    verdict: str
    detected_kinds: frozenset[str] = frozenset()
    explained_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class KindStats:
    """One row of the table: a fault kind and the reports of the anomaly kind that detects it, or a
    catch-all anomaly kind (no faults, reports true when they overlap any fault of their node)."""

    kind: str
    catch_all: bool = False
    faults: int = 0
    detected: int = 0
    reports: int = 0
    true_reports: int = 0
    confounder_reports: int = 0
    other_fault_reports: int = 0
    false_reports: int = 0
    latencies_s: tuple[float, ...] = ()
    latencies_windows: tuple[float, ...] = ()
    drained_children: int = 0  # wrong actions: children of its layer faults drained during them

    def __add__(self, other: KindStats) -> KindStats:
        """The same row summed over two runs; latencies are pooled."""
        summed = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)
            if f.name not in ("kind", "catch_all")
        }
        return KindStats(self.kind, self.catch_all, **summed)

    @property
    def recall(self) -> float | None:
        return self.detected / self.faults if self.faults else None

    @property
    def precision(self) -> float | None:
        return self.true_reports / self.reports if self.reports else None

    def latency_s(self, percentile: float) -> float | None:
        """Detection latency at `percentile` (0-100, linear interpolation) over the detected faults."""
        return _percentile(self.latencies_s, percentile)

    def latency_windows(self, percentile: float) -> float | None:
        return _percentile(self.latencies_windows, percentile)


@dataclass(frozen=True)
class Goal:
    """One of the issue's goals; `met` is None when the run has no fault to judge it on."""

    name: str
    met: bool | None
    detail: str


@dataclass(frozen=True)
class ReturnFigures:
    """The lifecycle's returns to service against the scenario's repairs (return_figures). Each repair is
    named "node@at_s"; `wrongly_returned` holds "node@t" for each return while the node was faulty."""

    must_return: tuple[str, ...] = ()  # repairs of a fault that must drain: their nodes should come back
    repair_to_return_s: Mapping[str, float] = field(default_factory=dict)  # the repairs followed by a return
    wrongly_returned: tuple[str, ...] = ()

    def __add__(self, other: ReturnFigures) -> ReturnFigures:
        """Both runs' figures pooled."""
        return ReturnFigures(
            (*self.must_return, *other.must_return),
            {**self.repair_to_return_s, **other.repair_to_return_s},
            (*self.wrongly_returned, *other.wrongly_returned),
        )

    @property
    def returned_after_repair(self) -> int:
        return len(self.repair_to_return_s)

    @property
    def not_returned(self) -> tuple[str, ...]:
        return tuple(repair for repair in self.must_return if repair not in self.repair_to_return_s)

    @property
    def judged(self) -> bool:
        """Whether there is anything to judge: a repair that asks for a return, or any return."""
        return bool(self.must_return or self.repair_to_return_s or self.wrongly_returned)


@dataclass(frozen=True)
class ScenarioResult:
    name: str
    nodes: int
    duration_s: float
    interval_s: float
    window_s: float
    faults: tuple[FaultOutcome, ...]
    reports: tuple[ReportOutcome, ...]
    kinds: Mapping[str, KindStats]
    exporters: str = "fleetlens"
    excluded: tuple[Excluded, ...] = ()  # faults its exporters cannot show: not in `faults` nor the recall
    returns: ReturnFigures = ReturnFigures()

    @property
    def node_days(self) -> float:
        return self.nodes * self.duration_s / NODE_DAY_S


@dataclass(frozen=True)
class SuiteResult:
    scenarios: tuple[ScenarioResult, ...]
    kinds: Mapping[str, KindStats]
    goals: tuple[Goal, ...]

    @property
    def node_days(self) -> float:
        return sum(result.node_days for result in self.scenarios)

    @property
    def excluded(self) -> tuple[Excluded, ...]:
        return tuple(excluded for result in self.scenarios for excluded in result.excluded)

    @property
    def returns(self) -> ReturnFigures:
        """Every scenario's return figures, each repair and return named after its scenario too."""
        return _pooled_returns(self.scenarios)


def evaluate(
    scenario: Scenario,
    anomalies: Sequence[Anomaly],
    epoch: float,
    window_s: float = 10.0,
    returns: Mapping[str, Sequence[float]] | None = None,
) -> ScenarioResult:
    """Match the detectors' anomalies (unix times; `epoch` is the scenario's time 0) to its faults.
    `anomalies` may hold several rows of one anomaly (its updates): its latest is judged, and it counts
    as explained when any row had `explained_by`. `returns`: the lifecycle's returns to service, node ->
    scenario seconds (return_figures); None: replayed here (lifecycle_returns) where the scenario repairs
    nodes, none elsewhere."""
    reports = [_on_scenario_clock(anomaly, epoch, scenario.duration_s) for anomaly in _latest(anomalies)]
    explained = frozenset(anomaly.id for anomaly in anomalies if anomaly.explained_by)
    layers: list[LayerFault | None] = [*(None for _ in scenario.faults), *scenario.layer_faults]
    truths = (*scenario.faults, *map(layer_truth, scenario.layer_faults))
    costs = job_costs(scenario, truths)
    led_to, drained_at = _alerts_and_drains(scenario, reports, epoch, window_s)
    faults, excluded = [], []
    for fault, layer, cost in zip(truths, layers, costs, strict=True):
        outcome = _fault_outcome(fault, cost, reports, scenario, window_s, led_to)
        if layer is not None:
            outcome = dataclasses.replace(
                outcome, drained_children=_drained_children(layer, scenario, drained_at)
            )
        hidden = unobservable(fault, scenario) if scenario.exporters == "stock" else None
        if hidden is None:
            faults.append(outcome)
        else:
            excluded.append(Excluded(outcome, hidden))
    judged = tuple(_judge(report, scenario, truths, report.anomaly.id in explained) for report in reports)
    return ScenarioResult(
        name=scenario.name,
        nodes=scenario.fleet.nodes,
        duration_s=scenario.duration_s,
        interval_s=scenario.interval_s,
        window_s=window_s,
        faults=tuple(faults),
        reports=judged,
        kinds=_kind_rows(faults, judged),
        exporters=scenario.exporters,
        excluded=tuple(excluded),
        returns=return_figures(
            scenario,
            lifecycle_returns(scenario, reports, epoch, window_s)
            if returns is None and scenario.repairs
            else returns or {},
        ),
    )


def return_figures(scenario: Scenario, returns: Mapping[str, Sequence[float]]) -> ReturnFigures:
    """Judge the lifecycle's returns to service (node -> the scenario seconds it was returned at).

    A repair asks for a return when it ended a fault of its node that must drain (expected_consequences);
    the first return of that node at or after the repair and before the node's next repair is its
    return. A return while a fault of the node is active (start_s <= t < end; one without an end never
    ends) is wrong, whatever was repaired; faults that must not drain (an application's Xids, a
    contained error) do not make a node faulty.
    """
    must_return, repair_to_return = [], {}
    for repair in scenario.repairs:
        ended = [f for f in scenario.faults if f.node == repair.node and f.end_s == repair.at_s]
        if not any(expected_consequences(fault)[1] for fault in ended):
            continue
        name = f"{repair.node}@{repair.at_s:g}"
        must_return.append(name)
        later = [r.at_s for r in scenario.repairs if r.node == repair.node and r.at_s > repair.at_s]
        until = min(later, default=math.inf)
        after = [t for t in returns.get(repair.node, ()) if repair.at_s <= t < until]
        if after:
            repair_to_return[name] = min(after) - repair.at_s
    wrongly = [
        f"{node}@{t:g}"
        for node, times in sorted(returns.items())
        for t in times
        if any(_faulty_at(fault, node, t) for fault in scenario.faults)
    ]
    return ReturnFigures(tuple(must_return), repair_to_return, tuple(wrongly))


def _faulty_at(fault: Fault, node: str, t: float) -> bool:
    """`fault` makes `node` faulty at `t`: its own, active then, and not one that must not drain."""
    return (
        fault.node == node
        and fault.start_s <= t < (math.inf if fault.end_s is None else fault.end_s)
        and expected_consequences(fault)[1] is not False
    )


def _pooled_returns(results: Iterable[ScenarioResult]) -> ReturnFigures:
    """The scenarios' return figures in one, each repair and return prefixed with its scenario's name."""
    pooled = ReturnFigures()
    for result in results:
        figures, prefix = result.returns, f"{result.name}: "
        pooled += ReturnFigures(
            tuple(prefix + name for name in figures.must_return),
            {prefix + name: s for name, s in figures.repair_to_return_s.items()},
            tuple(prefix + name for name in figures.wrongly_returned),
        )
    return pooled


def combine(results: Iterable[ScenarioResult]) -> SuiteResult:
    """Per-kind sums over scenarios (latency percentiles over every detected fault) and the goals."""
    results = tuple(results)
    kinds: dict[str, KindStats] = {}
    for result in results:
        for kind, stats in result.kinds.items():
            kinds[kind] = kinds[kind] + stats if kind in kinds else stats
    ordered = {kind: kinds[kind] for kind in sorted(kinds, key=_row_order)}
    return SuiteResult(results, ordered, _goals(results, ordered))


def to_markdown(suite: SuiteResult) -> str:
    """The per-kind table and a line saying which of the issue's goals are met."""
    header = (
        "| kind | faults | recall | reports | precision | latency p50/p90 s | false/node-day "
        "| confounder reports |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for stats in suite.kinds.values():
        latency = f"{_number(stats.latency_s(50), 0)} / {_number(stats.latency_s(90), 0)}"
        lines.append(
            f"| {stats.kind}{' (catch-all)' if stats.catch_all else ''} | {stats.faults} "
            f"| {_ratio(stats.recall, stats.detected, stats.faults)} | {stats.reports} "
            f"| {_ratio(stats.precision, stats.true_reports, stats.reports)} | {latency} "
            f"| {_number(_per_node_day(stats.false_reports, suite.node_days), 2)} "
            f"| {stats.confounder_reports} |"
        )
    flavours = sorted({result.exporters for result in suite.scenarios})
    scenarios = f"{len(suite.scenarios)} scenario(s), {suite.node_days:.2f} node-days"
    scenarios += f", read by {' and '.join(flavours)} exporters" if flavours != ["fleetlens"] else ""
    goals = "; ".join(f"{goal.name}: {_verdict(goal)}" for goal in suite.goals)
    costs = slowdown_estimates(suite)
    cost_line = [] if not costs["faults"] else [_describe_estimates(costs)]
    excluded = [f"Not shown by stock exporters, out of the recall: {row}" for row in _excluded_rows(suite)]
    returned = [_describe_returns(suite.returns)] if suite.returns.judged else []
    return "\n".join([*lines, "", f"{scenarios}. Goals: {goals}.", *cost_line, *excluded, *returned]) + "\n"


def _describe_returns(figures: ReturnFigures) -> str:
    waits = _returns_json(figures)["repair_to_return_s"]
    return (
        f"Returns to service: {figures.returned_after_repair} of {len(figures.must_return)} repaired drained "
        f"node(s) returned after repair (repair to return median {_number(waits['median'], 0)} s, max "
        f"{_number(waits['max'], 0)} s); {len(figures.wrongly_returned)} returned while faulty."
    )


def _returns_json(figures: ReturnFigures) -> dict[str, Any]:
    """The issue's three figures, with the repairs and returns behind them."""
    waits = list(figures.repair_to_return_s.values())
    return {
        "returned_after_repair": figures.returned_after_repair,
        "repair_to_return_s": {
            "median": _percentile(waits, 50),
            "max": max(waits, default=None),
            "each": dict(figures.repair_to_return_s),
        },
        "wrongly_returned": len(figures.wrongly_returned),
        "wrong_returns": list(figures.wrongly_returned),
        "not_returned": list(figures.not_returned),
    }


def _excluded_rows(suite: SuiteResult) -> list[str]:
    """One line per unobservable kind the run had: how many faults, how many detected anyway, and why."""
    by_entry: dict[Unobservable, list[FaultOutcome]] = {}
    for excluded in suite.excluded:
        by_entry.setdefault(excluded.unobservable, []).append(excluded.outcome)
    return [
        f"{entry.name}: {len(outcomes)} fault(s), {sum(o.detected for o in outcomes)} detected anyway; "
        f"{entry.reason}"
        for entry, outcomes in by_entry.items()
    ]


def slowdown_estimates(suite: SuiteResult) -> dict[str, Any]:
    """How well the detectors' job_slowdown matches the truth over the slow nodes of the run's jobs:
    how many were estimated, how many within SLOWDOWN_TOLERANCE of the truth, the absolute errors."""
    pairs = [
        (outcome.true_job_slowdown, outcome.estimated_job_slowdown)
        for result in suite.scenarios
        for outcome in result.faults
        if outcome.true_job_slowdown is not None
    ]
    errors = [abs(estimate - truth) for truth, estimate in pairs if estimate is not None]
    return {
        "faults": len(pairs),
        "estimated": len(errors),
        "within_tolerance": sum(
            abs(estimate - truth) <= max(SLOWDOWN_TOLERANCE * truth, SLOWDOWN_FLOOR)
            for truth, estimate in pairs
            if estimate is not None
        ),
        "abs_error_p50": _percentile(errors, 50),
        "abs_error_max": max(errors, default=None),
    }


def _describe_estimates(costs: Mapping[str, Any]) -> str:
    line = f"slow_node job_slowdown: {costs['estimated']} of {costs['faults']} slow nodes estimated"
    if not costs["estimated"]:
        return line + "."
    return (
        f"{line}, {costs['within_tolerance']} within {SLOWDOWN_TOLERANCE:.0%} of the truth, |error| p50 "
        f"{costs['abs_error_p50']:.3f}, max {costs['abs_error_max']:.3f}."
    )


def to_json(suite: SuiteResult) -> dict[str, Any]:
    """Everything, per kind and per scenario, with every fault's outcome and every report that detected
    nothing, so that a person can see why a figure is what it is."""
    return {
        "node_days": suite.node_days,
        "kinds": {kind: _stats_json(stats, suite.node_days) for kind, stats in suite.kinds.items()},
        "goals": [{"name": goal.name, "met": goal.met, "detail": goal.detail} for goal in suite.goals],
        "job_slowdown": slowdown_estimates(suite),
        "unobservable": [_excluded_json(excluded) for excluded in suite.excluded],
        **_returns_json(suite.returns),
        "scenarios": [_scenario_json(result) for result in suite.scenarios],
    }


# -- matching ---------------------------------------------------------------------------------------------


def _latest(anomalies: Sequence[Anomaly]) -> list[Anomaly]:
    """One row per anomaly id: until the store merges them, an anomaly that ended has two rows, the open
    one and the closed one, which is the later."""
    by_id: dict[str, Anomaly] = {}
    for anomaly in anomalies:
        if anomaly.id not in by_id or by_id[anomaly.id].end is None:
            by_id[anomaly.id] = anomaly
    return list(by_id.values())


def _on_scenario_clock(anomaly: Anomaly, epoch: float, duration_s: float) -> Report:
    start = round(anomaly.start - epoch, 3)  # DateTime64(3): milliseconds are all there is
    end = duration_s if anomaly.end is None else round(anomaly.end - epoch, 3)
    return Report(anomaly, start, max(start, end))


def _grace_s(scenario: Scenario) -> float:
    return GRACE_INTERVALS * scenario.interval_s


def _meets(report: Report, start_s: float, end_s: float) -> bool:
    return report.start_s <= end_s and report.end_s >= start_s


def _overlaps_fault(report: Report, fault: Fault, scenario: Scenario) -> bool:
    """Same node, and the spans meet; any component."""
    end = (scenario.duration_s if fault.end_s is None else fault.end_s) + _grace_s(scenario)
    return report.anomaly.node == fault.node and _meets(report, fault.start_s, end)


def _on_component(report: Report, fault: Fault) -> bool:
    """The report names the fault's component, or the fault has none (any of its node's will do)."""
    return not fault.component or report.anomaly.component == fault.component


def _detects(report: Report, fault: Fault, scenario: Scenario) -> bool:
    return (
        report.anomaly.kind == expected_kind(fault)
        and _on_component(report, fault)
        and _overlaps_fault(report, fault, scenario)
    )


def layer_truth(fault: LayerFault) -> Fault:
    """A layer fault as the truth a shared_fault report is matched to: about its parent (the report's
    node), its layer where a report names it (its component: Fault.component's params["device"])."""
    return Fault(
        fault.kind,
        fault.parent,
        fault.start_s,
        fault.end_s,
        params={**fault.params, "device": str(fault.layer)},
    )


def _layer_fault_over(report: Report, scenario: Scenario) -> list[LayerFault]:
    """The layer faults active during `report` (plus the grace) whose children include its node."""
    return [
        fault
        for fault in scenario.layer_faults
        if report.anomaly.node in fault.nodes
        and _meets(report, fault.start_s, _end_s(fault.end_s, scenario) + _grace_s(scenario))
    ]


def _end_s(end_s: float | None, scenario: Scenario) -> float:
    return scenario.duration_s if end_s is None else end_s


def _drained_children(
    layer: LayerFault, scenario: Scenario, drained_at: Mapping[str, float]
) -> tuple[str, ...]:
    """The children of `layer` drained while it lasted (plus the grace) with no fault of their own that
    must drain (expected_consequences) begun by then."""
    end = _end_s(layer.end_s, scenario) + _grace_s(scenario)
    return tuple(
        node
        for node in layer.nodes
        if node in drained_at
        and layer.start_s <= drained_at[node] <= end
        and not any(
            own.node == node and expected_consequences(own)[1] and own.start_s <= drained_at[node]
            for own in scenario.faults
        )
    )


def expected_kind(fault: Fault) -> str:
    """The anomaly kind that detects `fault`: for an Xid, gpu_app_error where NVIDIA's catalog says the
    application causes its code, gpu_fault otherwise."""
    if fault.kind == "xid":
        return "gpu_app_error" if lookup(fault.params["code"]).by_application else "gpu_fault"
    return DETECTED_BY[fault.kind][0]


def expected_consequences(fault: Fault) -> tuple[bool | None, bool | None]:
    """Whether `fault` must lead to an alert, and to a drain decision: True must, False must not, None not
    judged. A GPU that must leave service (lost, a double-bit ECC error, an Xid whose catalog action is a
    reset, a reboot or an inspection) must do both; the application's Xids neither; other Xids must not
    drain (a contained error asks for the job's restart, not the node's)."""
    match fault.kind:
        case "gpu_lost" | "dbe_remap":
            return True, True
        case "xid_storm":
            return False, False
        case "xid":
            info = lookup(fault.params["code"])
            if info.by_application:
                return False, False
            return (True, True) if info.action.drains else (None, False)
    return None, None


def _alerts_and_drains(
    scenario: Scenario, reports: Sequence[Report], epoch: float, window_s: float
) -> tuple[dict[str, tuple[bool, bool]], dict[str, float]]:
    """Per anomaly id: whether it raised an alert, and whether its node was drained while that alert fired,
    replaying every window's open reports through the default alert rules and drain policy (module doc);
    and per node drained, when it first was (scenario seconds)."""
    drains = DrainController(
        _replay_policy(scenario, return_after_healthy_s=0.0), [], fleet_size=scenario.fleet.nodes
    )
    led_to: dict[str, tuple[bool, bool]] = {}
    drained_at: dict[str, float] = {}
    for now_s, current, engine in _windows(scenario, reports, epoch, window_s):
        drains.step(engine.firing, epoch + now_s)
        for node in drains.drained:
            drained_at.setdefault(node, now_s)
        firing = {
            tuple(alert.labels.get(label, "") for label in ("node", "kind", "component", "job"))
            for alert in engine.firing
        }
        for report in current:
            anomaly = report.anomaly
            if (anomaly.node, anomaly.kind, anomaly.component, anomaly.job) in firing:
                drained = led_to.get(anomaly.id, (False, False))[1] or anomaly.node in drains.drained
                led_to[anomaly.id] = (True, drained)
    return led_to, drained_at


def lifecycle_returns(
    scenario: Scenario, reports: Sequence[Report], epoch: float, window_s: float
) -> dict[str, list[float]]:
    """node -> the scenario seconds the node lifecycle returned it to service at, replaying the windows'
    alerts through the drain policy (auto, no backends) and the lifecycle at its default waits, its heavy
    checks answered by the simulated nodes (sim.checks.SimulatedChecks) from the faults they have then.
    A repair is also the technician's request for a test (`fleetlens alerts test NODE`), made once the
    node is not being tested (a test already running began before the repair)."""
    drains = DrainController(
        _replay_policy(scenario, return_after_healthy_s=None, mode="auto"),
        [],
        fleet_size=scenario.fleet.nodes,
    )
    checks = SimulatedChecks(scenario, epoch)
    policy = LifecyclePolicy(max_testing=scenario.fleet.nodes, checks=SIM_HEAVY_REPORTS)
    lifecycle = Lifecycle(policy, drains, checks, checks)
    returns: dict[str, list[float]] = {}
    asked: set[str] = set()  # repaired nodes whose test is still to be asked for
    for now_s, _, engine in _windows(scenario, reports, epoch, window_s):
        now = epoch + now_s
        asked |= {repair.node for repair in scenario.repairs if now_s - window_s < repair.at_s <= now_s}
        rows = drains.step(engine.firing, now) + lifecycle.step(engine.firing, now)
        for node in sorted(asked):
            state = lifecycle.states.get(node)
            if state is not None and state.state == "testing":
                continue
            asked.discard(node)
            rows += lifecycle.test(node, "the repair", now) if state is not None else []
        for row in rows:
            if row.action == "return" and row.outcome in DONE:
                returns.setdefault(row.node, []).append(now_s)
    return returns


def _replay_policy(scenario: Scenario, **chosen: Any) -> DrainPolicy:
    """The default drain policy with its safety limits lifted (module doc), and `chosen` settings."""
    nodes = scenario.fleet.nodes
    unlimited = DrainLimits(nodes, 1.0, nodes, max_per_hour=sys.maxsize, breaker_fraction=1.0)
    return DrainPolicy(limits=unlimited, cooldown_s=0.0, **chosen)


def _windows(
    scenario: Scenario, reports: Sequence[Report], epoch: float, window_s: float
) -> Iterator[tuple[float, list[Report], AlertEngine]]:
    """Each detection window's end (scenario seconds), the reports open then, and the default alert
    rules' engine having evaluated them."""
    engine = AlertEngine()
    for step in range(1, math.ceil(scenario.duration_s / window_s) + 2):
        now_s = step * window_s
        current = [report for report in reports if report.start_s <= now_s <= report.end_s]
        engine.evaluate([report.anomaly for report in current], epoch + now_s)
        yield now_s, current, engine


def _onset(fault: Fault) -> float:
    """When a fault can first be told apart: its start, except for a link flap, which is one only once
    the link is back up (half a period after it went down); until then it is a link going down."""
    if fault.kind == "link_flap":
        return fault.start_s + fault.params["period_s"] / 2
    return fault.start_s


def _fault_outcome(
    fault: Fault,
    cost: JobCost | None,
    reports: list[Report],
    scenario: Scenario,
    window_s: float,
    led_to: Mapping[str, tuple[bool, bool]],
) -> FaultOutcome:
    found = sorted((r for r in reports if _detects(r, fault, scenario)), key=lambda report: report.start_s)
    latency = max(0.0, round(found[0].start_s - _onset(fault), 3)) if found else None
    ids = tuple(report.anomaly.id for report in found)
    estimate = _job_slowdown(found[0].anomaly) if found else None
    led = [led_to.get(r.anomaly.id, (False, False)) for r in _consequential(fault, reports, scenario)]
    alerted, drained = any(alert for alert, _ in led), any(drain for _, drain in led)
    return FaultOutcome(fault, latency, window_s, scenario.interval_s, ids, cost, estimate, alerted, drained)


def _consequential(fault: Fault, reports: list[Report], scenario: Scenario) -> list[Report]:
    """The reports whose alerts and drains are the fault's (module doc); none for a fault not judged."""
    if expected_consequences(fault) == (None, None):
        return []
    return [
        report
        for report in reports
        if _overlaps_fault(report, fault, scenario)
        and _on_component(report, fault)
        and (
            _detects(report, fault, scenario)
            or not any(_detects(report, other, scenario) for other in scenario.faults)
        )
    ]


# -- what a slow node costs its job ----------------------------------------------------------------------


def true_job_slowdown(scenario: Scenario, fault: Fault) -> float | None:
    """The share of its job's step time that a slow_node fault costs while it lasts; None for other kinds
    and for a node outside every job."""
    cost = job_costs(scenario, [fault])[0]
    return None if cost is None else cost.job_slowdown


def job_costs(scenario: Scenario, faults: Sequence[Fault]) -> list[JobCost | None]:
    """What each of `faults` (of `scenario`) costs its job: None but for a slow node in a job.

    In a synchronous job every step waits for the slowest rank, so a slow node costs the difference
    between the job's steps with the fault and without it, over the steps that start during the fault:
    two runs of the job model, which draws the same noise either way (sim.jobs), so nothing but the fault
    tells them apart. Another fault at the same time stays in both: this one's cost on top of it."""
    played: dict[str, list[tuple[float, float]]] = {}  # each job's run with every fault, once
    costs: list[JobCost | None] = []
    for fault in faults:
        job = next((job for job in scenario.jobs if fault.node in job.nodes), None)
        if fault.kind != "slow_node" or job is None:
            costs.append(None)
            continue
        if job.name not in played:
            played[job.name] = _steps(scenario, job, scenario.duration_s)
        costs.append(_cost(scenario, job, fault, played[job.name]))
    return costs


def _cost(
    scenario: Scenario, job: JobSpec, fault: Fault, with_fault: list[tuple[float, float]]
) -> JobCost | None:
    others = list(scenario.faults)
    others.remove(fault)
    end = scenario.duration_s if fault.end_s is None else fault.end_s
    without_fault = _steps(dataclasses.replace(scenario, faults=tuple(others)), job, end)
    step_s, step_s_without = (
        _mean_step_s(steps, fault.start_s, end) for steps in (with_fault, without_fault)
    )
    return None if step_s is None or step_s_without is None else JobCost(step_s, step_s_without)


def _steps(scenario: Scenario, job: JobSpec, until_s: float) -> list[tuple[float, float]]:
    """(start, duration) of the job's steps that start before `until_s`, on the scenario's clock."""
    rows = JobModel(job, scenario, epoch=0.0).steps_until(until_s + 10 * job.step_s)
    ends = {(row.ts, row.duration_s) for row in rows}  # every rank of a step shares its end and duration
    return sorted((end - duration, duration) for end, duration in ends if end - duration < until_s)


def _mean_step_s(steps: list[tuple[float, float]], start_s: float, end_s: float) -> float | None:
    durations = [duration for start, duration in steps if start_s <= start < end_s]
    return float(np.mean(durations)) if durations else None


def _job_slowdown(anomaly: Anomaly) -> float | None:
    """The job slowdown a straggler's evidence estimates, when it is a finite number; else None."""
    evidence = anomaly.evidence
    if not isinstance(evidence, SlowNodeEvidence) or evidence.job_slowdown is None:
        return None
    return evidence.job_slowdown if math.isfinite(evidence.job_slowdown) else None


def _judge(report: Report, scenario: Scenario, truths: Sequence[Fault], explained: bool) -> ReportOutcome:
    """The report's verdict (module doc); `explained`: the runner set its explained_by at some point."""
    if report.anomaly.kind in DETECTING_KINDS:
        detected = [fault for fault in truths if _detects(report, fault, scenario)]
    else:  # a catch-all is right about any fault of its node
        detected = [fault for fault in truths if _overlaps_fault(report, fault, scenario)]
    if detected:
        kinds = frozenset(fault.kind for fault in detected)
        return ReportOutcome(report, TRUE, kinds, tuple(map(Fault.describe, detected)))
    if parents := _layer_fault_over(report, scenario):
        described = tuple(layer_truth(fault).describe() for fault in parents)
        return ReportOutcome(report, EXPLAINED if explained else FALSE, explained_by=described)
    during = [fault for fault in truths if _overlaps_fault(report, fault, scenario)]
    if during:
        return ReportOutcome(report, OTHER_FAULT, explained_by=tuple(map(Fault.describe, during)))
    confounders = [c for c in scenario.confounders if _during_confounder(report, c, scenario)]
    if confounders:
        return ReportOutcome(report, CONFOUNDER, explained_by=tuple(map(_describe_confounder, confounders)))
    return ReportOutcome(report, FALSE)


def _during_confounder(report: Report, confounder: Confounder, scenario: Scenario) -> bool:
    """The report meets the confounder's span (plus the grace) on a node it touches: its node, its job's
    nodes, or for stage_imbalance the nodes of that stage."""
    if not _meets(report, confounder.start_s, confounder.end_s + _grace_s(scenario)):
        return False
    node = report.anomaly.node
    if confounder.node is not None:
        return node == confounder.node
    job = next(job for job in scenario.jobs if job.name == confounder.job)
    if node not in job.nodes:
        return False
    if confounder.kind == "stage_imbalance":
        return confounder.params["stage"] in _stages(job, node, scenario.fleet.gpus_per_node)
    return True


def _stages(job: JobSpec, node: str, gpus_per_node: int) -> set[int]:
    """Every pipeline stage with a rank on `node` (a node holds several when tp x dp < gpus_per_node)."""
    first = job.nodes.index(node) * gpus_per_node
    return {rank // (job.tp * job.dp) for rank in range(first, first + gpus_per_node)}


# -- per-kind rows and goals -------------------------------------------------------------------------------


def _kind_rows(faults: Sequence[FaultOutcome], reports: Sequence[ReportOutcome]) -> dict[str, KindStats]:
    """A row per fault kind that had faults or reports, then one per catch-all kind that had reports.

    A fault kind's row holds the reports of its anomaly kinds, except those that detected only faults of
    another kind sharing that anomaly kind (gpu_fault detects xid, gpu_lost and dbe_remap); a layer
    fault kind's row the shared_fault reports of its layers (ROW_OF_LAYER). Explained reports are in none.
    """
    rows: dict[str, KindStats] = {}
    reports = [o for o in reports if o.verdict != EXPLAINED]
    for fault_kind, anomaly_kinds in DETECTED_BY.items():
        outcomes = [o for o in faults if o.fault.kind == fault_kind]
        mine = [
            o
            for o in reports
            if o.report.anomaly.kind in anomaly_kinds
            and (not o.detected_kinds or fault_kind in o.detected_kinds)
            and (fault_kind not in LAYER_FAULT_KINDS or _layer_row(o) == fault_kind)
        ]
        if outcomes or mine:
            rows[fault_kind] = _stats(fault_kind, False, outcomes, mine)
    catch_all = sorted({o.report.anomaly.kind for o in reports} - DETECTING_KINDS)
    for kind in catch_all:
        rows[kind] = _stats(kind, True, [], [o for o in reports if o.report.anomaly.kind == kind])
    return rows


def _layer_row(outcome: ReportOutcome) -> str | None:
    """The layer fault kind whose row a shared_fault report is in: that of the layer it names."""
    return ROW_OF_LAYER.get(outcome.report.anomaly.component)


def _stats(
    kind: str, catch_all: bool, faults: Sequence[FaultOutcome], reports: Sequence[ReportOutcome]
) -> KindStats:
    detected = [outcome for outcome in faults if outcome.detected]
    verdicts = [outcome.verdict for outcome in reports]
    return KindStats(
        kind=kind,
        catch_all=catch_all,
        faults=len(faults),
        detected=len(detected),
        reports=len(reports),
        true_reports=verdicts.count(TRUE),
        confounder_reports=verdicts.count(CONFOUNDER),
        other_fault_reports=verdicts.count(OTHER_FAULT),
        false_reports=verdicts.count(FALSE),
        latencies_s=tuple(outcome.latency_s for outcome in detected),
        latencies_windows=tuple(outcome.latency_windows for outcome in detected),
        drained_children=sum(len(outcome.drained_children) for outcome in faults),
    )


def _row_order(kind: str) -> tuple[int, str]:
    kinds = list(DETECTED_BY)
    return (kinds.index(kind), "") if kind in kinds else (len(kinds), kind)


def _goals(results: Sequence[ScenarioResult], kinds: Mapping[str, KindStats]) -> tuple[Goal, ...]:
    return (
        _precision_recall_goal(kinds),
        _latency_goal(
            f"slow_node (severity >= {SLOW_NODE_GOAL_SEVERITY:.0%}) within {SLOW_NODE_GOAL_WINDOWS} windows"
            f" or {SLOW_NODE_GOAL_STEPS} of its job's steps",
            [
                (result.name, outcome)
                for result in results
                for outcome in result.faults
                if outcome.fault.kind == "slow_node"
                and outcome.fault.params.get("severity", 0) >= SLOW_NODE_GOAL_SEVERITY
            ],
            _slow_node_in_time,
        ),
        _latency_goal(
            "link_flap within one interval of the first flap",
            [(r.name, outcome) for r in results for outcome in r.faults if outcome.fault.kind == "link_flap"],
            lambda outcome: outcome.latency_s <= outcome.interval_s,
        ),
        _confounder_goal(results),
        _child_drain_goal(results),
        _return_goal(results),
        _consequence_goal(results),
    )


def _slow_node_in_time(outcome: FaultOutcome) -> bool:
    """Within SLOW_NODE_GOAL_WINDOWS windows, or SLOW_NODE_GOAL_STEPS steps where those take longer: a
    node is judged by its steps, and a 46-s step leaves most windows without one."""
    steps = outcome.latency_steps
    return outcome.latency_windows <= SLOW_NODE_GOAL_WINDOWS or (
        steps is not None and steps <= SLOW_NODE_GOAL_STEPS
    )


def _precision_recall_goal(kinds: Mapping[str, KindStats]) -> Goal:
    name = f"precision >= {PRECISION_GOAL:g} and recall >= {RECALL_GOAL:g} per fault kind"
    judged = [stats for stats in kinds.values() if not stats.catch_all]
    if not judged:
        return Goal(name, None, "no fault kind had faults or reports")
    short = [
        f"{stats.kind} {what} {value:.2f}"
        for stats in judged
        for what, value, goal in (
            ("recall", stats.recall, RECALL_GOAL),
            ("precision", stats.precision, PRECISION_GOAL),
        )
        if value is not None and value < goal
    ]
    return Goal(name, not short, ", ".join(short) or f"{len(judged)} kinds")


def _latency_goal(
    name: str, outcomes: Sequence[tuple[str, FaultOutcome]], in_time: Callable[[FaultOutcome], bool]
) -> Goal:
    """Met when every fault in `outcomes` (scenario name, outcome) was detected and `in_time` holds."""
    if not outcomes:
        return Goal(name, None, "no such fault in this run")
    late = [
        f"{scenario}: {outcome.fault.describe()} "
        + (f"after {outcome.latency_s:g} s" if outcome.detected else "missed")
        for scenario, outcome in outcomes
        if not outcome.detected or not in_time(outcome)
    ]
    return Goal(name, not late, "; ".join(late) or f"{len(outcomes)} of {len(outcomes)} in time")


def _confounder_goal(results: Sequence[ScenarioResult]) -> Goal:
    caused = [
        f"{result.name}: {_describe_report(outcome.report)} during {', '.join(outcome.explained_by)}"
        for result in results
        for outcome in result.reports
        if outcome.verdict == CONFOUNDER and outcome.report.anomaly.kind in DETECTING_KINDS
    ]
    return Goal("zero reports caused by confounders", not caused, "; ".join(caused) or "none")


def _consequence_goal(results: Sequence[ScenarioResult]) -> Goal:
    """Met when every fault judged by expected_consequences raised the alert and the drain it must, and
    none it must not."""
    name = "alerts and drains as each fault asks"
    judged = [
        (result.name, outcome)
        for result in results
        for outcome in result.faults
        if expected_consequences(outcome.fault) != (None, None)
    ]
    if not judged:
        return Goal(name, None, "no such fault in this run")
    wrong = [
        f"{scenario}: {outcome.fault.describe()} led to "
        + (f"no {what}, which it must" if must else f"{article} {what}, which it must not")
        for scenario, outcome in judged
        for (article, what), must, did in zip(
            (("an", "alert"), ("a", "drain decision")),
            expected_consequences(outcome.fault),
            (outcome.alerted, outcome.drained),
            strict=True,
        )
        if must is not None and must != did
    ]
    return Goal(name, not wrong, "; ".join(wrong) or f"{len(judged)} faults as they ask")


def _return_goal(results: Sequence[ScenarioResult]) -> Goal:
    """Met when no node was returned while faulty and every node repaired of a fault that must drain was
    returned after its repair; not judged without such a repair or any return."""
    name = "no node returned while faulty, every repaired drained node returned"
    figures = _pooled_returns(results)
    if not figures.judged:
        return Goal(name, None, "no repair or return in this run")
    wrong = [f"returned while faulty: {repair}" for repair in figures.wrongly_returned]
    wrong += [f"not returned after repair: {repair}" for repair in figures.not_returned]
    detail = f"{figures.returned_after_repair} of {len(figures.must_return)} returned, none while faulty"
    return Goal(name, not wrong, "; ".join(wrong) or detail)


def _child_drain_goal(results: Sequence[ScenarioResult]) -> Goal:
    """Met when no layer fault had a child drained during it (FaultOutcome.drained_children)."""
    name = "no child of a shared fault drained"
    judged = [
        (result.name, outcome)
        for result in results
        for outcome in result.faults
        if outcome.fault.kind in LAYER_FAULT_KINDS
    ]
    if not judged:
        return Goal(name, None, "no such fault in this run")
    wrong = [
        f"{scenario}: {', '.join(outcome.drained_children)} drained during {outcome.fault.describe()}"
        for scenario, outcome in judged
        if outcome.drained_children
    ]
    return Goal(name, not wrong, "; ".join(wrong) or f"none of {len(judged)} faults' children")


# -- words and numbers -------------------------------------------------------------------------------------


def _percentile(values: Sequence[float], percentile: float) -> float | None:
    return float(np.percentile(values, percentile)) if values else None


def _describe_confounder(confounder: Confounder) -> str:
    span = f"{confounder.start_s:g}-{confounder.end_s:g} s"
    return f"{confounder.kind} of {confounder.node or confounder.job} {span}"


def _describe_report(report: Report) -> str:
    anomaly = report.anomaly
    where = f"{anomaly.node} {anomaly.component}".rstrip()
    return f"{anomaly.kind} on {where} {report.start_s:g}-{report.end_s:g} s"


def _ratio(value: float | None, part: int, whole: int) -> str:
    return "–" if value is None else f"{value:.2f} ({part}/{whole})"


def _number(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _per_node_day(count: int, node_days: float) -> float | None:
    return count / node_days if node_days else None


def _verdict(goal: Goal) -> str:
    if goal.met is None:
        return "not judged (no such fault)"
    return "met" if goal.met else f"NOT met ({goal.detail})"


def _stats_json(stats: KindStats, node_days: float) -> dict[str, Any]:
    return {
        "catch_all": stats.catch_all,
        "faults": stats.faults,
        "detected": stats.detected,
        "recall": stats.recall,
        "reports": stats.reports,
        "true_reports": stats.true_reports,
        "precision": stats.precision,
        "confounder_reports": stats.confounder_reports,
        "other_fault_reports": stats.other_fault_reports,
        "false_reports": stats.false_reports,
        "false_per_node_day": _per_node_day(stats.false_reports, node_days),
        "drained_children": stats.drained_children,
        "latency_s": {"p50": stats.latency_s(50), "p90": stats.latency_s(90)},
        "latency_windows": {"p50": stats.latency_windows(50), "p90": stats.latency_windows(90)},
    }


def _scenario_json(result: ScenarioResult) -> dict[str, Any]:
    return {
        "name": result.name,
        "nodes": result.nodes,
        "duration_s": result.duration_s,
        "interval_s": result.interval_s,
        "window_s": result.window_s,
        "node_days": result.node_days,
        "exporters": result.exporters,
        "kinds": {kind: _stats_json(stats, result.node_days) for kind, stats in result.kinds.items()},
        "faults": [_fault_json(outcome) for outcome in result.faults],
        "unobservable": [_excluded_json(excluded) for excluded in result.excluded],
        "reports_detecting_nothing": [_report_json(o) for o in result.reports if o.verdict != TRUE],
        **_returns_json(result.returns),
    }


def _fault_json(outcome: FaultOutcome) -> dict[str, Any]:
    fault = outcome.fault
    return {
        "kind": fault.kind,
        "node": fault.node,
        "component": fault.component,
        "start_s": fault.start_s,
        "end_s": fault.end_s,
        "params": dict(fault.params),
        "detected": outcome.detected,
        "latency_s": outcome.latency_s,
        "latency_windows": outcome.latency_windows,
        "latency_steps": outcome.latency_steps,
        "job_step_s": None if outcome.cost is None else outcome.cost.step_s,
        "true_job_slowdown": outcome.true_job_slowdown,
        "estimated_job_slowdown": outcome.estimated_job_slowdown,
        "reports": list(outcome.report_ids),
        "alerted": outcome.alerted,
        "drained": outcome.drained,
        "drained_children": list(outcome.drained_children),
        "must_alert": expected_consequences(fault)[0],
        "must_drain": expected_consequences(fault)[1],
    }


def _excluded_json(excluded: Excluded) -> dict[str, Any]:
    return {**_fault_json(excluded.outcome), "reason": excluded.unobservable.reason}


def _report_json(outcome: ReportOutcome) -> dict[str, Any]:
    anomaly = outcome.report.anomaly
    return {
        "verdict": outcome.verdict,
        "explained_by": list(outcome.explained_by),
        "start_s": outcome.report.start_s,
        "end_s": outcome.report.end_s,
        "open": anomaly.end is None,
        **{name: getattr(anomaly, name) for name in ("id", "kind", "node", "component", "job", "severity")},
        "score": anomaly.score,
        "evidence": as_dict(anomaly.evidence),
        "detector": f"{anomaly.detector} {anomaly.detector_version}",
    }

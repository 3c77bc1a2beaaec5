"""The evaluation harness on hand-built scenarios and anomaly lists: what an operator reads in its table."""

from __future__ import annotations

import itertools
import json
import pickle
from dataclasses import replace
from typing import Any

import pytest

from analytics.evidence import as_dict
from analytics.store.records import Anomaly
from analytics.xid_catalog import Action
from sim.evaluation import (
    CONFOUNDER,
    DETECTED_BY,
    FALSE,
    OTHER_FAULT,
    TRUE,
    ScenarioResult,
    combine,
    evaluate,
    expected_kind,
    to_json,
    to_markdown,
    true_job_slowdown,
)
from sim.scenario import FAULT_KINDS, LAYER_FAULT_KINDS, Fault, Scenario, parse_scenario
from tests.support.evidence import example

EPOCH = 1_767_225_600.0
NODE_DAYS = 8 * 1200 / 86_400  # the default hand-built scenario
_ids = itertools.count()


def scenario(faults: list[dict[str, Any]], confounders: list[dict[str, Any]] = ()) -> Scenario:
    """8 nodes for 20 minutes, scraped every 10 s, one job over all of them: 2 pipeline stages of 4 nodes."""
    document = {
        "duration_s": 1200,
        "interval_s": 10,
        "fleet": {"nodes": 8},
        "jobs": [{"name": "llm", "nodes": 8, "step_s": 4.0, "pp": 2, "tp": 8}],
        "faults": faults,
        "confounders": list(confounders),
    }
    return parse_scenario(document, "hand-built")


def anomaly(
    kind: str,
    node: str,
    start_s: float,
    end_s: float | None,
    component: str = "",
    severity: str = "warning",
    **evidence: object,
) -> Anomaly:
    """A detector's report on the scenario clock (seconds from its start); end_s None while open."""
    return Anomaly(
        id=f"a{next(_ids)}",
        start=EPOCH + start_s,
        end=None if end_s is None else EPOCH + end_s,
        kind=kind,
        node=node,
        component=component,
        job="llm",
        severity=severity,
        score=3.5,
        evidence=example(kind, **({"ratio": 1.2} if kind == "slow_node" else {}), **evidence),
        detector=kind,
        detector_version="1",
    )


def verdicts(result: ScenarioResult) -> list[str]:
    return [outcome.verdict for outcome in result.reports]


EVERY_FAULT = [
    {"kind": "slow_node", "node": "vela-001", "start_s": 300, "end_s": 600, "severity": 0.1},
    {"kind": "thermal_throttle", "node": "vela-002", "gpu": 3, "start_s": 300, "end_s": 600},
    {"kind": "power_brake", "node": "vela-003", "start_s": 900, "end_s": 1100},
    {"kind": "link_flap", "node": "vela-003", "nic": 2, "start_s": 300, "flaps": 3, "period_s": 30},
    {"kind": "link_down", "node": "vela-004", "nic": 0, "start_s": 300, "end_s": 500},
    {"kind": "dma_degraded", "node": "vela-005", "nic": 1, "start_s": 300, "end_s": 900, "mode": "no_gdr"},
    {"kind": "gpu_lost", "node": "vela-006", "gpu": 5, "start_s": 700},
    {"kind": "xid", "node": "vela-007", "gpu": 2, "code": 79, "start_s": 400},
    {"kind": "xid_storm", "node": "vela-001", "start_s": 700, "events": 300},
    {"kind": "dbe_remap", "node": "vela-004", "gpu": 1, "start_s": 700, "end_s": 1000},
    {"kind": "congestion", "node": "vela-008", "nic": 3, "start_s": 300, "end_s": 600},
    {"kind": "port_errors", "node": "vela-002", "nic": 1, "start_s": 700, "end_s": 900, "level": 0.5},
]
# what a perfect gpu_fault detector says of a GPU that must leave service, and of an application's Xids
GPU_REPORTS = {
    "gpu_fault": {"severity": "critical", "action": Action.RESET_GPU},
    "gpu_app_error": {"severity": "info", "action": Action.RESTART_JOB},
}


def perfect_report(fault: Fault, kind: str | None = None) -> Anomaly:
    """What a perfect detector reports: the right kind (or `kind`) on the right component, one window after
    onset, as severe as it should be and recommending what it should."""
    kind = kind or expected_kind(fault)
    end_s = None if fault.end_s is None else fault.end_s + 10
    return anomaly(kind, fault.node, fault.start_s + 10, end_s, fault.component, **GPU_REPORTS.get(kind, {}))


def perfect_reports(injected: Scenario) -> list[Anomaly]:
    return [perfect_report(fault) for fault in injected.faults]


def test_every_fault_kind_has_anomaly_kinds_detecting_it() -> None:
    assert set(DETECTED_BY) == {*FAULT_KINDS, *LAYER_FAULT_KINDS}
    assert all(DETECTED_BY[kind] for kind in DETECTED_BY)


def test_a_perfect_detector_meets_every_goal() -> None:
    every = scenario(EVERY_FAULT)
    suite = combine([evaluate(every, perfect_reports(every), EPOCH)])
    assert list(suite.kinds) == list(FAULT_KINDS)
    for stats in suite.kinds.values():
        assert (stats.recall, stats.precision, stats.false_reports) == (1.0, 1.0, 0), stats.kind
    assert [goal.met for goal in suite.goals] == [
        True,
        True,
        True,
        True,
        None,
        None,
        True,
    ]  # no layer fault, no repair
    assert "NOT met" not in to_markdown(suite)


def test_a_missed_fault_lowers_recall_and_is_listed() -> None:
    two = scenario(
        [
            {"kind": "slow_node", "node": "vela-001", "start_s": 300, "end_s": 600, "severity": 0.2},
            {"kind": "slow_node", "node": "vela-006", "start_s": 300, "end_s": 600, "severity": 0.2},
        ]
    )
    suite = combine([evaluate(two, [anomaly("slow_node", "vela-001", 310, 610)], EPOCH)])
    assert (suite.kinds["slow_node"].recall, suite.kinds["slow_node"].precision) == (0.5, 1.0)
    precision_recall, slow_node_latency = suite.goals[:2]
    assert precision_recall.met is False and "slow_node recall 0.50" in precision_recall.detail
    assert slow_node_latency.met is False and "vela-006" in slow_node_latency.detail
    missed = [f for f in to_json(suite)["scenarios"][0]["faults"] if not f["detected"]]
    assert [(f["node"], f["latency_s"]) for f in missed] == [("vela-006", None)]


@pytest.mark.parametrize(
    ("node", "component", "start_s", "end_s", "verdict"),
    [
        ("vela-004", "gpu:3", 310, 400, FALSE),  # another node
        ("vela-002", "gpu:3", 100, 290, FALSE),  # before the fault
        ("vela-002", "gpu:3", 621, 700, FALSE),  # after the fault's end and the 2 intervals it has to close
        ("vela-002", "gpu:4", 310, 400, OTHER_FAULT),  # another GPU of the faulty node, during the fault
    ],
)
def test_a_report_beside_the_fault_is_a_false_report(
    node: str, component: str, start_s: float, end_s: float, verdict: str
) -> None:
    throttled = scenario(
        [{"kind": "thermal_throttle", "node": "vela-002", "gpu": 3, "start_s": 300, "end_s": 600}]
    )
    result = evaluate(throttled, [anomaly("gpu_throttle", node, start_s, end_s, component)], EPOCH)
    stats = result.kinds["thermal_throttle"]
    assert (stats.recall, stats.precision, verdicts(result)) == (0.0, 0.0, [verdict])
    fault_free = to_json(combine([result]))["kinds"]["thermal_throttle"]["false_per_node_day"]
    assert fault_free == pytest.approx((verdict == FALSE) / NODE_DAYS)


def test_a_report_closing_within_two_intervals_of_the_fault_end_still_matches() -> None:
    throttled = scenario(
        [{"kind": "thermal_throttle", "node": "vela-002", "gpu": 3, "start_s": 300, "end_s": 600}]
    )
    late = evaluate(throttled, [anomaly("gpu_throttle", "vela-002", 620, 640, "gpu:3")], EPOCH)
    assert verdicts(late) == [TRUE]


def test_a_node_level_report_does_not_name_a_faulty_gpu() -> None:
    throttled = scenario(
        [{"kind": "thermal_throttle", "node": "vela-002", "gpu": 3, "start_s": 300, "end_s": 600}]
    )
    result = evaluate(throttled, [anomaly("gpu_throttle", "vela-002", 310, 400, "")], EPOCH)
    assert result.kinds["thermal_throttle"].recall == 0.0


def test_reports_during_confounders_are_counted_apart_from_fault_free_ones() -> None:
    confounded = scenario(
        [],
        [
            {"kind": "job_stall", "job": "llm", "start_s": 400, "end_s": 460},
            {"kind": "stage_imbalance", "job": "llm", "stage": 1, "severity": 0.2},
            {"kind": "exporter_restart", "node": "vela-002", "at_s": 800},
        ],
    )
    reports = [
        anomaly("slow_node", "vela-001", 410, 470),  # every rank slow at once: a checkpoint
        anomaly("slow_node", "vela-006", 900, 960),  # a node of the slower last stage
        anomaly("link_flap", "vela-002", 810, 820, "mlx5_0:1"),  # counters reset to zero
        anomaly("slow_node", "vela-002", 900, 960),  # stage 0, nothing going on
    ]
    suite = combine([evaluate(confounded, reports, EPOCH)])
    assert verdicts(suite.scenarios[0]) == [CONFOUNDER, CONFOUNDER, CONFOUNDER, FALSE]
    slow_node = suite.kinds["slow_node"]
    assert (slow_node.confounder_reports, slow_node.false_reports) == (2, 1)
    goal = suite.goals[3]
    assert goal.met is False
    assert "slow_node on vela-001 410-470 s during job_stall of llm 400-460 s" in goal.detail
    assert "| slow_node | 0 | – | 3 | 0.00 (0/3) | – / – | 9.00 | 2 |" in to_markdown(suite)


def test_a_report_naming_the_wrong_fault_on_a_faulty_node_is_not_fault_free_time() -> None:
    throttled = scenario(
        [{"kind": "thermal_throttle", "node": "vela-002", "gpu": 3, "start_s": 300, "end_s": 600}]
    )
    result = evaluate(throttled, [anomaly("slow_node", "vela-002", 320, 600)], EPOCH)
    assert verdicts(result) == [OTHER_FAULT]
    assert (result.kinds["slow_node"].precision, result.kinds["slow_node"].false_reports) == (0.0, 0)


def test_latency_percentiles_over_detected_faults_and_the_slow_node_goal() -> None:
    delays = [0, 10, 20, 30, 40]
    slow = scenario(
        [
            {"kind": "slow_node", "node": f"vela-00{i + 1}", "start_s": 300, "end_s": 700, "severity": 0.1}
            for i in range(len(delays))
        ]
    )
    reports = [anomaly("slow_node", f"vela-00{i + 1}", 300 + d, 700, "") for i, d in enumerate(delays)]
    suite = combine([evaluate(slow, reports, EPOCH)])
    stats = suite.kinds["slow_node"]
    assert (stats.latency_s(50), stats.latency_s(90), stats.latency_windows(50)) == (20.0, 36.0, 2.0)
    goal = suite.goals[1]
    assert goal.met is False and "vela-005" in goal.detail and "vela-004" not in goal.detail
    assert "| 20 / 36 |" in to_markdown(suite)


def test_slow_node_latency_goal_leaves_out_subtle_slowdowns() -> None:
    subtle = scenario(
        [{"kind": "slow_node", "node": "vela-001", "start_s": 300, "end_s": 900, "severity": 0.05}]
    )
    suite = combine([evaluate(subtle, [anomaly("slow_node", "vela-001", 400, 900)], EPOCH)])
    assert suite.goals[1].met is None
    assert "not judged" in to_markdown(suite)


def test_a_report_opened_before_the_fault_counts_as_immediate() -> None:
    lost = scenario([{"kind": "gpu_lost", "node": "vela-006", "gpu": 5, "start_s": 700}])
    result = evaluate(lost, [anomaly("gpu_fault", "vela-006", 695, None, "gpu:5")], EPOCH)
    assert [outcome.latency_s for outcome in result.faults] == [0.0]


@pytest.mark.parametrize(("delay_s", "met"), [(10, True), (20, False)])
def test_link_flap_goal_wants_one_interval_from_the_end_of_the_first_flap(delay_s: float, met: bool) -> None:
    """The link goes down at 300 and is back at 315 (period 30 s): the first flap is over at 315."""
    flap = scenario([{"kind": "link_flap", "node": "vela-003", "nic": 2, "start_s": 300, "period_s": 30}])
    report = anomaly("link_flap", "vela-003", 315 + delay_s, 400, "mlx5_2:1")
    result = combine([evaluate(flap, [report], EPOCH)])
    assert result.goals[2].met is met
    assert result.kinds["link_flap"].latency_s(50) == delay_s


def test_peer_outlier_is_shown_but_never_judged() -> None:
    throttled = scenario(
        [{"kind": "thermal_throttle", "node": "vela-002", "gpu": 3, "start_s": 300, "end_s": 600}]
    )
    reports = [
        anomaly("gpu_throttle", "vela-002", 310, 610, "gpu:3"),
        anomaly("peer_outlier", "vela-002", 320, 600),  # the same trouble, seen by the catch-all
        anomaly("peer_outlier", "vela-007", 320, 600),  # nothing wrong there
    ]
    suite = combine([evaluate(throttled, reports, EPOCH)])
    outlier = suite.kinds["peer_outlier"]
    assert outlier.catch_all and (outlier.reports, outlier.true_reports, outlier.false_reports) == (2, 1, 1)
    assert [goal.met for goal in suite.goals] == [True, None, None, True, None, None, None]
    assert "| peer_outlier (catch-all) | 0 | – | 2 | 0.50 (1/2) |" in to_markdown(suite)


def test_gpu_fault_reports_count_for_the_fault_kind_they_detected() -> None:
    gpus = scenario(
        [
            {"kind": "xid", "node": "vela-007", "gpu": 2, "start_s": 400},
            {"kind": "gpu_lost", "node": "vela-006", "gpu": 5, "start_s": 700},
        ]
    )
    reports = [
        anomaly("gpu_fault", "vela-007", 410, None, "gpu:2"),
        anomaly("gpu_fault", "vela-001", 300, 400, "gpu:0"),  # wrong: counts against both kinds
    ]
    kinds = evaluate(gpus, reports, EPOCH).kinds
    assert (kinds["xid"].recall, kinds["xid"].reports, kinds["xid"].precision) == (1.0, 2, 0.5)
    assert (kinds["gpu_lost"].recall, kinds["gpu_lost"].reports, kinds["gpu_lost"].precision) == (0.0, 1, 0.0)


def test_an_anomaly_rewritten_when_it_ended_is_one_report() -> None:
    slow = scenario(
        [
            {"kind": "slow_node", "node": "vela-001", "start_s": 300, "end_s": 400, "severity": 0.2},
            {"kind": "slow_node", "node": "vela-001", "start_s": 800, "end_s": 900, "severity": 0.2},
        ]
    )
    opened = anomaly("slow_node", "vela-001", 310, None)
    closed = replace(opened, end=EPOCH + 410)
    result = evaluate(slow, [closed, opened], EPOCH)
    assert len(result.reports) == 1
    assert [outcome.detected for outcome in result.faults] == [True, False]


def test_the_suite_pools_scenarios_and_reports_everything_as_json() -> None:
    every = scenario(EVERY_FAULT)
    first = evaluate(every, perfect_reports(every), EPOCH)
    second = evaluate(
        every, [*perfect_reports(every)[1:], anomaly("congestion", "vela-001", 50, 60, "mlx5_3:1")], EPOCH
    )
    suite = combine([first, second])
    assert suite.node_days == pytest.approx(2 * NODE_DAYS)
    assert (suite.kinds["slow_node"].faults, suite.kinds["slow_node"].recall) == (2, 0.5)
    assert suite.kinds["congestion"].precision == pytest.approx(2 / 3)
    document = json.loads(json.dumps(to_json(suite)))
    assert [s["name"] for s in document["scenarios"]] == ["hand-built", "hand-built"]
    assert document["kinds"]["congestion"]["false_per_node_day"] == pytest.approx(1 / (2 * NODE_DAYS))
    false_report = document["scenarios"][1]["reports_detecting_nothing"][0]
    assert (false_report["verdict"], false_report["node"], false_report["evidence"]) == (
        FALSE,
        "vela-001",
        as_dict(example("congestion")),
    )
    markdown = to_markdown(suite)
    assert "| congestion | 2 | 1.00 (2/2) | 3 | 0.67 (2/3) | 10 / 10 | 4.50 | 0 |" in markdown
    assert "2 scenario(s), 0.22 node-days" in markdown


def test_a_scenario_result_crosses_to_another_process() -> None:
    """fleetlens eval scores each scenario in a worker process of its own."""
    every = scenario(EVERY_FAULT)
    result = evaluate(every, perfect_reports(every), EPOCH)
    assert pickle.loads(pickle.dumps(result)) == result


# -- what a slow node costs its job -------------------------------------------------------------------------


def test_a_slow_nodes_truth_is_the_share_of_its_jobs_step_it_costs() -> None:
    """Steps of 4 s: compute 60%, data 5%, collectives 35%. A node computing 20% slower makes every step
    0.12 x 4 s longer, 0.12 / 1.12 of the step; 100% slower: 0.6 / 1.6."""
    slow = scenario(
        [
            {"kind": "slow_node", "node": "vela-002", "start_s": 300, "end_s": 600, "severity": 0.2},
            {"kind": "slow_node", "node": "vela-006", "start_s": 700, "end_s": 900, "severity": 1.0},
            {"kind": "thermal_throttle", "node": "vela-003", "gpu": 1, "start_s": 950, "end_s": 1100},
        ]
    )
    twenty, double, throttled = slow.faults
    assert true_job_slowdown(slow, twenty) == pytest.approx(0.12 / 1.12, abs=0.006)
    assert true_job_slowdown(slow, double) == pytest.approx(0.6 / 1.6, abs=0.006)
    assert true_job_slowdown(slow, throttled) is None, "slow_node faults only"


def test_a_slow_node_behind_a_slower_stage_costs_nothing() -> None:
    """The step waits for the slowest rank: a stage 20% slower by design hides a node 10% slower."""
    hidden = scenario(
        [{"kind": "slow_node", "node": "vela-002", "start_s": 300, "end_s": 600, "severity": 0.1}],
        [{"kind": "stage_imbalance", "job": "llm", "stage": 1, "severity": 0.2}],
    )
    assert true_job_slowdown(hidden, hidden.faults[0]) == pytest.approx(0.0, abs=0.004)


def test_a_node_outside_every_job_costs_no_job() -> None:
    idle = parse_scenario(
        {
            "duration_s": 600,
            "fleet": {"nodes": 4},
            "jobs": [{"name": "llm", "nodes": ["vela-001", "vela-002"], "step_s": 2.0}],
            "faults": [{"kind": "slow_node", "node": "vela-004", "start_s": 200, "severity": 0.3}],
        },
        "idle",
    )
    assert true_job_slowdown(idle, idle.faults[0]) is None


def test_the_detectors_estimate_stands_next_to_the_truth() -> None:
    slow = scenario(
        [
            {"kind": "slow_node", "node": "vela-002", "start_s": 300, "end_s": 600, "severity": 0.2},
            {"kind": "slow_node", "node": "vela-006", "start_s": 700, "end_s": 900, "severity": 1.0},
        ]
    )
    reports = [
        anomaly("slow_node", "vela-002", 320, 610, job_slowdown=0.1),
        anomaly("slow_node", "vela-006", 708, 910),  # a detector that does not estimate it
    ]
    suite = combine([evaluate(slow, reports, EPOCH)])
    first, second = suite.scenarios[0].faults
    assert (first.estimated_job_slowdown, second.estimated_job_slowdown) == (0.1, None)
    assert first.latency_steps == pytest.approx(20 / 4.5, rel=0.05), "steps of 4 s, 12% longer"
    faults = json.loads(json.dumps(to_json(suite)))["scenarios"][0]["faults"]
    assert [(f["estimated_job_slowdown"], round(f["true_job_slowdown"], 2)) for f in faults] == [
        (0.1, 0.11),
        (None, 0.38),
    ]
    assert to_json(suite)["job_slowdown"]["within_tolerance"] == 1
    assert "slow_node job_slowdown: 1 of 2 slow nodes estimated, 1 within 20% of the truth" in to_markdown(
        suite
    )


@pytest.mark.parametrize(("after_s", "met"), [(220, True), (400, False)])
def test_a_slow_node_in_a_job_of_long_steps_is_in_time_within_five_of_its_steps(
    after_s: int, met: bool
) -> None:
    """46-s steps, 73.6 s while the node computes twice as slow: 5 steps are 368 s, 3 windows 30 s."""
    long_steps = parse_scenario(
        {
            "duration_s": 1500,
            "fleet": {"nodes": 4, "gpus_per_node": 4},
            "jobs": [{"name": "llm", "nodes": 4, "step_s": 46.0, "pp": 2, "tp": 4}],
            "faults": [{"kind": "slow_node", "node": "vela-002", "start_s": 400, "severity": 1.0}],
        },
        "long-steps",
    )
    result = evaluate(long_steps, [anomaly("slow_node", "vela-002", 400 + after_s, None)], EPOCH)
    (outcome,) = result.faults
    assert outcome.latency_steps == pytest.approx(after_s / 73.6, rel=0.02)
    latency_goal = combine([result]).goals[1]
    assert latency_goal.name.endswith("within 3 windows or 5 of its job's steps")
    assert latency_goal.met is met


GPU_FAULTS = [
    {"kind": "xid_storm", "node": "vela-001", "start_s": 300},
    {"kind": "xid_storm", "node": "vela-002", "start_s": 300},
    {"kind": "dbe_remap", "node": "vela-003", "gpu": 4, "start_s": 400},
    {"kind": "xid", "node": "vela-004", "gpu": 1, "code": 94, "start_s": 400},  # contained: restart the job
    {"kind": "xid", "node": "vela-005", "gpu": 0, "code": 13, "start_s": 400},  # the application's
]


def test_xids_are_expected_as_their_catalog_cause_says_and_must_alert_and_drain_as_their_action_says() -> (
    None
):
    gpus = scenario(GPU_FAULTS)
    assert [expected_kind(f) for f in gpus.faults] == [
        "gpu_app_error", "gpu_app_error", "gpu_fault", "gpu_fault", "gpu_app_error",
    ]  # fmt: skip
    contained = replace(
        perfect_report(gpus.faults[3]),
        severity="warning",
        evidence=example("gpu_fault", action=Action.RESTART_JOB),
    )
    suite = combine(
        [evaluate(gpus, [*perfect_reports(gpus)[:3], contained, perfect_report(gpus.faults[4])], EPOCH)]
    )
    assert suite.goals[-1].met is True and suite.goals[-1].detail == "5 faults as they ask"
    faults = to_json(suite)["scenarios"][0]["faults"]
    assert [(f["kind"], f["alerted"], f["drained"], f["must_alert"], f["must_drain"]) for f in faults] == [
        ("xid_storm", False, False, False, False),
        ("xid_storm", False, False, False, False),
        ("dbe_remap", True, True, True, True),
        ("xid", False, False, None, False),
        ("xid", False, False, False, False),
    ]


def test_a_storm_taken_for_a_gpu_fault_and_a_dbe_too_mild_to_drain_are_caught() -> None:
    gpus = scenario(GPU_FAULTS[:3])
    storm, _, dbe = gpus.faults
    reports = [
        perfect_report(storm, "gpu_fault"),  # critical, reset_gpu: alerted and drained, and no detection
        replace(perfect_report(dbe), severity="warning"),  # detected, but neither alerted nor drained
    ]
    suite = combine([evaluate(gpus, reports, EPOCH)])
    goal = suite.goals[-1]
    assert goal.met is False
    assert goal.detail.split("; ") == [
        "hand-built: xid_storm on vela-001 300-390 s led to an alert, which it must not",
        "hand-built: xid_storm on vela-001 300-390 s led to a drain decision, which it must not",
        "hand-built: dbe_remap on vela-003 gpu:4 400-end s led to no alert, which it must",
        "hand-built: dbe_remap on vela-003 gpu:4 400-end s led to no drain decision, which it must",
    ]


def test_stock_exporters_keep_what_they_cannot_show_out_of_the_recall_and_say_why() -> None:
    downgrade = {"kind": "dma_degraded", "node": "vela-002", "gpu": 4, "start_s": 300, "end_s": 900}
    faults = [*EVERY_FAULT, {**downgrade, "mode": "pcie_downgrade"}]
    fleetlens = scenario(faults)
    stock = replace(fleetlens, exporters="stock")
    seen = [perfect_report(f) for f in fleetlens.faults if f.params.get("mode") != "pcie_downgrade"]

    as_fleetlens = combine([evaluate(fleetlens, seen, EPOCH)])
    assert as_fleetlens.kinds["dma_degraded"].recall == 0.5, "fleetlens's exporter shows the downgrade"
    assert not as_fleetlens.excluded

    suite = combine([evaluate(stock, seen, EPOCH)])
    assert suite.kinds["dma_degraded"].faults == 1 and suite.kinds["dma_degraded"].recall == 1.0
    assert [goal.met for goal in suite.goals] == [True, True, True, True, None, None, True]
    (excluded,) = suite.excluded
    assert (excluded.outcome.fault.params["mode"], excluded.outcome.detected) == ("pcie_downgrade", False)
    text = to_markdown(suite)
    assert "read by stock exporters" in text
    assert "dma_degraded pcie_downgrade: 1 fault(s), 0 detected anyway; dcgm-exporter's default set" in text
    listed = to_json(suite)["unobservable"]
    assert [(item["kind"], item["detected"]) for item in listed] == [("dma_degraded", False)]
    assert "DCGM_FI_DEV_PCIE_LINK_GEN" in listed[0]["reason"]


def test_stock_exporters_cannot_show_an_idle_gpu_throttled_but_a_busy_one_counts() -> None:
    document = {
        "duration_s": 1200,
        "fleet": {"nodes": 10},
        "jobs": [{"name": "llm", "nodes": 8, "step_s": 4.0, "pp": 2, "tp": 8}],  # vela-009, -010 idle
        "faults": [
            {"kind": "thermal_throttle", "node": "vela-002", "gpu": 3, "start_s": 300, "end_s": 600},
            {"kind": "thermal_throttle", "node": "vela-009", "gpu": 1, "start_s": 300, "end_s": 600},
            {"kind": "power_brake", "node": "vela-010", "start_s": 300, "end_s": 600},
        ],
        "exporters": "stock",
    }
    idle = parse_scenario(document, "idle")
    result = evaluate(idle, [], EPOCH)
    assert [outcome.fault.node for outcome in result.faults] == ["vela-002"]
    assert [(e.outcome.fault.node, e.unobservable.name) for e in result.excluded] == [
        ("vela-009", "thermal_throttle on idle GPUs"),
        ("vela-010", "power_brake on idle GPUs"),
    ]
    assert "an idle GPU's SM clock is the driver's to choose" in result.excluded[0].unobservable.reason

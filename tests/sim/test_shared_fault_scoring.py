"""How the evaluation scores faults of shared layers: on hand-made reports (right, wrong parent, wrong
layer, a child's report left unexplained, a drained child) and end to end on the leaf scenario."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from analytics.evidence import SharedFaultEvidence
from analytics.store.records import Anomaly
from sim.evaluation import EXPLAINED, FALSE, TRUE, ScenarioResult, combine, evaluate, to_json, to_markdown
from sim.pipeline import evaluate_files
from sim.scenario import Scenario, parse_scenario
from tests.sim.test_evaluation import EPOCH, GPU_REPORTS, anomaly, verdicts

LEAF_SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "topology" / "leaf-flaps-16.yaml"


def leaf_scenario(faults: list[dict] = ()) -> Scenario:
    """8 VMs, one per host, four hosts per leaf, both leaves under spine-0: leaf-01 (vela-005..008) has
    bit errors from 300 to 600 s."""
    document = {
        "duration_s": 1200,
        "interval_s": 10,
        "fleet": {"nodes": 8, "nics_per_node": 2},
        "topology": {"vms_per_host": 1, "hosts_per_leaf": 4, "leaves_per_spine": 2, "hosts_per_rack": 4},
        "jobs": [{"name": "llm", "nodes": 8, "step_s": 4.0, "pp": 2, "tp": 8}],
        "faults": [
            {"kind": "leaf_degraded", "leaf": "leaf-01", "mode": "errors", "start_s": 300, "end_s": 600},
            *faults,
        ],
    }
    return parse_scenario(document, "leaf")


def shared(layer: str, parent: str, start_s: float = 320, end_s: float = 610) -> Anomaly:
    """The runner's shared_fault anomaly of `parent` in `layer`: the parent its node, the layer its
    component."""
    fields = {"n": 4, "k": 4, "fleet_nodes": 8, "fleet_anomalous": 4, "tested": 4, "kinds": {"link_flap": 4}}
    evidence = SharedFaultEvidence(
        layer=layer,
        parent=parent,
        p_value=0.014,
        log10_p_value=-1.85,
        p_corrected=0.057,
        children=(),
        anomalous_children=(),
        explains=(),
        dominant_kind="link_flap",
        check="check the leaf",
        **fields,
    )
    report = anomaly("link_flap", parent, start_s, end_s, layer)
    return replace(report, kind="shared_fault", evidence=evidence, detector="shared_fault")


def explained(report: Anomaly) -> Anomaly:
    return replace(report, explained_by="shared-fault-1")


def leaf_row(result: ScenarioResult) -> tuple[int, int, int, int]:
    row = result.kinds["leaf_degraded"]
    return row.faults, row.detected, row.reports, row.true_reports


def test_a_shared_fault_naming_the_layer_and_parent_detects_the_layer_fault() -> None:
    result = evaluate(leaf_scenario(), [shared("leaf", "leaf-01")], EPOCH)
    assert verdicts(result) == [TRUE]
    assert leaf_row(result) == (1, 1, 1, 1)
    assert result.faults[0].latency_s == 20
    assert [f.fault.node for f in result.faults] == ["leaf-01"]  # one truth, not its per-node effects


def test_a_shared_fault_naming_the_wrong_parent_is_false_and_misses() -> None:
    result = evaluate(leaf_scenario(), [shared("leaf", "leaf-00")], EPOCH)
    assert verdicts(result) == [FALSE]
    assert leaf_row(result) == (1, 0, 1, 0)


def test_a_shared_fault_naming_the_wrong_layer_is_false_in_that_layers_row() -> None:
    result = evaluate(leaf_scenario(), [shared("spine", "spine-0")], EPOCH)
    assert verdicts(result) == [FALSE]
    assert leaf_row(result) == (1, 0, 0, 0)
    spine = result.kinds["spine_degraded"]
    assert (spine.faults, spine.reports, spine.precision) == (0, 1, 0.0)


def test_a_childs_report_is_explained_only_when_the_runner_said_so() -> None:
    congestion = anomaly("congestion", "vela-007", 330, 500, "mlx5_1:1")
    unexplained = anomaly("congestion", "vela-006", 330, 500, "mlx5_0:1")
    reports = [shared("leaf", "leaf-01"), explained(congestion), unexplained]
    result = evaluate(leaf_scenario(), reports, EPOCH)
    assert verdicts(result) == [TRUE, EXPLAINED, FALSE]
    row = result.kinds["congestion"]  # the explained report is in no row; the unexplained one is false
    assert (row.reports, row.false_reports) == (1, 1)
    assert "leaf_degraded on leaf-01" in result.reports[2].explained_by[0]


def test_an_update_row_that_cleared_explained_by_still_counts_as_explained() -> None:
    opened = explained(anomaly("congestion", "vela-007", 330, None, "mlx5_1:1"))
    closed = replace(opened, end=EPOCH + 640, explained_by="")  # the shared fault closed first
    result = evaluate(leaf_scenario(), [shared("leaf", "leaf-01"), opened, closed], EPOCH)
    assert verdicts(result) == [TRUE, EXPLAINED]


def test_a_drained_child_is_a_wrong_action_but_a_child_with_its_own_lost_gpu_is_not() -> None:
    own = {"kind": "gpu_lost", "node": "vela-008", "gpu": 1, "start_s": 400}
    stray = anomaly("gpu_fault", "vela-006", 330, 500, "gpu:0", **GPU_REPORTS["gpu_fault"])
    lost = anomaly("gpu_fault", "vela-008", 410, None, "gpu:1", **GPU_REPORTS["gpu_fault"])
    result = evaluate(leaf_scenario([own]), [shared("leaf", "leaf-01"), stray, lost], EPOCH)
    leaf = next(outcome for outcome in result.faults if outcome.fault.kind == "leaf_degraded")
    assert leaf.drained_children == ("vela-006",)
    assert result.kinds["leaf_degraded"].drained_children == 1
    suite = combine([result])
    goal = next(goal for goal in suite.goals if goal.name == "no child of a shared fault drained")
    assert goal.met is False and "vela-006 drained during leaf_degraded on leaf-01" in goal.detail
    assert to_json(suite)["kinds"]["leaf_degraded"]["drained_children"] == 1
    assert "no child of a shared fault drained: NOT met" in to_markdown(suite)


def test_the_leaf_scenario_end_to_end_names_the_leaf_and_drains_only_the_lost_gpu() -> None:
    (result,) = evaluate_files([LEAF_SCENARIO], workers=1)  # a process of its own: chDB's one directory
    leaf = result.kinds["leaf_degraded"]
    assert (leaf.recall, leaf.precision, leaf.drained_children) == (1.0, 1.0, 0)
    lost = next(outcome for outcome in result.faults if outcome.fault.kind == "gpu_lost")
    assert lost.detected and lost.drained
    unexplained = [
        o for o in result.reports if o.verdict == FALSE and o.report.anomaly.node.startswith("vela-")
    ]
    assert unexplained == []

"""The eval's figures of the lifecycle's returns to service, on hand-made return rows."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sim.evaluation import combine, evaluate, return_figures, to_json, to_markdown
from sim.scenario import Scenario, load_scenario, parse_scenario

EPOCH = 1_767_225_600.0
GOAL = "no node returned while faulty, every repaired drained node returned"
LIFECYCLE = Path(__file__).resolve().parents[1] / "scenarios" / "lifecycle"


def repairs_scenario() -> Scenario:
    """Two nodes lose a GPU (must drain) and are repaired, one never is; a throttled GPU is repaired too
    (it does not drain: no return asked)."""
    document = {
        "duration_s": 7200,
        "fleet": {"nodes": 8},
        "jobs": [],
        "faults": [
            {"kind": "gpu_lost", "node": "vela-001", "gpu": 0, "start_s": 600},
            {"kind": "gpu_lost", "node": "vela-002", "gpu": 0, "start_s": 600},
            {"kind": "gpu_lost", "node": "vela-003", "gpu": 0, "start_s": 600},
            {"kind": "thermal_throttle", "node": "vela-004", "gpu": 0, "start_s": 600},
        ],
        "confounders": [
            {"kind": "repair", "node": "vela-001", "at_s": 2000},
            {"kind": "repair", "node": "vela-002", "at_s": 3000},
            {"kind": "repair", "node": "vela-004", "at_s": 3000},
        ],
    }
    return parse_scenario(document, "returns")


def test_returns_after_repair_are_timed_and_none_is_wrong() -> None:
    figures = return_figures(repairs_scenario(), {"vela-001": [2600.0, 5000.0], "vela-002": [4800.0]})
    assert figures.must_return == ("vela-001@2000", "vela-002@3000")
    assert dict(figures.repair_to_return_s) == {"vela-001@2000": 600.0, "vela-002@3000": 1800.0}
    assert (
        figures.returned_after_repair == 2 and figures.wrongly_returned == () and figures.not_returned == ()
    )
    suite = combine(
        [evaluate(repairs_scenario(), [], EPOCH, returns={"vela-001": [2600.0], "vela-002": [4800.0]})]
    )
    document = to_json(suite)
    assert (document["returned_after_repair"], document["wrongly_returned"]) == (2, 0)
    assert (document["repair_to_return_s"]["median"], document["repair_to_return_s"]["max"]) == (
        1200.0,
        1800.0,
    )
    assert document["scenarios"][0]["repair_to_return_s"]["each"] == {
        "vela-001@2000": 600.0,
        "vela-002@3000": 1800.0,
    }
    assert next(goal for goal in suite.goals if goal.name == GOAL).met is True
    assert (
        "Returns to service: 2 of 2 repaired drained node(s) returned after repair (repair to return "
        "median 1200 s, max 1800 s); 0 returned while faulty."
    ) in to_markdown(suite)


def test_a_return_before_the_repair_or_of_a_node_never_repaired_is_wrong() -> None:
    returns = {"vela-001": [1500.0], "vela-003": [4000.0], "vela-004": [3500.0], "vela-005": [100.0]}
    figures = return_figures(repairs_scenario(), returns)
    assert figures.wrongly_returned == ("vela-001@1500", "vela-003@4000")  # 004 is repaired, 005 healthy
    assert figures.not_returned == ("vela-001@2000", "vela-002@3000")  # 1500 is before the repair
    suite = combine([evaluate(repairs_scenario(), [], EPOCH, returns=returns)])
    goal = next(goal for goal in suite.goals if goal.name == GOAL)
    assert goal.met is False
    assert goal.detail.split("; ") == [
        "returned while faulty: returns: vela-001@1500",
        "returned while faulty: returns: vela-003@4000",
        "not returned after repair: returns: vela-001@2000",
        "not returned after repair: returns: vela-002@3000",
    ]
    assert to_json(suite)["wrongly_returned"] == 2


def test_without_repairs_or_returns_the_figures_are_zero_and_the_goal_not_judged() -> None:
    document = {"duration_s": 1200, "fleet": {"nodes": 8}, "jobs": [], "faults": []}
    suite = combine([evaluate(parse_scenario(document, "quiet"), [], EPOCH)])
    figures = to_json(suite)
    assert (figures["returned_after_repair"], figures["wrongly_returned"]) == (0, 0)
    assert figures["repair_to_return_s"] == {"median": None, "max": None, "each": {}}
    assert next(goal for goal in suite.goals if goal.name == GOAL).met is None
    assert "Returns to service" not in to_markdown(suite)


def test_a_node_repaired_twice_is_timed_from_each_repair() -> None:
    loaded = load_scenario(LIFECYCLE / "repair-twice-8.yaml")
    figures = return_figures(loaded, {"vela-002": [2400.0, 3000.0, 6060.0]})
    assert dict(figures.repair_to_return_s) == {"vela-002@2400": 0.0, "vela-002@6000": 60.0}
    assert figures.wrongly_returned == ()
    assert return_figures(loaded, {"vela-002": [5000.0]}).wrongly_returned == ("vela-002@5000",)  # lost again


@given(st.floats(min_value=0, max_value=7200), st.sampled_from(["vela-001", "vela-002", "vela-003"]))
def test_a_return_is_wrong_exactly_while_a_drainable_fault_of_the_node_is_active(
    at_s: float, node: str
) -> None:
    loaded = repairs_scenario()
    end = {"vela-001": 2000, "vela-002": 3000, "vela-003": float("inf")}[node]
    figures = return_figures(loaded, {node: [at_s]})
    assert bool(figures.wrongly_returned) is (600 <= at_s < end)

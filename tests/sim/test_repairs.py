"""Repair events: parsing, the faults they end, and the simulated node following the cut faults."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from sim.errors import ScenarioError
from sim.jobs import JobModel
from sim.node import timeline
from sim.scenario import Repair, Scenario, parse_scenario

DURATION_S = 7200


def repaired(faults: list[dict[str, Any]], events: list[dict[str, Any]]) -> Scenario:
    """8 nodes for two hours, one job on the first four, with `events` as the confounders list."""
    document = {
        "duration_s": DURATION_S,
        "fleet": {"nodes": 8},
        "jobs": [{"name": "llm", "nodes": 4, "step_s": 4.0, "tp": 8}],
        "faults": faults,
        "confounders": events,
    }
    return parse_scenario(document, "repairs")


LOST = {"kind": "gpu_lost", "node": "vela-002", "gpu": 5, "start_s": 600}


def test_a_repair_ends_every_fault_of_its_node_active_then_and_no_other() -> None:
    scenario = repaired(
        [
            LOST,
            {"kind": "thermal_throttle", "node": "vela-002", "gpu": 1, "start_s": 700, "end_s": 5000},
            {"kind": "thermal_throttle", "node": "vela-002", "gpu": 1, "start_s": 100, "end_s": 300},  # over
            {"kind": "gpu_lost", "node": "vela-002", "gpu": 3, "start_s": 3000},  # after the repair
            {"kind": "gpu_lost", "node": "vela-003", "gpu": 5, "start_s": 600},  # another node
        ],
        [
            {"kind": "repair", "node": "vela-002", "at_s": 1800},
            {"kind": "exporter_restart", "node": "vela-001", "at_s": 60},
        ],
    )
    assert [fault.end_s for fault in scenario.faults] == [1800, 1800, 300, None, None]
    assert scenario.repairs == (Repair("vela-002", 1800.0),)
    assert [confounder.kind for confounder in scenario.confounders] == ["exporter_restart"]
    assert scenario.until(1800).repairs == () and scenario.until(1801).repairs == scenario.repairs


@pytest.mark.parametrize(
    ("second_s", "refused"), [(1800, 1), (4000, 0)]
)  # the same repair twice, or one later
def test_a_repair_of_what_an_earlier_repair_already_ended_is_refused(second_s: float, refused: int) -> None:
    twice = [{"kind": "repair", "node": "vela-002", "at_s": at_s} for at_s in (second_s, 1800)]  # any order
    message = rf"confounders\[{refused}\]\.at_s: no fault of vela-002 is active at {second_s} s"
    with pytest.raises(ScenarioError, match=message):
        repaired([LOST], twice)


def test_a_second_repair_ends_a_fault_that_started_after_the_first() -> None:
    again = {"kind": "gpu_lost", "node": "vela-002", "gpu": 5, "start_s": 3000}
    scenario = repaired(
        [LOST, again],
        [
            {"kind": "repair", "node": "vela-002", "at_s": 1800},
            {"kind": "repair", "node": "vela-002", "at_s": 4000},
        ],
    )
    assert [(fault.start_s, fault.end_s) for fault in scenario.faults] == [(600, 1800), (3000, 4000)]


@pytest.mark.parametrize(
    ("event", "message"),
    [
        ({"node": "vela-042", "at_s": 1800}, "confounders[0].node: no node 'vela-042' in a fleet of 8"),
        ({"at_s": 1800}, "confounders[0].node: no node None"),
        ({"node": "vela-002", "at_s": DURATION_S + 1}, "confounders[0].at_s: 7201 is outside 0..7200"),
        ({"node": "vela-002", "at_s": -1}, "confounders[0].at_s: -1 is outside 0..7200"),
        ({"node": "vela-002", "at_s": "noon"}, "confounders[0].at_s: want a number, got 'noon'"),
        ({"node": "vela-002"}, "confounders[0].at_s: missing"),
        ({"node": "vela-002", "at_s": 300}, "confounders[0].at_s: no fault of vela-002 is active at 300 s"),
        ({"node": "vela-002", "at_s": 600}, "confounders[0].at_s: no fault of vela-002 is active at 600 s"),
        ({"node": "vela-004", "at_s": 1800}, "confounders[0].at_s: no fault of vela-004 is active at 1800 s"),
        (
            {"node": "vela-002", "at_s": 1800, "gpu": 5},
            "confounders[0]: unknown key(s) gpu; known: at_s, kind, node",
        ),
    ],
)
def test_a_bad_repair_is_refused_naming_its_key(event: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        repaired([LOST], [{"kind": "repair", **event}])
    assert str(caught.value).startswith(f"<scenario>: {message}")


def test_the_simulated_node_is_healthy_from_the_repair_on() -> None:
    """The node's events follow the cut fault: the lost GPU comes back at the repair, and a flapping
    link repaired between flaps comes up then and flaps no more."""
    scenario = repaired(
        [
            LOST,
            {"kind": "link_flap", "node": "vela-002", "nic": 1, "start_s": 1780, "flaps": 3, "period_s": 30},
        ],
        [{"kind": "repair", "node": "vela-002", "at_s": 1800}],
    )
    times = [event.t for event in timeline(scenario, "vela-002") if event.t > 0]
    assert times == [600, 1780, 1795, 1800]  # lost, first flap down and up, GPU back; the 1810 flap never


def test_a_repaired_slow_node_computes_at_the_healthy_pace_from_the_repair_on() -> None:
    """The job's step model follows the cut fault: vela-002's ranks compute 50% slower until the repair
    at 1800 s, and as fast as the healthy vela-001's after it."""
    slow = {"kind": "slow_node", "node": "vela-002", "severity": 0.5, "start_s": 600}
    scenario = repaired([slow], [{"kind": "repair", "node": "vela-002", "at_s": 1800}])

    def compute_ratio(start_s: float, end_s: float) -> float:
        rows = JobModel(scenario.jobs[0], scenario, epoch=0.0).steps_until(3000)
        mean = {
            node: statistics.mean(r.compute_s for r in rows if r.node == node and start_s <= r.ts < end_s)
            for node in ("vela-001", "vela-002")
        }
        return mean["vela-002"] / mean["vela-001"]

    assert compute_ratio(900, 1700) == pytest.approx(1.5, rel=0.05)
    assert compute_ratio(1900, 3000) == pytest.approx(1.0, rel=0.05)

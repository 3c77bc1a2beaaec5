"""The eval's replay of the node lifecycle: drained simulated nodes are tested with the real Lifecycle and
DrainController, the simulated nodes answering the heavy checks from their faults; a repaired node comes
back, a node still faulty does not, whatever its alerts do."""

from __future__ import annotations

from analytics.store.records import Anomaly
from sim.evaluation import evaluate, lifecycle_returns
from sim.scenario import Scenario, parse_scenario
from tests.sim.test_evaluation import EPOCH, GPU_REPORTS, anomaly

GOAL = "no node returned while faulty, every repaired drained node returned"


def scenario() -> Scenario:
    """vela-001 loses a GPU and is repaired; vela-002 loses one and never is; vela-003 has an Xid 79 whose
    alert stops after a minute (the detector reports it once) while the GPU stays off the bus."""
    return parse_scenario(
        {
            "duration_s": 9000,
            "fleet": {"nodes": 4},
            "jobs": [],
            "faults": [
                {"kind": "gpu_lost", "node": "vela-001", "gpu": 0, "start_s": 600},
                {"kind": "gpu_lost", "node": "vela-002", "gpu": 1, "start_s": 600},
                {"kind": "xid", "node": "vela-003", "gpu": 2, "code": 79, "start_s": 600},
            ],
            "confounders": [{"kind": "repair", "node": "vela-001", "at_s": 3000}],
        },
        "lifecycle-replay",
    )


def reports() -> list[Anomaly]:
    fault = GPU_REPORTS["gpu_fault"]
    return [
        anomaly("gpu_fault", "vela-001", 610, 3010, "gpu:0", **fault),  # closes once repaired
        anomaly("gpu_fault", "vela-002", 610, None, "gpu:1", **fault),
        anomaly("gpu_fault", "vela-003", 610, 670, "gpu:2", **fault),  # quiet, still faulty
    ]


def test_the_repaired_node_returns_after_its_heavy_checks_and_the_faulty_ones_never_do() -> None:
    result = evaluate(scenario(), reports(), EPOCH)

    figures = result.returns
    assert figures.must_return == ("vela-001@3000",)
    assert figures.returned_after_repair == 1 and figures.wrongly_returned == ()
    # the repair asks for a test at once; DCGM level 3 (the longest simulated check) takes 1800 s
    assert dict(figures.repair_to_return_s) == {"vela-001@3000": 1800.0}


def test_returns_come_only_from_passing_checks_not_from_quiet_alerts() -> None:
    on_clock = [outcome.report for outcome in evaluate(scenario(), reports(), EPOCH).reports]
    returns = lifecycle_returns(scenario(), on_clock, EPOCH, 10.0)
    assert set(returns) == {"vela-001"}  # vela-003's alert stopped at 670 s; its checks keep failing
    assert all(at >= 3000 for at in returns["vela-001"])

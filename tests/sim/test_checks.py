"""Simulated active checks (sim.checks): durations, statuses over time, repairs, the lifecycle scenarios."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alerts.errors import BackendError
from analytics.xid_catalog import catalog
from sim.checks import CHECK_DURATION_S, REQUESTS, SIM_HEAVY_CHECKS, SimulatedChecks, seen_by
from sim.evaluation import expected_consequences
from sim.scenario import FAULT_KINDS, Fault, Scenario, load_scenario, parse_scenario

EPOCH = 1_767_225_600.0
DURATION_S = 14_400
LIFECYCLE = Path(__file__).resolve().parents[1] / "scenarios" / "lifecycle"
HEAVY_S = max(CHECK_DURATION_S[check] for check in SIM_HEAVY_CHECKS)


def scenario(faults: list[dict[str, Any]], repairs: list[dict[str, Any]] = ()) -> Scenario:
    """8 nodes for four hours, no job: checks run on free nodes."""
    document = {
        "duration_s": DURATION_S,
        "fleet": {"nodes": 8},
        "jobs": [],
        "faults": faults,
        "confounders": [{"kind": "repair", **repair} for repair in repairs],
    }
    return parse_scenario(document, "checks")


def heavy_statuses(checks: SimulatedChecks, node: str, at_s: float) -> set[str]:
    """The statuses of the heavy set started on `node` at scenario second `at_s`, once all finished."""
    started = EPOCH + at_s
    checks.start(node, SIM_HEAVY_CHECKS, started)
    return {row.status for row in checks(node, started, started + HEAVY_S)}


def test_a_check_reports_only_once_its_duration_has_passed() -> None:
    checks = SimulatedChecks(scenario([]), EPOCH)
    checks.start("vela-001", ["dcgm_diag", "gpu_state"], EPOCH + 100)
    nvml_done, diag_done = (
        EPOCH + 100 + CHECK_DURATION_S["gpu_state"],
        EPOCH + 100 + CHECK_DURATION_S["dcgm_diag"],
    )
    assert checks("vela-001", EPOCH, nvml_done - 0.5) == []
    assert {row.check for row in checks("vela-001", EPOCH, nvml_done)} == {"remapped_rows", "power_slowdown"}
    assert len(checks("vela-001", EPOCH, diag_done - 1)) == 16  # two rows per GPU, no diagnostic yet
    rows = checks("vela-001", EPOCH, diag_done)
    diag = [row for row in rows if row.check == "dcgm_diag"]
    assert [row.target for row in diag] == [f"gpu:{gpu}" for gpu in range(8)]
    assert {(row.status, row.duration_s, row.started) for row in diag} == {("PASS", 1800.0, EPOCH + 100)}
    assert json.loads(diag[0].evidence) == {"simulated": True, "faults": [], "level": 3}
    assert checks("vela-002", EPOCH, diag_done) == []  # another node's
    assert checks("vela-001", EPOCH + 101, diag_done + 1) == []  # started before `since`


def test_every_request_names_its_rows_and_targets_as_the_real_checks_do() -> None:
    checks = SimulatedChecks(scenario([]), EPOCH)
    checks.start("vela-008", list(REQUESTS), EPOCH)
    rows = checks("vela-008", EPOCH, EPOCH + max(CHECK_DURATION_S.values()))
    targets = {row.check: {r.target for r in rows if r.check == row.check} for row in rows}
    gpus = {f"gpu:{gpu}" for gpu in range(8)}
    assert targets == {
        **dict.fromkeys(
            ["dcgm_diag", "remapped_rows", "power_slowdown", "pcie_bandwidth", "hbm_bandwidth"], gpus
        ),
        "gemm": gpus,
        "allreduce_busbw": {""},
        "ping": {"peer:vela-001"},  # the next node, wrapping
        "iperf3": {"peer:vela-001"},
    }
    assert {row.status for row in rows} == {"PASS"}


def test_a_lost_gpu_fails_its_checks_until_the_repair_and_passes_after_it() -> None:
    lost = {"kind": "gpu_lost", "node": "vela-003", "gpu": 5, "start_s": 600}
    checks = SimulatedChecks(scenario([lost], [{"node": "vela-003", "at_s": 5000}]), EPOCH)
    checks.start("vela-003", ["dcgm_diag", "gpu_state"], EPOCH + 1200)
    rows = checks("vela-003", EPOCH, EPOCH + 1200 + HEAVY_S)
    failing = {(row.check, row.target, row.status) for row in rows if row.status != "PASS"}
    assert failing == {
        ("dcgm_diag", "gpu:5", "FAIL"),
        ("remapped_rows", "gpu:5", "ERROR"),  # a GPU that is down: ERROR, never PASS
        ("power_slowdown", "gpu:5", "ERROR"),
    }
    evidence = json.loads(
        next(row for row in rows if row.check == "dcgm_diag" and row.target == "gpu:5").evidence
    )
    assert evidence["faults"] == ["gpu_lost on vela-003 gpu:5 600-5000 s"]
    # a diagnostic started before the repair ran while the GPU was lost; one started at it passes
    assert "FAIL" in heavy_statuses(checks, "vela-003", 5000 - 60)
    assert heavy_statuses(checks, "vela-003", 5000) == {"PASS"}


def test_faults_that_leave_the_hardware_healthy_pass_every_check() -> None:
    faults = [
        {"kind": "xid_storm", "node": "vela-001", "start_s": 600, "end_s": 700},
        {
            "kind": "xid",
            "node": "vela-002",
            "gpu": 1,
            "code": 94,
            "start_s": 600,
        },  # contained: restart the job
        {"kind": "xid", "node": "vela-003", "gpu": 1, "code": 13, "start_s": 600},  # the application's
    ]
    checks = SimulatedChecks(scenario(faults), EPOCH)
    for node in ("vela-001", "vela-002", "vela-003"):
        checks.start(node, list(REQUESTS), EPOCH + 650)
        assert {row.status for row in checks(node, EPOCH, EPOCH + 650 + HEAVY_S)} == {"PASS"}, node


def test_a_fault_that_does_not_drain_still_shows_where_it_should() -> None:
    faults = [
        {"kind": "power_brake", "node": "vela-001", "start_s": 600},
        {"kind": "link_down", "node": "vela-002", "nic": 2, "start_s": 600},
        {"kind": "congestion", "node": "vela-003", "nic": 1, "start_s": 600},
    ]
    checks = SimulatedChecks(scenario(faults), EPOCH)
    seen = {}
    for node in ("vela-001", "vela-002", "vela-003"):
        checks.start(node, list(REQUESTS), EPOCH + 900)
        rows = checks(node, EPOCH, EPOCH + 900 + HEAVY_S)
        seen[node] = {(row.check, row.status) for row in rows if row.status != "PASS"}
    assert seen == {
        "vela-001": {("power_slowdown", "FAIL"), ("gemm", "FAIL")},
        "vela-002": {("ping", "FAIL"), ("iperf3", "FAIL"), ("allreduce_busbw", "FAIL")},
        "vela-003": {("iperf3", "WARN"), ("allreduce_busbw", "WARN")},
    }


def test_a_request_it_cannot_run_is_refused_whole() -> None:
    checks = SimulatedChecks(scenario([]), EPOCH)
    with pytest.raises(BackendError, match="unknown check"):
        checks.start("vela-001", ["gpu_state", "memtest"], EPOCH)
    with pytest.raises(BackendError, match="no node 'vela-099'"):
        checks.start("vela-099", ["gpu_state"], EPOCH)
    assert checks("vela-001", EPOCH, EPOCH + HEAVY_S) == []


def drainable_faults() -> list[dict[str, Any]]:
    """One fault of every kind (and every catalogued Xid) that expected_consequences says must drain."""
    candidates = [
        {"kind": kind, "node": "vela-004", "gpu": 2, "start_s": 600}
        for kind in FAULT_KINDS
        if kind in ("gpu_lost", "dbe_remap", "thermal_throttle", "power_brake")
    ]
    candidates += [
        {"kind": "xid", "node": "vela-004", "gpu": 2, "code": x.code, "start_s": 600} for x in catalog()
    ]
    drainable = [c for c in candidates if expected_consequences(scenario([c]).faults[0])[1]]
    assert {c["kind"] for c in drainable} == {"gpu_lost", "dbe_remap", "xid"}
    return drainable


@pytest.mark.parametrize("fault", drainable_faults(), ids=lambda f: f"{f['kind']}-{f.get('code', '')}")
def test_the_heavy_set_fails_every_drainable_fault_and_passes_after_its_repair(fault: dict[str, Any]) -> None:
    checks = SimulatedChecks(scenario([fault], [{"node": "vela-004", "at_s": 6000}]), EPOCH)
    assert "FAIL" in heavy_statuses(checks, "vela-004", 1000)
    assert heavy_statuses(checks, "vela-004", 6000) == {"PASS"}


def test_every_fault_kind_is_known_to_the_checks_model() -> None:
    """A kind added to the scenario format must be mapped to what checks see (or to nothing, on purpose)."""
    silent = {
        kind
        for kind in FAULT_KINDS
        if not seen_by(Fault(kind, "vela-001", 0, params={"code": 79, "mode": "no_gdr"}))
    }
    assert silent == {"xid_storm"}


@settings(max_examples=60, deadline=None)
@given(
    repair_s=st.floats(min_value=601, max_value=DURATION_S),
    check_s=st.floats(min_value=0, max_value=DURATION_S + 3600),
    fault=st.sampled_from(drainable_faults()),
)
def test_no_check_passes_while_a_drainable_fault_is_active(
    repair_s: float, check_s: float, fault: dict[str, Any]
) -> None:
    """Whatever the repair time, a heavy run that overlaps the fault fails and one wholly after passes."""
    checks = SimulatedChecks(scenario([fault], [{"node": "vela-004", "at_s": repair_s}]), EPOCH)
    started = EPOCH + check_s  # compared in unix seconds, as the lifecycle's clock gives them
    overlaps = started < EPOCH + repair_s and EPOCH + fault["start_s"] < started + HEAVY_S
    statuses = heavy_statuses(checks, "vela-004", check_s)
    assert ("FAIL" in statuses) if overlaps else (statuses == {"PASS"})


@pytest.mark.parametrize("path", sorted(LIFECYCLE.glob("*.yaml")), ids=lambda p: p.stem)
def test_lifecycle_scenarios_fail_faulty_nodes_and_pass_repaired_ones(path: Path) -> None:
    """In each lifecycle scenario a node with a fault that must drain fails the heavy set while it lasts,
    passes after each repair, and a node never repaired fails it to the end."""
    loaded = load_scenario(path)
    checks = SimulatedChecks(loaded, EPOCH)
    drained = [fault for fault in loaded.faults if expected_consequences(fault)[1]]
    assert any(fault.end_s is None for fault in drained) and loaded.repairs
    for fault in drained:
        assert "FAIL" in heavy_statuses(checks, fault.node, fault.start_s), fault.describe()
        after = loaded.duration_s if fault.end_s is None else fault.end_s
        if fault.end_s is None:
            assert "FAIL" in heavy_statuses(checks, fault.node, after), fault.describe()
        elif not any(
            f.node == fault.node and f.start_s < after + HEAVY_S and f is not fault for f in drained
        ):
            assert heavy_statuses(checks, fault.node, after) == {"PASS"}, fault.describe()

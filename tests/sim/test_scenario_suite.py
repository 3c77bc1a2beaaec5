"""The scenario suite (tests/scenarios): every file loads, and together they cover what the issue asks of
the evaluation: every fault and confounder kind, 8 to 192 nodes, slow nodes 5% to 100% slower,
overlapping faults, jobs stepping every 0.5 to 60 s with 1 to 8 ranks per node and the noise of real
jobs, and a CI subset small enough for `make test`."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from sim.scenario import (
    CONFOUNDER_KINDS,
    DMA_MODES,
    FAULT_KINDS,
    Fault,
    Scenario,
    load_scenario,
)
from tests.conftest import REPO

SUITE = REPO / "tests" / "scenarios"
FILES = sorted(SUITE.glob("*.yaml"))
CI_FILES = [path for path in FILES if path.name.startswith("ci-")]
HEALTHY_LEAD_S = 180  # peers need a few minutes of normal steps before a fault
HEALTHY_LEAD_STEPS = 5  # ... and, where steps are long, as many steps after the job's warm-up


def draws_random_faults(path: Path) -> bool:
    return isinstance(yaml.safe_load(path.read_text()).get("faults"), dict)


@pytest.fixture(scope="module")
def written() -> list[Scenario]:
    """The scenarios whose faults are written out (random ones need the shared fixtures)."""
    return [load_scenario(path) for path in FILES if not draws_random_faults(path)]


def span(fault: Fault, scenario: Scenario) -> tuple[float, float]:
    return fault.start_s, scenario.duration_s if fault.end_s is None else fault.end_s


def at_once(first: Fault, second: Fault, scenario: Scenario) -> bool:
    (start_a, end_a), (start_b, end_b) = span(first, scenario), span(second, scenario)
    return start_a < end_b and start_b < end_a


def stage_peers(first: Fault, second: Fault, scenario: Scenario) -> bool:
    """Different nodes of one job and pipeline stage: each is the other's yardstick."""
    gpus = scenario.fleet.gpus_per_node
    return first.node != second.node and any(
        {first.node, second.node} <= set(job.nodes)
        and job.stage_of_node(first.node, gpus) == job.stage_of_node(second.node, gpus)
        for job in scenario.jobs
    )


def test_the_suite_has_fifteen_scenarios_and_a_ci_subset() -> None:
    assert len(FILES) >= 15
    assert len(CI_FILES) >= 4


def test_random_scenarios_draw_faults_from_the_trace(fixtures: Path) -> None:
    drawn = [load_scenario(path, fixtures=fixtures) for path in FILES if draws_random_faults(path)]
    assert drawn, "no scenario uses faults: {random: ...}"
    for scenario in drawn:
        assert len(scenario.faults) >= 10, scenario.name


def test_every_fault_and_confounder_kind_is_injected(written: list[Scenario]) -> None:
    faults = [fault for scenario in written for fault in scenario.faults]
    assert {fault.kind for fault in faults} == set(FAULT_KINDS)
    assert {fault.params["mode"] for fault in faults if fault.kind == "dma_degraded"} == set(DMA_MODES)
    confounders = {confounder.kind for scenario in written for confounder in scenario.confounders}
    assert confounders == set(CONFOUNDER_KINDS)


def test_fleets_range_from_8_to_192_nodes(written: list[Scenario]) -> None:
    sizes = {scenario.fleet.nodes for scenario in written}
    assert (min(sizes), max(sizes)) == (8, 192)
    assert len(sizes) >= 6


def test_slow_nodes_range_from_5_percent_to_twice_as_slow(written: list[Scenario]) -> None:
    severities = {
        fault.params["severity"]
        for scenario in written
        for fault in scenario.faults
        if fault.kind == "slow_node"
    }
    assert min(severities) == 0.05 and 0.30 in severities
    assert max(severities) == 1.0, "one node computing twice as slow, as in the issue's real job"
    assert {s for s in severities if s < 0.10} and {s for s in severities if 0.10 <= s < 0.30}


def test_faults_overlap_on_one_node_and_across_stage_peers(written: list[Scenario]) -> None:
    pairs = [
        (first, second, scenario)
        for scenario in written
        for first, second in itertools.combinations(scenario.faults, 2)
        if at_once(first, second, scenario)
    ]
    assert any(first.node == second.node for first, second, _ in pairs)
    assert any(stage_peers(first, second, scenario) for first, second, scenario in pairs)
    assert any(
        first.kind == second.kind == "slow_node" and stage_peers(first, second, scenario)
        for first, second, scenario in pairs
    )


def test_jobs_look_like_real_training_jobs(written: list[Scenario]) -> None:
    for scenario in written:
        assert scenario.interval_s == 10, scenario.name
        for job in scenario.jobs:
            where = (scenario.name, job.name)
            assert job.tp == scenario.fleet.gpus_per_node, where  # one tensor-parallel group per node
            assert 1 <= job.pp <= 8 and 0.5 <= job.step_s <= 60, where


def test_jobs_step_as_fast_and_as_slow_as_real_ones(written: list[Scenario]) -> None:
    """Steps from 0.5 s (many per window) to 60 s (most windows without one), 1 to 8 ranks per node, the
    noise of real jobs (sim.jobs's PAI model) with a warm-up, and sequence-length imbalance on dedicated
    GPUs with nothing to report (PAI's sustained per-worker slowdowns are slow nodes by our definition)."""
    jobs = [(scenario, job) for scenario in written for job in scenario.jobs]
    assert min(job.step_s for _, job in jobs) == 0.5 and max(job.step_s for _, job in jobs) == 60
    assert {scenario.fleet.gpus_per_node for scenario, _ in jobs} >= {1, 2, 4, 8}
    realistic = [job for _, job in jobs if job.noise == "pai"]
    assert len(realistic) >= 3
    assert any(job.warmup_steps for job in realistic)
    assert any((job.imbalance or 0) >= 0.05 for _, job in jobs)
    slow = [
        (scenario, job)
        for scenario, job in jobs
        if job.step_s > 4 * scenario.interval_s
        and any(fault.kind == "slow_node" and fault.node in job.nodes for fault in scenario.faults)
    ]
    assert slow, "a slow node in a job whose steps outlast several windows"
    quiet = [
        scenario
        for scenario in written
        if not scenario.faults and any((job.imbalance or 0) >= 0.05 for job in scenario.jobs)
    ]
    assert quiet, "an imbalanced job and nothing to report"


def test_faults_on_a_job_follow_its_warmup_and_a_few_steps(written: list[Scenario]) -> None:
    for scenario in written:
        for fault in scenario.faults:
            for job in (job for job in scenario.jobs if fault.node in job.nodes):
                warmup_s = job.warmup_steps * (1 + job.warmup_slowdown / 2) * job.step_s
                lead_s = warmup_s + HEALTHY_LEAD_STEPS * job.step_s
                assert fault.start_s >= lead_s, (scenario.name, fault.kind, fault.node)


def test_written_faults_are_visible_and_follow_healthy_time(written: list[Scenario]) -> None:
    windows = 3
    for scenario in written:
        for fault in scenario.faults:
            start, end = span(fault, scenario)
            where = (scenario.name, fault.kind, fault.node)
            assert start >= HEALTHY_LEAD_S, where
            assert end - start >= windows * scenario.interval_s or fault.kind == "link_flap", where
            assert scenario.duration_s - start >= windows * scenario.interval_s, where


def test_the_ci_subset_is_small_and_injects_every_kind() -> None:
    subset = [load_scenario(path) for path in CI_FILES]
    for scenario in subset:
        assert 8 <= scenario.fleet.nodes <= 16 and 600 <= scenario.duration_s <= 1200, scenario.name
    assert {fault.kind for scenario in subset for fault in scenario.faults} == set(FAULT_KINDS)
    assert {c.kind for scenario in subset for c in scenario.confounders} == set(CONFOUNDER_KINDS)


def test_the_readme_describes_every_scenario() -> None:
    readme = (SUITE / "README.md").read_text()
    assert [path.name for path in FILES if f"`{path.name}`" not in readme] == []

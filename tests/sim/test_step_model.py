"""The simulator's step times against real ones: the PAI noise model keeps the Alibaba PAI traces' figures
(sim.calibration computes them the same way on both), and each part of the model does what sim.jobs says.

The tolerances are what one real trace allows: ten workers and 300 records make a figure of one job vary
by a tenth to a quarter, so the model's figures (a mean over simulated jobs) must land within that of
the real ones; a recalibration that drifts further fails here.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from sim.calibration import StepStats, mean_rank_corr, pai_times, simulated_stats, step_stats
from sim.jobs import JobModel
from sim.scenario import Scenario, parse_scenario

RECORDS = 300  # as many as job_1 has
SEEDS = 4


@pytest.fixture(scope="module")
def job_1(fixtures: Path) -> StepStats:
    return step_stats(pai_times(fixtures, "job_1"))


@pytest.fixture(scope="module")
def pai() -> StepStats:
    return simulated_stats(RECORDS, SEEDS)


def within(simulated: float, real: float, factor: float) -> bool:
    return real / factor <= simulated <= real * factor


def test_the_jitter_spread_and_the_steady_offsets_are_job_1s(job_1: StepStats, pai: StepStats) -> None:
    assert within(pai.jitter_sd, job_1.jitter_sd, 1.2), (pai.jitter_sd, job_1.jitter_sd)
    assert within(pai.offset_sd, job_1.offset_sd, 1.3), (pai.offset_sd, job_1.offset_sd)


def test_the_tails_are_job_1s(job_1: StepStats, pai: StepStats) -> None:
    assert within(math.log(pai.q99), math.log(job_1.q99), 1.2), (pai.q99, job_1.q99)
    assert pai.tail_ratio == pytest.approx(job_1.tail_ratio, abs=0.4)
    assert within(-math.log(pai.q01), -math.log(job_1.q01), 1.3), (pai.q01, job_1.q01)
    assert pai.tail_ratio > 2.33, "a longer tail than a normal distribution's"


def test_imbalance_moves_between_ranks_as_in_job_1(job_1: StepStats, pai: StepStats) -> None:
    """Ranks keep their order from one record to the next about as much as job_1's workers do."""
    assert pai.rank_corr == pytest.approx(job_1.rank_corr, abs=0.1)
    assert pai.residual_rank_corr == pytest.approx(job_1.residual_rank_corr, abs=0.1)
    assert pai.residual_rank_corr_10 == pytest.approx(job_1.residual_rank_corr_10, abs=0.1)


def test_the_jobs_pace_drifts_as_job_1s(job_1: StepStats, pai: StepStats) -> None:
    assert within(pai.job_step_sd, job_1.job_step_sd, 1.4), (pai.job_step_sd, job_1.job_step_sd)
    assert within(pai.job_drift_sd, job_1.job_drift_sd, 1.5), (pai.job_drift_sd, job_1.job_drift_sd)


def test_rank_offset_gives_job_2s_steady_differences(fixtures: Path) -> None:
    job_2 = step_stats(pai_times(fixtures, "job_2"))
    steady = simulated_stats(RECORDS, SEEDS, rank_offset=0.095)
    assert within(steady.offset_sd, job_2.offset_sd, 1.2), (steady.offset_sd, job_2.offset_sd)
    assert steady.rank_corr == pytest.approx(job_2.rank_corr, abs=0.1)


def test_the_tidy_model_stays_tidy() -> None:
    tidy = simulated_stats(100, 2, noise="tidy")
    assert tidy.jitter_sd < 0.005 and tidy.offset_sd < 0.003 and tidy.q99 < 1.01


# -- each part of the model -------------------------------------------------------------------------------


def scenario(
    job: dict[str, object], *, gpus_per_node: int = 2, seed: int = 11, faults=(), confounders=()
) -> Scenario:
    """A job on 4 nodes of `gpus_per_node` GPUs, one tensor-parallel group per node, 1-s steps."""
    document = {
        "seed": seed,
        "duration_s": 900,
        "fleet": {"nodes": 4, "gpus_per_node": gpus_per_node},
        "jobs": [{"name": "llm", "nodes": 4, "step_s": 1.0, "tp": gpus_per_node, **job}],
        "faults": list(faults),
        "confounders": list(confounders),
    }
    return parse_scenario(document, "step-model")


def computes(played: Scenario, until: float = 600) -> dict[int, dict[int, float]]:
    """compute_s by step, then rank."""
    steps: dict[int, dict[int, float]] = defaultdict(dict)
    for row in JobModel(played.jobs[0], played, epoch=0.0).steps_until(until):
        steps[row.step][row.rank] = row.compute_s
    return steps


def durations(played: Scenario, until: float = 600) -> list[float]:
    by_step = {row.step: row.duration_s for row in JobModel(played.jobs[0], played, 0.0).steps_until(until)}
    return [by_step[step] for step in sorted(by_step)]


def test_sequence_length_imbalance_is_a_replicas_and_moves_every_step() -> None:
    """Variable sequence lengths: each step another data-parallel replica is the slowest, and the ranks
    of one replica (one tensor-parallel group, one node here) are slow together."""
    steps = computes(scenario({"imbalance": 0.08}))
    replicas = np.array([[ranks[2 * d] for d in range(4)] for ranks in steps.values()])
    partners = np.array([[ranks[2 * d + 1] for d in range(4)] for ranks in steps.values()])
    assert np.allclose(replicas / partners, 1, atol=0.012), "a replica's tensor-parallel ranks share it"
    slowest = np.argmax(replicas, axis=1)
    assert min(np.bincount(slowest, minlength=4)) > len(slowest) / 8, "every replica is the slowest at times"
    assert abs(mean_rank_corr(np.log(replicas), 1)) < 0.15, "no memory from one step to the next"
    log_ratio = np.log(replicas / np.median(replicas, axis=1, keepdims=True)).ravel()
    high, low = np.quantile(log_ratio, [0.99, 0.01])
    assert high > 1.3 * -low, "right-skewed: much slower happens, much faster does not"


def test_warmup_steps_run_slower_after_every_start() -> None:
    restart = {"kind": "job_restart", "job": "llm", "at_s": 300, "down_s": 30}
    played = scenario({"warmup_steps": 5}, confounders=[restart])
    times = durations(played)
    settled = statistics.median(times[10:100])
    assert times[0] == pytest.approx(2 * settled, rel=0.05), "the first step: x (1 + warmup_slowdown)"
    assert times[:5] == sorted(times[:5], reverse=True)
    assert times[5] == pytest.approx(settled, rel=0.03)
    rows = JobModel(played.jobs[0], played, 0.0).steps_until(600)
    after = sorted({(row.ts, row.duration_s) for row in rows if row.ts > 330})
    assert after[0][1] > 1.5 * settled, "a restarted job warms up again"


def test_the_noise_draws_are_the_same_with_a_fault_or_without() -> None:
    """So a slow node's cost is the difference of two runs that differ by the fault alone."""
    slow = {"kind": "slow_node", "node": "vela-002", "start_s": 0, "severity": 0.25}
    healthy, faulty = (
        computes(scenario({"noise": "pai"})),
        computes(scenario({"noise": "pai"}, faults=[slow])),
    )
    common = sorted(set(healthy) & set(faulty))
    assert len(common) > 400
    for step in common:
        for rank, compute in faulty[step].items():
            expected = healthy[step][rank] * (1.25 if rank in (2, 3) else 1.0)
            assert compute == pytest.approx(expected, rel=1e-5), (step, rank)


def test_one_rank_per_node_and_the_same_seed_the_same_noise() -> None:
    played = scenario({"noise": "pai"}, gpus_per_node=1)
    first = JobModel(played.jobs[0], played, 0.0).steps_until(100)
    assert {row.rank: row.node for row in first} == {
        0: "vela-001",
        1: "vela-002",
        2: "vela-003",
        3: "vela-004",
    }
    assert JobModel(played.jobs[0], played, 0.0).steps_until(100) == first
    other = scenario({"noise": "pai"}, gpus_per_node=1, seed=12)
    assert JobModel(other.jobs[0], other, 0.0).steps_until(100) != first

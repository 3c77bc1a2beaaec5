"""The simulated training jobs: synchronous steps whose phases show slow nodes, stalls and restarts."""

from __future__ import annotations

import statistics
from collections import defaultdict

import pytest

from collectors.nccl.parse import parse_nccl_log
from collectors.nccl.records import Verdict
from collectors.nccl.verdict import summarize
from collectors.steprecord import StepRecord
from sim.jobs import CHECKPOINT_EVERY, WARMUP_STEPS, JobModel, nccl_log
from sim.scenario import Scenario, parse_scenario

EPOCH = 1_700_000_000.0
STEP_S = 2.0


def scenario(*, faults=(), confounders=(), seed=3) -> Scenario:
    """A job on 4 nodes of 8 GPUs: tp 8, dp 2, pp 2 (vela-001 and vela-002 hold stage 0)."""
    document = {
        "seed": seed,
        "duration_s": 600,
        "fleet": {"nodes": 4},
        "jobs": [{"name": "llm", "nodes": 4, "step_s": STEP_S, "pp": 2, "tp": 8}],
        "faults": list(faults),
        "confounders": list(confounders),
    }
    return parse_scenario(document, "jobs")


def model(**scenario_keys: object) -> JobModel:
    played = scenario(**scenario_keys)
    return JobModel(played.jobs[0], played, EPOCH)


def by_step(rows: list[StepRecord]) -> dict[int, list[StepRecord]]:
    steps = defaultdict(list)
    for row in rows:
        steps[row.step].append(row)
    return steps


def compute_of(rows: list[StepRecord], node: str) -> float:
    return statistics.mean(row.compute_s for row in rows if row.node == node)


def test_a_healthy_job_steps_in_lockstep_at_its_pace():
    rows = model().steps_until(100)
    steps = by_step(rows)

    assert len(steps) == pytest.approx(100 / STEP_S, abs=2)
    for number, ranks in steps.items():
        assert len(ranks) == 32, f"step {number}: every rank reports"
        assert len({(row.ts, row.duration_s) for row in ranks}) == 1, "synchronous: one end, one duration"
        for row in ranks:
            assert row.compute_s + row.comm_s + row.data_s == pytest.approx(row.duration_s, abs=2e-6)
            assert min(row.compute_s, row.comm_s, row.data_s) > 0
    durations = [ranks[0].duration_s for ranks in steps.values()]
    assert min(durations) > STEP_S * 0.97 and max(durations) < STEP_S * 1.05
    assert all(row.ts <= EPOCH + 100 for row in rows)
    assert [row.pp_stage for row in steps[1]] == [0] * 16 + [1] * 16


def test_later_calls_continue_where_the_last_ended():
    whole = model().steps_until(60)
    job = model()
    assert job.steps_until(25) + job.steps_until(25) + job.steps_until(60) == whole


def test_a_slow_node_computes_slower_and_its_peers_wait_in_communication():
    slow = {"kind": "slow_node", "node": "vela-002", "start_s": 0, "severity": 0.2}
    rows = model(faults=[slow]).steps_until(60)
    healthy = model().steps_until(60)

    stage_peer = compute_of(rows, "vela-001")
    assert compute_of(rows, "vela-002") / stage_peer == pytest.approx(1.2, abs=0.01)
    for ranks in by_step(rows).values():
        assert len({row.duration_s for row in ranks}) == 1
    peer_comm = statistics.mean(row.comm_s for row in rows if row.node == "vela-001")
    assert peer_comm > statistics.mean(row.comm_s for row in healthy if row.node == "vela-001") + 0.2


def test_a_slow_pipeline_stage_and_a_throttled_gpu_slow_only_their_ranks():
    imbalance = {"kind": "stage_imbalance", "job": "llm", "stage": 1, "severity": 0.2}
    hot = {"kind": "thermal_throttle", "node": "vela-001", "gpu": 3, "start_s": 0}
    rows = model(faults=[hot], confounders=[imbalance]).steps_until(60)

    by_rank = defaultdict(list)
    for row in rows:
        by_rank[row.rank].append(row.compute_s)
    mean = {rank: statistics.mean(values) for rank, values in by_rank.items()}
    plain = statistics.mean(mean[rank] for rank in range(16) if rank != 3)
    assert mean[3] / plain == pytest.approx(1.2, abs=0.01)
    assert statistics.mean(mean[rank] for rank in range(16, 32)) / plain == pytest.approx(1.2, abs=0.01)
    assert max(mean[rank] for rank in range(16) if rank != 3) / plain < 1.01


def test_a_job_stall_slows_every_rank_at_once():
    stall = {"kind": "job_stall", "job": "llm", "start_s": 20, "end_s": 30}
    rows = model(confounders=[stall]).steps_until(60)

    stalled = [row for row in rows if EPOCH + 22 < row.ts <= EPOCH + 30]
    normal = [row for row in rows if row.ts > EPOCH + 40]
    assert stalled and {row.data_s > STEP_S for row in stalled} == {True}
    assert {row.data_s < STEP_S / 10 for row in normal} == {True}
    assert statistics.mean(r.compute_s for r in stalled) == pytest.approx(
        statistics.mean(r.compute_s for r in normal), rel=0.02
    )


def test_a_restart_pauses_the_job_and_resumes_from_the_last_checkpoint():
    restart = {"kind": "job_restart", "job": "llm", "at_s": 250, "down_s": 60}
    rows = model(confounders=[restart]).steps_until(400)

    ends = sorted({row.ts - EPOCH for row in rows})
    assert not [t for t in ends if 250 < t < 310], "no step completes while the job is down"
    before = [row for row in rows if row.ts <= EPOCH + 250]
    after = sorted((row for row in rows if row.ts > EPOCH + 250), key=lambda row: row.ts)
    last_before = max(row.step for row in before)
    assert last_before > CHECKPOINT_EVERY
    assert after[0].step == last_before - last_before % CHECKPOINT_EVERY + 1
    first_steps = by_step(after)
    slow = [first_steps[after[0].step + i][0].duration_s for i in range(WARMUP_STEPS)]
    settled = first_steps[after[0].step + WARMUP_STEPS][0].duration_s
    assert min(slow) > 1.5 * settled


def test_no_gdr_on_one_node_slows_the_collectives_of_the_whole_job():
    no_gdr = {"kind": "dma_degraded", "node": "vela-004", "nic": 1, "start_s": 0, "mode": "no_gdr"}
    degraded, healthy = model(faults=[no_gdr]).steps_until(60), model().steps_until(60)

    assert statistics.mean(r.comm_s for r in degraded) > 1.3 * statistics.mean(r.comm_s for r in healthy)
    assert statistics.mean(r.compute_s for r in degraded) == pytest.approx(
        statistics.mean(r.compute_s for r in healthy), rel=0.01
    )


def test_same_seed_same_steps_other_seed_other_steps():
    assert model(seed=5).steps_until(30) == model(seed=5).steps_until(30)
    assert model(seed=5).steps_until(30) != model(seed=6).steps_until(30)


def test_nccl_logs_say_which_ranks_lost_gpudirect_rdma():
    job, fleet = scenario().jobs[0], scenario().fleet
    text = nccl_log(job, "vela-002", fleet, host_staged_nics={1}, start=0)

    parsed = parse_nccl_log(text.splitlines())
    assert parsed.malformed == ()
    verdicts = {rank.key.device: rank for rank in summarize(parsed.records)}
    assert sorted(verdicts) == list(range(8))
    assert {gpu for gpu, rank in verdicts.items() if rank.gdr is Verdict.NO} == {2, 3}, "GPUs 2, 3 use NIC 1"
    assert {rank.gdr for gpu, rank in verdicts.items() if gpu not in (2, 3)} == {Verdict.YES}
    assert verdicts[2].ranks == (10,)
    assert any("GPU Direct RDMA Disabled for HCA 1" in line.text for line in verdicts[2].evidence)
    assert {rank.transports for rank in verdicts.values()} == {("RoCE",)}
    restarted = nccl_log(job, "vela-002", fleet, host_staged_nics=set(), start=1)
    assert {rank.key.pid for rank in summarize(parse_nccl_log(restarted.splitlines()).records)}.isdisjoint(
        rank.key.pid for rank in verdicts.values()
    )

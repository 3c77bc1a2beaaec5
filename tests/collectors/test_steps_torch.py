"""A real data-parallel PyTorch job (4 gloo ranks on CPU, one of them made slow) reporting through the SDK."""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from collectors.steprecord import PHASE_DURATION, PHASES, STEP_DURATION, StepRecord, read_step_records
from tests.conftest import REPO
from tests.support.otlp import HistogramPoint, OtlpReceiver
from tests.support.peers import free_port

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

JOB = "ddp-test"
WORLD_SIZE = 4
NODES = ["node-a", "node-a", "node-b", "node-b"]
STEPS = 40
SLOW_RANK = 2
SLOW_FROM_STEP = 20
SLOW_FACTOR = 10
JOB_TIMEOUT_S = 180


@dataclass(frozen=True)
class JobRun:
    records: dict[int, list[StepRecord]]  # by rank, in file order
    steps: list[HistogramPoint]
    phases: list[HistogramPoint]


def launch_ranks(out_jsonl: str, otlp_endpoint: str) -> None:
    """Start one process per rank with the environment torchrun would give it; fail with their output."""
    environ = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    environ |= {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(WORLD_SIZE),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    command = [
        *(sys.executable, "-m", "fleetlens.demo.train"),
        *("--job", JOB, "--steps", str(STEPS), "--node-of-rank", ",".join(NODES)),
        *("--out-jsonl", out_jsonl, "--otlp-endpoint", otlp_endpoint),
        *(
            "--slow-rank",
            str(SLOW_RANK),
            "--slow-from-step",
            str(SLOW_FROM_STEP),
            "--slow-factor",
            str(SLOW_FACTOR),
        ),
    ]
    ranks = [
        subprocess.Popen(
            command,
            cwd=REPO,
            env={**environ, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(WORLD_SIZE)
    ]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    try:
        outputs = [process.communicate(timeout=max(deadline - time.monotonic(), 1))[0] for process in ranks]
    finally:
        for process in ranks:  # a rank that died leaves the others waiting in all-reduce
            if process.poll() is None:
                process.kill()
                process.wait()
    failed = [
        (rank, process.returncode, outputs[rank]) for rank, process in enumerate(ranks) if process.returncode
    ]
    assert not failed, failed


@pytest.fixture(scope="module")
def job_run(tmp_path_factory: pytest.TempPathFactory) -> JobRun:
    out = tmp_path_factory.mktemp("ddp")
    with OtlpReceiver() as receiver:
        launch_ranks(str(out / "steps-{rank}.jsonl"), receiver.url)
    return JobRun(
        records={rank: list(read_step_records(out / f"steps-{rank}.jsonl")) for rank in range(WORLD_SIZE)},
        steps=receiver.latest(STEP_DURATION),
        phases=receiver.latest(PHASE_DURATION),
    )


def median(job_run: JobRun, rank: int, field: str, steps: range) -> float:
    return statistics.median(
        getattr(record, field) for record in job_run.records[rank] if record.step in steps
    )


BEFORE = range(1, SLOW_FROM_STEP)  # step 0 pays for connection set-up and first allocations
AFTER = range(SLOW_FROM_STEP, STEPS)
HEALTHY = [rank for rank in range(WORLD_SIZE) if rank != SLOW_RANK]


def test_every_rank_and_step_is_recorded_once_with_its_identity(job_run: JobRun) -> None:
    for rank, records in job_run.records.items():
        assert [record.step for record in records] == list(range(STEPS))
        identities = {(r.job, r.rank, r.node, r.dp_rank, r.pp_stage, r.tp_rank) for r in records}
        assert identities == {(JOB, rank, NODES[rank], rank, 0, 0)}, "rank comes from torchrun's RANK"
        assert all(None not in (r.compute_s, r.comm_s, r.data_s) for r in records)


def test_slow_rank_computes_longer_from_the_slow_step_on(job_run: JobRun) -> None:
    healthy_after = max(median(job_run, rank, "compute_s", AFTER) for rank in HEALTHY)
    healthy_before = max(median(job_run, rank, "compute_s", BEFORE) for rank in HEALTHY)
    assert median(job_run, SLOW_RANK, "compute_s", AFTER) > 1.5 * healthy_after
    assert median(job_run, SLOW_RANK, "compute_s", BEFORE) < 1.5 * healthy_before


def test_all_ranks_slow_down_together_and_healthy_ones_wait_in_comm(job_run: JobRun) -> None:
    for rank in range(WORLD_SIZE):
        assert median(job_run, rank, "duration_s", AFTER) > 1.3 * median(job_run, rank, "duration_s", BEFORE)
    for rank in HEALTHY:
        assert median(job_run, rank, "comm_s", AFTER) > 1.5 * median(job_run, rank, "comm_s", BEFORE)
    # synchronous training: a step takes about as long everywhere. Compared over the steps' medians: on a
    # loaded machine one rank's step can end a few ms after the others', and the next one then starts late
    durations = [median(job_run, rank, "duration_s", AFTER) for rank in range(WORLD_SIZE)]
    assert min(durations) > 0.8 * max(durations), durations


def test_otlp_histograms_match_the_json_lines(job_run: JobRun) -> None:
    by_rank = {point.attributes["rank"]: point for point in job_run.steps}
    assert sorted(by_rank) == list(range(WORLD_SIZE))
    for rank, point in by_rank.items():
        records = job_run.records[rank]
        assert point.attributes == {
            "job": JOB,
            "rank": rank,
            "node": NODES[rank],
            "dp_rank": rank,
            "pp_stage": 0,
            "tp_rank": 0,
        }
        assert point.count == STEPS
        assert point.sum == pytest.approx(sum(r.duration_s for r in records), abs=1e-6)
    assert len(job_run.phases) == WORLD_SIZE * len(PHASES)
    for point in job_run.phases:
        records = job_run.records[point.attributes["rank"]]
        phase_total = sum(getattr(r, f"{point.attributes['phase']}_s") for r in records)
        assert point.count == STEPS
        assert point.sum == pytest.approx(phase_total, abs=1e-6)

"""Step records of training jobs for detector tests, as the step SDK would report them.

    job = SyncJob(nodes=8, stages=2, slowdown=lambda node, stage, t: 1.1 if node == "vela-003" else 1.0)
    store.insert_steps(job.steps(T0, 120), token="steps")
    findings = SlowNode().detect(store, window(5))

Metric samples come from the real collectors through tests.support.fleetdata.SimulatedFleet.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from analytics.detectors.base import Window
from collectors.steprecord import StepRecord
from sim.fleet import node_name

WINDOW_S = 10.0
# a whole hour, recent enough that no TTL drops the rows: window i is [T0 + 10 i, T0 + 10 (i + 1))
T0 = time.time() // 3600 * 3600 - 2 * 3600

Slowdown = Callable[[str, int, float], float]  # (node, pipeline stage, step start) -> compute time factor


def window(index: int) -> Window:
    """The index-th 10 s window from T0."""
    return Window(T0 + index * WINDOW_S, T0 + (index + 1) * WINDOW_S)


def records(base: float, rows: list[tuple[Any, ...]]) -> list[StepRecord]:
    """Rows of (ms after base, (node, job, rank, pp_stage, step, steps, compute_s, duration_s)) as step
    records: what property tests draw."""
    return [
        StepRecord(
            ts=base + ms / 1000,
            job=job,
            rank=rank,
            node=node,
            step=step,
            duration_s=duration_s,
            compute_s=compute_s,
            pp_stage=stage,
            steps=steps,
        )
        for ms, (node, job, rank, stage, step, steps, compute_s, duration_s) in rows
    ]


def healthy(node: str, stage: int, t: float) -> float:
    return 1.0


@dataclass
class SyncJob:
    """A data- and pipeline-parallel job. Each step every rank computes for its node's slowdown times the
    base (with 1% jitter); with `barrier` (synchronous training) all then wait for the slowest rank in
    communication, so every rank's step takes as long as the slowest one's, else each rank's step is its
    own compute plus a fixed communication. Ranks fill nodes in order; pipeline stages are contiguous
    blocks of nodes."""

    nodes: int = 8
    ranks_per_node: int = 8
    stages: int = 2
    step_s: float = 2.0
    name: str = "llm"
    slowdown: Slowdown = field(default=healthy)
    phases: bool = True  # False: duration_s only, as a job reporting step times alone
    barrier: bool = True
    seed: int = 0

    compute_share = 0.7
    data_share = 0.02

    @property
    def node_names(self) -> list[str]:
        return [node_name(index) for index in range(self.nodes)]

    def stage_of(self, node_index: int) -> int:
        return node_index * self.stages // self.nodes

    def steps(self, start: float, seconds: float, first_step: int = 0) -> list[StepRecord]:
        """Every rank's step records of the steps that end within `seconds` from `start`, numbered from
        `first_step`."""
        rng = random.Random(f"{self.seed}/{first_step}")
        data_s = self.data_share * self.step_s
        comm_s = (1 - self.compute_share - self.data_share) * self.step_s
        rows: list[StepRecord] = []
        t, step = start, first_step
        while True:
            computes = [
                self.step_s
                * self.compute_share
                * self.slowdown(node, self.stage_of(index), t)
                * rng.gauss(1, 0.01)
                for index, node in enumerate(self.node_names)
                for _ in range(self.ranks_per_node)
            ]
            durations = (
                [max(computes) + data_s + comm_s] * len(computes)
                if self.barrier
                else [compute + data_s + comm_s for compute in computes]
            )
            t += max(durations)
            if t > start + seconds:
                return rows
            rows.extend(self._records(step, t, computes, durations, rng))
            step += 1

    def _records(
        self, step: int, end: float, computes: list[float], durations: list[float], rng: random.Random
    ) -> list[StepRecord]:
        data_s = self.data_share * self.step_s
        ranks_per_stage = len(computes) // self.stages
        return [
            StepRecord(
                ts=end + rng.uniform(0, 0.005),
                job=self.name,
                rank=rank,
                node=self.node_names[rank // self.ranks_per_node],
                step=step,
                duration_s=duration,
                compute_s=compute if self.phases else None,
                comm_s=duration - compute - data_s if self.phases else None,
                data_s=data_s if self.phases else None,
                dp_rank=rank % ranks_per_stage,
                pp_stage=rank // ranks_per_stage,
                tp_rank=0,
            )
            for rank, (compute, duration) in enumerate(zip(computes, durations, strict=True))
        ]


def gpu_clock_straggler(fleet: object, store: object, node: str = "vela-003") -> float:
    """Play `fleet` 10 ticks, `node`'s four GPUs at 85% clock from the sixth, and store a job's steps
    (no phase times) in which that node slows every step by 18% from then; returns the steps' start."""
    start = fleet.clock() + fleet.interval_s
    fleet.tick(5)
    for gpu in range(4):
        fleet[node].gpus.set_fault(gpu, "slow", clock_factor=0.85)
    fleet.tick(5)
    job = SyncJob(
        slowdown=lambda name, stage, t: 1.18 if name == node and t >= start + 50 else 1.0, phases=False
    )
    store.insert_steps(job.steps(start, 100), token="steps")
    return start

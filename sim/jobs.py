"""What the ranks of a simulated training job report: a step record per rank and step, and NCCL INFO logs.

The jobs are synchronous (data, pipeline and tensor parallel), so a step ends for every rank at once:

    compute_s  0.6 x step_s, x (1 + severity) on a slow node, x (1 + severity) in a stage_imbalance'd
               pipeline stage, x 1.2 on a thermally throttled GPU, x the rank's noise factor, +-0.5%
               per rank
    data_s     0.05 x step_s, +-0.5% per rank; + step_s for every rank during a job_stall (a checkpoint)
               and in the first WARMUP_STEPS steps after a job_restart (data loaders refilling)
    duration_s max over ranks of (compute_s + data_s), + the collectives that cannot overlap
               (0.35 x step_s, x 1.5 while any node of the job runs without GPUDirect RDMA)
    comm_s     duration_s - compute_s - data_s: the fast ranks wait for the slowest in communication

Every step's step_s is jittered by +-1%, and x (1 + warmup_slowdown x (n - k) / n) in step k < n =
warmup_steps after each (re)start. On top, the job's noise model (JobSpec.noise, see Noise) multiplies
step_s and each rank's compute: "tidy", the default, adds nothing (the original model); "pai" is
calibrated on real jobs (PAI below): steady per-rank offsets, per-rank slowdowns that come and go over
tens of steps, the whole job's pace drifting over hundreds, and a per-step imbalance between
data-parallel replicas (their data: sequence lengths) that is right-skewed and moves between ranks from
step to step. A job's `imbalance` and `rank_offset` keys replace the model's.

A job_restart kills the step in flight; after `down_s` the job starts again from its last checkpoint
(every CHECKPOINT_EVERY steps). Everything is a function of the scenario's seed: the same scenario gives
the same records, and the noise has a random stream of its own, so faults never change its draws.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from collectors.steprecord import StepRecord
from sim.scenario import Confounder, FleetSpec, JobSpec, Scenario

COMPUTE_SHARE = 0.6  # of step_s, on a healthy rank
DATA_SHARE = 0.05
COMM_SHARE = 1 - COMPUTE_SHARE - DATA_SHARE  # collectives that cannot overlap with compute
STEP_JITTER = 0.01
RANK_JITTER = 0.005
THROTTLED_SLOWDOWN = 0.2  # a thermally throttled GPU computes 20% slower
NO_GDR_COMM_SLOWDOWN = 0.5  # allreduce through host memory: the job's collectives 50% slower
STALL_DATA = 1.0  # x step_s added to every rank's data_s while the job stalls
WARMUP_STEPS = 3
WARMUP_DATA = 1.0  # x step_s added to every rank's data_s in the first steps after a restart
CHECKPOINT_EVERY = 100
DIGITS = 6  # microseconds, as the step SDK writes them


@dataclass(frozen=True)
class Rank:
    """Where one rank of a job runs, and its place in the job's topology (JobSpec's layout)."""

    rank: int
    node: str
    gpu: int
    dp_rank: int
    pp_stage: int
    tp_rank: int


def job_ranks(job: JobSpec, gpus_per_node: int) -> list[Rank]:
    """Rank r on node r // gpus_per_node, GPU r % gpus_per_node; tp innermost, then dp, then pp."""
    return [
        Rank(
            rank=r,
            node=job.nodes[r // gpus_per_node],
            gpu=r % gpus_per_node,
            dp_rank=(r // job.tp) % job.dp,
            pp_stage=r // (job.tp * job.dp),
            tp_rank=r % job.tp,
        )
        for r in range(len(job.nodes) * gpus_per_node)
    ]


def nic_of_gpu(gpu: int, fleet: FleetSpec) -> int:
    """The RoCE NIC a GPU's inter-node traffic uses: the one on its PCIe switch, GPUs split evenly."""
    return gpu * fleet.nics_per_node // fleet.gpus_per_node


# -- the noise model ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noise:
    """A job's step-time variation beyond the +-1% per step and +-0.5% per rank of every job; log sds."""

    drift_sd: float = 0.0  # the whole job's pace, drifting over hundreds of steps
    drift_keep: float = 0.0  # its correlation from one step to the next
    rank_offset: float = 0.0  # each rank's steady offset, drawn once
    wander_sd: float = 0.0  # each rank's slowdown that comes and goes (co-located work, clocks)
    wander_keep: float = 0.0  # its correlation from one step to the next: it lasts ~1 / (1 - keep) steps
    imbalance: float = 0.0  # each data-parallel replica's imbalance, drawn afresh every step (Gumbel)

    @property
    def quiet(self) -> bool:
        return self == Noise()


# Calibrated on ../shared/fixtures/steps/alibaba-pai (PROVENANCE.md §9: 10 data-parallel workers of real
# jobs on Alibaba PAI, every 10th iteration) with sim/calibration.py, which prints the real and simulated
# figures side by side (`python -m sim.calibration`); tests/sim/test_step_model.py holds the model to them.
# job_1 (its labelled straggler episode left out), real | this model (mean of 8 simulated jobs):
#   workers' steady offsets (log sd of their median ratios to the iteration's median)   0.037 | 0.037
#   spread once the offset is divided out (1.4826 MAD, log)                             0.037 | 0.037
#   its 1st / 99th / 99.9th percentile                        0.905 / 1.100 / 1.204 | 0.912 / 1.101 / 1.140
#   rank correlation of the workers' ratios, one record (10 iterations) to the next      0.82 | 0.81
#   the same of the offset-free ratios, 10 / 100 iterations apart                 0.64 / 0.16 | 0.66 / 0.17
#   the job's median: change from record to record / sd over the trace         0.011 / 0.036 | 0.012 / 0.031
# So: ranks sit a few % apart for good (rank_offset); each one's slowdown of a few % comes and goes over
# ~75 steps (wander); the whole job's pace drifts by ~3% over ~700 steps (drift); what is left is a small
# per-step imbalance (1.6%, right-skewed). The 99.9th percentile (1.20 from 3 of 3,000 values: worker 4
# 20% slower for 40 iterations) is the one figure the model falls short of. job_2's workers sit further
# apart (offsets 0.086: `rank_offset: 0.095` gives that) with half job_1's spread. Neither trace shows a
# warm-up (job_1's first records are within its drift), so warmup_steps is the scenario's to choose; the
# per-step imbalance of LLM batches of variable sequence length is larger than PAI's (`imbalance:`).
PAI = Noise(
    drift_sd=0.032, drift_keep=0.9985, rank_offset=0.041, wander_sd=0.037, wander_keep=0.987, imbalance=0.016
)
NOISE: Mapping[str, Noise] = MappingProxyType({"tidy": Noise(), "pai": PAI})
EULER_GAMMA = 0.5772156649015329
GUMBEL_SD = math.pi / math.sqrt(6)


def job_noise(job: JobSpec) -> Noise:
    """The job's noise model with its own `imbalance` and `rank_offset` where it gives them."""
    given = {key: getattr(job, key) for key in ("imbalance", "rank_offset") if getattr(job, key) is not None}
    return replace(NOISE[job.noise], **given)


class Variation:
    """The noise factors of a job's steps (Noise), from a random stream of their own: a quiet model draws
    nothing and gives exactly 1, so that a tidy job steps as it always did."""

    def __init__(self, noise: Noise, ranks: list[Rank], seed: str) -> None:
        self._noise = noise
        self._rng = random.Random(seed)
        self._replica = [rank.dp_rank for rank in ranks]
        self._replicas = max(self._replica, default=-1) + 1
        self._offset = [self._rng.gauss(0.0, noise.rank_offset) for _ in ranks]
        self._wander = [self._rng.gauss(0.0, noise.wander_sd) for _ in ranks]  # already stationary
        self._drift = self._rng.gauss(0.0, noise.drift_sd)

    def next_step(self) -> tuple[float, list[float]]:
        """The next step's factor on the job's step_s, and each rank's factor on its compute."""
        noise, rng = self._noise, self._rng
        if noise.quiet:
            return 1.0, [1.0] * len(self._replica)
        self._drift = _ar1(rng, self._drift, noise.drift_sd, noise.drift_keep)
        job = math.exp(self._drift)
        self._wander = [_ar1(rng, w, noise.wander_sd, noise.wander_keep) for w in self._wander]
        imbalance = [noise.imbalance * self._gumbel() for _ in range(self._replicas)]
        return job, [
            math.exp(offset + wander + imbalance[replica])
            for offset, wander, replica in zip(self._offset, self._wander, self._replica, strict=True)
        ]

    def _gumbel(self) -> float:
        """Mean 0, sd 1, right-skewed: a step may run much slower than usual, rarely much faster."""
        u = self._rng.random() or 1e-12
        return (-math.log(-math.log(u)) - EULER_GAMMA) / GUMBEL_SD


def _ar1(rng: random.Random, value: float, sd: float, keep: float) -> float:
    """The next value of a Gaussian AR(1) process with stationary sd `sd` and lag-1 correlation `keep`."""
    return keep * value + rng.gauss(0.0, sd * math.sqrt(1 - keep**2))


def warmup_factor(job: JobSpec, steps_since_start: int) -> float:
    """How much longer step k after a (re)start runs: the excess falls linearly over warmup_steps."""
    left = job.warmup_steps - steps_since_start
    return 1.0 + job.warmup_slowdown * left / job.warmup_steps if left > 0 else 1.0


@dataclass(frozen=True)
class Downtime:
    """A job_restart: no steps from `start` to `end`."""

    start: float
    end: float


def downtimes(scenario: Scenario, job: str) -> list[Downtime]:
    """The job's restarts, in time order."""
    restarts = [c for c in scenario.confounders if c.kind == "job_restart" and c.job == job]
    return sorted(Downtime(c.start_s, c.start_s + c.params["down_s"]) for c in restarts)


@dataclass(frozen=True)
class _Step:
    end: float
    rows: list[StepRecord]


class JobModel:
    """One job's steps through simulated time (seconds from the scenario's start; rows carry unix ts)."""

    def __init__(self, job: JobSpec, scenario: Scenario, epoch: float) -> None:
        self.job = job
        self._epoch = epoch
        self._ranks = job_ranks(job, scenario.fleet.gpus_per_node)
        self._fleet = scenario.fleet
        self._rng = random.Random(f"{scenario.seed}/job/{job.name}")
        nodes = set(job.nodes)
        self._faults = [f for f in scenario.played_faults if f.node in nodes]
        self._duration_s = scenario.duration_s
        mine = [c for c in scenario.confounders if c.job == job.name]
        stage_slowdown = {
            c.params["stage"]: c.params["severity"] for c in mine if c.kind == "stage_imbalance"
        }
        self._stage_factor = [1 + stage_slowdown.get(rank.pp_stage, 0.0) for rank in self._ranks]
        self._stalls: list[Confounder] = [c for c in mine if c.kind == "job_stall"]
        self._downtimes = downtimes(scenario, job.name)
        self._variation = Variation(job_noise(job), self._ranks, f"{scenario.seed}/noise/{job.name}")
        self._start = 0.0
        self._last_step = 0
        self._since_start = 0  # steps since the job (re)started
        self._warmup_left = 0
        self._pending: _Step | None = None

    def steps_until(self, t: float) -> list[StepRecord]:
        """The records of every step that ended after the last call and at or before `t`."""
        rows: list[StepRecord] = []
        while True:
            if self._pending is None:
                self._pending = self._next_step()
            if self._pending.end > t:
                return rows
            rows += self._pending.rows
            self._pending = None

    def _next_step(self) -> _Step:
        """Plan the next step that completes (a restart kills the one in flight and rewinds the count)."""
        while True:
            start = self._start
            step_s = self.job.step_s * (1 + self._rng.uniform(-STEP_JITTER, STEP_JITTER))
            job_factor, rank_factors = self._variation.next_step()
            step_s *= job_factor * warmup_factor(self.job, self._since_start)
            computes, datas = self._busy_times(start, step_s, rank_factors)
            comm_floor = COMM_SHARE * step_s * (1 + NO_GDR_COMM_SLOWDOWN * self._without_gdr(start))
            duration = round(max(c + d for c, d in zip(computes, datas, strict=True)) + comm_floor, DIGITS)
            end = start + duration
            if self._downtimes and self._downtimes[0].start < end:
                self._restart(self._downtimes.pop(0))
                continue
            self._start = end
            self._last_step += 1
            self._since_start += 1
            self._warmup_left = max(0, self._warmup_left - 1)
            return _Step(end, self._rows(end, duration, computes, datas))

    def _restart(self, downtime: Downtime) -> None:
        self._start = downtime.end
        self._last_step -= self._last_step % CHECKPOINT_EVERY
        self._since_start = 0
        self._warmup_left = WARMUP_STEPS

    def _busy_times(
        self, start: float, step_s: float, rank_factors: list[float]
    ) -> tuple[list[float], list[float]]:
        """Each rank's compute_s and data_s of a step that starts at `start` (rank_factors: the noise's)."""
        node_factor: dict[str, float] = {}
        throttled: set[tuple[str, int | None]] = set()
        for fault in self._faults:
            if not fault.active(start, self._duration_s):
                continue
            if fault.kind == "slow_node":
                node_factor[fault.node] = node_factor.get(fault.node, 1.0) * (1 + fault.params["severity"])
            elif fault.kind == "thermal_throttle":
                throttled.add((fault.node, fault.gpu))
        stalled = any(stall.start_s <= start < stall.end_s for stall in self._stalls)
        extra_data = step_s * (STALL_DATA * stalled + WARMUP_DATA * (self._warmup_left > 0))
        rng = self._rng
        computes, datas = [], []
        for rank, stage_factor, noise in zip(self._ranks, self._stage_factor, rank_factors, strict=True):
            compute = COMPUTE_SHARE * step_s * stage_factor * node_factor.get(rank.node, 1.0) * noise
            if (rank.node, rank.gpu) in throttled:
                compute *= 1 + THROTTLED_SLOWDOWN
            computes.append(round(compute * (1 + rng.uniform(-RANK_JITTER, RANK_JITTER)), DIGITS))
            data = DATA_SHARE * step_s * (1 + rng.uniform(-RANK_JITTER, RANK_JITTER)) + extra_data
            datas.append(round(data, DIGITS))
        return computes, datas

    def _without_gdr(self, start: float) -> bool:
        return any(
            fault.kind == "dma_degraded"
            and fault.params["mode"] == "no_gdr"
            and fault.active(start, self._duration_s)
            for fault in self._faults
        )

    def _rows(
        self, end: float, duration: float, computes: list[float], datas: list[float]
    ) -> list[StepRecord]:
        ts = round(self._epoch + end, DIGITS)
        return [
            StepRecord(
                ts=ts,
                job=self.job.name,
                rank=rank.rank,
                node=rank.node,
                step=self._last_step,
                duration_s=duration,
                compute_s=compute,
                comm_s=round(duration - compute - data, DIGITS),
                data_s=data,
                dp_rank=rank.dp_rank,
                pp_stage=rank.pp_stage,
                tp_rank=rank.tp_rank,
            )
            for rank, compute, data in zip(self._ranks, computes, datas, strict=True)
        ]


# -- NCCL logs ------------------------------------------------------------------------------------------

NCCL_PID_BASE = 20_000  # ranks of one node: consecutive pids, a new block after each restart
NCCL_PIDS_PER_START = 1_000
NCCL_CHANNELS = 2


def nccl_log(job: JobSpec, node: str, fleet: FleetSpec, host_staged_nics: Collection[int], start: int) -> str:
    """The NCCL_DEBUG=INFO lines that the job's ranks on `node` write when their communicator comes up.

    One process per rank (torchrun), each on its GPU's NIC (nic_of_gpu); `start` counts the job's
    (re)starts, which give its processes new pids. Ranks on a NIC in `host_staged_nics` cannot use
    GPUDirect RDMA: NCCL logs it disabled for that HCA and their ring connections lack `/GDRDMA`. The
    wording is NCCL 2.18's on RoCE (as in ../shared/fixtures/nccl).
    """
    ranks = [rank for rank in job_ranks(job, fleet.gpus_per_node) if rank.node == node]
    total = len(job.nodes) * fleet.gpus_per_node
    index = fleet.names.index(node)
    devices = " ".join(f"[{nic}]mlx5_{nic}:1/RoCE" for nic in range(fleet.nics_per_node))
    comm_id = zlib.crc32(f"{job.name}/{start}".encode())
    lines = []
    for rank in ranks:
        pid = NCCL_PID_BASE + NCCL_PIDS_PER_START * start + rank.gpu
        prefix = f"{node}:{pid}:{pid + 128} [{rank.gpu}] NCCL INFO"
        nic = nic_of_gpu(rank.gpu, fleet)
        gdr = nic not in host_staged_nics
        state = "Enabled" if gdr else "Disabled"
        comm = f"comm 0x7f{comm_id:08x}{rank.rank:04x} rank {rank.rank} nranks {total}"
        device = (
            f"cudaDev {rank.gpu} nvmlDev {rank.gpu} busId {(0x09 + rank.gpu) << 4:x} commId 0x{comm_id:x}"
        )
        lines += [
            f"{prefix} NET/IB : Using {devices} [RO]; OOB eth0:10.0.{index // 250}.{index % 250 + 2}<0>",
            f"{prefix} Using network IB",
            f"{prefix} {comm} {device} - Init START",
            f"{prefix} NET/IB : GPU Direct RDMA {state} for HCA {nic} 'mlx5_{nic}'",
        ]
        if len(job.nodes) > 1:  # a ring through the same GPU of every node: inter-node over the NIC
            via = f"NET/IB/{nic}" + ("/GDRDMA" if gdr else "")
            previous, following = (
                (rank.rank - fleet.gpus_per_node) % total,
                (rank.rank + fleet.gpus_per_node) % total,
            )
            for channel in range(NCCL_CHANNELS):
                lines += [
                    f"{prefix} Channel {channel:02d}/0 : {previous}[{rank.gpu}] -> {rank.rank}[{rank.gpu}]"
                    f" [receive] via {via}",
                    f"{prefix} Channel {channel:02d}/0 : {rank.rank}[{rank.gpu}] -> {following}[{rank.gpu}]"
                    f" [send] via {via}",
                ]
        lines += [
            f"{prefix} Connected all rings, use ring PXN 0 GDR {int(gdr)}",
            f"{prefix} {comm} {device} - Init COMPLETE",
        ]
    return "\n".join(lines) + "\n"

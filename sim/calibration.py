"""Step-time statistics of real training jobs and of the simulator's, computed the same way.

The real jobs are ../shared/fixtures/steps/alibaba-pai (PROVENANCE.md §9): each worker's mini-batch time,
every 10th iteration, of 10 data-parallel workers. A worker's mini-batch time is its own processing time,
so the simulator's counterpart is a rank's compute_s, in a job of one rank per node and ten replicas
sampled every SAMPLE_EVERY-th step as the trace was. sim.jobs's PAI noise model was fitted to job_1's
figures by hand with this module, and tests/sim/test_step_model.py holds it to them.

    python -m sim.calibration [FIXTURES_DIR]    # the real and simulated figures side by side

The statistics (StepStats) work on a matrix of times, records x workers (NaN: left out): each time's ratio
to its record's median over workers; a worker's steady offset is the median of its ratios over records,
its jitter what is left once that is divided out.
"""

from __future__ import annotations

import csv
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from sim.jobs import JobModel
from sim.scenario import parse_scenario
from sim.trace import DEFAULT_FIXTURES

SAMPLE_EVERY = 10  # the trace keeps every 10th iteration
PAI_DIR = Path("steps") / "alibaba-pai"
# job_1's labelled straggler (PROVENANCE.md §9): worker 6 from about iteration 1811 to 1941; a fault, not
# noise, so it is left out of the statistics
JOB_1_STRAGGLER = (6, 1800, 1950)
MAD_TO_SD = 1.4826  # a normal distribution's sd per median absolute deviation


@dataclass(frozen=True)
class StepStats:
    """How a job's workers' step times differ (log ratios unless said)."""

    records: int
    workers: int
    offset_sd: float  # sd of the workers' steady offsets: how far apart they sit for good
    jitter_sd: float  # robust sd (1.4826 MAD) of the offset-free ratio: the step-to-step spread
    q99: float  # 99th percentile of the offset-free ratio (a ratio, 1 = the worker's usual)
    q999: float  # 99.9th percentile: the long tail (from 3 of 3000 values: a rough figure)
    q01: float  # 1st percentile: how much faster than usual a worker ever runs
    rank_corr: float  # mean Spearman correlation of the workers' ratios from one record to the next
    residual_rank_corr: float  # the same of the offset-free ratios: how imbalance lingers, offsets aside
    residual_rank_corr_10: float  # ... ten records apart
    job_step_sd: float  # the job's median time from one record to the next (sd of the change / sqrt 2)
    job_drift_sd: float  # the job's median time over the whole trace: its pace drifting
    job_drift_corr_10: float  # the latter's autocorrelation ten records apart: how slowly it drifts

    @property
    def tail_ratio(self) -> float:
        """The 99th percentile's excess over 1 in units of the spread: 2.3 for a normal distribution."""
        return float(np.log(self.q99) / self.jitter_sd)


def step_stats(times: np.ndarray) -> StepStats:
    """The statistics of `times` (records x workers; NaN where left out)."""
    job = np.nanmedian(np.log(times), axis=1)
    log_ratio = np.log(times) - job[:, None]
    offsets = np.nanmedian(log_ratio, axis=0)
    residual = log_ratio - offsets
    values = residual[~np.isnan(residual)]
    spread = MAD_TO_SD * float(np.median(np.abs(values - np.median(values))))
    q01, q99, q999 = np.exp(np.quantile(values, [0.01, 0.99, 0.999]))
    return StepStats(
        records=times.shape[0],
        workers=times.shape[1],
        offset_sd=float(np.std(offsets)),
        jitter_sd=spread,
        q99=float(q99),
        q999=float(q999),
        q01=float(q01),
        rank_corr=mean_rank_corr(log_ratio, 1),
        residual_rank_corr=mean_rank_corr(residual, 1),
        residual_rank_corr_10=mean_rank_corr(residual, 10),
        job_step_sd=float(np.std(np.diff(job)) / np.sqrt(2)),
        job_drift_sd=float(np.std(job)),
        job_drift_corr_10=float(np.corrcoef(job[:-10], job[10:])[0, 1]),
    )


def mean_rank_corr(values: np.ndarray, lag: int) -> float:
    """Mean Spearman correlation across workers between records t and t + lag (NaNs left out pairwise)."""
    correlations = []
    for now, later in zip(values[:-lag], values[lag:], strict=True):
        both = ~np.isnan(now) & ~np.isnan(later)
        if both.sum() >= 3:
            correlation = np.corrcoef(_ranks(now[both]), _ranks(later[both]))[0, 1]
            if np.isfinite(correlation):
                correlations.append(correlation)
    return float(np.mean(correlations))


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 0, ties sharing their average (as Spearman's rho wants)."""
    ordered = np.sort(values)
    return (np.searchsorted(ordered, values, "left") + np.searchsorted(ordered, values, "right") - 1) / 2


# -- the real traces ----------------------------------------------------------------------------------------


def pai_times(fixtures: Path, job: str) -> np.ndarray:
    """A PAI trace (job "job_1" or "job_2") as records x workers: the records that have every worker,
    job_1's straggler episode left out (NaN)."""
    path = fixtures / PAI_DIR / f"{job}_norm.csv"
    with path.open(newline="") as handle:
        records = csv.DictReader(handle)
        rows = [(int(r["time"]), int(r["worker"]), float(r["batch_time_norm"])) for r in records]
    iterations = {iteration: i for i, iteration in enumerate(sorted({row[0] for row in rows}))}
    workers = {worker: i for i, worker in enumerate(sorted({row[1] for row in rows}))}
    times = np.full((len(iterations), len(workers)), np.nan)
    for iteration, worker, value in rows:
        times[iterations[iteration], workers[worker]] = value
    complete = ~np.isnan(times).any(axis=1)
    if job == "job_1":
        worker, first, last = JOB_1_STRAGGLER
        episode = [i for iteration, i in iterations.items() if first <= iteration <= last]
        times[episode, workers[worker]] = np.nan
    return times[complete]


# -- the simulator ------------------------------------------------------------------------------------------


def simulated_times(records: int, seed: int = 1, workers: int = 10, **job_keys: object) -> np.ndarray:
    """compute_s of a simulated job like the traced ones, records x workers: `workers` data-parallel
    ranks, one per node, every SAMPLE_EVERY-th step; `job_keys` are the job's scenario keys (default
    noise: pai)."""
    step_s = 1.0
    steps = records * SAMPLE_EVERY
    document = {
        "seed": seed,
        "duration_s": steps * step_s * 2,
        "fleet": {"nodes": workers, "gpus_per_node": 1, "nics_per_node": 1},
        "jobs": [{"name": "pai", "nodes": workers, "step_s": step_s, "tp": 1, "noise": "pai", **job_keys}],
    }
    scenario = parse_scenario(document, "calibration")
    times = np.full((steps, workers), np.nan)
    for row in JobModel(scenario.jobs[0], scenario, epoch=0.0).steps_until(scenario.duration_s):
        if row.step <= steps:
            times[row.step - 1, row.rank] = row.compute_s
    if np.isnan(times).any():
        raise ValueError(f"{records} records need more than {scenario.duration_s:g} s of simulated time")
    return times[SAMPLE_EVERY - 1 :: SAMPLE_EVERY]


def simulated_stats(records: int, seeds: int = 8, **job_keys: object) -> StepStats:
    """step_stats of simulated_times, averaged over `seeds` jobs: the model's expected figures, where a
    real trace is one draw (ten workers' offsets alone make one job's offset_sd vary by a quarter)."""
    runs = [asdict(step_stats(simulated_times(records, seed, **job_keys))) for seed in range(1, seeds + 1)]
    mean = {key: float(np.mean([run[key] for run in runs])) for key in runs[0]}
    return StepStats(**{**mean, "records": records * seeds, "workers": runs[0]["workers"]})


# -- side by side ------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    fixtures = Path(argv[0]) if argv else Path(os.environ.get("FLEETLENS_FIXTURES") or DEFAULT_FIXTURES)
    columns = {
        "job_1 (real)": step_stats(pai_times(fixtures, "job_1")),
        "pai (sim)": simulated_stats(300),
        "job_2 (real)": step_stats(pai_times(fixtures, "job_2")),
        "pai, rank_offset 0.095 (sim)": simulated_stats(300, rank_offset=0.095),
    }
    print("| statistic | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name in [*asdict(next(iter(columns.values()))), "tail_ratio"]:
        cells = [_cell(getattr(stats, name)) for stats in columns.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


def _cell(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.3f}"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""`fleetlens checks schedule`: the loop a node runs for its own health checks.

Every `interval_s` (an hour by default, plus up to `jitter_s` at random so that nodes do not all run at
once) the `light` set runs, busy node or not. After it, the `heavy` set (dcgm_diag at level 3) runs when
the node is free and the last heavy run is at least `heavy_every_s` ago (a day by default), or, with
`force_heavy`, on a busy node too. Free means that every probe says so: no GPU compute process (NVML)
and no Slurm job on the node (`squeue -h -w NODE -o %i` lists none). A probe that cannot tell (NVML not
there, squeue missing or failing, output it does not accept) says the node is busy: a heavy check on a
node running a job would slow or break the job, so an unknown state is never taken for free.

GPU time: each light run is timed. When one took more than GPU_SHARE (1%) of the interval, that is
logged and the next interval is stretched to duration / GPU_SHARE, so that the light checks keep within
1% of the node's time; the configured interval comes back once the runs are short again.

Results go to `emit` (the CLI prints them) and to `post` (the hub). A post that could not reach the hub
is logged and its results kept for the next one, the newest `max_unsent`; results the hub refused are
dropped, as sending them again would be refused again; the log says how many were dropped.

The loop stops between runs when `wait` says so (the CLI's SIGTERM handler sets the event `wait` waits
on). `clock` and `wait` are the seams tests replace with a fake clock.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from collectors import commands
from collectors.checks.catalog import CATALOG, CheckOptions, chosen
from collectors.checks.result import CheckResult, worst
from collectors.errors import CollectorConfigError, CommandError
from collectors.logtext import printable

log = logging.getLogger("fleetlens.checks.schedule")

HOUR_S = 3600.0
DAY_S = 86_400.0
GPU_SHARE = 0.01  # the most of the node's time the light checks may take
HEAVY_DCGM_LEVEL = 3
SQUEUE_TIMEOUT_S = 30.0
MAX_SQUEUE_OUTPUT_BYTES = 1 << 20
# A Slurm job id as `%i` prints it: 123, an array task 123_4 or a pending array 123_[1-3,5%2], a
# heterogeneous job's component 123+0.
_JOB_ID = re.compile(r"[0-9]+(?:_(?:[0-9]+|\[[0-9,%\-]+\]))?(?:\+[0-9]+)?")

Probe = Callable[[], "str | None"]
"""Says why the node is busy (or why its state is unknown), or None when it is free."""


@dataclass(frozen=True)
class PostFailed:
    """Why results were not stored, and whether sending them again may work (the hub was unreachable)
    or not (the hub refused them)."""

    reason: str
    retry: bool


Post = Callable[[list[CheckResult]], "PostFailed | None"]
"""Sends results to the hub; None when they were stored."""
RunChecks = Callable[[Sequence[str], CheckOptions], list[CheckResult]]


@dataclass(frozen=True)
class Schedule:
    """How often the checks run, and how many unsent results are kept."""

    interval_s: float = HOUR_S
    jitter_s: float = 0.0
    heavy_every_s: float = DAY_S
    force_heavy: bool = False
    max_unsent: int = 2000  # some 40 hours of an 8-GPU node's light results; a post far under 16 MiB

    def __post_init__(self) -> None:
        if not (
            self.interval_s > 0 and self.jitter_s >= 0 and self.heavy_every_s >= 0 and self.max_unsent >= 0
        ):
            raise CollectorConfigError(
                f"schedule needs interval {self.interval_s:g} s > 0, jitter {self.jitter_s:g} s >= 0, "
                f"heavy-every {self.heavy_every_s:g} s >= 0 and max-unsent {self.max_unsent} >= 0"
            )


def run_catalog(names: Sequence[str], options: CheckOptions) -> list[CheckResult]:
    """The results of the catalog's checks `names`, in order."""
    return [result for name in names for result in CATALOG[name].run(options)]


def slurm_jobs_probe(
    node: str, squeue: Sequence[str] = ("squeue",), env: Mapping[str, str] | None = None
) -> Probe:
    """A probe asking Slurm for the jobs on `node`: busy with their ids, unknown (busy) when squeue is
    not there, fails, or prints a line that is not a job id."""
    argv = [*squeue, "-h", "-w", node, "-o", "%i"]

    def probe() -> str | None:
        try:
            ran = commands.run(argv, SQUEUE_TIMEOUT_S, max_output_bytes=MAX_SQUEUE_OUTPUT_BYTES, env=env)
        except CommandError as error:
            return f"Slurm state unknown: {error}"
        if ran.returncode != 0:
            return (
                f"Slurm state unknown: squeue exited {ran.returncode}: {printable(ran.stderr.strip()[:300])}"
            )
        jobs = []
        for number, line in enumerate(ran.stdout.splitlines(), 1):
            if not _JOB_ID.fullmatch(job := line.strip()):
                return f"Slurm state unknown: squeue line {number} is not a job id: {printable(job[:100])!r}"
            jobs.append(job)
        return f"Slurm jobs on {node}: {', '.join(jobs)}" if jobs else None

    return probe


def nvml_processes_probe(nvml: ModuleType | Any | None = None) -> Probe:
    """A probe asking NVML for compute processes on any GPU: busy with their pids, unknown (busy) when
    NVML cannot be opened or read. `nvml` is pynvml's interface (the module itself by default)."""

    def probe() -> str | None:
        try:
            nv = nvml if nvml is not None else importlib.import_module("pynvml")
        except ImportError as error:
            return f"GPU processes unknown: pynvml cannot be imported: {error}"
        try:
            nv.nvmlInit()
        except nv.NVMLError as error:
            return f"GPU processes unknown: nvmlInit failed: {error}"
        try:
            pids = {
                (index, process.pid)
                for index in range(nv.nvmlDeviceGetCount())
                for process in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(index))
            }
        except nv.NVMLError as error:
            return f"GPU processes unknown: {error}"
        finally:
            nv.nvmlShutdown()
        listed = ", ".join(f"pid {pid} on gpu:{index}" for index, pid in sorted(pids))
        return f"GPU compute processes: {listed}" if pids else None

    return probe


def _sleep(seconds: float) -> bool:
    """Sleep; never says stop (the CLI waits on an event its SIGTERM handler sets instead)."""
    time.sleep(seconds)
    return False


class Outbox:
    """Results waiting to be posted: what the hub could not be reached for is kept, the newest `limit` of
    it; what it refused is dropped (sending it again would be refused again). `dropped` counts both, and
    the log says how many at each failed post and at the next post that works."""

    def __init__(self, post: Post, limit: int) -> None:
        self._post = post
        self._limit = limit
        self._unsent: list[CheckResult] = []
        self.dropped = 0
        self._dropped_reported = 0

    def send(self, results: Iterable[CheckResult]) -> None:
        """Post what is waiting and `results` as one batch."""
        batch = [*self._unsent, *results]
        if not batch:
            return
        failed = self._post(batch)
        if failed is None:
            if self.dropped > self._dropped_reported:
                log.warning(
                    "sent %d results; %d earlier ones were dropped unsent",
                    len(batch),
                    self.dropped - self._dropped_reported,
                )
                self._dropped_reported = self.dropped
            self._unsent = []
            return
        self._unsent = batch[max(len(batch) - self._limit, 0) :] if failed.retry else []
        self.dropped += len(batch) - len(self._unsent)
        log.warning(
            "results not sent: %s; %d kept for the next post (at most %d), %d dropped so far",
            printable(failed.reason),
            len(self._unsent),
            self._limit,
            self.dropped,
        )


class Scheduler:
    """The loop of the module doc, for the node `options.node`."""

    def __init__(
        self,
        options: CheckOptions,
        schedule: Schedule,
        probes: Sequence[Probe],
        post: Post | None = None,
        emit: Callable[[list[CheckResult]], None] = lambda results: None,
        run_checks: RunChecks = run_catalog,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] = _sleep,
        jitter: Callable[[float], float] = lambda most: random.uniform(0.0, most),
    ) -> None:
        self.light, self.heavy = chosen("light"), chosen("heavy")
        self._options = options
        self._heavy_options = dataclasses.replace(options, dcgm_level=HEAVY_DCGM_LEVEL)
        self._schedule = schedule
        self._probes = probes
        self._outbox = Outbox(post, schedule.max_unsent) if post is not None else None
        self._emit = emit
        self._run_checks = run_checks
        self._clock = clock
        self._wait = wait
        self._jitter = jitter
        self._last_heavy: float | None = None

    def run(self) -> None:
        """Run light checks now and every interval (and heavy ones when due) until `wait` says stop."""
        while True:
            started = self._clock()
            interval = self._light(started)
            self._heavy_if_due()
            delay = started + interval + self._jitter(self._schedule.jitter_s) - self._clock()
            if self._wait(max(delay, 0.0)):
                return

    def _light(self, started: float) -> float:
        """Run the light set; the interval to the next run, stretched past GPU_SHARE."""
        results = self._run_checks(self.light, self._options)
        took = self._clock() - started
        self._deliver(results, "light", took)
        interval = self._schedule.interval_s
        if took > GPU_SHARE * interval:
            interval = took / GPU_SHARE
            log.warning(
                "the light checks took %.1f s, over %g%% of the %g s interval: the next run is in %.0f s",
                took,
                GPU_SHARE * 100,
                self._schedule.interval_s,
                interval,
            )
        return interval

    def _heavy_if_due(self) -> None:
        now = self._clock()
        if self._last_heavy is not None and now - self._last_heavy < self._schedule.heavy_every_s:
            return
        busy = [reason for reason in (probe() for probe in self._probes) if reason is not None]
        if busy and not self._schedule.force_heavy:
            log.info("heavy checks wait for a free node: %s", printable("; ".join(busy)))
            return
        if busy:
            log.warning("heavy checks forced on a busy node: %s", printable("; ".join(busy)))
        self._last_heavy = now
        results = self._run_checks(self.heavy, self._heavy_options)
        self._deliver(results, "heavy", self._clock() - now)

    def _deliver(self, results: list[CheckResult], which: str, took: float) -> None:
        log.info("%s checks: %d results, worst %s, %.1f s", which, len(results), worst(results), took)
        self._emit(results)
        if self._outbox is not None:
            self._outbox.send(results)

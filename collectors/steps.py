"""Step-time SDK for training loops: how long each rank's steps take, and where the time went.

    tracker = StepTracker(job="llama-70b-run3", dp_rank=1, pp_stage=0, tp_rank=3, jsonl_path="steps.jsonl")
    for batch in loader:
        with tracker.step():
            with tracker.phase("data"): ...
            with tracker.phase("compute"): ...
            with tracker.phase("comm"): ...
    tracker.close()  # also runs at exit; `with StepTracker(...) as tracker:` works too

Identity: `job`, `rank` and `node` come from the arguments; where not given, `rank` is torchrun's RANK
(else 0), `job` is torchrun's TORCHELASTIC_RUN_ID (its --rdzv-id) and `node` the host name. `dp_rank`,
`pp_stage` and `tp_rank` are known only to the caller's parallelism setup, so they are omitted unless given.
A phase may be entered several times in one step (its times add up); phases must not nest, and a step
whose body raises is not recorded.

OpenTelemetry: histograms `fleetlens.step.duration` and `fleetlens.step.phase.duration` (unit "s",
buckets STEP_BUCKETS_S, attributes job, rank, node and the known dp_rank, pp_stage, tp_rank; the phase
histogram adds `phase`), cumulative, exported over OTLP/HTTP every `export_interval_s` from a private
MeterProvider. The endpoint is, first match wins: the `otlp_endpoint` argument (a base URL such as
http://hub:4318, "/v1/metrics" is appended), OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (the full URL),
OTEL_EXPORTER_OTLP_ENDPOINT (a base URL); with none of them nothing is exported. The training thread
only queues each step; the exporting thread feeds the histograms and sends them, so a down or slow
endpoint never blocks or fails a step: failed exports are counted (`otlp_failures`) and logged once.

JSON lines: one object per rank and step, appended to `jsonl_path` when the step ends, in the contract
of collectors.steprecord (which the hub reads back with `read_step_records`).

A tracker belongs to one training thread; it is not thread-safe.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from collectors.errors import CollectorConfigError
from collectors.steprecord import PHASE_DURATION, PHASES, STEP_DURATION, check_value

log = logging.getLogger("fleetlens.steps")

# 1 ms to ~12 min in steps of about 1.5x: fine enough to tell a 1.3x straggler from its peers' p50.
STEP_BUCKETS_S = tuple(round(m * 10.0**e, 4) for e in range(-3, 3) for m in (1, 1.5, 2, 3, 5, 7))
_UNSET_JOB = "none"  # torchrun's TORCHELASTIC_RUN_ID when no --rdzv-id was given

Clock = Callable[[], float]
PhaseSeconds = list[float | None]  # one entry per PHASES, None where the step did not enter it


class _FailureLog:
    """Counts the failures of one output, logging the first at WARNING and the rest at DEBUG.

    Telemetry trouble must neither stop training nor flood its log with one line per export or step.
    """

    def __init__(self, output: str) -> None:
        self.output = output
        self.count = 0

    def failed(self, problem: str) -> None:
        self.count += 1
        level = logging.WARNING if self.count == 1 else logging.DEBUG
        log.log(
            level, "%s failed (%s); training goes on, further failures are only counted", self.output, problem
        )


class _ExportLogCapture(logging.Filter):
    """Holds back the OTLP library's per-attempt log lines on a thread exporting for a tracker.

    The library logs every failed attempt (one per interval while the endpoint is down); the tracker
    logs the first failure itself, with the library's message, through _FailureLog.
    """

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        held = getattr(self._local, "held", None)
        if held is None:
            return True
        held.append(record.getMessage())
        return False

    @contextmanager
    def holding(self) -> Iterator[list[str]]:
        self._local.held = held = []
        try:
            yield held
        finally:
            self._local.held = None


_EXPORT_LOGS = _ExportLogCapture()
logging.getLogger(OTLPMetricExporter.__module__).addFilter(_EXPORT_LOGS)


class _GuardedExporter(MetricExporter):
    """Wraps the OTLP exporter so that an export never raises and every failure is counted.

    It also stays silent in a forked child (a DataLoader worker): the child inherits the tracker's
    exporting thread and a copy of its histograms, and must not speak for the rank.
    """

    def __init__(self, exporter: MetricExporter, failures: _FailureLog) -> None:
        super().__init__(  # read as PeriodicExportingMetricReader itself reads them
            preferred_temporality=exporter._preferred_temporality,
            preferred_aggregation=exporter._preferred_aggregation,
        )
        self._exporter = exporter
        self._failures = failures
        self._pid = os.getpid()

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        if os.getpid() != self._pid:
            return MetricExportResult.SUCCESS
        with _EXPORT_LOGS.holding() as library_messages:
            try:
                result = self._exporter.export(metrics_data, timeout_millis=timeout_millis)
            except Exception as error:  # an exporter bug must not end up in the training loop either
                library_messages.append(repr(error))
                result = MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._failures.failed("; ".join(library_messages[:1]) or "no reason given")
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._exporter.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._exporter.shutdown(timeout_millis=timeout_millis)


class _FeedingReader(PeriodicExportingMetricReader):
    """Feeds the queued steps into the histograms right before each collection, on the exporting thread.

    A histogram record costs tens of microseconds in the OpenTelemetry SDK; doing it here keeps that
    cost off the training thread, which only appends to a queue.
    """

    def __init__(self, exporter: MetricExporter, feed: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(exporter, **kwargs)
        self._feed = feed

    def collect(self, timeout_millis: float = 10_000) -> None:
        self._feed()
        super().collect(timeout_millis=timeout_millis)


def otlp_metrics_url(endpoint: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """Where step histograms go: the argument, else the OTLP environment variables, else nowhere (None)."""
    if endpoint:
        return endpoint.rstrip("/") + "/v1/metrics"
    if url := environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        return url
    if base := environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return base.rstrip("/") + "/v1/metrics"
    return None


class _OtlpSink:
    """Queues each step; the exporting thread records the queue into histograms and sends them."""

    def __init__(
        self, url: str, attributes: Mapping[str, str | int], interval_s: float, timeout_s: float
    ) -> None:
        self.url = url
        self.failures = _FailureLog(f"OTLP export of step times to {url}")
        self._timeout_s = timeout_s
        self._queue: collections.deque[tuple[float, PhaseSeconds]] = collections.deque()
        exporter = _GuardedExporter(OTLPMetricExporter(endpoint=url, timeout=timeout_s), self.failures)
        reader = _FeedingReader(
            exporter,
            self._record_queued,
            export_interval_millis=interval_s * 1000,
            export_timeout_millis=timeout_s * 1000,
        )
        self._provider = MeterProvider(
            metric_readers=[reader],
            resource=Resource.create({"service.name": "fleetlens-steps"}),
            views=[
                View(
                    instrument_name="fleetlens.step.*",
                    aggregation=ExplicitBucketHistogramAggregation(STEP_BUCKETS_S),
                )
            ],
            shutdown_on_exit=False,  # the tracker's own exit hook closes it, after the last step
        )
        meter = self._provider.get_meter("fleetlens.steps")
        self._steps = meter.create_histogram(
            STEP_DURATION, unit="s", description="Wall time of one training step"
        )
        self._phases = meter.create_histogram(
            PHASE_DURATION, unit="s", description="Time spent in one phase (compute, comm, data) of a step"
        )
        self._attributes = dict(attributes)
        self._phase_attributes = [{**attributes, "phase": phase} for phase in PHASES]

    def add(self, duration: float, phase_seconds: PhaseSeconds) -> None:
        self._queue.append((duration, phase_seconds))

    def _record_queued(self) -> None:
        while self._queue:
            duration, phase_seconds = self._queue.popleft()
            self._steps.record(duration, self._attributes)
            for attributes, seconds in zip(self._phase_attributes, phase_seconds, strict=True):
                if seconds is not None:
                    self._phases.record(seconds, attributes)

    def close(self) -> None:
        """Send what is left; bounded by two export timeouts (one export in flight, then the last one)."""
        self._provider.shutdown(timeout_millis=2 * self._timeout_s * 1000)


class _JsonlWriter:
    """Appends one contract line per step.

    Lines are formatted from pre-rendered fragments rather than json.dumps of a dict, which would cost
    more than the rest of a step's bookkeeping. Times have fixed decimals: nanoseconds for durations (the
    clock's resolution), microseconds for ts; shortest-repr floats cost twice as much. The file is flushed
    when a step ends at least FLUSH_EVERY_S after the last flush, not per line: a write system call per
    step costs as much again, and a rank killed outright loses at most that last second of steps.
    """

    FLUSH_EVERY_S = 1.0

    def __init__(
        self, path: str | os.PathLike[str], identity: Mapping[str, Any], topology: Mapping[str, int]
    ) -> None:
        self.path = os.fspath(path)
        self.failures = _FailureLog(f"writing step records to {self.path}")
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._flushed_at = -math.inf
        self._identity = json.dumps(dict(identity))[1:-1]
        self._phase_keys = [f', "{phase}_s": ' for phase in PHASES]
        self._end = "".join(f", {json.dumps(key)}: {value:d}" for key, value in topology.items()) + "}\n"

    def add(self, ts: float, step: int, duration: float, phase_seconds: PhaseSeconds) -> None:
        line = f'{{"ts": {ts:.6f}, {self._identity}, "step": {step:d}, "duration_s": {duration:.9f}'
        for key, seconds in zip(self._phase_keys, phase_seconds, strict=True):
            if seconds is not None:
                line += f"{key}{seconds:.9f}"
        try:
            self._file.write(line + self._end)
            if ts - self._flushed_at >= self.FLUSH_EVERY_S:
                self._file.flush()
                self._flushed_at = ts
        except OSError as error:
            self.failures.failed(str(error))

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as error:
            self.failures.failed(str(error))


class _PhaseTimer:
    """Adds the time spent inside `with tracker.phase(name):` to the current step's total for that phase."""

    __slots__ = ("_clock", "_start", "_step", "name", "seconds")

    def __init__(self, name: str, step: _StepTimer, clock: Clock) -> None:
        self.name = name
        self.seconds: float | None = None
        self._step = step
        self._clock = clock
        self._start = 0.0

    def __enter__(self) -> None:
        if not self._step.running:
            raise RuntimeError(f"phase {self.name!r} entered outside `with tracker.step():`")
        if self._step.in_phase:
            raise RuntimeError(f"phase {self.name!r} entered inside another phase; phases do not nest")
        self._step.in_phase = True
        self._start = self._clock()

    def __exit__(self, *exc_info: object) -> None:
        elapsed = self._clock() - self._start
        self._step.in_phase = False
        self.seconds = elapsed if self.seconds is None else self.seconds + elapsed


class _StepTimer:
    """Times one `with tracker.step():` and hands its number, duration and phase totals to `finish`."""

    __slots__ = ("_clock", "_finish", "_start", "in_phase", "number", "phases", "running")

    def __init__(self, clock: Clock, finish: Callable[[int, float, PhaseSeconds], None]) -> None:
        self.phases = [_PhaseTimer(phase, self, clock) for phase in PHASES]
        self.number = 0
        self.running = False
        self.in_phase = False
        self._clock = clock
        self._finish = finish
        self._start = 0.0

    def __enter__(self) -> None:
        for phase in self.phases:
            phase.seconds = None
        self.running = True
        self._start = self._clock()

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        duration = self._clock() - self._start
        self.running = False
        if exc_type is None:
            self._finish(self.number, duration, [phase.seconds for phase in self.phases])


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise CollectorConfigError(f"environment variable {name}={value!r} is not an integer") from None


class StepTracker:
    """Times a rank's training steps and their phases; writes JSON lines and/or exports OTLP histograms.

    `jsonl_path`: append the step records there (None: no file). `otlp_endpoint`: see the module
    docstring for the precedence with the environment. `export_interval_s`: how often histograms are
    sent. `export_timeout_s`: the limit of one export; close() waits at most twice that. `clock` (for
    durations), `wall_clock` (for ts) and `environ` (torchrun and OTLP variables) are injectable.
    """

    def __init__(
        self,
        job: str | None = None,
        *,
        rank: int | None = None,
        node: str | None = None,
        dp_rank: int | None = None,
        pp_stage: int | None = None,
        tp_rank: int | None = None,
        jsonl_path: str | os.PathLike[str] | None = None,
        otlp_endpoint: str | None = None,
        export_interval_s: float = 5.0,
        export_timeout_s: float = 2.0,
        clock: Clock = time.perf_counter,
        wall_clock: Clock = time.time,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        job = job or environ.get("TORCHELASTIC_RUN_ID", _UNSET_JOB)
        if job == _UNSET_JOB:
            raise CollectorConfigError("no job name: pass job=... or run under torchrun with --rdzv-id")
        if rank is None:
            rank = _env_int(environ, "RANK") or 0
        self.identity: dict[str, str | int] = {"job": job, "rank": rank, "node": node or socket.gethostname()}
        self.topology = {
            key: value
            for key, value in (("dp_rank", dp_rank), ("pp_stage", pp_stage), ("tp_rank", tp_rank))
            if value is not None
        }
        for key, value in {**self.identity, **self.topology}.items():
            check_value(key, value)  # refuse now what the JSON-lines reader would refuse later
        self._wall_clock = wall_clock
        self._next_step = 0
        self._timer = _StepTimer(clock, self._finish)
        self._phase_timers = {timer.name: timer for timer in self._timer.phases}
        self._jsonl = (
            _JsonlWriter(jsonl_path, self.identity, self.topology) if jsonl_path is not None else None
        )
        url = otlp_metrics_url(otlp_endpoint, environ)
        self._otlp = (
            _OtlpSink(url, {**self.identity, **self.topology}, export_interval_s, export_timeout_s)
            if url
            else None
        )
        self._closed = False
        atexit.register(self.close)

    def step(self, number: int | None = None) -> _StepTimer:
        """Context manager timing one step: `number`, else the previous step's number plus one (from 0)."""
        if self._timer.running:
            raise RuntimeError("steps do not nest")
        if number is not None:
            check_value("step", number)  # refuse now what the JSON-lines reader would refuse later
        self._timer.number = self._next_step if number is None else number
        self._next_step = self._timer.number + 1
        return self._timer

    def phase(self, name: str) -> _PhaseTimer:
        """Context manager adding the time inside it to phase `name` (compute, comm or data) of this step."""
        try:
            return self._phase_timers[name]
        except KeyError:
            raise ValueError(f"unknown phase {name!r}; phases are {', '.join(PHASES)}") from None

    @property
    def otlp_url(self) -> str | None:
        return self._otlp.url if self._otlp else None

    @property
    def otlp_failures(self) -> int:
        """Exports that did not reach the endpoint (each covers every step since the one before)."""
        return self._otlp.failures.count if self._otlp else 0

    @property
    def jsonl_failures(self) -> int:
        """Writes or flushes of the JSON-lines file that failed (a full disk, say)."""
        return self._jsonl.failures.count if self._jsonl else 0

    def _finish(self, number: int, duration: float, phase_seconds: PhaseSeconds) -> None:
        if self._jsonl:
            self._jsonl.add(self._wall_clock(), number, duration, phase_seconds)
        if self._otlp:
            self._otlp.add(duration, phase_seconds)

    def close(self) -> None:
        """Flush and stop both outputs; later calls do nothing. Runs at interpreter exit if not called."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._otlp:
            self._otlp.close()
        if self._jsonl:
            self._jsonl.close()

    def __enter__(self) -> StepTracker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

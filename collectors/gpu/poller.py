"""GPU readings off the scrape path: a thread per GPU calls NVML on a schedule, a scrape reads the latest.

Why: on a real H200 a scrape that called NVML itself waited 51 ms for one GPU, 42 of them in the two PCIe
throughput calls (NVML samples a 20 ms window per call); eight GPUs read in turn cost 400 ms per scrape on
the node the scrape must not disturb. dcgm-exporter reads DCGM's cached fields; this is fleetlens's cache.

Each device's thread runs the readers of collectors.gpu.nvml by cadence: POLLED every `poll_interval_s`,
SAMPLED every `sample_interval_s` (DCGM's field watches, per GPU), STATIC until a pass answers them once
(again after the device was lost). A pass starts early by twice the longest recent pass and a wake-up's
slack (at most half an interval), so each cadence's values are renewed within their interval; each
reading carries their ages.
Devices are read in parallel: NVML is thread-safe, and pynvml releases the GIL in every call.

A device whose polled values grow older than STALE_INTERVALS poll intervals (its thread is stuck in a
call that does not return) reads as down, its ages still growing, and comes back with its next answer: a
hung GPU costs a scrape nothing. A problem is reported once per pass that met it (an exception that is no
NVML error too: the thread goes on). The first read waits for every device's first pass, at most
`first_read_timeout_s`, so that a one-shot `collect` prints values.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from collectors.gpu.model import GpuIdentity, GpuReading, GpuSample, XidEvent, XidWatch
from collectors.gpu.nvml import POLLED, SAMPLED, STATIC, Cadence, DeviceRead, NvmlBackend, merged

log = logging.getLogger("fleetlens.collectors")

STALE_INTERVALS = 3
CLOSE_WAIT_S = 1.0  # for all threads together; one stuck in NVML is left behind
RECENT_PASSES = 16
WAKE_SLACK_S = 0.05  # how late a thread may wake on a busy machine
STALE_PROBLEM = f"no answer from NVML for over {STALE_INTERVALS} poll intervals"  # the age says how long


@dataclass
class _Latest:
    """One device's newest answers: values by cadence, when each cadence was last renewed (monotonic)."""

    values: dict[Cadence, dict[str, float]] = field(default_factory=dict)
    renewed_at: dict[Cadence, float] = field(default_factory=dict)
    polled: DeviceRead | None = None  # the newest POLLED pass (its MIG readings)
    lost: DeviceRead | None = None  # the newest pass, when the device did not answer it
    problems: list[str] = field(default_factory=list)  # met since the last read


class PolledBackend:
    """A GpuBackend whose read() answers from what per-device threads last read through `source`."""

    def __init__(
        self,
        source: NvmlBackend,
        poll_interval_s: float,
        sample_interval_s: float,
        first_read_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._intervals = {POLLED: poll_interval_s, SAMPLED: sample_interval_s}
        self._clock = clock
        self._identities = source.identities()
        self._latest = [_Latest() for _ in self._identities]
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._answered = [threading.Event() for _ in self._identities]
        self._ready_by = clock() + first_read_timeout_s
        self._threads = [
            threading.Thread(target=self._poll, args=(index,), name=f"gpu-poller-{index}", daemon=True)
            for index in range(len(self._identities))
        ]
        for thread in self._threads:
            thread.start()

    def identities(self) -> list[GpuIdentity]:
        return list(self._identities)

    def read(self) -> list[GpuReading]:
        """Every device's newest values, without calling NVML.

        Only a device that has not answered yet is waited for (until `first_read_timeout_s` after the
        start), so that the first read has values; once each has answered, a read takes no wait at all.
        """
        for answered in self._answered:
            if not answered.is_set():
                answered.wait(max(0.0, self._ready_by - self._clock()))
        now = self._clock()
        with self._lock:
            return [
                self._reading(identity, latest, now)
                for identity, latest in zip(self._identities, self._latest, strict=True)
            ]

    def _reading(self, identity: GpuIdentity, latest: _Latest, now: float) -> GpuReading:
        problems, latest.problems = tuple(latest.problems), []
        if latest.lost is not None:
            return GpuReading(identity, None, problems)
        renewed = latest.renewed_at.get(POLLED)
        if renewed is None:
            return GpuReading(identity, None, (*problems, "no answer from NVML yet"))
        ages = tuple(
            (cadence.value, now - latest.renewed_at[cadence])
            for cadence in self._intervals
            if cadence in latest.renewed_at
        )
        if now - renewed > STALE_INTERVALS * self._intervals[POLLED]:
            return GpuReading(identity, None, (*problems, STALE_PROBLEM), ages_s=ages)
        mig = () if latest.polled is None else latest.polled.mig_instances
        return GpuReading(identity, GpuSample(**merged(latest.values)), problems, mig, ages)

    def _poll(self, index: int) -> None:
        due = {cadence: self._clock() for cadence in self._intervals}
        recent: deque[float] = deque(maxlen=RECENT_PASSES)
        while not self._stopping.is_set():
            now = self._clock()
            cadences = {cadence for cadence, at in due.items() if at <= now}
            if not cadences:
                self._stopping.wait(min(due.values()) - now)
                continue
            if STATIC not in self._latest[index].values:
                cadences.add(STATIC)
            try:
                result = self._source.read_device(index, cadences)
            except Exception as error:  # a bug must not end the thread: the GPU reads down, saying why
                log.debug("reading %s failed", self._identities[index].where, exc_info=True)
                result = DeviceRead({}, (f"reading the device failed: {error!r}",), lost=True)
            done = self._clock()
            recent.append(done - now)
            self._store(index, cadences, result, done)
            for cadence in cadences & due.keys():
                interval = self._intervals[cadence]
                due[cadence] = done + interval - min(2 * max(recent) + WAKE_SLACK_S, interval / 2)

    def _store(self, index: int, cadences: set[Cadence], result: DeviceRead, done: float) -> None:
        with self._lock:
            latest = self._latest[index]
            latest.problems.extend(result.problems)
            if result.lost:
                latest.lost = result
                latest.values.pop(STATIC, None)  # a device back from the dead is asked again
            else:
                latest.lost = None
                latest.values.update(result.values)
                latest.renewed_at.update(dict.fromkeys(cadences, done))
                if POLLED in cadences:
                    latest.polled = result
        self._answered[index].set()

    def watch_xids(self, on_xid: Callable[[XidEvent], None], report: Callable[[str, str], None]) -> XidWatch:
        return self._source.watch_xids(on_xid, report)

    def close(self) -> None:
        """Stop the threads (one stuck in NVML is left to the process's end), then close NVML."""
        self._stopping.set()
        deadline = time.monotonic() + CLOSE_WAIT_S
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._source.close()

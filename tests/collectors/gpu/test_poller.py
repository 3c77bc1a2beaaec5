"""The GPU poller (collectors.gpu.poller) on real captures: a scrape renders what per-GPU threads read, never
calling NVML itself; a GPU that hangs or is lost reads as down and comes back; problems are counted per
pass. The eight GPUs are gpud's throttled H100 node (PROVENANCE.md section 6), NVML's costs the H200's.

Conditions that take the threads a moment are awaited (`eventually`), never timed."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pynvml
import pytest

from collectors.gpu.latency import H200_PROFILE, Slowed, load_profile
from collectors.gpu.model import GpuReading
from collectors.gpu.nvml import NvmlBackend, handle_address
from collectors.gpu.poller import STALE_PROBLEM, PolledBackend
from collectors.gpu.replay import load_capture

GPUD = "gpud/nvidia-smi-query.535.161.08.out.0.valid"
HOUR = 3600.0  # an interval no test outlives: only the first pass runs


class Gate:
    """A pynvml stand-in in front of another: counts the calls each thread makes and those in flight at
    once, and holds (until released) or fails a device's calls."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._lock = threading.Lock()
        self.calls_by_thread: Counter[int] = Counter()
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self.in_flight = 0
        self.most_in_flight = 0
        self.held: dict[int | None, threading.Event] = {}
        self.failing: dict[tuple[int | None, str | None], int] = {}  # (device, function or None): NVML error
        self.broken: dict[int | None, Exception] = {}  # device: what any call on it raises (no NVML error)

    def handle(self, index: int) -> int | None:
        return handle_address(self._nvml.nvmlDeviceGetHandleByIndex(index))

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._nvml, name)
        if not (name.startswith("nvmlDevice") and callable(found)):
            return found

        def gated(*args: Any, **kwargs: Any) -> Any:
            device = handle_address(args[0]) if args and isinstance(args[0], pynvml.c_nvmlDevice_t) else None
            with self._lock:
                self.calls_by_thread[threading.get_ident()] += 1
                self.calls[name, device] += 1
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                if device in self.held:
                    self.held[device].wait()
                if device in self.broken:
                    raise self.broken[device]
                code = self.failing.get((device, name), self.failing.get((device, None)))
                if code is not None:
                    raise pynvml.NVMLError(code)
                return found(*args, **kwargs)
            finally:
                with self._lock:
                    self.in_flight -= 1

        return gated


@contextmanager
def polled(
    fixtures, poll_s: float = HOUR, sample_s: float = HOUR, slowed: bool = False
) -> Iterator[tuple[PolledBackend, Gate]]:
    nvml: Any = load_capture(fixtures / GPUD)
    if slowed:
        nvml = Slowed(nvml, load_profile(H200_PROFILE).delays_s("max"))
    gate = Gate(nvml)
    backend = PolledBackend(NvmlBackend(nvml=gate), poll_s, sample_s)
    try:
        yield backend, gate
    finally:
        for held in gate.held.values():
            held.set()
        backend.close()


def eventually(read: Callable[[], list[GpuReading]], condition: Callable[[list[GpuReading]], bool]) -> None:
    """Read until `condition` holds of a read (the poller's threads act on their own time)."""
    deadline = time.monotonic() + 60
    while not condition(readings := read()):
        assert time.monotonic() < deadline, readings
        time.sleep(0.01)


def test_a_scrape_reads_what_the_threads_read_and_never_calls_nvml(fixtures):
    with polled(fixtures) as (backend, gate):
        before = gate.calls_by_thread[threading.get_ident()]  # opening the devices, on this thread
        readings = [backend.read() for _ in range(3)]
        assert gate.calls_by_thread[threading.get_ident()] == before
        assert len(gate.calls_by_thread) == 1 + 8  # this thread, and one per GPU
    assert [reading.sample for reading in readings[0]] == [reading.sample for reading in readings[2]]
    assert [reading.sample is not None for reading in readings[0]] == [True] * 8
    assert readings[0][0].sample.pcie_link_width == 16


def test_the_gpus_are_read_at_once_not_in_turn(fixtures):
    with polled(fixtures, slowed=True) as (backend, gate):
        backend.read()
        assert gate.most_in_flight >= 2


def test_each_reading_says_how_old_its_values_are(fixtures):
    with polled(fixtures) as (backend, _):
        first = backend.read()[0]
        time.sleep(0.05)
        later = backend.read()[0]
    assert [cadence for cadence, _ in first.ages_s] == ["polled", "sampled"]
    assert all(age_later > age for (_, age), (_, age_later) in zip(first.ages_s, later.ages_s, strict=True))
    assert first.sample.pcie_tx_bytes_per_second is not None  # a sampled value
    assert first.sample.max_sm_clock_hz is not None  # a static one


def test_a_scrape_after_every_gpu_answered_takes_no_wait(fixtures, monkeypatch):
    """Only a GPU not yet answered is waited for: once each has, a scrape blocks on nothing."""
    waits = []
    real_wait = threading.Event.wait

    def recorded(event: threading.Event, timeout: float | None = None) -> bool:
        if threading.current_thread() is threading.main_thread():
            waits.append(timeout)
        return real_wait(event, timeout)

    with polled(fixtures) as (backend, _):
        assert all(reading.sample is not None for reading in backend.read())  # waited for the first passes
        monkeypatch.setattr(threading.Event, "wait", recorded)
        assert all(reading.sample is not None for reading in backend.read())
    assert waits == []


def test_a_hung_gpu_reads_down_without_holding_the_scrape_and_comes_back(fixtures):
    with polled(fixtures, poll_s=0.02, sample_s=0.05) as (backend, gate):
        assert backend.read()[1].sample is not None
        gate.held[gate.handle(1)] = threading.Event()
        eventually(backend.read, lambda readings: readings[1].sample is None)
        down, later = backend.read(), backend.read()
        assert STALE_PROBLEM in down[1].problems and STALE_PROBLEM in later[1].problems  # logged once
        assert dict(later[1].ages_s)["polled"] > dict(down[1].ages_s)["polled"] > 3 * 0.02
        assert all(reading.sample is not None for index, reading in enumerate(down) if index != 1)
        gate.held.pop(gate.handle(1)).set()
        eventually(backend.read, lambda readings: readings[1].sample is not None)


def test_a_lost_gpu_is_down_until_it_answers_and_its_static_facts_are_asked_again(fixtures):
    with polled(fixtures, poll_s=0.02, sample_s=0.05) as (backend, gate):
        backend.read()
        handle = gate.handle(2)
        static_reads = gate.calls["nvmlDeviceGetMaxPcieLinkWidth", handle]
        gate.failing[handle, None] = pynvml.NVML_ERROR_GPU_IS_LOST
        eventually(backend.read, lambda readings: readings[2].sample is None)
        assert gate.calls["nvmlDeviceGetMaxPcieLinkWidth", handle] == static_reads  # lost: read again later
        del gate.failing[handle, None]
        eventually(backend.read, lambda readings: readings[2].sample is not None)
        assert gate.calls["nvmlDeviceGetMaxPcieLinkWidth", handle] == static_reads + 1
        assert backend.read()[2].sample.pcie_max_link_width == 16


def test_an_error_that_is_no_nvml_error_reads_the_gpu_down_and_the_thread_goes_on(fixtures):
    with polled(fixtures, poll_s=0.02, sample_s=0.05) as (backend, gate):
        backend.read()
        gate.broken[gate.handle(3)] = RuntimeError("a ctypes struct the driver did not fill")
        eventually(backend.read, lambda readings: readings[3].sample is None)
        del gate.broken[gate.handle(3)]
        eventually(backend.read, lambda readings: readings[3].sample is not None)


def test_a_problem_met_by_a_pass_reaches_one_scrape(fixtures):
    nvml = Gate(load_capture(fixtures / GPUD))
    nvml.nvmlInit()  # to name the handle before the backend's first pass
    nvml.failing[nvml.handle(0), "nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_UNKNOWN
    backend = PolledBackend(NvmlBackend(nvml=nvml), HOUR, HOUR)
    try:
        first, second = backend.read()[0], backend.read()[0]
    finally:
        backend.close()
    assert first.problems == ("power usage: Unknown Error",)
    assert second.problems == ()
    assert first.sample == second.sample and first.sample.power_w is None


def test_closing_stops_every_thread(fixtures):
    before = set(threading.enumerate())
    with polled(fixtures, poll_s=0.01, sample_s=0.01) as (backend, _):
        backend.read()
        started = [thread for thread in threading.enumerate() if thread not in before]
    assert len([thread for thread in started if thread.name.startswith("gpu-poller-")]) == 8
    assert not [thread for thread in started if thread.is_alive()]


@pytest.mark.parametrize("pick", ["median", "max"])
def test_the_first_read_waits_for_the_first_pass_even_at_the_slowest_costs(fixtures, pick):
    nvml = Slowed(load_capture(fixtures / GPUD), load_profile(H200_PROFILE).delays_s(pick))
    backend = PolledBackend(NvmlBackend(nvml=nvml), HOUR, HOUR)
    try:
        readings = backend.read()
    finally:
        backend.close()
    assert all(
        reading.sample is not None and reading.sample.pcie_rx_bytes_per_second is not None
        for reading in readings
    )

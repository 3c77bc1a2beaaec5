"""One GPU backend per CollectorOptions, shared by the gpu and xid collectors and by a fleet simulator
that drives the simulated one: NVML for real GPUs, the simulator for tests and the demo, and NVML's code
on a replayed `nvidia-smi -q` capture (`replay:FILE[#N]`) for GPU-less machines, at the costs of a
measured latency profile where one is named. NVML, replayed or not, is read off the scrape path
(collectors.gpu.poller)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collectors.base import CollectorOptions, ReadErrors
from collectors.errors import GpuBackendError
from collectors.gpu.model import GpuBackend
from collectors.gpu.nvml import NvmlBackend
from collectors.gpu.poller import PolledBackend
from collectors.gpu.sim import SimBackend

REPLAY_PREFIX = "replay:"


def open_backend(options: CollectorOptions) -> GpuBackend | None:
    """A new backend of the kind `options.gpu_backend` names; None for "none". (NvmlBackend loads pynvml
    when it is opened, and the replay when a capture is named, so the simulator never does.)"""
    if options.gpu_backend == "none":
        return None
    if options.gpu_backend == "sim":
        return SimBackend(count=options.gpu_sim_count, seed=options.gpu_sim_seed)
    if options.gpu_backend == "nvml":
        source = NvmlBackend()
    elif is_replay(options.gpu_backend):
        source = NvmlBackend(nvml=_replay(options))
    else:
        raise GpuBackendError(
            f"unknown gpu backend {options.gpu_backend!r}; expected nvml, sim, none or replay:FILE[#N]"
        )
    return PolledBackend(source, options.gpu_poll_interval_s, options.gpu_sample_interval_s)


def _replay(options: CollectorOptions) -> Any:
    """The pynvml stand-in answering from the named capture, slowed by the named latency profile."""
    from collectors.gpu.latency import Slowed, load_profile
    from collectors.gpu.replay import load_capture

    nvml = load_capture(*parse_replay_backend(options.gpu_backend))
    if options.gpu_replay_latency is None:
        return nvml
    profile = load_profile(options.gpu_replay_latency)
    return Slowed(nvml, profile.delays_s(options.gpu_replay_latency_pick))


def is_replay(gpu_backend: str) -> bool:
    """Whether `gpu_backend` names a capture to replay (replay:FILE[#N])."""
    return gpu_backend.startswith(REPLAY_PREFIX)


def parse_replay_backend(name: str) -> tuple[Path, int]:
    """`replay:FILE` or `replay:FILE#N` as (FILE, N): the Nth `nvidia-smi -q` snapshot in FILE, counted
    from 1, the first by default. Raises GpuBackendError on any other spelling."""
    spec = name.removeprefix(REPLAY_PREFIX)
    path, sep, number = spec.rpartition("#")
    if not (sep and number.isdigit()):
        path, number = spec, "1"
    if spec == name or not path:
        raise GpuBackendError(f"{name!r} is not replay:FILE or replay:FILE#N")
    if int(number) < 1:
        raise GpuBackendError(f"{name!r}: snapshots are counted from 1")
    return Path(path), int(number)


_shared: dict[CollectorOptions, tuple[GpuBackend, int]] = {}
_shared_lock = threading.Lock()


def acquire_backend(options: CollectorOptions) -> GpuBackend | None:
    """The backend shared by everyone built from `options`, opened by its first user.

    Shared so that the xid collector hears the events of the very devices the gpu collector reads, and a
    fleet simulator's faults reach both. Raises GpuBackendError when the backend cannot open.
    """
    with _shared_lock:
        if options in _shared:
            backend, users = _shared[options]
        else:
            backend, users = open_backend(options), 0
            if backend is None:
                return None
        _shared[options] = (backend, users + 1)
        return backend


def release_backend(options: CollectorOptions) -> None:
    """End one use of the shared backend; the last one closes it."""
    with _shared_lock:
        backend, users = _shared.pop(options)
        if users > 1:
            _shared[options] = (backend, users - 1)
        else:
            backend.close()


def lease_backend(
    options: CollectorOptions, errors: ReadErrors
) -> tuple[GpuBackend | None, Callable[[], None]]:
    """The shared backend and the call that gives it back; a backend that fails to open is reported
    once here and leaves the collector without one (a node without a GPU driver has no GPU metrics).
    A capture to replay that fails to open raises GpuBackendError: the user named that file."""
    try:
        backend = acquire_backend(options)
    except GpuBackendError as error:
        if is_replay(options.gpu_backend):
            raise
        errors.report(f"gpu backend {options.gpu_backend}", str(error))
        backend = None
    if backend is None:
        return None, lambda: None
    return backend, lambda: release_backend(options)

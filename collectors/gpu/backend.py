"""One GPU backend per CollectorOptions, shared by the gpu and xid collectors and by a fleet simulator
that drives the simulated one: NVML for real GPUs, the simulator for tests and the demo."""

from __future__ import annotations

import threading
from collections.abc import Callable

from collectors.base import CollectorOptions, ReadErrors
from collectors.errors import GpuBackendError
from collectors.gpu.model import GpuBackend
from collectors.gpu.nvml import NvmlBackend
from collectors.gpu.sim import SimBackend


def open_backend(options: CollectorOptions) -> GpuBackend | None:
    """A new backend of the kind `options.gpu_backend` names; None for "none". (NvmlBackend loads pynvml
    when it is opened, so the simulator never does.)"""
    if options.gpu_backend == "none":
        return None
    if options.gpu_backend == "nvml":
        return NvmlBackend()
    if options.gpu_backend == "sim":
        return SimBackend(count=options.gpu_sim_count, seed=options.gpu_sim_seed)
    raise GpuBackendError(f"unknown gpu backend {options.gpu_backend!r}; expected nvml, sim or none")


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
    once here and leaves the collector without one."""
    try:
        backend = acquire_backend(options)
    except GpuBackendError as error:
        errors.report(f"gpu backend {options.gpu_backend}", str(error))
        backend = None
    if backend is None:
        return None, lambda: None
    return backend, lambda: release_backend(options)

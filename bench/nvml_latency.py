"""What each NVML call the exporter makes costs on this machine's GPU: a latency profile to replay with.

Each call runs `--repeat` times on GPU 0; the figures are printed as `nvml-call-latency.txt` was written
(`NAME median MS max MS [error]`), which `--gpu-replay-latency FILE` reads back. A call the GPU does not
support is timed too, with the error it answered: the driver charges for saying no. Without a GPU,
`--replay CAPTURE --latency PROFILE` times the replay itself at that profile's prices (a check of the
stand-in, not a measurement of any GPU).

    .venv/bin/python bench/nvml_latency.py [--repeat 20] > profile.txt
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from collectors.gpu.latency import Slowed, load_profile
from collectors.gpu.replay import load_capture


def calls(nv: Any, handle: Any) -> dict[str, Callable[[], Any]]:
    """The calls to time, by their profile names (the exporter's, and the sampling ones DCGM offers)."""
    return {
        "GetPowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(handle),
        "GetTotalEnergyConsumption": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle),
        "GetTemperature": lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
        "GetUtilizationRates": lambda: nv.nvmlDeviceGetUtilizationRates(handle),
        "GetClockInfo_SM": lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
        "GetMemoryInfo": lambda: nv.nvmlDeviceGetMemoryInfo(handle),
        "GetPcieThroughput_TX": lambda: nv.nvmlDeviceGetPcieThroughput(handle, nv.NVML_PCIE_UTIL_TX_BYTES),
        "GetPcieThroughput_RX": lambda: nv.nvmlDeviceGetPcieThroughput(handle, nv.NVML_PCIE_UTIL_RX_BYTES),
        "GetCurrPcieLinkGeneration": lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(handle),
        "GetCurrPcieLinkWidth": lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(handle),
        "GetPcieReplayCounter": lambda: nv.nvmlDeviceGetPcieReplayCounter(handle),
        "GetCurrentClocksEventReasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle),
        "GetTotalEccErrors": lambda: nv.nvmlDeviceGetTotalEccErrors(
            handle, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC
        ),
        "GetRemappedRows": lambda: nv.nvmlDeviceGetRemappedRows(handle),
        "GetFieldValues_1": lambda: nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_MEMORY_TEMP]),
        "GetUUID": lambda: nv.nvmlDeviceGetUUID(handle),
        "GetPciInfo": lambda: nv.nvmlDeviceGetPciInfo(handle),
    }


def time_call(call: Callable[[], Any], error_type: type[Exception], repeat: int) -> tuple[list[float], str]:
    """Wall times in ms of `repeat` calls, and the error the last one answered ("" if none)."""
    times, error = [], ""
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            call()
        except error_type as answered:
            error = f"{type(answered).__name__}"
        times.append((time.perf_counter() - start) * 1e3)
    return times, error


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--replay", type=Path, help="an nvidia-smi -q capture instead of this machine's GPU")
    parser.add_argument("--latency", type=Path, help="with --replay: the profile the replay pays")
    args = parser.parse_args()
    nv: Any = importlib.import_module("pynvml") if args.replay is None else load_capture(args.replay)
    if args.latency is not None:
        nv = Slowed(nv, load_profile(args.latency).delays_s("median"))
    start = time.perf_counter()
    nv.nvmlInit()
    print(f"nvmlInit {(time.perf_counter() - start) * 1e3:.3f}")
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(0)
        for name, call in calls(nv, handle).items():
            times, error = time_call(call, nv.NVMLError, args.repeat)
            print(f"{name:32} median {statistics.median(times):8.3f} max {max(times):8.3f} {error}".rstrip())
    finally:
        nv.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What each NVML call costs on a real GPU, and a pynvml stand-in that makes a replay pay it.

A replayed capture answers at once, so no test could see that a scrape waited on NVML; on a real H200
the two PCIe throughput calls took 21 ms each. A latency profile holds each call's median and max in
ms, measured on a real GPU; `Slowed` wraps a pynvml stand-in (collectors.gpu.replay) and answers each
call after the profile's delay (its median, or its max to see the worst case), whether or not the call
succeeds, as the driver does.

Two formats, told apart by their first character:
- text, as `nvml-call-latency.txt` was written: `GetPcieThroughput_TX  median 21.049 max 21.357 [note]`,
  or `nvmlInit 9.06` (one figure: median and max);
- JSON: `{"source": "...", "calls": {"GetPcieThroughput_TX": {"median_ms": 21.049, "max_ms": 21.357}}}`.
A call is named without pynvml's `nvmlDevice` prefix (`nvml` for calls without a device); what follows
the name, an `_ARG` or a digit (`GetClockInfo_SM`, `GetNvLinkState0`), tells the argument it was measured
with: every argument pays the same, the slowest variant's. Only names of real pynvml functions are
accepted. A call the profile does not name, and a delay below what a sleep can keep (50 us), answers at once.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from collectors.errors import GpuBackendError, SysfsError
from collectors.sysfs import read_regular_file

MAX_PROFILE_BYTES = 1024 * 1024
MAX_DELAY_MS = 60_000.0  # a call measured slower than a minute is no measurement
SLEEP_RESOLUTION_S = 50e-6
PICKS = ("median", "max")

_TEXT_LINE = re.compile(
    r"(?P<name>\w{1,80})\s+(?:median\s+(?P<median>\S+)\s+max\s+(?P<max>\S+)|(?P<only>\S+))(?:\s+.*)?"
)
_VARIANT = re.compile(r"(?P<call>[A-Za-z]+?)(?:_\w+|\d+)?")


@dataclass(frozen=True)
class CallCost:
    """One call's measured latency in ms."""

    median_ms: float
    max_ms: float


@dataclass(frozen=True)
class LatencyProfile:
    """Measured costs by pynvml function (`nvmlDeviceGetPcieThroughput`), and where they were measured."""

    costs: Mapping[str, CallCost]
    source: str = ""

    def delays_s(self, pick: str) -> dict[str, float]:
        """Each function's delay in seconds at `pick` (median or max)."""
        if pick not in PICKS:
            raise GpuBackendError(f"latency pick {pick!r}: expected one of {', '.join(PICKS)}")
        return {name: getattr(cost, f"{pick}_ms") / 1000 for name, cost in self.costs.items()}


def load_profile(path: Path) -> LatencyProfile:
    """The profile in the file at `path`; GpuBackendError naming the file (and line) when it is not one."""
    try:
        data = read_regular_file(path, MAX_PROFILE_BYTES)
    except SysfsError:
        raise GpuBackendError(f"{path}: not a regular file") from None
    except OSError as error:
        raise GpuBackendError(f"{path}: cannot read the latency profile: {error.strerror or error}") from None
    if len(data) > MAX_PROFILE_BYTES:
        raise GpuBackendError(f"{path}: larger than {MAX_PROFILE_BYTES} bytes: not a latency profile")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise GpuBackendError(f"{path}: not UTF-8 text") from None
    if text.lstrip().startswith("{"):
        return _from_json(text, path)
    return _from_text(text, path)


def _from_text(text: str, path: Path) -> LatencyProfile:
    entries: list[tuple[str, CallCost]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _TEXT_LINE.fullmatch(line.strip())
        if match is None:
            raise GpuBackendError(f"{path}:{number}: expected `NAME median MS max MS` or `NAME MS`")
        where = f"{path}:{number}"
        only = match["only"]
        median = _ms(only if only is not None else match["median"], where)
        entries.append(
            (match["name"], _cost(median, median if only is not None else _ms(match["max"], where), where))
        )
    return _profile(entries, str(path), path)


def _from_json(text: str, path: Path) -> LatencyProfile:
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        raise GpuBackendError(f"{path}: not JSON: {error}") from None
    calls = document.get("calls") if isinstance(document, dict) else None
    if not isinstance(calls, dict):
        raise GpuBackendError(f'{path}: expected an object with "calls": {{NAME: {{"median_ms", "max_ms"}}}}')
    entries = []
    for name, cost in calls.items():
        where = f"{path}: calls.{name}"
        if not isinstance(cost, dict) or set(cost) != {"median_ms", "max_ms"}:
            raise GpuBackendError(f'{where}: expected {{"median_ms": MS, "max_ms": MS}}')
        entries.append((name, _cost(_ms(cost["median_ms"], where), _ms(cost["max_ms"], where), where)))
    source = document.get("source", "")
    return _profile(entries, source if isinstance(source, str) else "", path)


def _ms(value: object, where: str) -> float:
    """A delay in ms from text or JSON: a finite number from 0 to MAX_DELAY_MS."""
    try:
        number = (
            float(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else None
        )
    except ValueError:
        number = None
    if number is None or not math.isfinite(number) or not 0 <= number <= MAX_DELAY_MS:
        raise GpuBackendError(f"{where}: {value!r} is not a delay in ms (0 to {MAX_DELAY_MS:g})")
    return number


def _cost(median: float, maximum: float, where: str) -> CallCost:
    if maximum < median:
        raise GpuBackendError(f"{where}: max {maximum:g} ms is below the median {median:g} ms")
    return CallCost(median, maximum)


def _profile(entries: list[tuple[str, CallCost]], source: str, path: Path) -> LatencyProfile:
    """Entries by pynvml function; variants of one function (TX and RX) keep the slowest figures."""
    costs: dict[str, CallCost] = {}
    for name, cost in entries:
        function = pynvml_function(name)
        if function is None:
            raise GpuBackendError(f"{path}: {name!r} names no pynvml function (nvmlDevice{name}, nvml{name})")
        known = costs.get(function, cost)
        costs[function] = CallCost(max(known.median_ms, cost.median_ms), max(known.max_ms, cost.max_ms))
    return LatencyProfile(costs, source)


def pynvml_function(name: str) -> str | None:
    """The real pynvml function a profile name stands for, or None."""
    match = _VARIANT.fullmatch(name)
    if match is None:
        return None
    for candidate in (f"nvmlDevice{match['call']}", f"nvml{match['call']}", match["call"]):
        if candidate.startswith("nvml") and callable(getattr(pynvml, candidate, None)):
            return candidate
    return None


class Slowed:
    """A pynvml stand-in whose calls answer after their delay: `nvml`'s answers, at the profile's prices."""

    def __init__(self, nvml: Any, delays_s: Mapping[str, float], sleep: Callable[[float], None] = time.sleep):
        self._nvml = nvml
        self._delays_s = {name: delay for name, delay in delays_s.items() if delay >= SLEEP_RESOLUTION_S}
        self._sleep = sleep

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._nvml, name)
        delay = self._delays_s.get(name)
        if delay is None:
            return found

        def slowed(*args: Any, **kwargs: Any) -> Any:
            try:
                return found(*args, **kwargs)
            finally:
                self._sleep(delay)

        return slowed


PROFILES = Path(__file__).parent / "profiles"
H200_PROFILE = PROFILES / "h200-passthrough-r580.json"  # one H200 in a KVM guest, driver 580.159.04

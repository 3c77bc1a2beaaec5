"""Simulated GPUs for machines without any: collectors.gpu.nvml's interface, driven by a seed, a clock, a
load level and faults.

Values follow real nvidia-smi captures (../shared/fixtures/nvidia_gpu_exporter, driver 590.48.01) at
idle and under gpu-burn load; each GPU gets a small seeded offset and per-second jitter so that peers
differ as real ones do. Everything is a function of the seed and of the call sequence: two backends
with the same seed, driven alike, read alike. Gauges depend only on the current state and second;
counters integrate over the clock, so they grow monotonically however often they are read.

Driving it (the fleet simulator's API):

    clock = ManualClock()
    sim = SimBackend(count=8, seed=7, clock=clock)
    sim.set_load(None, 0.9)                          # every GPU busy; set_load(3, 0.0) idles one
    sim.set_fault(2, "thermal_throttle", temp_c=92)
    clock.advance(15)                                # energy, replays, ECC and NVLink counters grow
    sim.clear_fault(2, "thermal_throttle")

Fault kinds, their parameters and defaults: FAULTS; docs/exporter.md says what each does.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collectors.gpu.model import THROTTLE_REASONS, GpuIdentity, GpuReading, GpuSample, XidEvent

KIB = 1024
XID_FALLEN_OFF_THE_BUS = 79

FAULTS: dict[str, dict[str, Any]] = {
    "thermal_throttle": {"temp_c": 90.0, "clock_factor": 0.6},
    "power_brake": {"clock_factor": 0.25},
    "slow": {"clock_factor": 0.7},
    "pcie_downgrade": {"gen": 4, "width": 8, "replays_per_second": 5.0},
    "ecc": {"sbe_per_second": 0.5, "dbe": 1, "remap_failure": False},
    "host_staged": {"pcie_factor": 2.0},
    "gpu_lost": {},
    "xid": {"code": 13},
}


# The clocks-event reasons NVML reports while each fault lasts.
SLOWDOWNS = {
    "thermal_throttle": ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"),
    "power_brake": ("hw_slowdown", "hw_power_brake_slowdown"),
}


@dataclass(frozen=True)
class Profile:
    """One GPU model as nvidia-smi reported it; pairs are (idle, under gpu-burn load)."""

    model_name: str
    fb_total_mib: int
    fb_reserved_mib: int
    fb_used_mib: tuple[int, int]
    sm_clock_mhz: tuple[float, float]
    memory_clock_mhz: float
    power_w: tuple[float, float]
    gpu_temp_c: tuple[float, float]
    memory_temp_c: tuple[float, float]
    mem_copy_util_percent: tuple[float, float]
    pcie_tx_kbps: tuple[float, float]
    pcie_rx_kbps: tuple[float, float]
    nvlink_bytes_per_second: float  # all links, one direction
    pcie_max_gen: int = 5
    pcie_max_width: int = 16


PROFILES = {
    # linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt: the idle and load query-gpu rows, PCIe throughput
    # from -q, `nvlink -s` (18 links at 26.562 GB/s).
    "h100": Profile(
        model_name="NVIDIA H100 80GB HBM3",
        fb_total_mib=81559,
        fb_reserved_mib=479,
        fb_used_mib=(0, 19818),
        sm_clock_mhz=(345, 1980),
        memory_clock_mhz=2619,
        power_w=(69.85, 631.95),
        gpu_temp_c=(41, 59),
        memory_temp_c=(48, 54),
        mem_copy_util_percent=(0, 11),
        pcie_tx_kbps=(352, 3092),
        pcie_rx_kbps=(329, 6346),
        nvlink_bytes_per_second=18 * 26.562e9,
    ),
    # linux-x86_64__nvidia-h200__590.48.01.txt: the same sections.
    "h200": Profile(
        model_name="NVIDIA H200",
        fb_total_mib=143771,
        fb_reserved_mib=614,
        fb_used_mib=(0, 32362),
        sm_clock_mhz=(345, 1980),
        memory_clock_mhz=3201,
        power_w=(77.71, 627.40),
        gpu_temp_c=(28, 52),
        memory_temp_c=(32, 40),
        mem_copy_util_percent=(0, 7),
        pcie_tx_kbps=(371, 4217),
        pcie_rx_kbps=(337, 8691),
        nvlink_bytes_per_second=18 * 26.562e9,
    ),
}


def between(idle_and_busy: tuple[float, float], load: float) -> float:
    """The value at `load`, on the line from idle (0) to the capture's load (1)."""
    idle, busy = idle_and_busy
    return idle + load * (busy - idle)


class ManualClock:
    """A clock that moves only when told: how a fleet simulation or a test drives simulated time."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"time cannot go back ({seconds} s)")
        self.now += seconds


@dataclass
class _Gpu:
    identity: GpuIdentity
    temp_offset_c: float
    power_scale: float
    load: float = 0.0
    faults: dict[str, dict[str, Any]] = field(default_factory=dict)
    energy_mj: float = 0.0
    pcie_replays: float = 0.0
    ecc_sbe: float = 0.0
    ecc_dbe: int = 0
    nvlink_bytes: float = 0.0

    def param(self, kind: str, name: str, default: float) -> Any:
        return self.faults[kind][name] if kind in self.faults else default


@dataclass(frozen=True)
class _XidSubscription:
    backend: SimBackend
    on_xid: Callable[[XidEvent], None]

    def stop(self) -> None:
        self.backend.unwatch_xids(self.on_xid)


class SimBackend:
    """`count` simulated GPUs of one model (a key of PROFILES) in one VM."""

    def __init__(
        self,
        count: int = 8,
        seed: int = 0,
        model: str = "h100",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.profile = PROFILES[model]
        self._seed = seed
        self._clock = clock
        self._last = clock()
        self._lock = threading.Lock()
        self._watchers: list[Callable[[XidEvent], None]] = []
        self._gpus = [self._new_gpu(index) for index in range(count)]

    def _new_gpu(self, index: int) -> _Gpu:
        rng = random.Random(f"{self._seed}/gpu/{index}")
        bus, slot = divmod(9 + index, 32)  # a KVM guest's slots, from 00:09.0 as in the H100 capture
        identity = GpuIdentity(
            index=index,
            uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
            pci_bus_id=f"00000000:{bus:02X}:{slot:02X}.0",
            minor_number=index,
            model_name=self.profile.model_name,
        )
        return _Gpu(identity, temp_offset_c=rng.uniform(-2, 2), power_scale=rng.uniform(0.98, 1.02))

    def identities(self) -> list[GpuIdentity]:
        return [gpu.identity for gpu in self._gpus]

    def set_load(self, gpu: int | None, load: float) -> None:
        """Set how busy GPU `gpu` (None: all of them) is, from 0 (idle) to 1 (the capture's gpu-burn)."""
        if not 0 <= load <= 1:
            raise ValueError(f"load must be within 0..1, got {load}")
        with self._lock:
            self._catch_up()
            for target in self._targets(gpu):
                target.load = load

    def set_fault(self, gpu: int, kind: str, **params: Any) -> None:
        """Start fault `kind` on GPU `gpu` with `params` overriding FAULTS[kind]; see the module doc."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")
        unknown = set(params) - set(FAULTS[kind])
        if unknown:
            raise ValueError(
                f"fault {kind} takes {sorted(FAULTS[kind]) or 'no parameters'}, not {sorted(unknown)}"
            )
        settings = {**FAULTS[kind], **params}
        with self._lock:
            self._catch_up()
            (target,) = self._targets(gpu)
            if kind != "xid":
                target.faults[kind] = settings
            if kind == "ecc":
                target.ecc_dbe += settings["dbe"]
            watchers = list(self._watchers)
        if kind in ("xid", "gpu_lost"):
            xid = settings.get("code", XID_FALLEN_OFF_THE_BUS)
            for on_xid in watchers:
                on_xid(XidEvent(target.identity.pci_bus_id, xid, source="nvml"))

    def clear_fault(self, gpu: int, kind: str) -> None:
        """End fault `kind` on GPU `gpu` (the counters it grew keep their values)."""
        with self._lock:
            self._catch_up()
            (target,) = self._targets(gpu)
            target.faults.pop(kind, None)

    def _targets(self, gpu: int | None) -> list[_Gpu]:
        if gpu is None:
            return self._gpus
        if not 0 <= gpu < len(self._gpus):
            raise ValueError(f"no GPU {gpu}; this backend has {len(self._gpus)}")
        return [self._gpus[gpu]]

    def _clock_factor(self, gpu: _Gpu) -> float:
        return math.prod(
            gpu.param(kind, "clock_factor", 1.0) for kind in ("thermal_throttle", "power_brake", "slow")
        )

    def _power_w(self, gpu: _Gpu) -> float:
        return gpu.power_scale * between(self.profile.power_w, gpu.load * self._clock_factor(gpu))

    def _catch_up(self) -> None:
        """Integrate the counters from the last call to now under the state that held meanwhile."""
        now = self._clock()
        elapsed, self._last = now - self._last, now
        for gpu in self._gpus:
            if "gpu_lost" in gpu.faults:
                continue
            gpu.energy_mj += self._power_w(gpu) * elapsed * 1000
            gpu.pcie_replays += gpu.param("pcie_downgrade", "replays_per_second", 0.0) * elapsed
            gpu.ecc_sbe += gpu.param("ecc", "sbe_per_second", 0.0) * elapsed
            gpu.nvlink_bytes += 2 * gpu.load * self.profile.nvlink_bytes_per_second * elapsed

    def read(self) -> list[GpuReading]:
        with self._lock:
            self._catch_up()
            second = math.floor(self._last)
            return [self._reading(gpu, second) for gpu in self._gpus]

    def _reading(self, gpu: _Gpu, second: int) -> GpuReading:
        if "gpu_lost" in gpu.faults:
            return GpuReading(gpu.identity, None, ("GPU is lost (simulated gpu_lost fault)",))
        p = self.profile
        jitter = random.Random(f"{self._seed}/jitter/{gpu.identity.index}/{second}")
        load = gpu.load
        fb_used = round(between(p.fb_used_mib, load))
        reasons = THROTTLE_REASONS["gpu_idle"] if load == 0 else 0
        for kind, slowdowns in SLOWDOWNS.items():
            if kind in gpu.faults:
                reasons |= sum(THROTTLE_REASONS[reason] for reason in slowdowns)
        gpu_temp = gpu.param("thermal_throttle", "temp_c", between(p.gpu_temp_c, load) + gpu.temp_offset_c)
        pcie_factor = gpu.param("host_staged", "pcie_factor", 1.0)
        sample = GpuSample(
            sm_clock_mhz=round(p.sm_clock_mhz[1 if load > 0 else 0] * self._clock_factor(gpu)),
            memory_clock_mhz=p.memory_clock_mhz,
            gpu_temp_c=round(gpu_temp + jitter.uniform(-1, 1)),
            memory_temp_c=round(between(p.memory_temp_c, load) + gpu.temp_offset_c),
            power_w=round(self._power_w(gpu) * jitter.uniform(0.99, 1.01), 2),
            energy_mj=math.floor(gpu.energy_mj),
            gpu_util_percent=round(100 * load),
            mem_copy_util_percent=round(between(p.mem_copy_util_percent, load)),
            fb_free_mib=p.fb_total_mib - p.fb_reserved_mib - fb_used,
            fb_used_mib=fb_used,
            fb_reserved_mib=p.fb_reserved_mib,
            pcie_replays=math.floor(gpu.pcie_replays),
            pcie_tx_bytes_per_second=round(between(p.pcie_tx_kbps, load) * KIB * pcie_factor),
            pcie_rx_bytes_per_second=round(between(p.pcie_rx_kbps, load) * KIB * pcie_factor),
            pcie_link_gen=gpu.param("pcie_downgrade", "gen", p.pcie_max_gen),
            pcie_link_width=gpu.param("pcie_downgrade", "width", p.pcie_max_width),
            pcie_max_link_gen=p.pcie_max_gen,
            pcie_max_link_width=p.pcie_max_width,
            clock_throttle_reasons=reasons,
            ecc_sbe_volatile=math.floor(gpu.ecc_sbe),
            ecc_dbe_volatile=gpu.ecc_dbe,
            ecc_sbe_aggregate=math.floor(gpu.ecc_sbe),
            ecc_dbe_aggregate=gpu.ecc_dbe,
            remapped_rows_correctable=0,
            remapped_rows_uncorrectable=gpu.ecc_dbe,
            row_remap_pending=1 if "ecc" in gpu.faults and gpu.ecc_dbe else 0,
            row_remap_failure=1 if gpu.param("ecc", "remap_failure", False) else 0,
            nvlink_crc_flit_errors=0,
            nvlink_crc_data_errors=0,
            nvlink_replay_errors=0,
            nvlink_recovery_errors=0,
            nvlink_bandwidth_bytes=math.floor(gpu.nvlink_bytes),
        )
        return GpuReading(gpu.identity, sample)

    def watch_xids(
        self, on_xid: Callable[[XidEvent], None], report: Callable[[str, str], None]
    ) -> _XidSubscription:
        """Hand each simulated Xid (xid and gpu_lost faults) to `on_xid` as it is set; stop() ends that.
        Simulated Xids never fail, so `report` is never called."""
        with self._lock:
            self._watchers.append(on_xid)
        return _XidSubscription(self, on_xid)

    def unwatch_xids(self, on_xid: Callable[[XidEvent], None]) -> None:
        with self._lock:
            if on_xid in self._watchers:
                self._watchers.remove(on_xid)

    def close(self) -> None:
        """Nothing to release: the simulator holds no handles or threads."""

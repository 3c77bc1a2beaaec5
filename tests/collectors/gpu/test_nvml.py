"""The NVML backend against a fake pynvml: the machines that run these tests have no GPU.

The fake answers with pynvml's own constants, ctypes structs, handle pointers and NVMLError classes, and
only with functions that real pynvml has under the same signature (checked below), so the calls the
backend makes here are the calls it makes on a GPU machine. Device values come from the H100 capture in
../shared/fixtures/nvidia_gpu_exporter (under load).
"""

from __future__ import annotations

import inspect
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest

from collectors.base import ReadErrors
from collectors.errors import GpuBackendError
from collectors.gpu.collector import GpuCollector
from collectors.gpu.model import XidEvent
from collectors.gpu.nvml import ALL_NVLINKS, NvmlBackend, handle_address
from tests.support.exposition import samples_of

H100_LOAD = {
    "sm_clock": 1980,
    "memory_clock": 2619,
    "temperature": 59,
    "memory_temperature": 54,
    "power_mw": 631950,
    "energy_mj": 123_456_789,
    "utilization": (100, 11),
    "memory_mib": {"total": 81559, "reserved": 479, "used": 19818, "free": 61263},
    "pcie_kbps": {pynvml.NVML_PCIE_UTIL_TX_BYTES: 3092, pynvml.NVML_PCIE_UTIL_RX_BYTES: 6346},
}


@dataclass
class FakeGpu:
    """One scripted device. `unsupported` and `failing` name pynvml functions (or `field:<id>` for a
    field value) that answer NOT_SUPPORTED or the given NVML error code; `lost` fails every call."""

    uuid: str
    bus_id: bytes
    minor: int
    name: str = "NVIDIA H100 80GB HBM3"
    replays: int = 0
    link: tuple[int, int, int, int] = (5, 16, 5, 16)  # current gen, current width, max gen, max width
    reasons: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    fields: dict[tuple[int, int], int] = field(
        default_factory=lambda: {
            (pynvml.NVML_FI_DEV_MEMORY_TEMP, 0): H100_LOAD["memory_temperature"],
            (pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, 0): 0,
            (pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, 0): 0,
            (pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, 0): 2,
            (pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, 0): 0,
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX, ALL_NVLINKS): 1000,
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX, ALL_NVLINKS): 500,
        }
    )
    unsupported: set[str] = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)
    lost: bool = False


class FakeNvml:
    """The subset of pynvml that NvmlBackend calls, over FakeGpu devices."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.open_handle_errors: dict[int, int] = {}
        self.shutdowns = 0
        self.events: queue.Queue[tuple[int, int] | int] = queue.Queue()
        self.freed_event_sets: list[object] = []
        self._structs = [pynvml.struct_c_nvmlDevice_t() for _ in gpus]
        self._handles = [pynvml.c_nvmlDevice_t(struct) for struct in self._structs]

    def __getattr__(self, name: str) -> Any:
        """pynvml's constants, structs and error classes; never its functions, which need a driver."""
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            raise AttributeError(f"FakeNvml does not fake pynvml.{name}")
        return value

    def emit_xid(self, index: int, xid: int) -> None:
        self.events.put((index, xid))

    def fail_next_wait(self, code: int) -> None:
        self.events.put(code)

    def _gpu(self, handle: Any, function: str) -> FakeGpu:
        index = [handle_address(h) for h in self._handles].index(handle_address(handle))
        gpu = self.gpus[index]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if function in gpu.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if function in gpu.failing:
            raise pynvml.NVMLError(gpu.failing[function])
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if index in self.open_handle_errors:
            raise pynvml.NVMLError(self.open_handle_errors[index])
        return self._handles[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return pynvml.nvmlPciInfo_t(busId=self._gpu(handle, "nvmlDeviceGetPciInfo").bus_id)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMinorNumber").minor

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        self._gpu(handle, "nvmlDeviceGetClockInfo")
        return {
            pynvml.NVML_CLOCK_SM: H100_LOAD["sm_clock"],
            pynvml.NVML_CLOCK_MEM: H100_LOAD["memory_clock"],
        }[type]

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        self._gpu(handle, "nvmlDeviceGetTemperature")
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return H100_LOAD["temperature"]

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        self._gpu(handle, "nvmlDeviceGetPowerUsage")
        return H100_LOAD["power_mw"]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption")
        return H100_LOAD["energy_mj"]

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        gpu, memory = H100_LOAD["utilization"]
        return pynvml.c_nvmlUtilization_t(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        assert version == pynvml.nvmlMemory_v2, "only the v2 struct has `reserved`"
        mib = {key: value * 1024 * 1024 for key, value in H100_LOAD["memory_mib"].items()}
        return pynvml.c_nvmlMemory_v2_t(version=version, **mib)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").replays

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        self._gpu(device, "nvmlDeviceGetPcieThroughput")
        return H100_LOAD["pcie_kbps"][counter]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration").link[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth").link[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").link[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").link[3]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEccErrors").ecc.get((errorType, counterType), 0)

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return self._gpu(device, "nvmlDeviceGetRemappedRows").remapped

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[tuple[int, int]]) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for entry, (field_id, scope_id) in zip(values, fieldIds, strict=True):
            entry.fieldId, entry.scopeId = field_id, scope_id
            if (field_id, scope_id) in gpu.fields and f"field:{field_id}" not in gpu.unsupported:
                entry.nvmlReturn = pynvml.NVML_SUCCESS
                entry.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                entry.value.ullVal = gpu.fields[field_id, scope_id]
            else:
                entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: object) -> None:
        self._gpu(handle, "nvmlDeviceRegisterEvents")
        assert eventTypes == pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait(self, eventSet: object, timeoutms: int) -> Any:
        try:
            item = self.events.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None
        if isinstance(item, int):
            raise pynvml.NVMLError(item)
        index, xid = item
        return pynvml.c_nvmlEventData_t(
            device=self._handles[index], eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid
        )

    def nvmlEventSetFree(self, eventSet: object) -> None:
        self.freed_event_sets.append(eventSet)


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(uuid="GPU-509665ad-b600-ac93-3616-d754b23d636d", bus_id=b"00000000:9B:00.0", minor=4),
        FakeGpu(uuid="GPU-a6158b59-2c1e-1e63-0068-9178c4298abd", bus_id=b"00000000:BB:00.0", minor=5),
    ]


def scrape(nv: FakeNvml) -> tuple[dict[str, list], ReadErrors]:
    errors = ReadErrors("gpu")
    return samples_of(GpuCollector(NvmlBackend(nv), "node-1", errors)), errors


def value(samples: dict[str, list], name: str, gpu: str) -> float:
    (found,) = [s.value for s in samples[name] if s.labels["gpu"] == gpu]
    return found


def wait_until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_fake_only_offers_real_pynvml_functions_with_their_signatures():
    faked = [name for name in vars(FakeNvml) if name.startswith("nvml")]
    assert len(faked) > 25
    for name in faked:
        real = inspect.signature(getattr(pynvml, name))
        fake = inspect.signature(getattr(FakeNvml, name))
        assert list(fake.parameters)[1:] == list(real.parameters), name


def test_healthy_gpus_in_dcgm_units_and_labels():
    samples, errors = scrape(FakeNvml(two_gpus()))
    assert errors.count == 0
    assert samples["fleetlens_gpu_up"][0].labels == {
        "gpu": "0",
        "UUID": "GPU-509665ad-b600-ac93-3616-d754b23d636d",
        "pci_bus_id": "00000000:9B:00.0",
        "device": "nvidia4",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-1",
    }
    assert [s.value for s in samples["fleetlens_gpu_up"]] == [1, 1]
    assert value(samples, "DCGM_FI_DEV_POWER_USAGE", "0") == pytest.approx(631.95)  # mW -> W
    assert value(samples, "DCGM_FI_DEV_FB_USED", "0") == 19818  # bytes -> MiB
    assert value(samples, "DCGM_FI_DEV_FB_FREE", "0") == 61263
    assert value(samples, "DCGM_FI_DEV_FB_RESERVED", "0") == 479
    assert value(samples, "DCGM_FI_PROF_PCIE_RX_BYTES", "1") == 6346 * 1024  # KB/s -> bytes/s
    assert value(samples, "DCGM_FI_DEV_MEMORY_TEMP", "1") == 54
    assert value(samples, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "1") == 2
    assert value(samples, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "0") == 1500 * 1024  # KiB -> bytes
    assert value(samples, "fleetlens_gpu_pcie_link_width", "0") == 16


def test_unsupported_fields_are_omitted_for_that_gpu_only_and_silently():
    gpus = two_gpus()
    gpus[1].unsupported = {
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        f"field:{pynvml.NVML_FI_DEV_MEMORY_TEMP}",
        f"field:{pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX}",
    }
    samples, errors = scrape(FakeNvml(gpus))
    assert errors.count == 0
    for name in ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_MEMORY_TEMP"):
        assert [s.labels["gpu"] for s in samples[name]] == ["0"], name
    assert [s.labels["gpu"] for s in samples["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"]] == ["0"]
    assert [s.value for s in samples["fleetlens_gpu_up"]] == [1, 1]
    assert value(samples, "DCGM_FI_DEV_GPU_TEMP", "1") == 59


def test_a_gpu_lost_mid_scrape_is_down_with_its_labels_and_the_other_keeps_its_metrics():
    nv = FakeNvml(two_gpus())
    errors = ReadErrors("gpu")
    collector = GpuCollector(NvmlBackend(nv), "node-1", errors)
    samples_of(collector)
    nv.gpus[0].lost = True
    samples = samples_of(collector)
    up = {s.labels["pci_bus_id"]: s.value for s in samples["fleetlens_gpu_up"]}
    assert up == {"00000000:9B:00.0": 0, "00000000:BB:00.0": 1}
    assert [s.labels["gpu"] for s in samples["DCGM_FI_DEV_SM_CLOCK"]] == ["1"]
    assert errors.count == 1


def test_a_device_whose_handle_fails_is_down_and_named_by_index():
    nv = FakeNvml(two_gpus())
    nv.open_handle_errors[1] = pynvml.NVML_ERROR_UNKNOWN
    samples, errors = scrape(nv)
    down = [s.labels for s in samples["fleetlens_gpu_up"] if s.value == 0]
    assert down == [
        {"gpu": "1", "UUID": "", "pci_bus_id": "", "device": "", "modelName": "", "Hostname": "node-1"}
    ]
    assert errors.count == 1


def test_other_field_errors_drop_that_field_and_are_reported():
    gpus = two_gpus()
    gpus[0].failing = {"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_UNKNOWN}
    samples, errors = scrape(FakeNvml(gpus))
    assert [s.labels["gpu"] for s in samples["DCGM_FI_DEV_POWER_USAGE"]] == ["1"]
    assert value(samples, "DCGM_FI_DEV_SM_CLOCK", "0") == 1980
    assert errors.count == 1


def test_drivers_without_clocks_event_reasons_fall_back_to_throttle_reasons():
    gpus = two_gpus()
    gpus[0].failing = {"nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND}
    gpus[0].reasons = pynvml.nvmlClocksThrottleReasonSwPowerCap
    samples, errors = scrape(FakeNvml(gpus))
    active = [
        s.labels["reason"]
        for s in samples["fleetlens_gpu_clock_throttle_reason"]
        if s.labels["gpu"] == "0" and s.value == 1
    ]
    assert active == ["sw_power_cap"]
    assert errors.count == 0


def test_init_failure_raises_a_backend_error_naming_nvml():
    with pytest.raises(GpuBackendError, match="nvmlInit failed: Driver Not Loaded"):
        NvmlBackend(FakeNvml(two_gpus(), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))


def test_close_shuts_nvml_down():
    nv = FakeNvml(two_gpus())
    NvmlBackend(nv).close()
    assert nv.shutdowns == 1


def test_xid_events_reach_the_watcher_with_the_gpu_address_and_stop_ends_the_listener():
    nv = FakeNvml(two_gpus())
    backend = NvmlBackend(nv, event_wait_ms=20)
    received: list[XidEvent] = []
    errors = ReadErrors("xid")
    watch = backend.watch_xids(received.append, errors.report)
    nv.emit_xid(1, 79)
    nv.fail_next_wait(pynvml.NVML_ERROR_UNKNOWN)
    nv.emit_xid(0, 119)
    wait_until(lambda: len(received) == 2)
    assert received == [XidEvent("00000000:BB:00.0", 79, "nvml"), XidEvent("00000000:9B:00.0", 119, "nvml")]
    assert errors.count == 1  # the failed wait, reported; the listener went on
    watch.stop()
    assert "nvml-xid-listener" not in [thread.name for thread in threading.enumerate()]
    assert len(nv.freed_event_sets) == 1


def test_a_gpu_without_xid_events_is_skipped_silently():
    gpus = two_gpus()
    gpus[0].unsupported = {"nvmlDeviceRegisterEvents"}
    nv = FakeNvml(gpus)
    received: list[XidEvent] = []
    errors = ReadErrors("xid")
    watch = NvmlBackend(nv, event_wait_ms=20).watch_xids(received.append, errors.report)
    nv.emit_xid(1, 48)
    wait_until(lambda: received)
    watch.stop()
    assert received == [XidEvent("00000000:BB:00.0", 48, "nvml")]
    assert errors.count == 0


def test_a_running_listener_does_not_keep_the_process_alive():
    program = (
        "from collectors.gpu.nvml import NvmlBackend\n"
        "from tests.collectors.gpu.test_nvml import FakeNvml, two_gpus\n"
        "NvmlBackend(FakeNvml(two_gpus()), event_wait_ms=60_000).watch_xids(print, print)\n"
        "print('main thread done')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "main thread done\n"

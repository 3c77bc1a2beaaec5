"""The real GPU backend: NVML through pynvml (nvidia-ml-py 13.x names and argument order).

The pynvml module is a constructor argument so that tests can pass a fake: the machines that run the
test suite have no GPU. Units are converted here to dcgm-exporter's (W, MiB, bytes), so the gpu
collector only names values.

Per device and field: NVML_ERROR_NOT_SUPPORTED (or a function this driver lacks) omits the field
silently; GPU_IS_LOST or RESET_REQUIRED marks the whole device down; any other error drops that field
and is reported. Devices are enumerated once, when the backend opens, so that a GPU which later falls
off the bus keeps its labels in `fleetlens_gpu_up 0`. A GPU in MIG mode is read whole, then per GPU
instance (its framebuffer and profile), enumerated on each read: MIG instances come and go at run time.
"""

from __future__ import annotations

import ctypes
import enum
import importlib
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from collectors.errors import GpuBackendError
from collectors.gpu.model import (
    MIB,
    GpuIdentity,
    GpuReading,
    GpuSample,
    MigReading,
    XidEvent,
    mig_profile_name,
    normalize_pci_bus_id,
)

ALL_NVLINKS = 0xFFFFFFFF  # field-value scopeId asking NVML for the sum over every NVLink
KIB = 1024
MHZ = 1_000_000

Reader = Callable[[Any, Any], dict[str, float]]
T = TypeVar("T")


class Cadence(enum.Enum):
    """How often a reader's values are read again (collectors.gpu.poller runs each on its own schedule)."""

    STATIC = "static"  # once, when the device is first read
    POLLED = "polled"  # every poll interval: cheap calls
    SAMPLED = "sampled"  # every sample interval: calls that sample a window or are slow


STATIC, POLLED, SAMPLED = Cadence.STATIC, Cadence.POLLED, Cadence.SAMPLED
CADENCES = tuple(Cadence)


def merged(values: Mapping[Cadence, Mapping[str, float]]) -> dict[str, float]:
    """One sample's fields from the values of each cadence."""
    return {name: value for by_field in values.values() for name, value in by_field.items()}


def field_value(nv: Any, handle: Any, field_id: int, scope_id: int = 0) -> float:
    """One nvmlDeviceGetFieldValues entry, raising its per-field NVML return code like any other call."""
    (entry,) = nv.nvmlDeviceGetFieldValues(handle, [(field_id, scope_id)])
    if entry.nvmlReturn != nv.NVML_SUCCESS:
        raise nv.NVMLError(entry.nvmlReturn)
    member = {
        nv.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nv.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }[entry.valueType]
    return getattr(entry.value, member)


def _call(nv: Any, function: str, *args: Any) -> Any:
    """pynvml's `function`(*args); a pynvml without that function (a stand-in that fakes fewer calls than
    fleetlens makes) answers NVML_ERROR_FUNCTION_NOT_FOUND, as a driver without it does."""
    found = getattr(nv, function, None)
    if found is None:
        raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
    return found(*args)


def _utilization(nv: Any, handle: Any) -> dict[str, float]:
    rates = nv.nvmlDeviceGetUtilizationRates(handle)
    return {"gpu_util_percent": rates.gpu, "mem_copy_util_percent": rates.memory}


def _framebuffer(nv: Any, handle: Any) -> dict[str, float]:
    memory = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
    return {
        "fb_free_mib": memory.free // MIB,
        "fb_used_mib": memory.used // MIB,
        "fb_reserved_mib": memory.reserved // MIB,
    }


def _remapped_rows(nv: Any, handle: Any) -> dict[str, float]:
    correctable, uncorrectable, pending, failure = nv.nvmlDeviceGetRemappedRows(handle)
    return {
        "remapped_rows_correctable": correctable,
        "remapped_rows_uncorrectable": uncorrectable,
        "row_remap_pending": pending,
        "row_remap_failure": failure,
    }


def _throttle_reasons(nv: Any, handle: Any) -> dict[str, float]:
    try:
        reasons = nv.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except nv.NVMLError as error:
        if error.value != nv.NVML_ERROR_FUNCTION_NOT_FOUND:
            raise
        reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)  # drivers before R535
    return {"clock_throttle_reasons": reasons}


def _nvlink_bandwidth(nv: Any, handle: Any) -> dict[str, float]:
    kib = field_value(nv, handle, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX, ALL_NVLINKS) + field_value(
        nv, handle, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX, ALL_NVLINKS
    )
    return {"nvlink_bandwidth_bytes": kib * KIB}


def _ecc(field: str, error_type: str, counter_type: str) -> Reader:
    def read(nv: Any, handle: Any) -> dict[str, float]:
        count = nv.nvmlDeviceGetTotalEccErrors(handle, getattr(nv, error_type), getattr(nv, counter_type))
        return {field: count}

    return read


def _field(field: str, nvml_field: str) -> Reader:
    return lambda nv, handle: {field: field_value(nv, handle, getattr(nv, nvml_field))}


def _pcie_throughput(field: str, counter: str) -> Reader:
    return lambda nv, handle: {field: nv.nvmlDeviceGetPcieThroughput(handle, getattr(nv, counter)) * KIB}


# (what a report names, reader, cadence); each reader makes the NVML calls of the fields it returns.
# SAMPLED: the calls measured slow on a real GPU (nvmlDeviceGetPcieThroughput samples a 20 ms window,
# the energy counter takes about 3 ms; ../shared/fixtures/h200-passthrough/nvml-call-latency.txt).
# STATIC: facts of the board and its slot that do not change while the driver is loaded.
READERS: tuple[tuple[str, Reader, Cadence], ...] = (
    ("SM clock", lambda nv, h: {"sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)}, POLLED),
    (
        "memory clock",
        lambda nv, h: {"memory_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)},
        POLLED,
    ),
    (
        "max SM clock",
        lambda nv, h: {"max_sm_clock_hz": _call(nv, "nvmlDeviceGetMaxClockInfo", h, nv.NVML_CLOCK_SM) * MHZ},
        STATIC,
    ),
    (
        "GPU temperature",
        lambda nv, h: {"gpu_temp_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)},
        POLLED,
    ),
    ("memory temperature", _field("memory_temp_c", "NVML_FI_DEV_MEMORY_TEMP"), POLLED),
    ("power usage", lambda nv, h: {"power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000}, POLLED),
    (
        "enforced power limit",
        lambda nv, h: {"power_limit_w": _call(nv, "nvmlDeviceGetEnforcedPowerLimit", h) / 1000},
        POLLED,
    ),
    ("total energy", lambda nv, h: {"energy_mj": nv.nvmlDeviceGetTotalEnergyConsumption(h)}, SAMPLED),
    ("utilization", _utilization, POLLED),
    ("framebuffer", _framebuffer, POLLED),
    ("PCIe replays", lambda nv, h: {"pcie_replays": nv.nvmlDeviceGetPcieReplayCounter(h)}, POLLED),
    ("PCIe TX throughput", _pcie_throughput("pcie_tx_bytes_per_second", "NVML_PCIE_UTIL_TX_BYTES"), SAMPLED),
    ("PCIe RX throughput", _pcie_throughput("pcie_rx_bytes_per_second", "NVML_PCIE_UTIL_RX_BYTES"), SAMPLED),
    (
        "PCIe link generation",
        lambda nv, h: {"pcie_link_gen": nv.nvmlDeviceGetCurrPcieLinkGeneration(h)},
        POLLED,
    ),
    ("PCIe link width", lambda nv, h: {"pcie_link_width": nv.nvmlDeviceGetCurrPcieLinkWidth(h)}, POLLED),
    (
        "PCIe max link generation",
        lambda nv, h: {"pcie_max_link_gen": nv.nvmlDeviceGetMaxPcieLinkGeneration(h)},
        STATIC,
    ),
    (
        "PCIe max link width",
        lambda nv, h: {"pcie_max_link_width": nv.nvmlDeviceGetMaxPcieLinkWidth(h)},
        STATIC,
    ),
    ("clock throttle reasons", _throttle_reasons, POLLED),
    *(
        (f"{scope} {kind.upper()}", _ecc(f"ecc_{kind}_{scope}", error_type, counter), POLLED)
        for scope, counter in (("volatile", "NVML_VOLATILE_ECC"), ("aggregate", "NVML_AGGREGATE_ECC"))
        for kind, error_type in (
            ("sbe", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
            ("dbe", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
        )
    ),
    ("remapped rows", _remapped_rows, POLLED),
    (
        "NVLink CRC flit errors",
        _field("nvlink_crc_flit_errors", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
        POLLED,
    ),
    (
        "NVLink CRC data errors",
        _field("nvlink_crc_data_errors", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
        POLLED,
    ),
    (
        "NVLink replay errors",
        _field("nvlink_replay_errors", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
        POLLED,
    ),
    (
        "NVLink recovery errors",
        _field("nvlink_recovery_errors", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
        POLLED,
    ),
    ("NVLink bandwidth", _nvlink_bandwidth, POLLED),
    ("MIG mode", lambda nv, h: {"mig_mode": _call(nv, "nvmlDeviceGetMigMode", h)[0]}, POLLED),
)


def handle_address(handle: Any) -> int | None:
    """What identifies an NVML device handle: the pointer's value (two handle objects may share it)."""
    return ctypes.cast(handle, ctypes.c_void_p).value


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _DeviceLost(GpuBackendError):
    """NVML says the device is gone (GPU_IS_LOST, RESET_REQUIRED); the message names the call."""


@dataclass(frozen=True)
class DeviceRead:
    """What one pass over some of a device's readers found: values by cadence, then GpuSample field; what
    went wrong; the MIG instances' readings; `lost`: the device did not answer (the reason in `problems`)."""

    values: dict[Cadence, dict[str, float]]
    problems: tuple[str, ...]
    mig_instances: tuple[MigReading, ...] = ()
    lost: bool = False

    def reading(self, identity: GpuIdentity) -> GpuReading:
        """This pass as one scrape's reading of the device."""
        sample = None if self.lost else GpuSample(**merged(self.values))
        return GpuReading(identity, sample, self.problems, self.mig_instances)


@dataclass(frozen=True)
class _Device:
    identity: GpuIdentity
    handle: Any  # None: the device failed when it was opened
    problem: str = ""


class NvmlBackend:
    """Readings and Xid events of this host's GPUs through NVML."""

    def __init__(self, nvml: ModuleType | None = None, event_wait_ms: int = 500) -> None:
        self._nv: Any = nvml if nvml is not None else importlib.import_module("pynvml")
        self._event_wait_ms = event_wait_ms
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as error:
            raise GpuBackendError(f"NVML: nvmlInit failed: {error}") from error
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as error:
            nv.nvmlShutdown()
            raise GpuBackendError(f"NVML: nvmlDeviceGetCount failed: {error}") from error
        self._lost_codes = {nv.NVML_ERROR_GPU_IS_LOST, nv.NVML_ERROR_RESET_REQUIRED}
        self._absent_codes = {nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND}
        self._devices = [self._open(index) for index in range(count)]

    def _open(self, index: int) -> _Device:
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            identity = GpuIdentity(
                index=index,
                uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                pci_bus_id=normalize_pci_bus_id(_text(nv.nvmlDeviceGetPciInfo(handle).busId)),
                minor_number=nv.nvmlDeviceGetMinorNumber(handle),
                model_name=_text(nv.nvmlDeviceGetName(handle)),
            )
        except nv.NVMLError as error:
            return _Device(GpuIdentity(index=index), None, f"opening the device: {error}")
        return _Device(identity, handle)

    def identities(self) -> list[GpuIdentity]:
        return [device.identity for device in self._devices]

    def read(self) -> list[GpuReading]:
        """Every device's every value, read now (the exporter reads through collectors.gpu.poller)."""
        return [
            self.read_device(index, CADENCES).reading(device.identity)
            for index, device in enumerate(self._devices)
        ]

    def read_device(self, index: int, cadences: Collection[Cadence]) -> DeviceRead:
        """The values of the readers of `cadences` on device `index` (with POLLED, its MIG instances)."""
        device = self._devices[index]
        if device.handle is None:
            return DeviceRead({}, (device.problem,), lost=True)
        values: dict[Cadence, dict[str, float]] = {cadence: {} for cadence in cadences}
        problems: list[str] = []
        mig_instances: tuple[MigReading, ...] = ()
        try:
            for what, reader, cadence in READERS:
                if cadence in cadences:
                    values[cadence].update(
                        self._attempt(what, problems, reader, self._nv, device.handle) or {}
                    )
            if values.get(POLLED, {}).get("mig_mode") == self._nv.NVML_DEVICE_MIG_ENABLE:
                mig_instances = (
                    self._attempt("MIG devices", problems, self._mig_instances, device.handle, problems) or ()
                )
        except _DeviceLost as lost:
            return DeviceRead({}, (str(lost),), lost=True)
        return DeviceRead(values, tuple(problems), mig_instances)

    def _attempt(self, what: str, problems: list[str], call: Callable[..., T], *args: Any) -> T | None:
        """call(*args), or None where NVML does not answer: silently when the device lacks the value,
        with a line in `problems` on any other error. Raises _DeviceLost when the device is gone."""
        try:
            return call(*args)
        except self._nv.NVMLError as error:
            if error.value in self._lost_codes:
                raise _DeviceLost(f"{what}: {error}") from error
            if error.value not in self._absent_codes:
                problems.append(f"{what}: {error}")
            return None

    def _mig_instances(self, handle: Any, problems: list[str]) -> tuple[MigReading, ...]:
        """The GPU instances of a device in MIG mode, one reading each. A GPU instance split into several
        compute instances is several MIG devices with one framebuffer: it is read once."""
        nv = self._nv
        memory = self._attempt("framebuffer size", problems, nv.nvmlDeviceGetMemoryInfo, handle)
        device_bytes = 0 if memory is None else memory.total
        instances: dict[int, MigReading] = {}
        for index in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nv.NVMLError as error:
                if error.value == nv.NVML_ERROR_NOT_FOUND:  # no MIG device at this index
                    continue
                raise
            instance_id = nv.nvmlDeviceGetGpuInstanceId(mig)
            if instance_id not in instances:
                instances[instance_id] = self._mig_instance(mig, instance_id, device_bytes, problems)
        return tuple(instances.values())

    def _mig_instance(self, mig: Any, instance_id: int, device_bytes: int, problems: list[str]) -> MigReading:
        nv = self._nv
        where = f"MIG GPU instance {instance_id}"
        attributes = self._attempt(f"{where} attributes", problems, nv.nvmlDeviceGetAttributes, mig)
        profile = (
            ""
            if attributes is None
            else mig_profile_name(attributes.gpuInstanceSliceCount, attributes.memorySizeMB, device_bytes)
        )
        framebuffer = self._attempt(f"{where} framebuffer", problems, _framebuffer, nv, mig) or {}
        return MigReading(instance_id, profile, GpuSample(**framebuffer))

    def watch_xids(
        self, on_xid: Callable[[XidEvent], None], report: Callable[[str, str], None]
    ) -> XidListener:
        """Start a daemon thread handing each NVML critical-Xid event to `on_xid`; stop() ends it."""
        return XidListener(self._nv, self._devices, on_xid, report, self._event_wait_ms)

    def close(self) -> None:
        self._nv.nvmlShutdown()


class XidListener:
    """Waits on an NVML event set for critical Xids; a daemon thread, so it never keeps the process alive."""

    def __init__(
        self,
        nv: Any,
        devices: list[_Device],
        on_xid: Callable[[XidEvent], None],
        report: Callable[[str, str], None],
        wait_ms: int,
    ) -> None:
        self._nv = nv
        self._on_xid = on_xid
        self._report = report
        self._wait_ms = wait_ms
        self._bus_ids: dict[int | None, str] = {}
        self._event_set = nv.nvmlEventSetCreate()
        for device in devices:
            if device.handle is None:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(device.handle, nv.nvmlEventTypeXidCriticalError, self._event_set)
            except nv.NVMLError as error:
                if error.value != nv.NVML_ERROR_NOT_SUPPORTED:
                    report(device.identity.where, f"registering for Xid events: {error}")
                continue
            self._bus_ids[handle_address(device.handle)] = device.identity.pci_bus_id
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-xid-listener", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nv = self._nv
        while not self._stopping.is_set():
            try:
                data = nv.nvmlEventSetWait(self._event_set, self._wait_ms)
            except nv.NVMLError as error:
                if error.value != nv.NVML_ERROR_TIMEOUT:
                    self._report("NVML event set", f"nvmlEventSetWait: {error}")
                    self._stopping.wait(self._wait_ms / 1000)  # do not spin on a persistent error
                continue
            bus_id = self._bus_ids.get(handle_address(data.device), "")
            self._on_xid(XidEvent(pci_bus_id=bus_id, xid=int(data.eventData), source="nvml"))

    def stop(self) -> None:
        """End the thread, then free the event set it waits on; safe to call twice."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._thread.join()
        self._nv.nvmlEventSetFree(self._event_set)

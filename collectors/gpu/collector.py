"""GPU metrics under dcgm-exporter's names, types and labels, read from a pluggable backend.

A backend (collectors.gpu.nvml for real GPUs, collectors.gpu.sim for simulated ones) returns plain readings
already in dcgm-exporter's units; this module only names them. One backend per CollectorOptions is
shared by the gpu and xid collectors, and by a fleet simulator that drives the simulated one, through
`acquire_backend` / `release_backend`.

dcgm-exporter's counters carry no `_total` suffix. CounterMetricFamily would append one and rename the
series, so each family is a plain `Metric` typed counter whose samples keep dcgm-exporter's name, and
collectors.textformat writes its HELP/TYPE lines under that same name, as dcgm-exporter does. Prometheus
ingests them as counters from either format. The OpenMetrics parser of prometheus_client rejects such
counters, so a Python scraper of this exporter should ask for the Prometheus text format.

A GPU in MIG mode also gets, per GPU instance, the framebuffer series under dcgm-exporter's extra labels
GPU_I_PROFILE and GPU_I_ID (the device's own series keep the six labels).

With `kubernetes` (dcgm-exporter's --kubernetes), the DCGM_* series of a GPU a pod holds also carry
`pod`, `namespace` and `container`, from the kubelet's PodResources API (collectors.podresources, its
answer cached for a refresh interval); a free GPU's series, and every series while the kubelet cannot
be asked, go without them.

NVML is read off the scrape path (collectors.gpu.poller): a scrape renders the newest values, and
`fleetlens_gpu_reading_age_seconds` says how old they are.

NVML init failure (no driver, no GPU) is reported once, when the collector is built; the collector then
yields nothing: a node without GPUs is worth one log line, not an error per scrape. Install the driver,
then restart the exporter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from collectors.base import CollectorOptions, ReadErrors
from collectors.errors import CollectorConfigError, GpuBackendError
from collectors.gpu.backend import lease_backend
from collectors.gpu.model import LABELS, THROTTLE_REASONS, GpuBackend, GpuReading, GpuSample
from collectors.registry import register

if TYPE_CHECKING:
    from collectors.podresources import GpuHolder


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric and the GpuSample field it shows."""

    name: str
    kind: str
    help: str
    field: str


# Help texts of DCGM_FI_* metrics are dcgm-exporter's (etc/default-counters.csv).
METRICS = (
    MetricSpec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "sm_clock_mhz"),
    MetricSpec("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "memory_clock_mhz"),
    MetricSpec("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "memory_temp_c"),
    MetricSpec("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "gpu_temp_c"),
    MetricSpec("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "power_w"),
    MetricSpec(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        "energy_mj",
    ),
    MetricSpec("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "pcie_replays"),
    MetricSpec(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
        "pcie_tx_bytes_per_second",
    ),
    MetricSpec(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
        "pcie_rx_bytes_per_second",
    ),
    MetricSpec("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "gpu_util_percent"),
    MetricSpec("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "mem_copy_util_percent"),
    MetricSpec("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "fb_free_mib"),
    MetricSpec("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "fb_used_mib"),
    MetricSpec(
        "DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", "fb_reserved_mib"
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        "ecc_sbe_volatile",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        "ecc_dbe_volatile",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "counter",
        "Total number of single-bit persistent ECC errors.",
        "ecc_sbe_aggregate",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "counter",
        "Total number of double-bit persistent ECC errors.",
        "ecc_dbe_aggregate",
    ),
    MetricSpec(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        "remapped_rows_correctable",
    ),
    MetricSpec(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        "remapped_rows_uncorrectable",
    ),
    MetricSpec(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", "row_remap_failure"
    ),
    MetricSpec(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
        "nvlink_crc_flit_errors",
    ),
    MetricSpec(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink data CRC errors.",
        "nvlink_crc_data_errors",
    ),
    MetricSpec(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink retries.",
        "nvlink_replay_errors",
    ),
    MetricSpec(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink recovery errors.",
        "nvlink_recovery_errors",
    ),
    MetricSpec(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        "nvlink_bandwidth_bytes",
    ),
    # dcgm-exporter lists no field for these.
    MetricSpec(
        "fleetlens_gpu_pcie_link_generation", "gauge", "Current PCIe link generation.", "pcie_link_gen"
    ),
    MetricSpec(
        "fleetlens_gpu_pcie_link_width", "gauge", "Current PCIe link width (lanes).", "pcie_link_width"
    ),
    MetricSpec(
        "fleetlens_gpu_pcie_max_link_generation",
        "gauge",
        "Highest PCIe link generation the GPU and its slot support.",
        "pcie_max_link_gen",
    ),
    MetricSpec(
        "fleetlens_gpu_pcie_max_link_width",
        "gauge",
        "Widest PCIe link (lanes) the GPU and its slot support.",
        "pcie_max_link_width",
    ),
    MetricSpec(
        "fleetlens_gpu_row_remap_pending",
        "gauge",
        "1 if remapped rows wait for a GPU reset to take effect.",
        "row_remap_pending",
    ),
)


# Values NVML (and a replayed `nvidia-smi -q` capture) answers that the simulator does not model: apart
# from METRICS, whose every field the simulated backend fills (tests/collectors/gpu/test_collector.py).
# dcgm-exporter's csv lists none of them, hence fleetlens names and base units.
NVML_METRICS = (
    MetricSpec(
        "fleetlens_gpu_max_sm_clock_hertz",
        "gauge",
        "Highest SM clock the GPU may run at; with DCGM_FI_DEV_SM_CLOCK, how far it is held back.",
        "max_sm_clock_hz",
    ),
    MetricSpec(
        "fleetlens_gpu_power_limit_watts",
        "gauge",
        "Power limit the driver enforces after every limiter (NVML's enforced power limit).",
        "power_limit_w",
    ),
    MetricSpec("fleetlens_gpu_mig_mode", "gauge", "1 if MIG mode is enabled on the GPU, else 0.", "mig_mode"),
)
SPECS = METRICS + NVML_METRICS


class GpuCollector:
    """Turns one backend's readings into dcgm-exporter's families, plus fleetlens_gpu_up per device.

    While the readings are those of the last scrape (the poller renews them every few seconds, scrapes
    come more often), the same family objects are yielded again, and collectors.textformat renders them
    once; only the values' ages are new families every scrape."""

    def __init__(
        self,
        backend: GpuBackend | None,
        node: str,
        errors: ReadErrors,
        release: Callable[[], None] = lambda: None,
        holders: Callable[[], Mapping[str, GpuHolder]] | None = None,
    ) -> None:
        self._backend = backend
        self._node = node
        self._errors = errors
        self._release = release
        self._holders = holders
        self._last: tuple[object, list[Metric]] | None = None  # the newest readings' key, their families

    def collect(self) -> Iterator[Metric]:
        if self._backend is None:
            return
        try:
            readings = self._backend.read()
        except GpuBackendError as error:
            self._errors.report("gpu backend", str(error))
            return
        holders = {} if self._holders is None else dict(self._holders())
        for reading in readings:
            for problem in reading.problems:
                self._errors.report(reading.identity.where, problem)
        key = ([(reading.identity, reading.sample, reading.mig_instances) for reading in readings], holders)
        if self._last is None or self._last[0] != key:
            self._last = (key, self._value_families(readings, holders))
        yield from self._last[1]
        ages = GaugeMetricFamily(
            "fleetlens_gpu_reading_age_seconds",
            "Age of the GPU's newest values at this scrape, by the cadence that renews them (polled: every"
            " poll interval; sampled: PCIe throughput and energy, every sample interval).",
            labels=(*LABELS, "cadence"),
        )
        for reading in readings:
            labels = list(reading.identity.labels(self._node).values())
            for cadence, age in reading.ages_s:
                ages.add_metric([*labels, cadence], age)
        if ages.samples:
            yield ages

    def _value_families(self, readings: list[GpuReading], holders: Mapping[str, GpuHolder]) -> list[Metric]:
        up = GaugeMetricFamily(
            "fleetlens_gpu_up",
            "1 if the GPU answered this scrape, 0 if it errored or is lost.",
            labels=LABELS,
        )
        throttle = GaugeMetricFamily(
            "fleetlens_gpu_clock_throttle_reason",
            "1 if NVML reports this clock throttle (clocks event) reason as active, else 0.",
            labels=(*LABELS, "reason"),
        )
        families = [Metric(spec.name, spec.help, spec.kind) for spec in SPECS]
        for reading in readings:
            labels = reading.identity.labels(self._node)
            up.add_metric(list(labels.values()), 0 if reading.sample is None else 1)
            if reading.sample is None:
                continue
            holder = holders.get(reading.identity.uuid)
            pod = {} if holder is None else holder.labels()
            _add_samples(families, reading.sample, labels, pod)
            for instance in reading.mig_instances:
                _add_samples(families, instance.sample, instance.labels(labels), pod)
            reasons = reading.sample.clock_throttle_reasons
            if reasons is not None:
                for reason, bit in THROTTLE_REASONS.items():
                    throttle.add_metric([*labels.values(), reason], 1 if reasons & bit else 0)
        return [
            up,
            *(family for family in families if family.samples),
            *([throttle] if throttle.samples else []),
        ]

    def close(self) -> None:
        """Give the shared backend back (the last user closes NVML); safe to call twice."""
        release, self._release = self._release, lambda: None
        self._backend = None
        release()


def _add_samples(
    families: list[Metric], sample: GpuSample, labels: dict[str, str], pod: dict[str, str]
) -> None:
    """Each value `sample` holds, in its family (`families` are SPECS' in order), under `labels`, and
    on dcgm-exporter's DCGM_* series also the `pod` labels (dcgm-exporter's own series carry none)."""
    for spec, family in zip(SPECS, families, strict=True):
        value = getattr(sample, spec.field)
        if value is not None:
            family.add_sample(spec.name, labels | pod if spec.name.startswith("DCGM_") else labels, value)


@register("gpu")
def build_gpu_collector(options: CollectorOptions, errors: ReadErrors) -> GpuCollector:
    holders = _pod_resources(options, errors) if options.kubernetes else None
    backend, release = lease_backend(options, errors)
    return GpuCollector(backend, options.node, errors, release, holders)


def _pod_resources(options: CollectorOptions, errors: ReadErrors) -> Callable[[], Mapping[str, GpuHolder]]:
    """The kubelet's GPU holders, cached (collectors.podresources needs grpcio and protobuf: the k8s
    extra, imported only here so an exporter without --kubernetes never needs them)."""
    try:
        from collectors.podresources import PodResourcesCache
    except ImportError as error:
        raise CollectorConfigError(f"--kubernetes needs the k8s extra (grpcio, protobuf): {error}") from None
    return PodResourcesCache(options.pod_resources_socket, report=errors.report).holders

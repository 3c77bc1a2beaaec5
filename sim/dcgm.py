"""dcgm-exporter's view of a simulated node's GPUs: what a fleet that runs only stock exporters scrapes.

fleetlens's gpu and xid collectors already name what they read as dcgm-exporter does (names, types, help,
the labels gpu, UUID, pci_bus_id, device, modelName, Hostname; counters without `_total`). This layer
runs them on the node's simulated GPUs and keeps what an unmodified dcgm-exporter with its default counter
set would serve, and nothing else:

- only the families of DEFAULT_COUNTERS: every fleetlens_* family goes (GPU up, clock throttle reasons,
  PCIe link generation and width, the per-code Xid counter, remap pending), and so do the DCGM fields the
  default set leaves commented out (ECC and NVLink error counters); Xids are seen only through the
  DCGM_FI_DEV_XID_ERRORS gauge, the last Xid of each GPU;
- every series gets the DCGM_FI_DRIVER_VERSION label, the one `label` field of the default set, after
  Hostname, as the real H100 excerpt in ../shared/fixtures/dcgm-exporter shows it;
- a GPU that fell off the bus has no series at all: DCGM loses the device and dcgm-exporter stops
  exporting it (fleetlens's exporter says fleetlens_gpu_up 0 instead).

The default set's fields the simulated GPUs do not model (NOT_SIMULATED) are left out, as dcgm-exporter
leaves out a field DCGM answers blank for; no detector reads them.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from collectors.base import ReadErrors
from collectors.gpu.collector import GpuCollector
from collectors.gpu.model import GpuBackend
from collectors.xid import XidCollector

# The non-comment lines of dcgm-exporter's etc/default-counters.csv (NVIDIA/dcgm-exporter at commit
# e61056b94eb98ab6598bd3a7c2a299a482b16a42; ../shared/fixtures/dcgm-exporter/default-counters.csv): field
# -> its Prometheus type, "label" for a field exported as a label of every series.
DEFAULT_COUNTERS: dict[str, str] = {
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_ENC_UTIL": "gauge",
    "DCGM_FI_DEV_DEC_UTIL": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_RESERVED": "gauge",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "gauge",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DRIVER_VERSION": "label",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gauge",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "gauge",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "gauge",
}
# Default fields the simulated GPUs (collectors.gpu.sim) have no model for: video engines, vGPU licensing
# and the profiling (DCP) ratios.
NOT_SIMULATED = frozenset(
    {
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    }
)
EXPORTED = frozenset(name for name, kind in DEFAULT_COUNTERS.items() if kind != "label") - NOT_SIMULATED
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"
# The driver of the nvidia-smi captures the simulated GPUs follow (collectors.gpu.sim.PROFILES).
DRIVER_VERSION = "590.48.01"
GPU_UP = "fleetlens_gpu_up"  # fleetlens's own answer to "is this GPU there": 0 for a lost one


class DcgmExporter:
    """A collector whose collect() yields what dcgm-exporter would serve for `backend`'s GPUs on
    `hostname` (module doc). Like dcgm-exporter, it remembers each GPU's last Xid from its start on."""

    def __init__(self, backend: GpuBackend, hostname: str) -> None:
        errors = ReadErrors("dcgm")
        self._gpu = GpuCollector(backend, hostname, errors)
        self._xid = XidCollector(hostname, errors, backend)

    def collect(self) -> Iterator[Metric]:
        families = [*self._gpu.collect(), *self._xid.collect()]
        lost = {
            sample.labels["UUID"]
            for family in families
            if family.name == GPU_UP
            for sample in family.samples
            if sample.value == 0
        }
        for family in families:
            if family.name not in EXPORTED:
                continue
            kept = Metric(family.name, family.documentation, family.type)
            for sample in family.samples:
                if sample.labels.get("UUID") not in lost:
                    labels = {**sample.labels, DRIVER_LABEL: DRIVER_VERSION}
                    kept.add_sample(sample.name, labels, sample.value)
            if kept.samples:
                yield kept

    def close(self) -> None:
        """Stop the Xid listener on the backend (the backend itself is the node's, not ours)."""
        self._xid.close()
        self._gpu.close()

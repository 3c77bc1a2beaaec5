"""What a fleet that runs only stock exporters sends the hub: a SimulatedFleet's scrapes as NVIDIA's
dcgm-exporter and Prometheus's node_exporter serve them, received through Prometheus remote write.

fleetlens's collectors already name what they read as the two exporters do, so this view keeps of each
scrape what the stock ones would serve, as the shared fixtures show them (read from FLEETLENS_FIXTURES,
never copied here):

- dcgm-exporter: the fields of its default counter set (the non-comment lines of
  dcgm-exporter/default-counters.csv), plus any field the test enables (`dcgm_fields`), each series with
  the DCGM_FI_DRIVER_VERSION label the set's one `label` field adds, valued as in the real H100 excerpt
  (issue512-h100-mig-metrics-excerpt.prom). Every fleetlens_* series goes. Enabled fields fleetlens
  exports under its own name are derived from it: the clock-event reasons bitmask (either DCGM name)
  from fleetlens_gpu_clock_throttle_reason with NVML's bits, the PCIe link fields from fleetlens's link
  gauges. A GPU whose fleetlens_gpu_up is 0 has no series at all: DCGM lost it.
- node_exporter: the node_infiniband_* and node_network_* names of node_exporter/e2e-output.txt; with
  `hw_counters`, also the mlx5 hw_counters names newer node_exporter reads (1.5, Debian's, reads none).
- remote write: each exporter's samples are a scrape target of their own, with `job` and `instance`
  labels (dcgm on :9400, node on :9100 of the node's address); `node` stays the store's column, as the
  hub's receiver derives it (Hostname, or the file_sd node label).

    stock = StockExporters(fixtures, dcgm_fields={"DCGM_FI_DEV_CLOCKS_EVENT_REASONS"})
    with SimulatedFleet(store, tmp_path, view=stock) as fleet:
        stock.mute("vela-002", gpu="3")          # DCGM answers blank for that GPU until unmute()
"""

from __future__ import annotations

import csv
from collections.abc import Collection, Iterable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from analytics.store.records import ScrapeBatch
from collectors.gpu.model import LABELS as GPU_LABELS
from collectors.gpu.model import THROTTLE_REASONS
from collectors.infiniband import HW_COUNTERS

DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"
GPU_UP = "fleetlens_gpu_up"
THROTTLE_REASON = "fleetlens_gpu_clock_throttle_reason"
CLOCK_EVENT_MASKS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
RENAMED = {  # fleetlens's gauge -> the DCGM field that reads the same
    "fleetlens_gpu_pcie_link_generation": "DCGM_FI_DEV_PCIE_LINK_GEN",
    "fleetlens_gpu_pcie_link_width": "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "fleetlens_gpu_pcie_max_link_generation": "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
    "fleetlens_gpu_pcie_max_link_width": "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
}
DCGM_PORT, NODE_EXPORTER_PORT = 9400, 9100

Sample = tuple[str, dict[str, str], float]


def default_counters(fixtures: Path) -> dict[str, str]:
    """dcgm-exporter's default counter set: field -> Prometheus type ("label" for a label field)."""
    lines = (fixtures / "dcgm-exporter" / "default-counters.csv").read_text().splitlines()
    rows = csv.reader(line for line in lines if line.strip() and not line.lstrip().startswith("#"))
    return {row[0].strip(): row[1].strip() for row in rows}


def real_dcgm_labels(fixtures: Path) -> dict[str, str]:
    """The labels of the first series of the real H100 excerpt (a dcgm-exporter 3.x on driver 535)."""
    text = (fixtures / "dcgm-exporter" / "issue512-h100-mig-metrics-excerpt.prom").read_text()
    family = next(iter(text_string_to_metric_families(text)))
    return dict(family.samples[0].labels)


def node_exporter_names(fixtures: Path) -> frozenset[str]:
    """The node_infiniband_* and node_network_* sample names of node_exporter's end-to-end output."""
    lines = (fixtures / "node_exporter" / "e2e-output.txt").read_text().splitlines()
    names = (line.split("{", 1)[0].split(" ", 1)[0] for line in lines if not line.startswith("#"))
    return frozenset(name for name in names if name.startswith(("node_infiniband_", "node_network_")))


class StockExporters:
    """A SimulatedFleet `view` (module doc): one node's scrape -> its dcgm-exporter and node_exporter
    scrapes as remote write delivers them."""

    def __init__(
        self, fixtures: Path, *, dcgm_fields: Collection[str] = (), hw_counters: bool = False
    ) -> None:
        counters = default_counters(fixtures)
        self.dcgm_fields = frozenset(name for name, kind in counters.items() if kind != "label") | set(
            dcgm_fields
        )
        real = real_dcgm_labels(fixtures)
        missing = {*GPU_LABELS, DRIVER_LABEL} - real.keys()
        assert not missing, f"the real dcgm-exporter excerpt has no {missing} label: update this view"
        assert counters.get(DRIVER_LABEL) == "label", "the default set no longer adds the driver label"
        self.driver_version = real[DRIVER_LABEL]
        hw_names = {spec.name for spec in HW_COUNTERS.values()} if hw_counters else set()
        self.node_names = node_exporter_names(fixtures) | hw_names
        self._muted: set[tuple[str, str | None]] = set()
        self._addresses: dict[str, str] = {}

    def mute(self, node: str, gpu: str | None = None) -> None:
        """From now on DCGM answers blank for `gpu` of `node` (None: dcgm-exporter on `node` is down)."""
        self._muted.add((node, gpu))

    def unmute(self, node: str, gpu: str | None = None) -> None:
        self._muted.discard((node, gpu))

    def __call__(self, batch: ScrapeBatch) -> list[ScrapeBatch]:
        samples = list(zip(batch.names, batch.labels, batch.values, strict=True))
        dcgm = [] if (batch.node, None) in self._muted else self._dcgm(batch.node, samples)
        node = [(name, labels, value) for name, labels, value in samples if name in self.node_names]
        targets = [
            self._target(batch, "dcgm", DCGM_PORT, dcgm),
            self._target(batch, "node", NODE_EXPORTER_PORT, node),
        ]
        return [target for target in targets if len(target)]

    def _dcgm(self, node: str, samples: list[Sample]) -> list[Sample]:
        """What dcgm-exporter serves of the GPU samples of one scrape."""
        lost = {labels.get("gpu") for name, labels, value in samples if name == GPU_UP and value == 0}
        lost |= {gpu for muted_node, gpu in self._muted if muted_node == node}
        derived = [*self._masks(samples), *self._renamed(samples)]
        return [
            (name, {**labels, DRIVER_LABEL: self.driver_version}, value)
            for name, labels, value in [*samples, *derived]
            if name in self.dcgm_fields and labels.get("gpu") not in lost
        ]

    def _masks(self, samples: list[Sample]) -> Iterable[Sample]:
        """The clock-event reasons bitmask of each GPU, under each enabled DCGM name."""
        masks: dict[str, tuple[dict[str, str], int]] = {}
        for name, labels, value in samples:
            if name != THROTTLE_REASON:
                continue
            gpu_labels = {key: labels[key] for key in GPU_LABELS if key in labels}
            _, mask = masks.get(labels["gpu"], (gpu_labels, 0))
            masks[labels["gpu"]] = (
                gpu_labels,
                mask | (THROTTLE_REASONS[labels["reason"]] if value == 1 else 0),
            )
        for field in CLOCK_EVENT_MASKS:
            if field in self.dcgm_fields:
                yield from ((field, labels, float(mask)) for labels, mask in masks.values())

    def _renamed(self, samples: list[Sample]) -> Iterable[Sample]:
        return ((RENAMED[name], labels, value) for name, labels, value in samples if name in RENAMED)

    def _target(self, batch: ScrapeBatch, job: str, port: int, samples: list[Sample]) -> ScrapeBatch:
        """One target's samples as remote write delivers them: with `job` and `instance` labels."""
        address = self._addresses.setdefault(batch.node, f"10.0.0.{len(self._addresses) + 1}")
        instance = f"{address}:{port}"
        target = {"job": job, "instance": instance}
        return ScrapeBatch(
            instance,
            batch.node,
            batch.ts,
            [name for name, _, _ in samples],
            [{**labels, **target} for _, labels, _ in samples],
            [value for _, _, value in samples],
        )

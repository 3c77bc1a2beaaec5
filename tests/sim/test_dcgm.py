"""dcgm-exporter's rendering of the simulated GPUs (sim.dcgm) against what dcgm-exporter really serves: its
default counter set and the real /metrics excerpts in the shared fixtures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from collectors import textformat
from collectors.gpu.sim import ManualClock, SimBackend
from hub.expfmt import Exposition, ExpositionParser
from sim.dcgm import DEFAULT_COUNTERS, DRIVER_LABEL, DRIVER_VERSION, EXPORTED, NOT_SIMULATED, DcgmExporter

# Labels of the real H100 excerpt that are no GPU's: MIG instances (the simulated GPUs have no MIG) and
# what dcgm-exporter adds on Kubernetes for the pod using the GPU.
NOT_A_GPU_LABEL = {"GPU_I_PROFILE", "GPU_I_ID", "container", "namespace", "pod"}
H100_EXCERPT = "issue512-h100-mig-metrics-excerpt.prom"


def default_counters(fixtures: Path) -> list[tuple[str, str, str]]:
    """(field, type, help) of each non-comment line of dcgm-exporter's default-counters.csv."""
    lines = (fixtures / "dcgm-exporter" / "default-counters.csv").read_text().splitlines()
    return [
        tuple(part.strip() for part in line.split(",", 2))  # type: ignore[misc]
        for line in lines
        if line.strip() and not line.lstrip().startswith("#")
    ]


def scrape(exporter: DcgmExporter) -> Exposition:
    return ExpositionParser().parse(textformat.render(exporter.collect()).decode())


@pytest.fixture
def gpus() -> SimBackend:
    clock = ManualClock(1_767_225_600.0)
    backend = SimBackend(count=4, seed=3, clock=clock)
    backend.set_load(None, 0.95)
    clock.advance(10)
    return backend


def test_the_field_list_is_the_default_counter_set(fixtures: Path):
    assert [(field, kind) for field, kind, _ in default_counters(fixtures)] == list(DEFAULT_COUNTERS.items())


def test_families_are_the_default_set_with_its_types_and_help(fixtures: Path, gpus: SimBackend):
    exporter = DcgmExporter(gpus, "vela-001")
    families = {family.name: family for family in exporter.collect()}
    assert set(families) == EXPORTED
    valued = {field for field, kind, _ in default_counters(fixtures) if kind != "label"}
    assert valued - NOT_SIMULATED == EXPORTED
    for field, kind, help_text in default_counters(fixtures):
        if field in families:
            assert (families[field].type, families[field].documentation) == (kind, help_text), field
    exposition = scrape(exporter)
    assert not [name for name in exposition.names if name.startswith("fleetlens_") or name.endswith("_total")]
    assert set(exposition.types.values()) == {"gauge", "counter"}


def test_labels_are_those_of_real_dcgm_exporter_series(fixtures: Path, gpus: SimBackend):
    real = (fixtures / "dcgm-exporter" / H100_EXCERPT).read_text()
    real_keys = {
        tuple(key for key in re.findall(r'([A-Za-z_]+)="', labels) if key not in NOT_A_GPU_LABEL)
        for labels in re.findall(r"^DCGM_FI_\w+\{([^}]*)\}", real, flags=re.MULTILINE)
    }
    exposition = scrape(DcgmExporter(gpus, "vela-001"))
    ours = {tuple(labels) for labels in exposition.labels}
    assert (
        ours
        == real_keys
        == {("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")}
    )
    assert {labels[DRIVER_LABEL] for labels in exposition.labels} == {DRIVER_VERSION}
    assert {labels["Hostname"] for labels in exposition.labels} == {"vela-001"}
    assert {labels["gpu"] for labels in exposition.labels} == {"0", "1", "2", "3"}


@pytest.mark.parametrize("excerpt", [H100_EXCERPT, "issue250-v100-metrics-excerpt.prom"])
def test_families_the_real_excerpts_share_have_their_types(fixtures: Path, gpus: SimBackend, excerpt: str):
    real = ExpositionParser().parse((fixtures / "dcgm-exporter" / excerpt).read_text()).types
    ours = scrape(DcgmExporter(gpus, "vela-001")).types
    shown = {name: kind for name, kind in real.items() if name in DEFAULT_COUNTERS}
    assert shown, "vacuous: the excerpt has no family of the default set"
    for name, kind in shown.items():
        assert ours.get(name, kind if name in NOT_SIMULATED else None) == kind, name


def test_a_lost_gpu_has_no_series_at_all(gpus: SimBackend):
    exporter = DcgmExporter(gpus, "vela-001")
    lost_uuid = gpus.identities()[2].uuid
    gpus.set_fault(2, "gpu_lost")  # with its Xid 79
    exposition = scrape(exporter)
    assert lost_uuid not in {labels["UUID"] for labels in exposition.labels}
    assert {labels["gpu"] for labels in exposition.labels} == {"0", "1", "3"}
    gpus.clear_fault(2, "gpu_lost")
    assert "2" in {labels["gpu"] for labels in scrape(exporter).labels}


def last_xids(exporter: DcgmExporter) -> dict[str, float]:
    """gpu -> DCGM_FI_DEV_XID_ERRORS in one scrape."""
    exposition = scrape(exporter)
    return {
        labels["gpu"]: value
        for name, labels, value in zip(exposition.names, exposition.labels, exposition.values, strict=True)
        if name == "DCGM_FI_DEV_XID_ERRORS"
    }


def test_xids_show_only_as_the_last_xid_of_each_gpu(gpus: SimBackend):
    exporter = DcgmExporter(gpus, "vela-001")
    assert last_xids(exporter) == {"0": 0, "1": 0, "2": 0, "3": 0}
    for code in (48, 63, 94, 94):  # a double-bit error as a real GPU reports it, between two scrapes
        gpus.set_fault(1, "xid", code=code)
    assert last_xids(exporter) == {"0": 0, "1": 94, "2": 0, "3": 0}
    exporter.close()
    restarted = DcgmExporter(gpus, "vela-001")
    assert last_xids(restarted) == {"0": 0, "1": 0, "2": 0, "3": 0}, "a restart forgets the last Xids"

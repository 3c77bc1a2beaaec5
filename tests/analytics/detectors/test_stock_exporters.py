"""Every detector on what a fleet running only stock exporters sends: dcgm-exporter's default counter set
(plus the fields a test enables) and node_exporter's infiniband and netclass series, with the job and
instance labels remote write adds, and no fleetlens_* series (tests.support.stock). Each fault is found
where the stock series can show it, with the degraded evidence docs/stock-exporters.md describes, and
what they cannot show is asserted missing, not assumed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from analytics.detectors.base import Detector, Finding, Window
from analytics.detectors.dcgm import CLOCK_EVENT_BITS
from analytics.detectors.gpu_fault import GpuFault
from analytics.detectors.gpu_throttle import GpuThrottle
from analytics.store import Store
from collectors.gpu.model import THROTTLE_REASONS
from tests.support.fleetdata import SimulatedFleet
from tests.support.stock import CLOCK_EVENT_MASKS, StockExporters


@contextmanager
def stock_fleet(
    store: Store,
    tmp_path: Path,
    fixtures: Path,
    *,
    dcgm_fields: frozenset[str] = frozenset(),
    hw_counters: bool = False,
    **fleet: object,
) -> Iterator[tuple[SimulatedFleet, StockExporters]]:
    """A simulated fleet whose scrapes reach the store as stock exporters would have sent them; on leaving,
    checks that the store holds nothing else."""
    stock = StockExporters(fixtures, dcgm_fields=dcgm_fields, hw_counters=hw_counters)
    with SimulatedFleet(store, tmp_path, view=stock, **fleet) as simulated:  # type: ignore[arg-type]
        yield simulated, stock
    assert_stock_only(store)


def assert_stock_only(store: Store) -> None:
    """No fleetlens_* series, and every series carries the job and instance labels of remote write."""
    [(ours, unlabelled, total)] = store.query(
        "SELECT countIf(startsWith(metric, 'fleetlens_')),"
        " countIf(NOT (mapContains(labels, 'job') AND mapContains(labels, 'instance'))), count()"
        " FROM (SELECT DISTINCT metric, labels FROM metrics)"
    ).rows
    assert (ours, unlabelled) == (0, 0) and total > 0


def by_place(findings: list[Finding]) -> dict[tuple[str, str], Finding]:
    return {(finding.node, finding.component): finding for finding in findings}


def reported(detector: Detector, store: Store, window: Window) -> set[tuple[str, str]]:
    return set(by_place(detector.detect(store, window)))


# -- gpu_fault ---------------------------------------------------------------------------------------------


def test_gpu_faults_from_the_default_counter_set_xid_gauge_remapped_rows_and_a_gpu_gone_silent(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures) as (fleet, _):
        fleet.tick(3)
        fleet["vela-001"].gpus.set_fault(2, "xid", code=48)  # a DBE: hardware
        fleet["vela-002"].gpus.set_fault(1, "gpu_lost")  # DCGM loses it: all its series go
        fleet["vela-003"].gpus.set_fault(0, "ecc", dbe=2)  # no ECC counters by default: remapped rows
        fleet["vela-004"].gpus.set_fault(3, "xid", code=13)  # the application's
        onset = by_place(GpuFault().detect(store, fleet.tick()))
        fleet.tick()
        third = by_place(GpuFault().detect(store, fleet.tick()))

    assert set(onset) == {("vela-001", "gpu:2"), ("vela-003", "gpu:0"), ("vela-004", "gpu:3")}
    xid, dbe, app = onset["vela-001", "gpu:2"], onset["vela-003", "gpu:0"], onset["vela-004", "gpu:3"]
    assert (xid.kind, xid.severity, xid.evidence["xid_counts"]) == ("gpu_fault", "critical", {"48": 1})
    assert (dbe.kind, dbe.evidence["signals"], dbe.evidence["action"]) == (
        "gpu_fault",
        ["ecc_dbe"],
        "reset_gpu",
    )
    assert (dbe.evidence["uncorrectable_remapped_rows"], dbe.evidence["ecc_dbe_errors"]) == (2, 0)
    assert (app.kind, app.severity, app.evidence["xid_counts"]) == ("gpu_app_error", "info", {"13": 1})
    # the lost GPU after lost_after_scrapes scrapes without it, with a reboot asked for
    lost = third["vela-002", "gpu:1"]
    assert (lost.kind, lost.severity, lost.evidence["signals"]) == ("gpu_fault", "critical", ["lost"])
    assert (lost.evidence["silent_scrapes"], lost.evidence["action"]) == (3, "reboot_node")
    assert "lost" not in {
        signal for finding in onset.values() for signal in finding.evidence.get("signals", [])
    }


def test_a_lost_gpu_stays_reported_while_its_node_answers_and_goes_with_its_node(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures, nodes=2) as (fleet, _):
        fleet.tick(2)
        fleet["vela-001"].gpus.set_fault(3, "gpu_lost")
        windows = [fleet.tick() for _ in range(8)]
        gap = fleet.tick(skip={"vela-001"})

        found = [reported(GpuFault(), store, window) for window in windows]
        assert found == [set()] * 2 + [{("vela-001", "gpu:3")}] * 6
        assert reported(GpuFault(), store, gap) == set()  # no other GPU answers: nothing to tell it by


def test_gpus_whose_series_stop_with_their_node_or_start_late_are_not_lost(
    store: Store, tmp_path: Path, fixtures: Path
):
    """A scrape gap, dcgm-exporter down while node_exporter answers, GPUs whose readings come back a scrape
    or two after the others' (DCGM's fields are blank until its watches have a sample), and a GPU first
    seen after its node's others: no lost GPU, no fault at all."""
    with stock_fleet(store, tmp_path, fixtures) as (fleet, stock):
        stock.mute("vela-004", gpu="2")  # first seen later than its node's other GPUs
        windows = [fleet.tick() for _ in range(2)]
        stock.unmute("vela-004", gpu="2")
        windows += [fleet.tick() for _ in range(2)]
        windows += [fleet.tick(skip={"vela-001"}) for _ in range(4)]  # scrape gap
        stock.mute("vela-002")  # dcgm-exporter restarts: no GPU series for a while
        windows += [fleet.tick() for _ in range(4)]
        stock.unmute("vela-002")
        stock.mute("vela-002", gpu="1")
        stock.mute("vela-002", gpu="3")
        windows += [fleet.tick() for _ in range(2)]  # two of its GPUs late after the restart
        stock.unmute("vela-002", gpu="1")
        stock.unmute("vela-002", gpu="3")
        windows += [fleet.tick() for _ in range(3)]

        assert [reported(GpuFault(), store, window) for window in windows] == [set()] * len(windows)
        assert GpuFault(lost_after_scrapes=2).detect(store, windows[-4])  # the late ones would count at 2


# -- gpu_throttle ------------------------------------------------------------------------------------------


def test_the_reasons_decoding_matches_nvmls_bits_as_the_exporter_knows_them():
    assert CLOCK_EVENT_BITS == THROTTLE_REASONS


@pytest.mark.parametrize("mask", CLOCK_EVENT_MASKS)
def test_throttling_read_from_dcgms_reasons_bitmask_names_its_reasons(
    store: Store, tmp_path: Path, fixtures: Path, mask: str
):
    """DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (before DCGM 3.3) or DCGM_FI_DEV_CLOCKS_EVENT_REASONS enabled."""
    with stock_fleet(store, tmp_path, fixtures, dcgm_fields=frozenset({mask}), gpus=8) as (fleet, _):
        fleet.tick(2)
        fleet["vela-002"].gpus.set_fault(3, "thermal_throttle", temp_c=91, clock_factor=0.7)
        for gpu in range(8):
            fleet["vela-001"].gpus.set_fault(gpu, "power_brake")
        fleet["vela-003"].gpus.set_fault(0, "slow", clock_factor=0.6)  # no reason: no throttling
        found = by_place(GpuThrottle().detect(store, fleet.tick()))

    assert found.keys() == {("vela-002", "gpu:3"), ("vela-001", "")}
    thermal, brake = found["vela-002", "gpu:3"], found["vela-001", ""]
    assert thermal.evidence["reasons"] == ["hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"]
    assert thermal.evidence["gpu_temp_c"] >= 90 and thermal.score == pytest.approx(0.3, abs=0.02)
    assert brake.evidence["reason_names"] == ["HW Power Brake Slowdown", "HW Slowdown"]
    assert brake.evidence["gpus_throttled"] == 8


def test_without_reasons_a_busy_gpu_far_below_its_peers_is_throttled_for_unknown_reasons(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures, nodes=5, gpus=8) as (fleet, _):
        fleet.set_load("vela-005", 0.0)  # an idle node: its GPUs' clocks are not judged
        fleet.tick(2)
        fleet["vela-002"].gpus.set_fault(3, "thermal_throttle", temp_c=91, clock_factor=0.6)
        for gpu in range(8):
            fleet["vela-001"].gpus.set_fault(gpu, "power_brake")
            fleet["vela-005"].gpus.set_fault(gpu, "power_brake")
        fleet["vela-003"].gpus.set_fault(0, "slow", clock_factor=0.85)  # a power cap's worth: too little
        window = fleet.tick()
        found = by_place(GpuThrottle().detect(store, window))

    assert found.keys() == {("vela-002", "gpu:3"), ("vela-001", "")}
    thermal, brake = found["vela-002", "gpu:3"], found["vela-001", ""]
    assert thermal.evidence["reasons"] == ["unknown"] and thermal.evidence["gpu_temp_c"] >= 90
    assert thermal.evidence["sm_clock_mhz"] < 0.65 * thermal.evidence["peers_sm_clock_mhz"]
    assert brake.evidence["reasons"] == ["unknown"] and brake.evidence["gpus_throttled"] == 8
    assert brake.evidence["gpu_power_w"] < 0.5 * 600  # a braked node draws little while busy
    assert ("vela-003", "gpu:0") in reported(GpuThrottle(min_unknown_drop=0.1), store, window)


def test_without_reasons_idle_gpus_at_any_clock_and_an_evenly_loaded_fleet_are_no_throttling(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures, gpus=8) as (fleet, _):
        busy = [fleet.tick() for _ in range(3)]
        for node in fleet.nodes:
            fleet.set_load(node.name, 0.0)
        for gpu in range(8):
            fleet["vela-002"].gpus.set_fault(gpu, "power_brake")  # idle and braked: 86 vs 345 MHz
        idle = [fleet.tick() for _ in range(3)]

        for window in busy + idle:
            assert reported(GpuThrottle(), store, window) == set()
        idle_clocks = GpuThrottle().features(store, idle[-1])
        assert idle_clocks.empty  # not even a candidate: no reason series, not busy

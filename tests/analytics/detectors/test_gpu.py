"""gpu_throttle on rows the real gpu collector reads from simulated GPUs, and neither GPU detector fooled
by reboots and scrape gaps (gpu_fault has its own tests: test_gpu_fault.py)."""

from __future__ import annotations

from pathlib import Path

from analytics.detectors.base import Detector, Window
from analytics.detectors.gpu import GpuThrottle
from analytics.detectors.gpu_fault import GpuFault
from analytics.store import Store
from tests.support.fleetdata import SimulatedFleet


def reported(detector: Detector, store: Store, window: Window) -> set[tuple[str, str]]:
    return {(finding.node, finding.component) for finding in detector.detect(store, window)}


def test_a_thermally_throttled_gpu_is_named_with_its_reasons_and_its_clock_against_its_peers(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet.tick(2)
        fleet["vela-002"].gpus.set_fault(3, "thermal_throttle", temp_c=91, clock_factor=0.7)
        window = fleet.tick()

        [finding] = GpuThrottle().detect(store, window)
    assert (finding.kind, finding.node, finding.component) == ("gpu_throttle", "vela-002", "gpu:3")
    assert {"hw_thermal_slowdown", "sw_thermal_slowdown"} <= set(finding.evidence["reasons"])
    assert finding.evidence["sm_clock_mhz"] < 0.75 * finding.evidence["peers_sm_clock_mhz"]
    assert finding.evidence["gpu_temp_c"] >= 90
    assert finding.score >= 0.25


def test_a_node_whose_every_gpu_throttles_still_stands_out_against_the_fleet(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet.tick(2)
        for gpu in range(4):
            fleet["vela-004"].gpus.set_fault(gpu, "thermal_throttle")
        window = fleet.tick()

        assert reported(GpuThrottle(), store, window) == {("vela-004", f"gpu:{gpu}") for gpu in range(4)}


def test_a_thermal_fault_on_an_idle_node_is_reported_against_the_idle_gpus(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet.set_load("vela-003", 0.0)  # no job on this node; the rest of the fleet is busy
        fleet.tick(2)
        fleet["vela-003"].gpus.set_fault(1, "thermal_throttle")
        window = fleet.tick()

        [finding] = GpuThrottle().detect(store, window)
    assert (finding.node, finding.component) == ("vela-003", "gpu:1")
    assert finding.evidence["peers"] == "idle GPUs" and finding.evidence["gpu_util_percent"] == 0
    assert finding.evidence["sm_clock_mhz"] < 0.9 * finding.evidence["peers_sm_clock_mhz"]


def test_a_slow_gpu_that_reports_no_reason_and_an_idle_fleet_are_no_throttling(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet["vela-001"].gpus.set_fault(0, "slow", clock_factor=0.6)
        busy = fleet.tick(2)
        for node in fleet.nodes:
            fleet.set_load(node.name, 0.0)
        idle = fleet.tick()

        assert reported(GpuThrottle(), store, busy) == set()
        assert reported(GpuThrottle(), store, idle) == set()


def test_reboots_and_scrape_gaps_are_no_gpu_faults(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet["vela-002"].gpus.set_fault(1, "ecc", dbe=3)
        fleet["vela-002"].gpus.clear_fault(1, "ecc")
        fleet.tick(3)
        fleet.restart("vela-002")  # volatile DBE counts start again from zero
        windows = [fleet.tick() for _ in range(2)]
        windows += [fleet.tick(skip={"vela-001"}) for _ in range(2)]
        windows.append(fleet.tick())

        for detector in (GpuFault(), GpuThrottle()):
            assert all(reported(detector, store, window) == set() for window in windows)

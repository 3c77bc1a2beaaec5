"""gpu_throttle on rows the real gpu collector reads from simulated GPUs, and neither GPU detector fooled
by reboots and scrape gaps (gpu_fault has its own tests: test_gpu_fault.py)."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import pytest

from analytics.detectors.base import Detector, Window
from analytics.detectors.gpu_fault import GpuFault
from analytics.detectors.gpu_throttle import GpuThrottle
from analytics.store import Store
from collectors.base import CollectorOptions
from collectors.gpu.backend import open_backend
from tests.support.fleetdata import SimulatedFleet, SimulatedNode


def brake_every_gpu(node: SimulatedNode) -> None:
    for gpu in range(len(node.gpus.identities())):
        node.gpus.set_fault(gpu, "power_brake")


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
    assert {"hw_thermal_slowdown", "sw_thermal_slowdown"} <= set(finding.evidence.reasons)
    assert finding.evidence.sm_clock_mhz < 0.75 * finding.evidence.peers_sm_clock_mhz
    assert finding.evidence.gpu_temp_c >= 90
    assert finding.score >= 0.25


def test_a_node_whose_every_gpu_throttles_is_one_finding_on_the_node_against_the_fleet(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet.tick(2)
        for gpu in range(4):
            fleet["vela-004"].gpus.set_fault(gpu, "thermal_throttle")
        window = fleet.tick()

        [finding] = GpuThrottle().detect(store, window)
    assert (finding.node, finding.component) == ("vela-004", "")
    assert finding.evidence.gpus_throttled == 4
    assert "HW Thermal Slowdown" in finding.evidence.reason_names
    assert finding.evidence.sm_clock_mhz < 0.75 * finding.evidence.fleet_peers_sm_clock_mhz


def test_a_power_brake_on_a_whole_node_names_the_brake_against_its_model_on_other_nodes(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path, gpus=8) as fleet:
        fleet.tick(2)
        brake_every_gpu(fleet["vela-001"])
        fleet["vela-002"].gpus.set_fault(5, "power_brake")  # one GPU braked: that GPU alone
        window = fleet.tick()

        found = {
            (finding.node, finding.component): finding for finding in GpuThrottle().detect(store, window)
        }
    assert found.keys() == {("vela-001", ""), ("vela-002", "gpu:5")}
    node = found["vela-001", ""]
    assert node.evidence.reasons == ("hw_power_brake_slowdown", "hw_slowdown")
    assert node.evidence.reason_names == ("HW Power Brake Slowdown", "HW Slowdown")
    assert node.evidence.gpus_throttled == 8 and node.score >= 0.7


def test_a_node_alone_of_its_model_is_judged_against_its_own_recent_past(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path, nodes=1, gpus=8) as fleet:
        fleet.tick(6)
        brake_every_gpu(fleet["vela-001"])
        window = fleet.tick()

        [finding] = GpuThrottle().detect(store, window)
    assert (finding.node, finding.component) == ("vela-001", "")
    assert finding.evidence.fleet_peers_sm_clock_mhz is None
    assert finding.evidence.past_sm_clock_mhz == 1980
    assert finding.evidence.sm_clock_mhz == 495


def test_the_real_power_braked_8_h100_node_stands_out_in_a_simulated_idle_h100_fleet(
    store: Store, tmp_path: Path, fixtures: Path
):
    """gpud's capture of 8 H100s, HW Slowdown and HW Power Brake Slowdown active on all, replayed through
    the real NVML code as one node among simulated idle H100s (345 MHz idle, as a healthy capture shows)."""
    capture = fixtures / "gpud/nvidia-smi-query.535.161.08.out.0.valid"
    braked = open_backend(CollectorOptions(gpu_backend=f"replay:{capture}"))
    with closing(braked), SimulatedFleet(store, tmp_path, gpus=8, real_gpus={"vela-002": braked}) as fleet:
        for node in fleet.nodes:
            fleet.set_load(node.name, 0.0)
        window = fleet.tick(3)

        [finding] = GpuThrottle().detect(store, window)
    assert (finding.node, finding.component) == ("vela-002", "")
    assert finding.evidence.gpus_throttled == 8
    assert finding.evidence.reason_names == ("HW Power Brake Slowdown", "HW Slowdown")
    assert (finding.evidence.sm_clock_mhz, finding.evidence.fleet_peers_sm_clock_mhz) == (86, 345)
    assert finding.evidence.peers == "idle GPUs" and finding.score == pytest.approx(1 - 86 / 345, abs=0.01)


def test_a_thermal_fault_on_an_idle_node_is_reported_against_the_idle_gpus(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet.set_load("vela-003", 0.0)  # no job on this node; the rest of the fleet is busy
        fleet.tick(2)
        fleet["vela-003"].gpus.set_fault(1, "thermal_throttle")
        window = fleet.tick()

        [finding] = GpuThrottle().detect(store, window)
    assert (finding.node, finding.component) == ("vela-003", "gpu:1")
    assert finding.evidence.peers == "idle GPUs" and finding.evidence.gpu_util_percent == 0
    assert finding.evidence.sm_clock_mhz < 0.9 * finding.evidence.peers_sm_clock_mhz


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

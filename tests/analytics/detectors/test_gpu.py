"""gpu_throttle and gpu_fault on rows the real gpu and xid collectors read from simulated GPUs."""

from __future__ import annotations

from pathlib import Path

from analytics.detectors.base import Detector, Window
from analytics.detectors.gpu import GpuFault, GpuThrottle
from analytics.detectors.runner import DetectionRunner
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


def test_xids_a_lost_gpu_and_a_failed_row_remap_are_each_reported_on_their_gpu(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet.tick(2)
        fleet["vela-001"].gpus.set_fault(2, "xid", code=13)
        fleet["vela-002"].gpus.set_fault(1, "gpu_lost")
        fleet["vela-003"].gpus.set_fault(0, "ecc", dbe=2, remap_failure=True)
        onset = fleet.tick()
        later = fleet.tick()

        found = {(f.node, f.component): f.evidence for f in GpuFault().detect(store, onset)}
        assert found == {
            ("vela-001", "gpu:2"): {"signals": ["xid"], "xid_codes": [13]},
            ("vela-002", "gpu:1"): {
                "signals": ["lost", "xid"],
                "lost": "fleetlens_gpu_up 0",
                "xid_codes": [79],
            },
            ("vela-003", "gpu:0"): {
                "signals": ["ecc_dbe", "row_remap_failure"],
                "ecc_dbe_errors": 2,
                "row_remap_failure": 1,
            },
        }
        # the Xid was a moment; the lost GPU and the failed remap last
        assert reported(GpuFault(), store, later) == {("vela-002", "gpu:1"), ("vela-003", "gpu:0")}


def test_a_gpu_missing_after_a_reboot_is_lost_while_its_node_reports(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet.tick(3)
        fleet.restart("vela-003", gpus=3)
        window = fleet.tick()

        [finding] = GpuFault().detect(store, window)
        assert (finding.node, finding.component) == ("vela-003", "gpu:3")
        assert finding.evidence == {"signals": ["lost"], "lost": "no series while the node reports"}
        assert reported(GpuFault(), store, fleet.tick(skip={"vela-003"})) == set()


def test_the_runner_keeps_a_lost_gpu_open_while_it_is_lost(store: Store, tmp_path: Path):
    runner = DetectionRunner([GpuFault()])
    with SimulatedFleet(store, tmp_path, nodes=2) as fleet:
        fleet.tick()
        fleet["vela-001"].gpus.set_fault(0, "gpu_lost")
        [opened] = runner.step(store, fleet.tick())
        lost = [runner.step(store, fleet.tick()) for _ in range(8)]

    assert (opened.node, opened.component, opened.severity, opened.end) == (
        "vela-001",
        "gpu:0",
        "critical",
        None,
    )
    assert all(anomaly.end is None for changed in lost for anomaly in changed)


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

"""congestion on the ECN and CNP counters the real infiniband collector reads from simulated RoCE ports."""

from __future__ import annotations

from pathlib import Path

from analytics.detectors.base import Window
from analytics.detectors.congestion import Congestion
from analytics.store import Store
from tests.support.fleetdata import SimulatedFleet


def reported(store: Store, window: Window) -> set[tuple[str, str]]:
    return {(finding.node, finding.component) for finding in Congestion().detect(store, window)}


def test_a_congested_port_is_reported_as_information_with_its_rates_against_the_fleet(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet.tick(2)
        fleet["vela-003"].sysfs.set_congestion(1, 0.2)
        window = fleet.tick()

        [finding] = Congestion().detect(store, window)
    assert (finding.kind, finding.node, finding.component) == ("congestion", "vela-003", "mlx5_1:1")
    assert finding.severity == "info"
    evidence = finding.evidence
    assert evidence.ecn_marks_per_s > 100 * evidence.fleet_median_per_s
    assert evidence.cnp_sent_per_s > 0 and evidence.cnp_handled_per_s > 0
    assert finding.score > Congestion().min_score


def test_a_fabric_congested_everywhere_alike_and_a_quiet_one_report_nothing(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        for node in fleet.nodes:
            for nic in range(2):
                node.sysfs.set_congestion(nic, 0.5)
        everywhere = fleet.tick(2)
        for node in fleet.nodes:
            fleet.set_load(node.name, 0.05)
            for nic in range(2):
                node.sysfs.set_congestion(nic, 0.0)
        quiet = fleet.tick(2)

        assert reported(store, everywhere) == set()
        assert reported(store, quiet) == set()


def test_reboots_and_scrape_gaps_are_no_congestion(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet.tick(6)
        fleet.restart("vela-002")
        windows = [fleet.tick() for _ in range(2)]
        windows += [fleet.tick(skip={"vela-004"}) for _ in range(3)]
        windows.append(fleet.tick())

        assert all(reported(store, window) == set() for window in windows)

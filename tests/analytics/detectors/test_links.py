"""link_flap and link_down on rows the real collectors read from simulated /sys trees."""

from __future__ import annotations

from pathlib import Path

from analytics.detectors.base import Detector, Window
from analytics.detectors.links import LinkDown, LinkFlap
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
from tests.support.fleetdata import SimulatedFleet


def reported(detector: Detector, store: Store, window: Window) -> set[tuple[str, str]]:
    return {(finding.node, finding.component) for finding in detector.detect(store, window)}


def flap(fleet: SimulatedFleet, node: str, nic: int) -> None:
    """A link that goes down and comes back between two scrapes: only its counters can tell."""
    fleet[node].sysfs.set_link(nic, up=False)
    fleet[node].sysfs.set_link(nic, up=True)


def test_a_flap_between_two_scrapes_is_reported_in_that_window_on_that_port(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet.tick(3)
        flap(fleet, "vela-002", 1)
        window = fleet.tick()

        [finding] = LinkFlap().detect(store, window)
        assert (finding.kind, finding.node, finding.component) == ("link_flap", "vela-002", "mlx5_1:1")
        assert finding.evidence["link_downed"] == 1 and finding.evidence["state"] == 4
        assert LinkDown().detect(store, window) == []


def test_a_flap_a_scrape_caught_down_is_reported_one_interval_later_when_the_link_is_back(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet.tick(3)
        fleet["vela-003"].sysfs.set_link(0, up=False)
        caught_down = fleet.tick()
        fleet["vela-003"].sysfs.set_link(0, up=True)
        back = fleet.tick()

        assert reported(LinkFlap(), store, caught_down) == set()
        [finding] = LinkFlap().detect(store, back)
        assert (finding.node, finding.component) == ("vela-003", "mlx5_0:1")
        assert finding.evidence["state_falls"] == 1


def test_the_runner_opens_a_flap_in_the_window_of_the_first_flap_and_keeps_it_through_the_next(
    store: Store, tmp_path: Path
):
    runner = DetectionRunner([LinkFlap()])
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        quiet = [fleet.tick() for _ in range(3)]
        assert [runner.step(store, window) for window in quiet] == [[], [], []]
        flap(fleet, "vela-004", 0)
        [opened] = runner.step(store, fleet.tick())
        for _ in range(3):  # flapping every 30 s, as a bad transceiver does
            fleet.tick(2)
            flap(fleet, "vela-004", 0)
            changed = runner.step(store, fleet.tick())
            assert all(anomaly.end is None for anomaly in changed)

    assert (opened.kind, opened.node, opened.component) == ("link_flap", "vela-004", "mlx5_0:1")
    assert opened.start == quiet[-1].end and opened.end is None


def test_a_link_down_for_a_minute_and_a_half_is_link_down_from_its_first_minute_and_its_return_is_no_flap(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet.tick(3)
        fleet["vela-001"].sysfs.set_link(1, up=False)
        down = [fleet.tick() for _ in range(9)]
        fleet["vela-001"].sysfs.set_link(1, up=True)
        back = [fleet.tick() for _ in range(3)]

        link_down = [LinkDown().detect(store, window) for window in down + back]
        assert [bool(found) for found in link_down] == [False] * 5 + [True] * 4 + [False] * 3
        assert {(f.node, f.component) for found in link_down for f in found} == {("vela-001", "mlx5_1:1")}
        assert [f.evidence["down_s"] for found in link_down for f in found] == [60, 60, 60, 60]
        assert all(reported(LinkFlap(), store, window) == set() for window in down + back)


def test_a_link_down_for_half_a_minute_is_a_flap_when_it_is_back_and_no_link_down(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet.tick(3)
        fleet["vela-001"].sysfs.set_link(1, up=False)
        down = [fleet.tick() for _ in range(3)]
        fleet["vela-001"].sysfs.set_link(1, up=True)
        back = fleet.tick()

        assert all(LinkDown().detect(store, window) == [] for window in [*down, back])
        assert all(reported(LinkFlap(), store, window) == set() for window in down)
        [finding] = LinkFlap().detect(store, back)
        assert (finding.node, finding.component, finding.score) == ("vela-001", "mlx5_1:1", 1)


def test_a_reboot_that_zeroes_the_counters_of_a_port_that_flapped_before_is_no_flap(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        for _ in range(2):
            flap(fleet, "vela-002", 0)
        fleet.tick(6)
        fleet.restart("vela-002")
        windows = [fleet.tick() for _ in range(4)]

        for detector in (LinkFlap(), LinkDown()):
            assert all(reported(detector, store, window) == set() for window in windows)


def test_a_scrape_gap_is_no_flap_but_a_flap_inside_it_is_reported_when_the_node_is_back(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet.tick(3)
        gap = [fleet.tick(skip={"vela-001", "vela-002"}) for _ in range(3)]
        flap(fleet, "vela-002", 1)
        after = fleet.tick(skip={"vela-001", "vela-002"})
        returned = fleet.tick()

        for detector in (LinkFlap(), LinkDown()):
            assert all(reported(detector, store, window) == set() for window in [*gap, after])
        assert reported(LinkFlap(), store, returned) == {("vela-002", "mlx5_1:1")}
        assert reported(LinkDown(), store, returned) == set()

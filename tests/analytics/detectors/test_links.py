"""link_flap and link_down on rows the real collectors read from simulated /sys trees."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from analytics.detectors import links as links_module
from analytics.detectors.base import Detector, Window
from analytics.detectors.counters import LOOKBACK_S
from analytics.detectors.links import IGNORED_INTERFACES, LinkDown, LinkFlap, links
from analytics.detectors.runner import DetectionRunner, _SharedQueries
from analytics.detectors.steptape import StepTape
from analytics.detectors.tape import Tape
from analytics.evidence import LinkDownEvidence
from analytics.store import Store
from analytics.store.records import ScrapeBatch
from collectors import registry
from collectors.base import CollectorOptions
from collectors.exporter import Exporter
from collectors.textformat import render
from hub.expfmt import ExpositionParser
from tests.support.fleetdata import HOUR_S, SimulatedFleet


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
        assert finding.evidence.link_downed == 1 and finding.evidence.state == 4
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
        assert finding.evidence.state_falls == 1


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


def test_in_one_window_link_flap_and_link_down_compute_the_links_once_and_find_what_each_finds_alone(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    computed = []
    real = links_module._links
    monkeypatch.setattr(links_module, "_links", lambda *args: computed.append(args) or real(*args))
    detectors = [LinkFlap(min_flaps=0), LinkDown(min_down_s=0)]  # every link a finding
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet.tick(3)
        fleet["vela-001"].sysfs.set_link(1, up=False)
        flap(fleet, "vela-002", 0)
        window = fleet.tick()
        shared = _SharedQueries(store, Tape(), StepTape())  # what the runner's step hands its detectors
        together = [detector.judge(shared, window).findings for detector in detectors]
        assert len(computed) == 1
        apart = [detector.judge(store, window).findings for detector in detectors]

    assert len(computed) == 3
    assert together == apart and all(len(found) == 2 * len(fleet.nodes) for found in together)  # 2 ports each
    first = links(shared, window, LOOKBACK_S, IGNORED_INTERFACES)
    first["down_s"] = -1.0  # what one caller does to its frame, the next does not see
    assert (links(shared, window, LOOKBACK_S, IGNORED_INTERFACES)["down_s"] >= 0).all()


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
        assert [f.evidence.down_s for found in link_down for f in found] == [60, 60, 60, 60]
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


LOOPBACK = {
    "address": "00:00:00:00:00:00",
    "broadcast": "00:00:00:00:00:00",
    "carrier": "1",
    "carrier_changes": "0",
    "carrier_down_count": "0",
    "carrier_up_count": "0",
    "flags": "0x9",
    "ifindex": "1",
    "mtu": "65536",
    "operstate": "unknown",
    "type": "772",  # ARPHRD_LOOPBACK
}
VETH = {
    "address": "02:42:ac:11:00:02",
    "broadcast": "ff:ff:ff:ff:ff:ff",
    "duplex": "full",
    "flags": "0x1003",
    "ifindex": "4",
    "mtu": "1500",
    "speed": "10000",
    "type": "1",  # ARPHRD_ETHER
}


class NetdevNode:
    """A node whose /sys has network interfaces and no class/infiniband: `lo` and a veth-like link
    `interface`, read by the real netclass collector and stored as the hub stores a scrape, one scrape
    per tick of 10 s (from an hour ago, which the store's retention keeps). A carrier change counts as
    the kernel counts it: carrier_up_count or carrier_down_count, and carrier_changes, their sum."""

    interval_s = 10.0

    def __init__(
        self, store: Store, root: Path, name: str = "fl-demo", interface: str = "fl-demo-a0"
    ) -> None:
        self.store = store
        self.name = name
        self.interface = interface
        self.now = math.floor((time.time() - HOUR_S) / self.interval_s) * self.interval_s
        self.sysfs = root / "sys"
        self.carrier, self.ups, self.downs = True, 1, 1
        self._write("lo", LOOPBACK)
        self._write(interface, VETH)
        self._write_carrier()
        self.exporter = Exporter(
            registry.build(("netclass",), CollectorOptions(sysfs_root=self.sysfs, node=name))
        )
        self.parser = ExpositionParser()

    def set_carrier(self, up: bool) -> None:
        if up != self.carrier:
            self.carrier = up
            self.ups, self.downs = (self.ups + 1, self.downs) if up else (self.ups, self.downs + 1)
            self._write_carrier()

    def flap(self) -> None:
        """Carrier lost and back between two scrapes: only the counters can tell."""
        self.set_carrier(False)
        self.set_carrier(True)

    def tick(self, count: int = 1) -> Window:
        """Scrape and store `count` times, an interval apart; returns the window of the last scrape."""
        for _ in range(count):
            self.now += self.interval_s
            exposition = self.parser.parse(render(self.exporter.collect()).decode())
            batch = ScrapeBatch(
                f"{self.name}:9100",
                self.name,
                self.now,
                exposition.names,
                exposition.labels,
                exposition.values,
            )
            self.store.insert_samples([batch], token=f"netdev/{self.name}/{self.now}")
        return Window(self.now, self.now + self.interval_s)

    def _write_carrier(self) -> None:
        self._write(
            self.interface,
            {
                "carrier": "1" if self.carrier else "0",
                "carrier_changes": str(self.ups + self.downs),
                "carrier_up_count": str(self.ups),
                "carrier_down_count": str(self.downs),
                "operstate": "up" if self.carrier else "down",
            },
        )

    def _write(self, interface: str, files: dict[str, str]) -> None:
        directory = self.sysfs / "class" / "net" / interface
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (directory / name).write_text(text + "\n")


def test_an_interface_of_a_node_without_rdma_ports_that_flapped_between_scrapes_is_a_flap_on_it(
    store: Store, tmp_path: Path
):
    node = NetdevNode(store, tmp_path)
    quiet = node.tick(3)
    node.flap()
    window = node.tick()

    assert set(links(store, window, LOOKBACK_S, IGNORED_INTERFACES).component) == {"fl-demo-a0"}  # no lo
    assert reported(LinkFlap(), store, quiet) == set()
    [finding] = LinkFlap().detect(store, window)
    assert (finding.kind, finding.node, finding.component) == ("link_flap", "fl-demo", "fl-demo-a0")
    assert finding.evidence.carrier == 1 and finding.evidence.link_downed == 1
    assert finding.evidence.state is None
    assert LinkDown().detect(store, window) == []


def test_an_interface_a_scrape_caught_without_carrier_is_a_flap_when_it_is_back(store: Store, tmp_path: Path):
    node = NetdevNode(store, tmp_path)
    node.tick(3)
    node.set_carrier(False)
    caught_down = node.tick()
    node.set_carrier(True)
    back = node.tick()

    assert reported(LinkFlap(), store, caught_down) == set()
    [finding] = LinkFlap().detect(store, back)
    assert finding.component == "fl-demo-a0"
    assert finding.evidence.state_falls == 1 and finding.evidence.carrier == 1


def test_an_interface_without_carrier_for_a_minute_and_a_half_is_link_down_and_its_return_is_no_flap(
    store: Store, tmp_path: Path
):
    node = NetdevNode(store, tmp_path)
    node.tick(3)
    node.set_carrier(False)
    down = [node.tick() for _ in range(9)]
    node.set_carrier(True)
    back = [node.tick() for _ in range(3)]

    link_down = [LinkDown().detect(store, window) for window in down + back]
    assert [bool(found) for found in link_down] == [False] * 5 + [True] * 4 + [False] * 3
    assert {(f.node, f.component) for found in link_down for f in found} == {("fl-demo", "fl-demo-a0")}
    assert [f.evidence for found in link_down for f in found] == [LinkDownEvidence(down_s=60, carrier=0)] * 4
    assert all(reported(LinkFlap(), store, window) == set() for window in down + back)


def write_carrier(fleet: SimulatedFleet, node: str, interface: str, up: bool, downs: int) -> None:
    """Set an interface's carrier in a simulated node's /sys without touching its RDMA port."""
    directory = fleet[node].sysfs.root / "class" / "net" / interface
    (directory / "carrier").write_text("1\n" if up else "0\n")
    (directory / "operstate").write_text("up\n" if up else "down\n")
    (directory / "carrier_down_count").write_text(f"{downs}\n")


def test_on_a_roce_node_interfaces_are_not_judged_only_its_ports(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        roce_netdev = fleet["vela-001"].sysfs.ports[1].netdev
        fleet.tick(3)
        write_carrier(fleet, "vela-001", roce_netdev, up=True, downs=5)  # flapped, the port did not
        write_carrier(fleet, "vela-002", "eth0", up=False, downs=2)
        windows = [fleet.tick() for _ in range(9)]
        write_carrier(fleet, "vela-002", "eth0", up=True, downs=2)
        windows += [fleet.tick() for _ in range(3)]

        for detector in (LinkFlap(), LinkDown()):
            assert all(reported(detector, store, window) == set() for window in windows)


def test_a_bridge_without_carrier_is_no_link_down_but_an_ethernet_port_without_carrier_is(
    store: Store, tmp_path: Path
):
    bridge = NetdevNode(store, tmp_path / "bridge", name="plain-1", interface="docker0")
    port = NetdevNode(store, tmp_path / "port", name="plain-2", interface="eth1")
    for node in (bridge, port):
        node.set_carrier(False)  # nothing attached to the bridge; the port's cable out
        window = node.tick(9)

    assert reported(LinkDown(), store, window) == {("plain-2", "eth1")}
    only_eth_ignored = LinkDown(ignored_interfaces=r"^(lo|eth\d+)$")  # what an operator may choose
    assert reported(only_eth_ignored, store, window) == {("plain-1", "docker0")}

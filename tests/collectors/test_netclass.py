"""The netclass collector on node_exporter's fixture tree and on copies of it broken as sysfs breaks.

Values equal to node_exporter's (flags in hex, speed in bytes, ignored devices, invalid speeds) are
checked in test_node_exporter_conformance; these tests cover the admin state and bad input.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collectors.base import ReadErrors
from collectors.netclass import NetClassCollector
from tests.support.exposition import SampleKey, key, parse_samples, render
from tests.support.trees import as_dangling_link, as_directory, assert_breaking_loses_only, containing


def scrape(sysfs_root: Path) -> tuple[dict[SampleKey, float], ReadErrors]:
    errors = ReadErrors("netclass")
    return parse_samples(render(NetClassCollector(sysfs_root, errors))), errors


@pytest.fixture
def net_copy(node_exporter_sys, tmp_path) -> Path:
    """A private copy of the fixture's class/net (bond0, dmz, eth0, int), eth0's link resolved; sysfs root."""
    root = tmp_path / "sys"
    shutil.copytree(node_exporter_sys / "class" / "net", root / "class" / "net")
    return root


def info(samples: dict[SampleKey, float], device: str) -> dict[str, str]:
    [labels] = [
        dict(labels)
        for name, labels in samples
        if name == "node_network_info" and ("device", device) in labels
    ]
    return labels


def test_interface_taken_down_by_an_operator(net_copy):
    eth0 = net_copy / "class" / "net" / "eth0"
    (eth0 / "flags").write_text("0x1002\n")  # IFF_UP cleared
    (eth0 / "operstate").write_text("down\n")
    samples, errors = scrape(net_copy)
    assert samples[key("node_network_up", device="eth0")] == 0
    assert info(samples, "eth0")["adminstate"] == "down"
    assert samples[key("node_network_up", device="bond0")] == 1
    assert info(samples, "bond0")["adminstate"] == "up"
    assert errors.count == 0


def test_attributes_a_driver_lacks_are_absent_not_errors(net_copy, caplog):
    eth0 = net_copy / "class" / "net" / "eth0"
    (eth0 / "speed").unlink()  # virtual interfaces have no speed
    (eth0 / "carrier_up_count").unlink()  # kernels before 4.16 have no carrier_up_count
    samples, errors = scrape(net_copy)
    assert key("node_network_speed_bytes", device="eth0") not in samples
    assert key("node_network_carrier_up_changes_total", device="eth0") not in samples
    assert samples[key("node_network_mtu_bytes", device="eth0")] == 1500
    assert errors.count == 0
    assert not caplog.records


def test_no_net_directory_means_no_interfaces(tmp_path, caplog):
    samples, errors = scrape(tmp_path)
    assert samples == {}
    assert errors.count == 0
    assert not caplog.records


def every_sample_of(device: str):
    return lambda pristine: {k for k in pristine if ("device", device) in k[1]}


def samples_named(*names: str, device: str):
    return lambda pristine: {k for k in pristine if k[0] in names and ("device", device) in k[1]}


# case -> (file below class/net, how it breaks, the samples that costs, what the log says is lost)
BAD_INPUT = {
    "non-numeric mtu": (
        "eth0/mtu",
        containing("1500 bytes"),
        samples_named("node_network_mtu_bytes", device="eth0"),
        'node_network_mtu_bytes{device="eth0"}',
    ),
    "counter is a directory": (
        "bond0/carrier_changes",
        as_directory,
        samples_named("node_network_carrier_changes_total", device="bond0"),
        'node_network_carrier_changes_total{device="bond0"}',
    ),
    "address is a dangling link": (
        "int/address",
        as_dangling_link,
        samples_named("node_network_up", "node_network_info", device="int"),
        'node_network_up and node_network_info{device="int"}',
    ),
    "interface vanished": (
        "eth0",
        as_dangling_link,
        every_sample_of("eth0"),
        "every sample of network device eth0",
    ),
}


@pytest.mark.parametrize(("relative", "breaks", "lost", "logged"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_skips_only_its_samples(net_copy, caplog, relative, breaks, lost, logged):
    path = net_copy / "class" / "net" / relative
    assert_breaking_loses_only(scrape, net_copy, path, breaks, lost, logged, caplog)

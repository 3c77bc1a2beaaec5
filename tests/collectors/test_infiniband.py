"""The infiniband collector on real fixture trees and on copies of them broken in the ways sysfs breaks.

Values equal to node_exporter's are checked in test_node_exporter_conformance; these tests cover what
node_exporter 1.5 lacks (hw counters, port to netdev) and what it does with bad input.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from collectors import sysfs
from collectors.base import ReadErrors
from collectors.infiniband import InfiniBandCollector
from tests.support.exposition import SampleKey, key, parse_samples, render
from tests.support.trees import as_dangling_link, as_directory, assert_breaking_loses_only, containing


def scrape(sysfs_root: Path) -> tuple[dict[SampleKey, float], ReadErrors]:
    errors = ReadErrors("infiniband")
    return parse_samples(render(InfiniBandCollector(sysfs_root, errors))), errors


def port(device: str, number: str = "1") -> dict[str, str]:
    return {"device": device, "port": number}


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@pytest.fixture
def ib_copy(procfs_sys, tmp_path) -> Path:
    """A private copy of the procfs tree's class/infiniband (hfi1_0, mlx4_0, mlx5_0); the sysfs root."""
    root = tmp_path / "sys"
    shutil.copytree(procfs_sys / "class" / "infiniband", root / "class" / "infiniband", symlinks=True)
    return root


def test_mlx5_hw_counters_under_newer_node_exporter_names(procfs_sys):
    samples, errors = scrape(procfs_sys)
    mlx5 = port("mlx5_0")
    assert samples[key("node_infiniband_local_ack_timeout_errors_total", **mlx5)] == 131
    assert samples[key("node_infiniband_req_cqes_errors_total", **mlx5)] == 3481
    assert samples[key("node_infiniband_resp_cqes_flush_errors_total", **mlx5)] == 4708
    assert samples[key("node_infiniband_out_of_sequence_packets_received_total", **mlx5)] == 1
    assert samples[key("node_infiniband_packet_sequence_errors_total", **mlx5)] == 1
    assert samples[key("node_infiniband_roce_adp_retransmits_total", **mlx5)] == 99
    assert samples[key("node_infiniband_roce_adp_retransmits_timeout_total", **mlx5)] == 4
    assert samples[key("node_infiniband_roce_slow_restart_cnps_total", **mlx5)] == 131
    assert samples[key("node_infiniband_lifespan_seconds", **mlx5)] == pytest.approx(0.010)  # 10 ms
    assert errors.count == 0


def real_connectx_counters(fixtures: Path) -> dict[str, int]:
    """The hw counters of a real ConnectX port (OCI's mlx5_2): name -> value, from `rdma statistic`."""
    text = (fixtures / "oci-tutorials" / "mlx5_2-rdma-statistic.txt").read_text()
    [line] = [line for line in text.splitlines() if line.startswith("link mlx5_2/1 ")]
    words = line.split()[2:]
    return {name: int(value) for name, value in zip(words[::2], words[1::2], strict=True)}


def test_every_hw_counter_of_a_real_connectx_port_gets_a_node_exporter_name(fixtures, tmp_path):
    counters = real_connectx_counters(fixtures)
    port_dir = tmp_path / "class" / "infiniband" / "mlx5_2" / "ports" / "1"
    port_files = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "100 Gb/sec (4X EDR)"}
    for name, text in {**port_files, "link_layer": "Ethernet"}.items():
        write(port_dir / name, text)
    for name, value in counters.items():
        write(port_dir / "hw_counters" / name, str(value))

    samples, errors = scrape(tmp_path)
    hw = {name: value for (name, labels), value in samples.items() if name.endswith("_total")}
    assert len(hw) == len(counters) == 29
    assert not [name for name in hw if name.startswith("node_infiniband_hw_")], "fell to the generic rule"
    assert hw["node_infiniband_rx_write_requests_total"] == counters["rx_write_requests"] == 18747
    for congestion in (
        "np_cnp_packets_sent",
        "np_ecn_marked_roce_packets_received",
        "rp_cnp_packets_handled",
    ):
        assert f"node_infiniband_{congestion}_total" in hw
    assert errors.count == 0


def test_hw_counters_without_a_node_exporter_name_follow_the_generic_rule(ib_copy):
    hw_dir = ib_copy / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "hw_counters"
    write(hw_dir / "ip4InOctets", "123")  # irdma's camel case
    write(hw_dir / "rx-vport.rdma", "7")
    samples, errors = scrape(ib_copy)
    assert samples[key("node_infiniband_hw_ip4_in_octets_total", **port("mlx5_0"))] == 123
    assert samples[key("node_infiniband_hw_rx_vport_rdma_total", **port("mlx5_0"))] == 7
    assert errors.count == 0


def test_no_pma_counters_are_absent_not_errors(node_exporter_sys, caplog):
    samples, errors = scrape(node_exporter_sys)
    i40iw = {name for name, labels in samples if ("device", "i40iw0") in labels}
    assert i40iw == {
        "node_infiniband_info",
        "node_infiniband_state_id",
        "node_infiniband_physical_state_id",
        "node_infiniband_rate_bytes_per_second",
        "fleetlens_infiniband_port_info",
    }
    assert errors.count == 0
    assert not caplog.records


def test_no_infiniband_directory_means_no_hardware(tmp_path, caplog):
    samples, errors = scrape(tmp_path)
    assert samples == {}
    assert errors.count == 0
    assert not caplog.records


def port_info(samples: dict[SampleKey, float], device: str, number: str) -> dict[str, str]:
    [labels] = [
        dict(labels)
        for name, labels in samples
        if name == "fleetlens_infiniband_port_info" and {("device", device), ("port", number)} <= labels
    ]
    return labels


def test_roce_port_netdev_from_gid_table(ib_copy):
    port_dir = ib_copy / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    write(port_dir / "link_layer", "Ethernet")
    write(port_dir / "gid_attrs" / "ndevs" / "0", "ens10f0np0")
    samples, _ = scrape(ib_copy)
    assert port_info(samples, "mlx5_0", "1")["netdev"] == "ens10f0np0"
    assert port_info(samples, "mlx5_0", "1")["link_layer"] == "Ethernet"


def test_ipoib_port_netdev_from_the_pci_function(ib_copy):
    """Without a GID netdev, the netdevs of the same PCI device; mlx4 numbers ports in dev_id."""
    pci = ib_copy / "devices" / "pci0000:00" / "0000:00:02.0" / "0000:05:00.0"
    for netdev, dev_id, dev_port in (("ib0", "0x0", "0"), ("ib0.8001", "0x0", "0"), ("ib1", "0x1", "0")):
        write(pci / "net" / netdev / "dev_id", dev_id)
        write(pci / "net" / netdev / "dev_port", dev_port)
    (ib_copy / "class" / "infiniband" / "mlx4_0" / "device").symlink_to(pci)
    samples, errors = scrape(ib_copy)
    assert port_info(samples, "mlx4_0", "1")["netdev"] == "ib0"
    assert port_info(samples, "mlx4_0", "2")["netdev"] == "ib1"
    assert port_info(samples, "mlx5_0", "1")["netdev"] == ""  # sysfs names none
    assert errors.count == 0


def sample(metric: str, device: str, number: str):
    return lambda pristine: {key(metric, **port(device, number))}


def every_sample_of(device: str, number: str | None = None, keep: tuple[str, ...] = ()):
    labels = {("device", device)} | ({("port", number)} if number else set())
    return lambda pristine: {k for k in pristine if labels <= k[1] and k[0] not in keep}


PORT_ATTRIBUTES = (
    "node_infiniband_state_id",
    "node_infiniband_physical_state_id",
    "node_infiniband_rate_bytes_per_second",
    "fleetlens_infiniband_port_info",
)

# case -> (file below class/infiniband, how it breaks, the samples that costs, what the log says is lost)
BAD_INPUT = {
    "counter is a directory": (
        "mlx5_0/ports/1/counters/port_xmit_data",
        as_directory,
        sample("node_infiniband_port_data_transmitted_bytes_total", "mlx5_0", "1"),
        'node_infiniband_port_data_transmitted_bytes_total{device="mlx5_0",port="1"}',
    ),
    "counter is a dangling link": (
        "mlx4_0/ports/2/counters/symbol_error",
        as_dangling_link,
        sample("node_infiniband_symbol_error_total", "mlx4_0", "2"),
        'node_infiniband_symbol_error_total{device="mlx4_0",port="2"}',
    ),
    "non-numeric hw counter": (
        "mlx5_0/ports/1/hw_counters/out_of_sequence",
        containing("garbage"),
        sample("node_infiniband_out_of_sequence_packets_received_total", "mlx5_0", "1"),
        "node_infiniband_out_of_sequence_packets_received_total",
    ),
    "negative counter": (
        "hfi1_0/ports/1/counters/link_downed",
        containing("-1"),
        sample("node_infiniband_link_downed_total", "hfi1_0", "1"),
        "node_infiniband_link_downed_total",
    ),
    "empty hw counter": (
        "mlx5_0/ports/1/hw_counters/rx_write_requests",
        containing(""),
        sample("node_infiniband_rx_write_requests_total", "mlx5_0", "1"),
        "node_infiniband_rx_write_requests_total",
    ),
    "state without its number": (
        "mlx4_0/ports/1/state",
        containing("ACTIVE"),
        sample("node_infiniband_state_id", "mlx4_0", "1"),
        "node_infiniband_state_id",
    ),
    "rate without a unit": (
        "hfi1_0/ports/1/rate",
        containing("fast"),
        sample("node_infiniband_rate_bytes_per_second", "hfi1_0", "1"),
        "node_infiniband_rate_bytes_per_second",
    ),
    "board_id is a directory": (
        "mlx5_0/board_id",
        as_directory,
        lambda pristine: {
            k for k in pristine if k[0] == "node_infiniband_info" and ("device", "mlx5_0") in k[1]
        },
        'node_infiniband_info{device="mlx5_0"}',
    ),
    "port counters vanished": (
        "mlx4_0/ports/1/counters",
        as_dangling_link,
        every_sample_of("mlx4_0", "1", keep=PORT_ATTRIBUTES),
        "every counter in",
    ),
    "device vanished": (
        "mlx4_0",
        as_dangling_link,
        every_sample_of("mlx4_0"),
        "every sample of InfiniBand device mlx4_0",
    ),
}


@pytest.mark.parametrize(("relative", "breaks", "lost", "logged"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_skips_only_its_samples(ib_copy, caplog, relative, breaks, lost, logged):
    path = ib_copy / "class" / "infiniband" / relative
    assert_breaking_loses_only(scrape, ib_copy, path, breaks, lost, logged, caplog)


def test_device_removed_between_listing_and_reading(ib_copy, caplog, monkeypatch):
    pristine, _ = scrape(ib_copy)
    list_dir = sysfs.list_dir

    def list_then_unplug_mlx4(path: str, **kwargs) -> list[str] | None:
        names = list_dir(path, **kwargs)
        if path.endswith("class/infiniband"):
            shutil.rmtree(os.path.join(path, "mlx4_0"))
        return names

    monkeypatch.setattr(sysfs, "list_dir", list_then_unplug_mlx4)
    samples, errors = scrape(ib_copy)

    assert samples == {k: v for k, v in pristine.items() if ("device", "mlx4_0") not in k[1]}
    assert errors.count == 1
    assert "mlx4_0: vanished" in caplog.text


def test_port_directory_without_a_number_is_reported_and_skipped(ib_copy, caplog):
    pristine, _ = scrape(ib_copy)
    odd = ib_copy / "class" / "infiniband" / "mlx5_0" / "ports" / "uplink"
    shutil.copytree(odd.parent / "1", odd)
    samples, errors = scrape(ib_copy)
    assert samples == pristine
    assert errors.count == 1
    assert str(odd) in caplog.text

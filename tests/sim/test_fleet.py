"""A simulated fleet served on loopback: one exporter per node, as a hub or Prometheus scrapes them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from collectors.gpu.sim import ManualClock
from sim.fleet import SimFleet
from tests.conftest import REPO
from tests.support.exposition import SampleKey, key, parse_samples, scrape

NAMES = ["vela-001", "vela-002", "vela-003"]
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def get(address: str, accept: str = "") -> tuple[bytes, str]:
    """One scrape of a node: body and content type."""
    request = urllib.request.Request(f"http://{address}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read(), response.headers["Content-Type"]


def label_values(samples: dict[SampleKey, float], label: str) -> set[str]:
    return {value for _, labels in samples for name, value in labels if name == label}


def assert_closed(address: str) -> None:
    """Nothing listens on the port any more, and a new server may bind it."""
    host, port = address.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), timeout=2):
        pass
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as every HTTP server sets it
        sock.bind((host, int(port)))


def test_each_node_is_its_own_exporter(tmp_path):
    with SimFleet(3, tmp_path) as fleet:
        fleet.write_file_sd(tmp_path / "targets.json")
        file_sd = json.loads((tmp_path / "targets.json").read_text())
        bodies = {node.name: scrape(f"http://{node.address}/metrics") for node in fleet.nodes}

    assert [group["labels"] for group in file_sd] == [{"node": name} for name in NAMES]
    addresses = [address for group in file_sd for address in group["targets"]]
    assert len(set(addresses)) == 3, "one port per node"
    assert all(address.startswith("127.0.0.1:") for address in addresses)
    assert len(set(bodies.values())) == 3, "nodes differ as real ones do"
    for name, body in bodies.items():
        samples = parse_samples(body)
        temperatures = {k: v for k, v in samples.items() if k[0] == "DCGM_FI_DEV_GPU_TEMP"}
        assert label_values(temperatures, "Hostname") == {name}
        assert label_values(temperatures, "gpu") == {str(gpu) for gpu in range(8)}
        assert label_values(samples, "netdev") == {"ens1f0np0", "ens2f0np0", "ens3f0np0", "ens4f0np0"}
        for collector in ("gpu", "infiniband", "netclass"):
            assert samples[key("fleetlens_exporter_collector_success", collector=collector)] == 1
            assert samples[key("fleetlens_exporter_read_errors_total", collector=collector)] == 0


def test_stop_frees_every_port(tmp_path):
    fleet = SimFleet(2, tmp_path).start()
    addresses = [node.address for node in fleet.nodes]
    for address in addresses:
        get(address)
    fleet.stop()
    assert fleet.targets == []
    for address in addresses:
        assert_closed(address)


def test_counters_grow_between_scrapes_and_faults_show_at_once(tmp_path):
    with SimFleet(1, tmp_path, nics=1) as fleet:
        [node] = fleet.nodes

        def scraped(name: str, **labels: str) -> float:
            return parse_samples(scrape(f"http://{node.address}/metrics"))[key(name, **labels)]

        received = "node_infiniband_port_data_received_bytes_total"
        first = scraped(received, device="mlx5_0", port="1")
        deadline = time.monotonic() + 5  # the fleet's own thread advances the trees every second
        while scraped(received, device="mlx5_0", port="1") == first and time.monotonic() < deadline:
            time.sleep(0.1)
        assert scraped(received, device="mlx5_0", port="1") > first

        node.sysfs.set_link(0, up=False)
        assert scraped("node_network_carrier", device="ens1f0np0") == 0


def test_cache_serves_one_render_per_format_until_it_is_stale(tmp_path):
    clock = ManualClock()
    with SimFleet(1, tmp_path, cache_s=5, clock=clock) as fleet:
        address = fleet.nodes[0].address
        text, text_type = get(address)
        openmetrics, openmetrics_type = get(address, accept=OPENMETRICS)
        assert get(address) == (text, text_type)
        assert get(address, accept=OPENMETRICS) == (openmetrics, openmetrics_type)
        assert text_type.startswith("text/plain")
        assert openmetrics_type.startswith("application/openmetrics-text")
        clock.advance(5)
        assert get(address)[0] == text  # stale: served at once while the successor renders behind it
        deadline = time.monotonic() + 10
        while get(address)[0] == text:  # a new render: at least the collector durations differ
            assert time.monotonic() < deadline, "the stale response was never re-rendered"
            time.sleep(0.05)


def test_command_line_serves_until_terminated(tmp_path):
    file_sd = tmp_path / "targets.json"
    args = [sys.executable, "-m", "sim.fleet", "--nodes", "2", "--dir", str(tmp_path / "trees")]
    process = subprocess.Popen(
        [*args, "--file-sd", str(file_sd)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ready = process.stdout.readline()
        assert "2 nodes serving" in ready
        addresses = [group["targets"][0] for group in json.loads(file_sd.read_text())]
        hostnames = [
            label_values(parse_samples(scrape(f"http://{a}/metrics")), "Hostname") for a in addresses
        ]
        assert hostnames == [{"vela-001"}, {"vela-002"}]
    finally:
        process.terminate()
        output, _ = process.communicate(timeout=20)
    assert process.returncode == 0, output
    for address in addresses:
        assert_closed(address)

"""Generated /sys trees of simulated VMs, read by our real collectors and by node_exporter itself."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from collectors.base import ReadErrors
from collectors.infiniband import HW_COUNTERS, InfiniBandCollector
from collectors.netclass import NetClassCollector
from sim.sysfs import SimSysfs
from tests.support.exposition import SampleKey, key, node_exporter_exposition, parse_samples, render

NETDEVS = {"mlx5_0": "ens1f0np0", "mlx5_1": "ens2f0np0", "mlx5_2": "ens3f0np0", "mlx5_3": "ens4f0np0"}
RX_BYTES = "node_infiniband_port_data_received_bytes_total"
TX_BYTES = "node_infiniband_port_data_transmitted_bytes_total"
ECN_MARKED = "node_infiniband_np_ecn_marked_roce_packets_received_total"


def tree(tmp_path: Path, **kwargs: object) -> SimSysfs:
    sim = SimSysfs(tmp_path / "sys", "vela-001", **kwargs)
    sim.write()
    return sim


def scrape(sim: SimSysfs) -> tuple[dict[SampleKey, float], ReadErrors]:
    errors = ReadErrors("sim")
    text = render(InfiniBandCollector(sim.root, errors), NetClassCollector(sim.root, errors))
    return parse_samples(text), errors


def clean_scrape(sim: SimSysfs) -> dict[SampleKey, float]:
    samples, errors = scrape(sim)
    assert errors.count == 0
    return samples


def port(device: str) -> dict[str, str]:
    return {"device": device, "port": "1"}


def labels_of(samples: dict[SampleKey, float], name: str) -> list[dict[str, str]]:
    return [dict(labels) for sample, labels in samples if sample == name]


def counters(samples: dict[SampleKey, float]) -> dict[SampleKey, float]:
    return {k: v for k, v in samples.items() if k[0].endswith("_total")}


def listed(fixtures: Path, directory: str) -> set[str]:
    """The names `ls ports/1/<directory>/` printed on the real ConnectX port."""
    text = (fixtures / "oci-tutorials" / "mlx5_2-counters-hw_counters-listing.txt").read_text()
    block = text.split(f"/ports/1/{directory}/\n", 1)[1].split("$", 1)[0]
    return set(block.split())


@pytest.mark.parametrize("rate_gbps", [200, 400])
def test_collectors_see_a_vm_with_roce_ports_and_their_netdevs(tmp_path, rate_gbps):
    samples = clean_scrape(tree(tmp_path, rate_gbps=rate_gbps))

    port_info = labels_of(samples, "fleetlens_infiniband_port_info")
    assert {info["device"]: info["netdev"] for info in port_info} == NETDEVS
    assert {(info["port"], info["link_layer"]) for info in port_info} == {("1", "Ethernet")}
    assert {info["device"] for info in labels_of(samples, "node_network_info")} == {"eth0", *NETDEVS.values()}
    line_rate = rate_gbps * 1e9 / 8
    for device, netdev in NETDEVS.items():
        assert samples[key("node_infiniband_state_id", **port(device))] == 4  # ACTIVE
        assert samples[key("node_infiniband_physical_state_id", **port(device))] == 5  # LinkUp
        assert samples[key("node_infiniband_rate_bytes_per_second", **port(device))] == line_rate
        assert samples[key("node_network_speed_bytes", device=netdev)] == line_rate
        assert samples[key("node_network_mtu_bytes", device=netdev)] == 9000
        assert samples[key("node_network_carrier", device=netdev)] == 1
        assert samples[key("node_network_up", device=netdev)] == 1


def test_ports_have_the_counters_of_a_real_connectx_port(fixtures, tmp_path):
    sim = tree(tmp_path, nics=1)
    port_dir = sim.root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    for directory in ("counters", "hw_counters"):
        assert {path.name for path in (port_dir / directory).iterdir()} == listed(fixtures, directory)

    samples = clean_scrape(sim)
    hw_names = {spec.name for spec in HW_COUNTERS.values()}
    exported = {name for name, labels in samples if name in hw_names}
    assert exported == hw_names, "every hw counter under node_exporter's name"
    assert not [name for name, labels in samples if name.startswith("node_infiniband_hw_")]
    # a VM shortly after boot, as the real port's `rdma statistic` (rx_write_requests 18747, no errors)
    assert 1_000 < samples[key("node_infiniband_rx_write_requests_total", **port("mlx5_0"))] < 100_000
    assert samples[key("node_infiniband_req_cqes_errors_total", **port("mlx5_0"))] == 0
    assert samples[key("node_infiniband_lifespan_seconds", **port("mlx5_0"))] == pytest.approx(0.010)


def test_counters_grow_with_load_and_never_shrink(tmp_path):
    sim = tree(tmp_path)
    rx_packets = "node_infiniband_port_packets_received_total"
    per_second: dict[float, dict[SampleKey, float]] = {}
    previous = clean_scrape(sim)
    for load in (1.0, 0.5, 0.0):
        sim.advance(2.0, load=load)
        now = clean_scrape(sim)
        assert not [k for k, value in counters(now).items() if value < previous[k]]
        per_second[load] = {k: (value - previous[k]) / 2 for k, value in counters(now).items()}
        previous = now

    line_rate = 200e9 / 8
    for device in NETDEVS:
        for name in (RX_BYTES, TX_BYTES, rx_packets):
            rates = [per_second[load][key(name, **port(device))] for load in (0.0, 0.5, 1.0)]
            assert 0 == rates[0] < rates[1] < rates[2]
        assert per_second[1.0][key(TX_BYTES, **port(device))] <= line_rate
        bytes_per_packet = (
            per_second[1.0][key(RX_BYTES, **port(device))] / per_second[1.0][key(rx_packets, **port(device))]
        )
        assert 1000 < bytes_per_packet <= 9000, "packets no larger than the 9000-byte MTU"


def growth_after(tmp_path: Path, change: Callable[[SimSysfs], None]) -> Callable[[str, str], float]:
    """How much each port's series grew over 10 busy seconds after `change` on a two-port tree:
    grown(metric, device)."""
    sim = tree(tmp_path, nics=2)
    before = clean_scrape(sim)
    change(sim)
    sim.advance(10.0)
    after = clean_scrape(sim)

    def grown(name: str, device: str) -> float:
        return after[key(name, **port(device))] - before[key(name, **port(device))]

    return grown


def test_congestion_marks_packets_and_throttles_the_port(tmp_path):
    grown = growth_after(tmp_path, lambda sim: sim.set_congestion(1, 1.0))
    assert grown(ECN_MARKED, "mlx5_1") > 1000 * max(grown(ECN_MARKED, "mlx5_0"), 1)
    assert grown("node_infiniband_np_cnp_packets_sent_total", "mlx5_1") > 0
    assert grown("node_infiniband_rp_cnp_packets_handled_total", "mlx5_1") > 0
    assert grown("node_infiniband_port_transmit_wait_total", "mlx5_1") > 0
    assert grown("node_infiniband_port_transmit_wait_total", "mlx5_0") == 0
    assert grown(TX_BYTES, "mlx5_1") < 0.7 * grown(TX_BYTES, "mlx5_0")


def test_bit_errors_count_errors_and_retransmits_on_their_port_only(tmp_path):
    grown = growth_after(tmp_path, lambda sim: sim.set_errors(1, 1.0))
    for name in (
        "node_infiniband_port_errors_received_total",
        "node_infiniband_symbol_error_total",
        "node_infiniband_out_of_sequence_packets_received_total",
        "node_infiniband_packet_sequence_errors_total",
    ):
        assert grown(name, "mlx5_1") > 0 == grown(name, "mlx5_0"), name
    assert grown(ECN_MARKED, "mlx5_1") < 2 * max(grown(ECN_MARKED, "mlx5_0"), 1), (
        "bit errors are no congestion"
    )


def changes(before: dict, after: dict, netdev: str, device: str) -> dict[str, float]:
    """How much the link-change counters of one port and its netdev grew."""
    names = {
        "changes": key("node_network_carrier_changes_total", device=netdev),
        "down": key("node_network_carrier_down_changes_total", device=netdev),
        "up": key("node_network_carrier_up_changes_total", device=netdev),
        "downed": key("node_infiniband_link_downed_total", **port(device)),
    }
    return {short: after[name] - before[name] for short, name in names.items()}


def test_link_down_and_up_read_as_the_kernel_reports_them(tmp_path):
    sim = tree(tmp_path)
    before = clean_scrape(sim)

    sim.set_link(2, up=False)
    sim.set_link(2, up=False)  # no change: nothing counted
    sim.advance(5.0)
    down = clean_scrape(sim)
    assert down[key("node_infiniband_state_id", **port("mlx5_2"))] == 1  # DOWN
    assert down[key("node_infiniband_physical_state_id", **port("mlx5_2"))] == 3  # Disabled
    assert down[key("node_network_carrier", device="ens3f0np0")] == 0
    assert down[key("node_network_up", device="ens3f0np0")] == 0
    assert down[key(RX_BYTES, **port("mlx5_2"))] == before[key(RX_BYTES, **port("mlx5_2"))]
    assert down[key(RX_BYTES, **port("mlx5_1"))] > before[key(RX_BYTES, **port("mlx5_1"))]
    assert changes(before, down, "ens3f0np0", "mlx5_2") == {"changes": 1, "down": 1, "up": 0, "downed": 1}
    assert changes(before, down, "ens2f0np0", "mlx5_1") == {"changes": 0, "down": 0, "up": 0, "downed": 0}

    sim.set_link(2, up=True)
    up = clean_scrape(sim)
    assert up[key("node_infiniband_state_id", **port("mlx5_2"))] == 4
    assert up[key("node_infiniband_physical_state_id", **port("mlx5_2"))] == 5
    assert up[key("node_network_carrier", device="ens3f0np0")] == 1
    assert changes(before, up, "ens3f0np0", "mlx5_2") == {"changes": 2, "down": 1, "up": 1, "downed": 1}


def test_a_port_staging_through_host_memory_moves_less(tmp_path):
    sim = tree(tmp_path, nics=2)
    before = clean_scrape(sim)
    sim.set_traffic(1, 0.5)
    sim.advance(10.0)
    after = clean_scrape(sim)

    def grown(device: str) -> float:
        return after[key(TX_BYTES, **port(device))] - before[key(TX_BYTES, **port(device))]

    assert grown("mlx5_1") / grown("mlx5_0") == pytest.approx(0.5, rel=0.15)
    assert after[key("node_infiniband_state_id", **port("mlx5_1"))] == 4, "the link stays up"


def test_a_driver_reload_starts_every_counter_over_and_keeps_the_links(tmp_path):
    sim = tree(tmp_path, nics=2)
    sim.set_link(1, up=False)
    sim.advance(10.0)
    sim.reload_driver()
    reloaded = clean_scrape(sim)

    infiniband = {
        value for (name, _), value in counters(reloaded).items() if name.startswith("node_infiniband")
    }
    assert infiniband == {0}
    assert reloaded[key("node_network_carrier_changes_total", device="ens1f0np0")] == 2  # probe's up and down
    assert reloaded[key("node_infiniband_state_id", **port("mlx5_1"))] == 1
    sim.advance(1.0)
    assert clean_scrape(sim)[key(RX_BYTES, **port("mlx5_0"))] > 0


def test_concurrent_scrapes_never_see_a_half_written_tree(tmp_path):
    sim = tree(tmp_path, nics=2)
    done = threading.Event()
    scrapes: list[tuple[dict[SampleKey, float], int]] = []

    def scrape_until_done() -> None:
        while not done.is_set():
            samples, errors = scrape(sim)
            scrapes.append((counters(samples), errors.count))

    scraper = threading.Thread(target=scrape_until_done)
    scraper.start()
    try:
        for second in range(20):
            sim.advance(1.0)
            sim.set_link(1, up=bool(second % 2))
    finally:
        done.set()
        scraper.join()
    assert len(scrapes) > 5
    assert [errors for _, errors in scrapes] == [0] * len(scrapes)
    for earlier, later in itertools.pairwise(scrapes):
        assert earlier[0].keys() == later[0].keys()
        assert all(later[0][k] >= value for k, value in earlier[0].items())


def test_same_seed_same_tree_other_seed_other_tree(tmp_path):
    def scraped(name: str, seed: int) -> dict[SampleKey, float]:
        sim = SimSysfs(tmp_path / name, "vela-001", seed=seed)
        sim.write()
        sim.advance(3.0, load=0.7)
        return clean_scrape(sim)

    first = scraped("a", seed=1)
    assert scraped("b", seed=1) == first
    assert counters(scraped("c", seed=2)) != counters(first)


@pytest.mark.parametrize(
    "call",
    [
        lambda sim: sim.advance(1.0, load=1.5),
        lambda sim: sim.advance(-1.0),
        lambda sim: sim.set_link(4, up=False),
        lambda sim: sim.set_congestion(0, -0.1),
        lambda sim: sim.set_errors(0, -1.0),
        lambda sim: sim.set_traffic(0, -0.5),
        lambda sim: sim.set_traffic(4, 0.5),
    ],
)
def test_calls_outside_the_model_are_refused(tmp_path, call):
    sim = tree(tmp_path)
    with pytest.raises(ValueError):
        call(sim)


@pytest.mark.integration
def test_node_exporter_reads_the_tree_and_agrees(tmp_path):
    sim = tree(tmp_path)
    sim.set_link(1, up=False)
    sim.set_congestion(2, 0.5)
    sim.advance(3.0)
    text = node_exporter_exposition(sim.root)
    theirs = parse_samples(text)
    assert theirs[key("node_scrape_collector_success", collector="infiniband")] == 1
    assert theirs[key("node_scrape_collector_success", collector="netclass")] == 1
    shared = {k: v for k, v in theirs.items() if k[0].startswith(("node_infiniband_", "node_network_"))}
    assert shared[key("node_infiniband_state_id", **port("mlx5_1"))] == 1, "vacuous: the down port is missing"
    # node_exporter 1.5's node_network_info lacks the adminstate label that newer versions and we add
    ours = {(name, labels - {("adminstate", "up")}): v for (name, labels), v in clean_scrape(sim).items()}
    assert {k: ours.get(k) for k in shared} == shared

"""Faults of shared layers played offline through the real exporter into a store: each shows on the
nodes below its parent and on no other (the helpers of test_offline_online read the stored series)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from analytics.store import Store
from sim.offline import simulate_offline
from sim.scenario import parse_scenario
from tests.sim.test_offline_online import EPOCH, during, increase, open_store, series

# 8 VMs, 2 per host, 2 hosts per leaf, 1 leaf per spine, 1 host per rack:
# leaf-00 / spine-0: vela-001..004, leaf-01 / spine-1: vela-005..008; host-003 and rack-03: vela-007, 008
FABRIC = {
    "seed": 39,
    "duration_s": 320,
    "interval_s": 10,
    "fleet": {"nodes": 8, "gpus_per_node": 2, "nics_per_node": 2},
    "topology": {"vms_per_host": 2, "hosts_per_leaf": 2, "leaves_per_spine": 1, "hosts_per_rack": 1},
    "jobs": [{"name": "llm", "nodes": 8, "step_s": 2.0, "tp": 2}],
    "faults": [
        {"kind": "leaf_degraded", "leaf": "leaf-00", "start_s": 40, "flaps": 3, "period_s": 20},
        {"kind": "leaf_degraded", "leaf": "leaf-01", "mode": "errors", "start_s": 40, "end_s": 140},
        {"kind": "spine_degraded", "spine": "spine-0", "start_s": 180, "end_s": 300},
        {"kind": "rail_congestion", "rail": "rail-1", "start_s": 180, "end_s": 300},
        {"kind": "host_pcie_degraded", "host": "host-003", "start_s": 180, "end_s": 300},
        {"kind": "rack_power", "rack": "rack-01", "start_s": 180, "end_s": 300},  # host-001: vela-003, 004
    ],
}


@pytest.fixture(scope="module")
def fabric(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with open_store(chdb_dir) as opened:
        scenario = parse_scenario(FABRIC, "fabric")
        simulate_offline(scenario, opened, tmp_path_factory.mktemp("fabric"), EPOCH)
        yield opened


def port_increase(store: Store, metric: str, node: str, nic: int, start: float, end: float) -> float:
    return increase(series(store, metric, node, device=f"mlx5_{nic}", port="1"), start, end)


def test_a_flapping_leaf_flaps_every_port_below_it_and_no_other(fabric: Store) -> None:
    downed = "node_infiniband_link_downed_total"
    below = {
        (node, nic): port_increase(fabric, downed, node, nic, 0, 170)
        for node in ("vela-001", "vela-004")
        for nic in (0, 1)
    }
    assert set(below.values()) == {3}
    assert port_increase(fabric, downed, "vela-005", 0, 0, 170) == 0


def test_a_leaf_with_bit_errors_shows_errors_and_retransmits_below_it(fabric: Store) -> None:
    for metric in (
        "node_infiniband_port_errors_received_total",
        "node_infiniband_out_of_sequence_packets_received_total",
    ):
        assert port_increase(fabric, metric, "vela-008", 1, 40, 140) > 0, metric
        assert port_increase(fabric, metric, "vela-001", 1, 0, 320) == 0, metric


def test_a_degraded_spine_congests_its_leaves_nodes_more_mildly_than_a_congested_rail(fabric: Store) -> None:
    marked = "node_infiniband_np_ecn_marked_roce_packets_received_total"
    spine = port_increase(fabric, marked, "vela-002", 0, 190, 300)
    rail = port_increase(fabric, marked, "vela-006", 1, 190, 300)
    calm = port_increase(fabric, marked, "vela-006", 0, 190, 300)  # under spine-1, off rail-1
    assert spine > 100 * max(calm, 1) and rail > 100 * max(calm, 1)
    assert spine < rail


def test_a_host_losing_gdr_shows_on_its_vms_pcie_and_nccl_logs_only(fabric: Store) -> None:
    def pcie(node: str) -> list[float]:
        return during(series(fabric, "DCGM_FI_PROF_PCIE_TX_BYTES", node, gpu="1"), 190, 300)

    assert min(pcie("vela-007")) > 1.5 * max(pcie("vela-005"))

    def without_gdr(node: str) -> set[float]:
        values = series(fabric, "fleetlens_nccl_gpudirect_rdma_status", node, cuda_device="0", status="no")
        return set(during(values, 190, 300))

    assert without_gdr("vela-008") == {1} and without_gdr("vela-006") <= {0}


def test_a_rack_power_fault_brakes_every_gpu_in_the_rack_only(fabric: Store) -> None:
    def braked(node: str, gpu: str) -> set[float]:
        values = series(
            fabric, "fleetlens_gpu_clock_throttle_reason", node, gpu=gpu, reason="hw_power_brake_slowdown"
        )
        return set(during(values, 190, 300))

    assert braked("vela-003", "0") == braked("vela-004", "1") == {1}
    assert braked("vela-005", "0") == {0}

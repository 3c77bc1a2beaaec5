"""dma_degraded on rows the real collectors read: simulated GPUs' PCIe links, simulated RoCE ports' traffic,
and real NCCL logs with and without GPUDirect RDMA."""

from __future__ import annotations

import shutil
from pathlib import Path

from analytics.detectors.base import Window
from analytics.detectors.dma import DmaDegraded
from analytics.evidence import DmaDegradedEvidence
from analytics.store import Store
from tests.support.fleetdata import SimulatedFleet

NO_GDR_LOG = "nccl-issue392-roce-no-gdr-ring.log"  # RoCE rings `via NET/IB/0`: no GPUDirect RDMA
GDR_LOG = "nccl-issue707-a100-ib-gdrdma.log"  # every rank `via NET/IB/5/GDRDMA`


def reported(store: Store, window: Window) -> set[tuple[str, str]]:
    return {(finding.node, finding.component) for finding in DmaDegraded().detect(store, window)}


def test_a_gpu_link_trained_below_its_maximum_and_replaying_is_reported_on_that_gpu(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet.tick(2)
        fleet["vela-004"].gpus.set_fault(2, "pcie_downgrade", gen=4, width=8, replays_per_second=2.0)
        fleet["vela-001"].gpus.set_fault(0, "pcie_downgrade", gen=3, width=16, replays_per_second=0.0)
        window = fleet.tick()

        [finding] = DmaDegraded().detect(store, window)
    assert (finding.kind, finding.node, finding.component) == ("dma_degraded", "vela-004", "gpu:2")
    assert finding.evidence == DmaDegradedEvidence(
        signals=("pcie",), pcie_link="gen4 x8", pcie_max_link="gen5 x16", pcie_replays=20
    )


def test_ports_moving_far_less_than_their_jobs_peers_are_reported_and_a_job_quiet_throughout_is_not(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path, nodes=6, gpus=1) as fleet:
        for node in fleet.nodes:
            node.job = "llm" if node.index < 4 else "batch"
        for name in ("vela-003", "vela-005", "vela-006"):
            fleet.set_load(name, 0.3)
        window = fleet.tick(2)

        findings = DmaDegraded().detect(store, window)
    assert {(f.node, f.component) for f in findings} == {("vela-003", "mlx5_0:1"), ("vela-003", "mlx5_1:1")}
    for finding in findings:
        assert finding.job == "llm" and finding.evidence.peers == "job llm"
        assert finding.evidence.signals == ("roce_bytes",)
        assert 0.2 < finding.evidence.roce_ratio < 0.4
        assert finding.evidence.peers_roce_bytes_per_s > 2 * finding.evidence.roce_bytes_per_s


def test_a_congested_port_or_a_port_whose_link_is_down_moves_less_but_is_no_dma_fault(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path, gpus=1) as fleet:
        fleet.tick(2)
        fleet["vela-001"].sysfs.set_congestion(0, 1.0)
        fleet["vela-002"].sysfs.set_link(1, up=False)
        window = fleet.tick()

        ports = DmaDegraded().features(store, window).set_index(["node", "component"])
        ratio = DmaDegraded().max_roce_ratio
        for port in (("vela-001", "mlx5_0:1"), ("vela-002", "mlx5_1:1")):
            assert ports.loc[port, "roce_bytes_per_s"] < ratio * ports.loc[port, "peers_roce_bytes_per_s"]
        assert reported(store, window) == set()


def test_a_port_back_from_a_flap_moving_little_while_its_connections_recover_is_no_dma_fault(
    store: Store, tmp_path: Path
):
    with SimulatedFleet(store, tmp_path, gpus=1) as fleet:
        fleet.tick(2)
        fleet["vela-003"].sysfs.set_link(1, up=False)
        fleet.tick()
        fleet["vela-003"].sysfs.set_link(1, up=True)
        fleet["vela-003"].sysfs.set_traffic(1, 0.1)  # its connections come back slowly
        recovering = [fleet.tick() for _ in range(4)]

        ports = DmaDegraded().features(store, recovering[-1]).set_index(["node", "component"])
        port = ports.loc[("vela-003", "mlx5_1:1")]
        assert port["roce_bytes_per_s"] < 0.2 * port["peers_roce_bytes_per_s"]
        assert all(reported(store, window) == set() for window in recovering)


def test_nccl_logs_saying_a_rank_runs_without_gpudirect_rdma_name_its_port_and_the_rank(
    store: Store, tmp_path: Path, fixtures: Path
):
    with SimulatedFleet(store, tmp_path, gpus=1) as fleet:
        for node in fleet.nodes:
            log = NO_GDR_LOG if node.name == "vela-002" else GDR_LOG
            shutil.copy(fixtures / "nccl" / log, node.nccl_dir / "rank.log")
        window = fleet.tick()

        [finding] = DmaDegraded().detect(store, window)
    assert (finding.node, finding.component) == ("vela-002", "mlx5_0:1")  # its rings go `via NET/IB/0`
    [rank] = finding.evidence.nccl_ranks_without_gdr
    assert rank.startswith("rank 0 in ") and rank.endswith("rank.log: no")


def test_reboots_scrape_gaps_and_a_fleet_equally_busy_are_no_dma_fault(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path, gpus=1) as fleet:
        for node in fleet.nodes:
            node.job = "llm"
        windows = [fleet.tick() for _ in range(3)]
        fleet.restart("vela-003")
        windows += [fleet.tick() for _ in range(2)]
        windows += [fleet.tick(skip={"vela-001"}) for _ in range(2)]
        windows.append(fleet.tick())

        assert all(reported(store, window) == set() for window in windows)

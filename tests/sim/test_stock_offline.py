"""The stock flavour played offline (sim.offline): per node and tick, dcgm-exporter's rendering and a real
node_exporter's scrape, labelled as Prometheus labels them, and nothing of fleetlens's own exporter."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.node import SCENARIO_EPOCH, SCRAPE_GAP_ERROR
from sim.offline import node_rounds
from sim.scenario import parse_scenario
from tests.support.peers import require_binary

pytestmark = pytest.mark.integration

SCENARIO = {
    "seed": 9,
    "duration_s": 60,
    "interval_s": 10,
    "exporters": "stock",
    "fleet": {"nodes": 2, "gpus_per_node": 2, "nics_per_node": 2, "prefix": "stock-"},
    "jobs": [{"name": "small", "nodes": 2, "step_s": 2.0, "dp": 2, "pp": 1, "tp": 2}],
    "faults": [
        {"kind": "gpu_lost", "node": "stock-001", "gpu": 1, "start_s": 20},
        {"kind": "link_down", "node": "stock-002", "nic": 1, "start_s": 20, "end_s": 40},
    ],
    "confounders": [{"kind": "scrape_gap", "node": "stock-002", "start_s": 30, "end_s": 50}],
}


def test_each_node_is_two_stock_targets_labelled_as_prometheus_labels_them(tmp_path: Path):
    require_binary("prometheus-node-exporter")
    rounds = list(node_rounds(parse_scenario(SCENARIO, "stock"), range(2), tmp_path, SCENARIO_EPOCH))
    assert len(rounds) == 7
    batches, statuses = rounds[0]
    assert sorted(batch.target for batch in batches) == [
        "stock-001:9100",
        "stock-001:9400",
        "stock-002:9100",
        "stock-002:9400",
    ]
    for batch in batches:
        node, port = batch.target.split(":")
        assert batch.node == node
        job = {"9400": "dcgm-exporter", "9100": "node-exporter"}[port]
        assert all(labels["job"] == job and labels["instance"] == batch.target for labels in batch.labels)
        assert all("node" not in labels for labels in batch.labels), "the node is a column, not a label"
        assert not [name for name in batch.names if name.startswith("fleetlens_")]
        prefixes = ("DCGM_FI_",) if job == "dcgm-exporter" else ("node_", "go_", "process_", "promhttp_")
        assert all(name.startswith(prefixes) for name in batch.names), set(batch.names)
    assert all(status.up for status in statuses)

    def gpus(tick: int, node: str) -> set[str]:
        (batch,) = [b for b in rounds[tick][0] if b.target == f"{node}:9400"]
        return {labels["gpu"] for labels in batch.labels}

    def port_state(tick: int, node: str, device: str) -> float:
        (batch,) = [b for b in rounds[tick][0] if b.target == f"{node}:9100"]
        return next(
            value
            for name, labels, value in zip(batch.names, batch.labels, batch.values, strict=True)
            if name == "node_infiniband_state_id" and labels["device"] == device
        )

    assert gpus(1, "stock-001") == {"0", "1"}
    assert gpus(2, "stock-001") == {"0"}, "dcgm-exporter drops a GPU that fell off the bus"
    assert port_state(2, "stock-002", "mlx5_1") == 1, "node_exporter reads the link down from the tree"
    assert port_state(2, "stock-002", "mlx5_0") == 4
    gap = [status for status in rounds[3][1] if status.node == "stock-002"]
    assert [(status.up, status.error) for status in gap] == [(False, SCRAPE_GAP_ERROR)] * 2
    assert {batch.node for batch in rounds[3][0]} == {"stock-001"}
    assert port_state(5, "stock-002", "mlx5_1") == 4, "answering again after the gap, the link back"

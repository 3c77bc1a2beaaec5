"""dma_degraded: a GPU-NIC data path that fell off its fast lane, in any of three ways.

- `pcie`: a GPU whose PCIe link trained below its maximum generation or width, with its replay
  counter rising (a link that merely idles at a low generation replays nothing); component gpu:N. The
  link is read from fleetlens's gauges or from DCGM's link fields (analytics.detectors.dcgm.PCIE_LINK),
  which dcgm-exporter's default counter set leaves out: without either, this signal is blind.
- `roce_bytes`: a RoCE port moving far fewer bytes per second than its peers while its node's job
  runs, with its link steady (up at every sample and never down since the lookback: the bytes of a
  port that just flapped say nothing about its data path) and its fabric not pushing back (ECN
  marks would make it congestion); component device:port. Peers are the ports of the nodes running
  the same job (the job of a node is its latest step row), or, for nodes without step rows, of all
  such nodes. In a synchronous job every port moves about the same bytes per step, so a port far
  below is staging its traffic through host memory or sitting on a narrowed link. The fabric's push
  back is read from the port's ECN marks (mlx5's hw_counters, which node_exporter 1.5 does not read);
  a port without them is judged by its transmit wait instead (port_xmit_wait: ticks it had data to
  send and no credit to send it, which PFC pauses and a congested switch port cause).
- `nccl`: NCCL logs saying a rank of the node runs without GPUDirect RDMA (status no or partial);
  component: the port its connections without GPUDirect RDMA go through, or "" when several. Only
  fleetlens's nccl_log collector reads NCCL's logs: without it a rank without GPUDirect RDMA shows as
  its port's `roce_bytes`, when it moves less than its peers.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, frame
from analytics.detectors.congestion import ECN_MARKED, TRANSMIT_WAIT
from analytics.detectors.counters import (
    LAST,
    LOOKBACK_S,
    MAX_CANDIDATES,
    STEADY_INCREASE,
    STEADY_RATE,
    STEADY_SECONDS,
    Evidence,
    evidence_number,
    series_parameters,
    series_sql,
    signal_count,
    signal_findings,
)
from analytics.detectors.dcgm import PCIE_LINK, metric_in
from analytics.detectors.peers import NODE_JOBS
from analytics.store.protocols import Reader

PCIE_REPLAYS = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
RECEIVED = "node_infiniband_port_data_received_bytes_total"
TRANSMITTED = "node_infiniband_port_data_transmitted_bytes_total"
STATE = "node_infiniband_state_id"
LINK_DOWNED = "node_infiniband_link_downed_total"
NCCL_GDR = "fleetlens_nccl_gpudirect_rdma_status"
NCCL_CONNECTIONS = "fleetlens_nccl_connections"
NCCL_NET_DEVICES = "fleetlens_nccl_net_device_info"
DMA_METRICS = (
    *(name for names in PCIE_LINK.values() for name in names),
    PCIE_REPLAYS,
    RECEIVED,
    TRANSMITTED,
    ECN_MARKED,
    TRANSMIT_WAIT,
    STATE,
    LINK_DOWNED,
    NCCL_GDR,
    NCCL_CONNECTIONS,
    NCCL_NET_DEVICES,
)
ACTIVE = 4
NET_WITHOUT_GDR = "^NET/[^/]+/([0-9]+)$"  # a connection `via NET/IB/1`, where GPUDirect RDMA adds `/GDRDMA`
# a GPU's link figures (pcie_gen, pcie_width, pcie_max_gen, pcie_max_width): fleetlens's or DCGM's
PCIE_FIGURES = ",\n    ".join(
    f"maxIf(last, {metric_in(names)} AND samples > 0) AS pcie_{figure}" for figure, names in PCIE_LINK.items()
)
DMA_SERIES = series_sql(
    f"{LAST} AS last",
    "length(inside) AS samples",
    f"{STEADY_SECONDS} AS steady_s",
    f"{STEADY_INCREASE} AS increase",
    f"{STEADY_RATE} AS rate",
    "lookback_low",
    "lookback_high",
    lookback_aggregates=("min(value) AS lookback_low", "max(value) AS lookback_high"),
)
# Units: a GPU, a port, or an NCCL rank (its log, pid and CUDA device). A rank without GPUDirect RDMA is
# put on the port its connections without it go through (NET device index -> device:port, as its log
# announced them), or on its node ("") when they go through several.
DMA_UNITS = f"""
SELECT node,
    multiIf(
        startsWith(metric, 'node_infiniband_'), concat(labels['device'], ':', labels['port']),
        startsWith(metric, 'fleetlens_nccl_'),
            concat(labels['log'], '|', labels['pid'], '|', labels['cuda_device']),
        concat('gpu:', labels['gpu'])
    ) AS unit,
    max(startsWith(metric, 'fleetlens_nccl_')) AS is_rank,
    {PCIE_FIGURES},
    sumIf(increase, metric = '{PCIE_REPLAYS}') AS pcie_replays,
    countIf(metric IN ('{RECEIVED}', '{TRANSMITTED}') AND steady_s > 0) = 2 AS is_port,
    sumIf(rate, metric IN ('{RECEIVED}', '{TRANSMITTED}')) AS roce_bytes_per_s,
    sumIf(rate, metric = '{ECN_MARKED}') AS ecn_marks_per_s,
    countIf(metric = '{ECN_MARKED}') > 0 AS has_ecn,
    sumIf(rate, metric = '{TRANSMIT_WAIT}') AS transmit_wait_per_s,
    minIf(lookback_low, metric = '{STATE}' AND samples > 0) = {ACTIVE}
        AND maxIf(lookback_high - lookback_low, metric = '{LINK_DOWNED}') = 0 AS link_steady,
    anyIf(labels['status'], metric = '{NCCL_GDR}' AND samples > 0 AND last = 1) AS gdr,
    anyIf(
        concat('rank ', labels['rank'], ' in ', labels['log']), startsWith(metric, 'fleetlens_nccl_')
    ) AS rank,
    groupUniqArrayIf(
        toUInt32OrZero(extract(labels['via'], '{NET_WITHOUT_GDR}')),
        metric = '{NCCL_CONNECTIONS}' AND samples > 0 AND match(labels['via'], '{NET_WITHOUT_GDR}')
    ) AS nets_without_gdr,
    groupArrayIf(
        (toUInt32OrZero(labels['index']), concat(labels['device'], ':', labels['port'])),
        metric = '{NCCL_NET_DEVICES}' AND samples > 0
    ) AS nets
FROM ({DMA_SERIES})
GROUP BY node, unit
"""
# Candidates: every port (each is its peers' peer), GPUs whose link trained below its maximum, and where
# NCCL ranks run without GPUDirect RDMA.
DMA_SQL = f"""
SELECT * FROM (
SELECT candidates.*, jobs.job AS job,
    medianExactIf(roce_bytes_per_s, is_port AND link_steady) OVER (PARTITION BY job) AS peers_roce_bytes_per_s
FROM (
    SELECT node,
        if(
            is_rank,
            if(length(nets_without_gdr) = 1, arrayFirst(net -> net.1 = nets_without_gdr[1], nets).2, ''),
            unit
        ) AS component,
        max(pcie_gen) AS pcie_gen,
        max(pcie_width) AS pcie_width,
        max(pcie_max_gen) AS pcie_max_gen,
        max(pcie_max_width) AS pcie_max_width,
        max(pcie_replays) AS pcie_replays,
        max(is_port) AS is_port,
        max(roce_bytes_per_s) AS roce_bytes_per_s,
        max(ecn_marks_per_s) AS ecn_marks_per_s,
        max(has_ecn) AS has_ecn,
        max(transmit_wait_per_s) AS transmit_wait_per_s,
        max(link_steady) AS link_steady,
        arraySort(groupArrayIf(concat(rank, ': ', gdr), gdr IN ('no', 'partial'))) AS nccl_without_gdr
    FROM ({DMA_UNITS})
    GROUP BY node, component
) AS candidates
LEFT JOIN ({NODE_JOBS}) AS jobs ON candidates.node = jobs.node
)
WHERE is_port OR pcie_gen < pcie_max_gen OR pcie_width < pcie_max_width OR notEmpty(nccl_without_gdr)
ORDER BY node, component
"""


@register
class DmaDegraded(Detector):
    """Reports each candidate on which at least one of the three signals (module doc) fired.

    Score: how many fired. `roce_bytes` needs the port at most `max_roce_ratio` of its peers' median,
    peers busy enough to tell (`min_peer_bytes_per_s`) and at most `max_ecn_marks_per_s` ECN marks, or,
    on a port without ECN counters, at most `max_transmit_wait_per_s` ticks of transmit wait per second.
    """

    name: ClassVar[str] = "dma_degraded"
    version: ClassVar[str] = "2"
    kinds: ClassVar[tuple[str, ...]] = ("dma_degraded",)
    min_windows: ClassVar[int] = 2
    of_windows: ClassVar[int] = 3
    clear_windows: ClassVar[int] = 3

    def __init__(
        self,
        max_roce_ratio: float = 0.75,
        min_peer_bytes_per_s: float = 1e9,
        max_ecn_marks_per_s: float = 100.0,
        lookback_s: float = LOOKBACK_S,
        max_transmit_wait_per_s: float = 1e5,
    ) -> None:
        self.max_roce_ratio = max_roce_ratio
        self.min_peer_bytes_per_s = min_peer_bytes_per_s
        self.max_ecn_marks_per_s = max_ecn_marks_per_s
        self.lookback_s = lookback_s
        self.max_transmit_wait_per_s = max_transmit_wait_per_s

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        parameters = series_parameters(DMA_METRICS, window.start, window.end, self.lookback_s)
        return frame(source.query(DMA_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))

    def score(self, features: pd.DataFrame) -> np.ndarray:
        return signal_count(self._signals(features))

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return signal_findings("dma_degraded", "warning", features, scores, self._signals, EVIDENCE)

    def _signals(self, features: pd.DataFrame) -> dict[str, pd.Series]:
        """Each signal of a degraded DMA path, True per row where it fired."""
        below_max = (features["pcie_gen"] < features["pcie_max_gen"]) | (
            features["pcie_width"] < features["pcie_max_width"]
        )
        ratio = features["roce_bytes_per_s"] / features["peers_roce_bytes_per_s"]
        return {
            "pcie": below_max & (features["pcie_replays"] > 0),
            "roce_bytes": features["is_port"].astype(bool)
            & features["link_steady"].astype(bool)
            & (features["peers_roce_bytes_per_s"] >= self.min_peer_bytes_per_s)
            & (ratio <= self.max_roce_ratio)
            & self._fabric_quiet(features),
            "nccl": features["nccl_without_gdr"].map(len) > 0,
        }

    def _fabric_quiet(self, features: pd.DataFrame) -> pd.Series:
        """Ports whose fabric does not push back (congestion moves fewer bytes too): few ECN marks where
        the port has ECN counters, else little transmit wait."""
        has_ecn = features["has_ecn"].astype(bool)
        few_marks = features["ecn_marks_per_s"] <= self.max_ecn_marks_per_s
        little_wait = features["transmit_wait_per_s"] <= self.max_transmit_wait_per_s
        return (has_ecn & few_marks) | (~has_ecn & little_wait)


EVIDENCE: dict[str, Evidence] = {
    "pcie": lambda row: {
        "pcie_link": f"gen{row.pcie_gen:g} x{row.pcie_width:g}",
        "pcie_max_link": f"gen{row.pcie_max_gen:g} x{row.pcie_max_width:g}",
        "pcie_replays": evidence_number(row.pcie_replays),
    },
    "roce_bytes": lambda row: {
        "roce_bytes_per_s": evidence_number(row.roce_bytes_per_s),
        "peers_roce_bytes_per_s": evidence_number(row.peers_roce_bytes_per_s),
        "roce_ratio": evidence_number(row.roce_bytes_per_s / row.peers_roce_bytes_per_s),
        **_pushback_evidence(row),
        "peers": f"job {row.job}" if row.job else "nodes without a job",
    },
    "nccl": lambda row: {"nccl_ranks_without_gdr": list(row.nccl_without_gdr)},
}


def _pushback_evidence(row: Any) -> dict[str, Any]:
    """What ruled congestion out: the port's ECN marks, or its transmit wait where it has no ECN counters."""
    if row.has_ecn:
        return {"ecn_marks_per_s": evidence_number(row.ecn_marks_per_s)}
    return {"transmit_wait_per_s": evidence_number(row.transmit_wait_per_s)}

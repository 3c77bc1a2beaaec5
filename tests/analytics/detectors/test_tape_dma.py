"""dma_degraded computes on the tape the very frame its ClickHouse SQL gave before it moved onto it (kept
here as the reference): on every window of every scenario of test_dma.py, alone or under the runner's
warm tape, and on a fleet stepped window by window with every signal firing."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from analytics.detectors import dma
from analytics.detectors.base import Window
from analytics.detectors.counters import (
    LAST,
    STEADY_INCREASE,
    STEADY_RATE,
    STEADY_SECONDS,
    series_sql,
)
from analytics.detectors.dcgm import PCIE_LINK, metric_in
from analytics.detectors.peers import NODE_JOBS
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
from analytics.store.protocols import Reader
from tests.analytics.detectors import test_dma
from tests.analytics.detectors.replay import Compared, compare, play_compared, scenarios, series_sql_frame
from tests.support.fleetdata import SimulatedFleet

D = dma
NET_WITHOUT_GDR = D.NET_WITHOUT_GDR.pattern
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
    sumIf(increase, metric = '{D.PCIE_REPLAYS}') AS pcie_replays,
    countIf(metric IN ('{D.RECEIVED}', '{D.TRANSMITTED}') AND steady_s > 0) = 2 AS is_port,
    sumIf(rate, metric IN ('{D.RECEIVED}', '{D.TRANSMITTED}')) AS roce_bytes_per_s,
    sumIf(rate, metric = '{D.ECN_MARKED}') AS ecn_marks_per_s,
    countIf(metric = '{D.ECN_MARKED}') > 0 AS has_ecn,
    sumIf(rate, metric = '{D.TRANSMIT_WAIT}') AS transmit_wait_per_s,
    minIf(lookback_low, metric = '{D.STATE}' AND samples > 0) = {D.ACTIVE}
        AND maxIf(lookback_high - lookback_low, metric = '{D.LINK_DOWNED}') = 0 AS link_steady,
    anyIf(labels['status'], metric = '{D.NCCL_GDR}' AND samples > 0 AND last = 1) AS gdr,
    anyIf(
        concat('rank ', labels['rank'], ' in ', labels['log']), startsWith(metric, 'fleetlens_nccl_')
    ) AS rank,
    groupUniqArrayIf(
        toUInt32OrZero(extract(labels['via'], '{NET_WITHOUT_GDR}')),
        metric = '{D.NCCL_CONNECTIONS}' AND samples > 0 AND match(labels['via'], '{NET_WITHOUT_GDR}')
    ) AS nets_without_gdr,
    groupArrayIf(
        (toUInt32OrZero(labels['index']), concat(labels['device'], ':', labels['port'])),
        metric = '{D.NCCL_NET_DEVICES}' AND samples > 0
    ) AS nets
FROM ({DMA_SERIES})
GROUP BY node, unit
"""
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


def old_candidates(source: Reader, window: Window, lookback_s: float) -> pd.DataFrame:
    return series_sql_frame(source, DMA_SQL, D.DMA_METRICS, window, lookback_s)


def signals(candidates: pd.DataFrame) -> set[str]:
    """The kinds of candidates a frame holds: gpu, port, nccl."""
    kinds = {"gpu"} if candidates["component"].str.startswith("gpu:").any() else set()
    kinds |= {"port"} if candidates["is_port"].any() else set()
    return kinds | ({"nccl"} if candidates["nccl_without_gdr"].map(len).any() else set())


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> Compared:
    return compare(monkeypatch, dma, "candidates", old_candidates)


SCENARIOS = scenarios(test_dma)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_gives_the_frame_the_sql_gave(
    scenario: Callable[..., None], compared: Compared, request: pytest.FixtureRequest
):
    play_compared(scenario, request, compared)


def test_a_fleet_stepped_by_the_runner_gives_the_frames_the_sql_gave(
    store: Store, tmp_path: Path, fixtures: Path, compared: Compared
):
    """PCIe downgrades, slow and congested ports, a link down and back, NCCL ranks with and without
    GPUDirect RDMA, a reboot and a scrape gap, every window through one runner's tape, warm from the
    second window on."""
    runner = DetectionRunner([dma.DmaDegraded()])
    with SimulatedFleet(store, tmp_path, nodes=6, gpus=2) as fleet:
        for node in fleet.nodes:
            node.job = "llm" if node.index < 4 else ""
            log = test_dma.NO_GDR_LOG if node.name in ("vela-002", "vela-005") else test_dma.GDR_LOG
            shutil.copy(fixtures / "nccl" / log, node.nccl_dir / "rank.log")
        windows = [fleet.tick() for _ in range(3)]
        fleet["vela-004"].gpus.set_fault(1, "pcie_downgrade", gen=4, width=8, replays_per_second=2.0)
        fleet.set_load("vela-003", 0.3)
        fleet["vela-001"].sysfs.set_congestion(0, 1.0)
        fleet["vela-006"].sysfs.set_link(1, up=False)
        windows += [fleet.tick() for _ in range(3)]
        fleet.restart("vela-002")
        fleet["vela-006"].sysfs.set_link(1, up=True)
        windows += [fleet.tick(skip={"vela-005"}) for _ in range(2)]
        windows += [fleet.tick() for _ in range(3)]
        for window in windows:
            runner.step(store, window)
    assert set().union(*map(signals, compared.frames)) == {"gpu", "port", "nccl"}

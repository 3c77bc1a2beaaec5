"""gpu_fault computes on the tape the very frame its ClickHouse SQL gave before it moved onto it (kept
here as the reference): on every window of every scenario of test_gpu_fault.py and of the stock-exporter
scenarios that run it, alone or under the runner's warm tape, and on a fleet stepped window by window
through Xids of several kinds, a lost GPU, ECC counter resets and DCGM going silent."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors import gpu_fault
from analytics.detectors.base import Window
from analytics.detectors.counters import (
    INCREASE,
    INSIDE_MAX,
    INSIDE_MIN,
    STEADY_INCREASE,
    series_sql,
)
from analytics.detectors.dcgm import ANSWERS, GPU_UP, metric_in
from analytics.detectors.gpu_fault import (
    DBE_COUNTERS,
    LAST_XID,
    REMAPPED_ROWS,
    ROW_REMAP_FAILURE,
    XID_COUNTER,
    GpuFault,
)
from analytics.detectors.peers import NODE_JOBS
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
from analytics.store.protocols import Reader
from tests.analytics.detectors import test_gpu_fault, test_stock_exporters
from tests.analytics.detectors.replay import (
    Compared,
    assert_same_frame,
    compare,
    play_compared,
    scenarios,
    series_sql_frame,
)
from tests.analytics.detectors.test_gpu_fault import store_gpu_scrapes
from tests.analytics.detectors.test_hostile_inputs import BASE, VALUES, XID_LABELS, examples
from tests.support.fleetdata import SimulatedFleet

FAULT_SERIES = series_sql(
    f"{INCREASE} AS increase",
    f"{STEADY_INCREASE} AS steady_increase",
    "length(inside) AS samples",
    f"{INSIDE_MIN} AS low",
    f"{INSIDE_MAX} AS high",
    "arrayMap(step -> step.2.2, arrayFilter(step -> step.2.2 != step.1.2, steps)) AS turned_to",
    "before_t > 0 AS seen_before",
    "if(length(inside) > 0, inside[1].2, 0) AS first_value",
    "first_t",
    "sampled_at",
    lookback_aggregates=("min(t) AS first_t", f"groupUniqArrayIf(t, {metric_in(ANSWERS)}) AS sampled_at"),
)
XID_EVENTS = f"""
SELECT node, labels['gpu'] AS gpu, labels['pci_bus_id'] AS pci_bus_id, metric, samples, low, high, increase,
    steady_increase, first_t, sampled_at,
    toInt64OrNull(labels['xid']) AS counted_code,
    increase + if(born, first_value, 0) AS events,
    arrayMap(value -> toInt64(value), arrayFilter(
        value -> isFinite(value) AND value >= 1 AND value < 1e9 AND value = floor(value),
        if(born, arrayPushFront(turned_to, first_value), turned_to)
    )) AS gauge_codes,
    multiIf(
        metric = '{XID_COUNTER}' AND isNotNull(counted_code) AND isFinite(events) AND events > 0,
            [assumeNotNull(counted_code)],
        metric = '{LAST_XID}', arrayDistinct(gauge_codes),
        CAST([], 'Array(Int64)')
    ) AS codes,
    multiIf(
        metric = '{XID_COUNTER}', arrayMap(code -> events, codes),
        arrayMap(code -> toFloat64(countEqual(gauge_codes, code)), codes)
    ) AS counts
FROM (
    SELECT *, samples > 0 AND NOT seen_before AND max(seen_before) OVER (PARTITION BY node) AS born
    FROM ({FAULT_SERIES})
)
"""
ANSWERED = metric_in(ANSWERS)
DBE_INCREASES = ", ".join(
    f"sumIf(increase, metric = '{name}' AND isFinite(increase))" for name in DBE_COUNTERS
)
FAULT_SQL = f"""
SELECT gpus.*, jobs.job AS job, max(reported) OVER (PARTITION BY gpus.node) AS node_reported,
    arrayCount(
        t -> t > if(notEmpty(answered_at), arrayMax(answered_at), first_seen - 0.001),
        groupUniqArrayArray(answered_at) OVER (PARTITION BY gpus.node)
    ) AS silent_scrapes
FROM (
    SELECT node, gpu != '' AS known_gpu, if(known_gpu, concat('gpu:', gpu), '') AS component, pci_bus_id,
        maxMap(codes, counts) AS xids, xids.1 AS xid_codes, xids.2 AS xid_events,
        countIf(metric = '{GPU_UP}') > 0 AS has_up,
        if(
            has_up, countIf(metric = '{GPU_UP}' AND samples > 0), countIf({ANSWERED} AND samples > 0)
        ) > 0 AS reported,
        minIf(low, metric = '{GPU_UP}' AND samples > 0) AS gpu_up,
        arraySort(groupUniqArrayArray(sampled_at)) AS answered_at,
        min(first_t) AS first_seen,
        maxIf(high, metric = '{ROW_REMAP_FAILURE}' AND samples > 0) AS row_remap_failure,
        greatest({DBE_INCREASES}) AS dbe_errors,
        sumIf(steady_increase, metric = '{REMAPPED_ROWS}' AND isFinite(steady_increase)) AS remapped_rows
    FROM ({XID_EVENTS})
    GROUP BY node, gpu, pci_bus_id
) AS gpus
LEFT JOIN ({NODE_JOBS}) AS jobs ON gpus.node = jobs.node
ORDER BY node, component, pci_bus_id
"""


def old_gpu_faults(source: Reader, window: Window, lookback_s: float) -> pd.DataFrame:
    """The SQL's frame as gpu_fault's now reads: its Xid lists turned into `xid_counts` as the detector
    turned them before, and without `answered_at`, which silent_scrapes is counted from (gpu_fault's
    frame holds neither: 1,536 lists each per window at 192 nodes, for the garbage collector to walk)."""
    found = series_sql_frame(source, FAULT_SQL, gpu_fault.FAULT_METRICS, window, lookback_s)
    counts = [
        {int(code): round(events) for code, events in zip(codes, counted, strict=True) if events >= 1}
        for codes, counted in zip(found["xid_codes"], found["xid_events"], strict=True)
    ]
    found.insert(found.columns.get_loc("xids"), "xid_counts", counts)
    return found.drop(columns=["xids", "xid_codes", "xid_events", "answered_at"])


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> Compared:
    return compare(monkeypatch, gpu_fault, "gpu_faults", old_gpu_faults)


SCENARIOS = scenarios(test_gpu_fault, test_stock_exporters, mentioning={test_stock_exporters: "GpuFault"})


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_gives_the_frame_the_sql_gave(
    scenario: Callable[..., None], compared: Compared, request: pytest.FixtureRequest
):
    play_compared(scenario, request, compared)


def test_a_fleet_stepped_by_the_runner_gives_the_frames_the_sql_gave(
    store: Store, tmp_path: Path, compared: Compared
):
    """Xids of several kinds, a lost GPU, ECC counters reset by a reboot, a scrape gap and a GPU missing
    after the reboot, every window through one runner's tape, warm from the second window on."""
    runner = DetectionRunner([GpuFault()])
    with SimulatedFleet(store, tmp_path, nodes=4) as fleet:
        windows = [fleet.tick() for _ in range(2)]
        fleet["vela-001"].gpus.set_fault(2, "xid", code=13)
        fleet["vela-001"].gpus.set_fault(3, "xid", code=79)
        fleet["vela-002"].gpus.set_fault(1, "gpu_lost")
        fleet["vela-003"].gpus.set_fault(0, "ecc", dbe=2, remap_failure=True)
        windows += [fleet.tick() for _ in range(3)]
        fleet["vela-004"].gpus.set_fault(3, "ecc", dbe=1)
        fleet["vela-004"].gpus.set_fault(3, "xid", code=48)
        windows.append(fleet.tick(skip={"vela-002"}))
        fleet.restart("vela-003", gpus=3)  # its ECC counters start again, and GPU 3 is gone
        windows += [fleet.tick() for _ in range(3)]
        for window in windows:
            runner.step(store, window)
    assert compared.rows > 0


def test_a_stock_fleet_whose_dcgm_goes_silent_gives_the_frames_the_sql_gave(
    store: Store, tmp_path: Path, fixtures: Path, compared: Compared
):
    """dcgm-exporter alone: the last-Xid gauge, remapped rows, a GPU lost, DCGM silent for a node and late
    for some GPUs, stepped through one runner."""
    runner = DetectionRunner([GpuFault()])
    with test_stock_exporters.stock_fleet(store, tmp_path, fixtures) as (fleet, stock):
        windows = [fleet.tick() for _ in range(2)]
        fleet["vela-001"].gpus.set_fault(2, "xid", code=48)
        fleet["vela-002"].gpus.set_fault(1, "gpu_lost")
        fleet["vela-003"].gpus.set_fault(0, "ecc", dbe=1)
        for code in (48, 63, 94, 94):
            fleet["vela-003"].gpus.set_fault(0, "xid", code=code)
        windows += [fleet.tick() for _ in range(2)]
        stock.mute("vela-004")
        windows += [fleet.tick() for _ in range(2)]
        stock.unmute("vela-004")
        stock.mute("vela-004", gpu="1")
        windows += [fleet.tick() for _ in range(4)]
        for window in windows:
            runner.step(store, window)
    assert compared.rows > 0


GAUGE_VALUES = st.one_of(st.sampled_from([13.0, 48.0, 79.0, 0.0, 2.5, 1e9, math.nan, math.inf]), VALUES)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(
    counters=st.lists(st.tuples(XID_LABELS, st.lists(VALUES, min_size=4, max_size=4)), max_size=3),
    gauges=st.lists(st.lists(GAUGE_VALUES, min_size=4, max_size=4), min_size=4, max_size=4),
    late=st.integers(1, 3),
)
def test_any_xid_labels_and_values_give_the_frame_the_sql_gave(
    store: Store,
    counters: list[tuple[str, list[float]]],
    gauges: list[list[float]],
    late: int,
):
    """Xid counters of any label and values, the last-Xid gauge, fleetlens_gpu_up, ECC and remap series
    taking any values (NaN, infinities, resets); the counters first seen `late` scrapes after the rest."""
    base = BASE - next(examples) * 7200 - 5400
    names = ["fleetlens_gpu_up", LAST_XID, *DBE_COUNTERS, REMAPPED_ROWS]
    series = [(name, {}) for name in names] + [(XID_COUNTER, {"xid": xid}) for xid, _ in counters]
    ticks = [[*(gauge[tick] for gauge in gauges), gauges[0][tick]] for tick in range(4)]
    store_gpu_scrapes(store, base, series[: len(names)], ticks)
    if counters:
        later = [[values[tick] for _, values in counters] for tick in range(late, 4)]
        store_gpu_scrapes(store, base + 10 * late, series[len(names) :], later)
    for index in range(5):
        window = Window(base + 10 * index, base + 10 * (index + 1))
        assert_same_frame(gpu_fault.gpu_faults(store, window, 20.0), old_gpu_faults(store, window, 20.0))

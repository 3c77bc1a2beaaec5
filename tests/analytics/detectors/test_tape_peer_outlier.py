"""peer_outlier computes its sampled features on the tape as the ClickHouse SQL did before it moved onto it
(kept here as the reference): the features frame is the same on every window of every scenario of
test_peer_outlier.py and of the stock-exporter scenarios that run it, alone or under the runner's warm
tape, and on a fleet stepped window by window through a throttled node, a reboot (counters reset) and a
scrape gap. The tape's medians are ClickHouse's quantileExact and median on any values."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors import peer_outlier
from analytics.detectors.base import Window
from analytics.detectors.groups import group_median, group_quantile_exact
from analytics.detectors.peer_outlier import SAMPLED, SAMPLED_METRICS, PeerOutlier
from analytics.detectors.peers import node_values
from analytics.detectors.runner import DetectionRunner
from analytics.detectors.slow_node import SlowNode
from analytics.store import Store
from analytics.store.protocols import Reader
from tests.analytics.detectors import SyncJob, test_peer_outlier, test_stock_exporters
from tests.analytics.detectors.replay import Compared, play_compared, scenarios
from tests.support.fleetdata import SimulatedFleet

# per series: the median (gauges) and the rate over the span (counters; NULL across a reset or with one
# sample); then per node: the median of its series' medians, or the sum of their rates. The detector's SQL
# summed them with sum(rate), in the order of ClickHouse's hash table, which three rates or more may round
# differently than another order: they are added here in ascending order, as the tape adds them.
NODE_FEATURES = """
SELECT node, metric,
    if(
        has({counters:Array(String)}, metric),
        if(count(rate) > 0, arraySum(arraySort(groupArray(rate))), NULL),
        median(level)
    ) AS value
FROM (
    SELECT node, CAST(metric, 'String') AS metric, quantileExact(0.5)(value) AS level,
        argMax(value, ts) - argMin(value, ts) AS growth,
        dateDiff('millisecond', min(ts), max(ts)) / 1000 AS seconds,
        if(seconds > 0 AND growth >= 0, growth / seconds, NULL) AS rate
    FROM samples
    WHERE metric IN {metrics:Array(String)} AND node IN {nodes:Array(String)}
        AND ts >= {since:DateTime64(3)} AND ts < {end:DateTime64(3)}
    GROUP BY node, metric, series_id
)
GROUP BY node, metric
"""
NEW_FEATURES = PeerOutlier.features


def old_sampled_features(source: Reader, window: Window, nodes: np.ndarray, lookback_s: float) -> np.ndarray:
    parameters = {
        **window.parameters,
        "since": datetime.fromtimestamp(window.start - lookback_s, UTC),
        "metrics": SAMPLED_METRICS,
        "counters": [feature.metric for feature in SAMPLED if feature.counter],
        "nodes": list(pd.unique(nodes)),
    }
    return node_values(source.query(NODE_FEATURES, parameters=parameters), SAMPLED_METRICS, nodes)


def new_features(source: Reader, window: Window, detector: PeerOutlier) -> pd.DataFrame:
    return NEW_FEATURES(detector, source, window)


def old_features(source: Reader, window: Window, detector: PeerOutlier) -> pd.DataFrame:
    """features() with its sampled features from the SQL, as before."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(peer_outlier, "sampled_features", old_sampled_features)
        return NEW_FEATURES(detector, source, window)


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> Compared:
    check = Compared(new_features, old_features)
    monkeypatch.setattr(
        PeerOutlier, "features", lambda detector, source, window: check(source, window, detector)
    )
    return check


SCENARIOS = scenarios(
    test_peer_outlier,
    test_stock_exporters,
    mentioning={test_peer_outlier: "run_job(", test_stock_exporters: "PeerOutlier"},
)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_gives_the_features_the_sql_gave(
    scenario: Callable[..., None], compared: Compared, request: pytest.FixtureRequest
):
    play_compared(scenario, request, compared)


def test_a_fleet_stepped_by_the_runner_gives_the_features_the_sql_gave(
    store: Store, tmp_path: Path, compared: Compared
):
    """A throttled node, a reboot (its RoCE counters start again), a scrape gap, a slow GPU and two nodes
    running a second job too, every window through one runner's tape shared with slow_node, warm from the
    second window on."""
    windows = []
    with SimulatedFleet(store, tmp_path, nodes=10, gpus=2, nics=2) as fleet:
        start = fleet.clock() + fleet.interval_s
        windows += [fleet.tick() for _ in range(3)]
        fleet["vela-003"].gpus.set_fault(0, "thermal_throttle")
        fleet["vela-005"].gpus.set_fault(1, "slow", clock_factor=0.8)
        windows += [fleet.tick() for _ in range(3)]
        fleet.restart("vela-002")
        windows += [fleet.tick(skip={"vela-004"}) for _ in range(2)]
        windows += [fleet.tick() for _ in range(3)]
    seconds = len(windows) * fleet.interval_s
    store.insert_steps(SyncJob(nodes=10).steps(start, seconds), token="steps")
    store.insert_steps(SyncJob(nodes=2, name="eval").steps(start, seconds), token="second job")
    runner = DetectionRunner([PeerOutlier(), SlowNode()])
    for window in windows:
        runner.step(store, window)
    assert compared.rows > 0
    assert PeerOutlier().features(store, windows[-1])["node"].tolist().count("vela-001") == 2  # two jobs


CLICKHOUSE_MEDIANS = """
SELECT g, quantileExact(0.5)(v) AS exact, median(v) AS median
FROM (SELECT arrayJoin(arrayZip({g:Array(Int64)}, {v:Array(Float64)})) AS row, row.1 AS g, row.2 AS v)
GROUP BY g
ORDER BY g
"""
MEDIAN_VALUES = st.one_of(
    st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 0.1, 0.7]),
    st.floats(-1e6, 1e6),
    st.floats(allow_nan=True, allow_infinity=True),
)
GROUPS = 3


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(MEDIAN_VALUES, min_size=1, max_size=20), min_size=GROUPS, max_size=GROUPS))
def test_group_medians_are_clickhouses_quantile_exact_and_median(store: Store, values: list[list[float]]):
    """Bit for bit, on 1 to 20 values per group with NaN (skipped), ties, infinities (an infinity times
    a zero weight is NaN in ClickHouse's interpolation) and groups left all NaN."""
    codes = np.repeat(np.arange(GROUPS), [len(group) for group in values])
    flat = np.array([value for group in values for value in group], dtype=float)
    order = np.random.default_rng(len(flat)).permutation(len(flat))  # groups' values interleaved
    codes, flat = codes[order], flat[order]
    result = store.query(CLICKHOUSE_MEDIANS, parameters={"g": codes.tolist(), "v": flat.tolist()})
    want = np.array([[exact, median] for _, exact, median in result.rows], dtype=float)
    got = np.column_stack([group_quantile_exact(codes, GROUPS, flat), group_median(codes, GROUPS, flat)])
    assert np.array_equal(got, want, equal_nan=True), (got, want)


def test_a_group_without_values_has_nan_medians():
    codes, values = np.array([1, 1, 2]), np.array([3.0, 1.0, np.nan])
    assert np.array_equal(
        group_quantile_exact(codes, 4, values), [np.nan, 3.0, np.nan, np.nan], equal_nan=True
    )
    assert np.array_equal(group_median(codes, 4, values), [np.nan, 2.0, np.nan, np.nan], equal_nan=True)

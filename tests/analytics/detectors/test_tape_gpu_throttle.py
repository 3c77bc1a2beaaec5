"""gpu_throttle computes on the tape the very frames its ClickHouse SQL gave before it moved onto it (kept
here as the reference): its window's GPUs and its features, on every call of the gpu_throttle scenarios
(test_gpu_throttle.py, the DCGM ones of test_stock_exporters.py, hostile tables), alone or under the
runner's warm tape, and on a fleet stepped window by window."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors import gpu_throttle, links
from analytics.detectors.base import Window, frame
from analytics.detectors.counters import MAX_CANDIDATES
from analytics.detectors.dcgm import CLOCK_EVENT_MASKS, CLOCK_EVENT_REASONS, mask_reasons, metric_in
from analytics.detectors.gpu_throttle import REASON_SERIES, SLOWDOWN_REASONS, THROTTLE_METRICS, GpuThrottle
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
from analytics.store.protocols import Reader
from analytics.store.records import ScrapeBatch
from tests.analytics.detectors import test_gpu_throttle, test_stock_exporters
from tests.analytics.detectors.replay import Compared, assert_same_frame, compare, play_compared, scenarios
from tests.support.fleetdata import SimulatedFleet

GPUS_SQL = f"""
SELECT node, concat('gpu:', labels['gpu']) AS component, '' AS job, any(labels['modelName']) AS model,
    avgIf(value, metric = 'DCGM_FI_DEV_SM_CLOCK') AS sm_clock_mhz,
    avgIf(value, metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_percent,
    maxIf(value, metric = 'DCGM_FI_DEV_GPU_TEMP') AS temp_c,
    avgIf(value, metric = 'DCGM_FI_DEV_POWER_USAGE') AS power_w,
    countIf({metric_in(REASON_SERIES)}) > 0 AS reasons_known,
    arraySort(arrayFilter(
        reason -> has({{slowdown_reasons:Array(String)}}, reason),
        arrayDistinct(arrayConcat(
            groupUniqArrayIf(labels['reason'], metric = '{CLOCK_EVENT_REASONS}' AND value = 1),
            groupUniqArrayArrayIf({mask_reasons("value")}, {metric_in(CLOCK_EVENT_MASKS)})
        ))
    )) AS reasons
FROM metrics
WHERE metric IN {{metrics:Array(String)}} AND ts >= {{start:DateTime64(3)}} AND ts < {{end:DateTime64(3)}}
    AND labels['gpu'] != ''
GROUP BY node, component
HAVING countIf(metric = 'DCGM_FI_DEV_SM_CLOCK') > 0
ORDER BY node, component
"""


def old_gpus(source: Reader, window: Window) -> pd.DataFrame:
    parameters = {
        **window.parameters,
        "metrics": list(THROTTLE_METRICS),
        "slowdown_reasons": list(SLOWDOWN_REASONS),
    }
    return frame(source.query(GPUS_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))


def pandas_features(
    detector: GpuThrottle, source: Reader, window: Window, gpus: pd.DataFrame
) -> pd.DataFrame:
    """GpuThrottle.features on `gpus` as pandas computed it before its groupbys moved onto numpy codes."""
    gpus["busy"] = gpus["util_percent"] >= detector.busy_util_percent
    group = gpus.groupby(["model", "busy"])
    alone = group["node"].transform("nunique") <= 1
    ceiling = group["sm_clock_mhz"].transform("max").where(~alone, math.inf)
    could_drop = gpus["sm_clock_mhz"] <= (1 - detector.min_unknown_drop) * ceiling
    gpus["unknown"] = ~gpus["reasons_known"].astype(bool) & gpus["busy"] & could_drop
    gpus["reasons"] = [
        [gpu_throttle.UNKNOWN] if unknown else list(reasons)
        for reasons, unknown in zip(gpus["reasons"], gpus["unknown"], strict=True)
    ]
    throttling = gpus["reasons"].map(len) > 0
    on_their_nodes = gpus[gpus["node"].isin(gpus.loc[throttling, "node"])].copy()
    on_their_nodes["node_gpus"] = on_their_nodes.groupby("node")["component"].transform("size")
    on_their_nodes["node_peers_mhz"] = on_their_nodes.groupby(["node", "busy"])["sm_clock_mhz"].transform(
        "median"
    )
    candidates = on_their_nodes[throttling[on_their_nodes.index]].copy()
    medians = pd.Series(math.nan, index=candidates.index, dtype=float)
    nodes, models, busy = (gpus[column].to_numpy() for column in ("node", "model", "busy"))
    clocks = gpus["sm_clock_mhz"].to_numpy(float)
    for (node, model, is_busy), own in candidates.groupby(["node", "model", "busy"]):
        others = (models == model) & (busy == is_busy) & (nodes != node)
        medians[own.index] = pd.Series(clocks[others]).median()
    candidates["fleet_peers_mhz"] = medians
    columns = {name: candidates[name].to_numpy() for name in ("node", "component", "busy", "fleet_peers_mhz")}
    candidates["past_mhz"] = detector._past(source, window, columns)
    return candidates.reset_index(drop=True)


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[Compared]:
    """The window's GPUs against the old SQL's, and the features against those the old pandas code
    (pandas_features) computed from the old SQL's GPUs."""
    features = GpuThrottle.features

    def old_features(detector: GpuThrottle, source: Reader, window: Window) -> pd.DataFrame:
        return pandas_features(detector, source, window, old_gpus(source, window))

    gpus = compare(monkeypatch, gpu_throttle, "window_gpus", old_gpus)
    checks = [gpus, Compared(features, old_features)]
    monkeypatch.setattr(GpuThrottle, "features", lambda self, *args: checks[1](self, *args))
    return checks


SCENARIOS = scenarios(
    test_gpu_throttle,
    test_stock_exporters,
    mentioning={test_gpu_throttle: "GpuThrottle", test_stock_exporters: "GpuThrottle"},
)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_gives_the_frames_the_sql_gave(
    scenario: Callable[..., None], compared: list[Compared], request: pytest.FixtureRequest
):
    play_compared(scenario, request, compared[0], mask=CLOCK_EVENT_MASKS[0])


GPU_LABELS = st.fixed_dictionaries(
    {"gpu": st.sampled_from(["0", "1", "2", "10", ""])},
    optional={"reason": st.sampled_from([*SLOWDOWN_REASONS, "gpu_idle", ""])},
)
VALUES = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0, 8.0, 136.0, 2.0**32, -8.0, math.nan, math.inf, -math.inf, 1e18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(0, 2**32 - 1).map(float),
)
FIXTURE_CHECKS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
examples = itertools.count()


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=FIXTURE_CHECKS)
@given(
    samples=st.lists(
        st.tuples(
            st.sampled_from(["n1", "n2"]),
            st.integers(-3, 12),
            st.sampled_from(THROTTLE_METRICS),
            GPU_LABELS,
            VALUES,
        ),
        max_size=60,
    )
)
def test_any_samples_give_the_gpus_the_sql_gave(
    store: Store, samples: list[tuple[str, int, str, dict[str, str], float]]
):
    """Random GPU series: NaN, infinite and huge values, masks that are no mask, reasons of every kind,
    series without a gpu label, samples at and outside the window's edges, several per series."""
    base = 1_700_000_000.0 - next(examples) * 7200  # an hour from every other example's rows, both ways
    batches = []
    for node, offset, metric, labels, value in samples:
        model = {"n1": "H100", "n2": "A100"}[node]
        batches.append(
            ScrapeBatch(
                f"{node}:9400", node, base + offset, [metric], [{**labels, "modelName": model}], [value]
            )
        )
    store.insert_samples(batches, token=f"gpus-{base}")
    for window in (Window(base, base + 10), Window(base - 10, base)):
        assert_same_frame(gpu_throttle.window_gpus(store, window), old_gpus(store, window))


def test_a_fleet_stepped_by_the_runner_gives_the_frames_the_sql_gave(
    store: Store, tmp_path: Path, compared: list[Compared]
):
    """Throttling GPUs, a braked node, a reboot and a scrape gap, every window through one runner's tape,
    held for link_flap's minute, warm from the second window on."""
    runner = DetectionRunner([GpuThrottle(), links.LinkFlap()])
    with SimulatedFleet(store, tmp_path, nodes=5, gpus=4) as fleet:
        windows = [fleet.tick() for _ in range(3)]
        fleet["vela-002"].gpus.set_fault(3, "thermal_throttle", temp_c=91, clock_factor=0.7)
        test_gpu_throttle.brake_every_gpu(fleet["vela-004"])
        fleet.set_load("vela-003", 0.0)
        windows += [fleet.tick() for _ in range(4)]
        fleet.restart("vela-002")
        windows += [fleet.tick(skip={"vela-005"}) for _ in range(2)]
        windows += [fleet.tick() for _ in range(3)]
        for window in windows:
            runner.step(store, window)
    assert runner.failures == {}
    assert compared[1].rows > 0


GPU_ROWS = st.lists(  # one GPU each: node, model, utilisation, SM clock, whether it has reasons, its reasons
    st.tuples(
        st.sampled_from(["n1", "n2", "n3", "n4"]),
        st.sampled_from(["H100", "A100", ""]),
        st.sampled_from([0.0, 10.0, 20.0, 95.0, math.nan]),
        st.one_of(st.sampled_from([math.nan, 0.0, 1410.0, 1980.0]), st.floats(0, 2000)),
        st.booleans(),
        st.lists(st.sampled_from(sorted(SLOWDOWN_REASONS)), unique=True, max_size=2).map(sorted),
    ),
    max_size=24,
)


@settings(max_examples=200, deadline=None)
@given(rows=GPU_ROWS, drop=st.sampled_from([0.1, 0.25, 0.6]))
def test_any_gpus_give_the_features_the_pandas_code_gave(
    rows: list[tuple[str, str, float, float, bool, list[str]]], drop: float
):
    """Random GPUs of several models over a few nodes, idle and busy, with and without reasons: a model on
    one node, on two and on more, NaN clocks and utilisations, equal clocks."""
    gpus = pd.DataFrame(
        [
            (node, f"gpu:{i}", "", model, clock, util, 60.0, 300.0, int(known), reasons if known else [])
            for i, (node, model, util, clock, known, reasons) in enumerate(rows)
        ],
        columns=gpu_throttle.GPU_COLUMNS,
    ).astype({"sm_clock_mhz": float, "util_percent": float, "temp_c": float, "power_w": float})
    detector = GpuThrottle(min_unknown_drop=drop, past_s=0)  # no past: no store to read it from
    new = pytest.MonkeyPatch.context()
    with new as patched:
        patched.setattr(gpu_throttle, "window_gpus", lambda *_: gpus.copy())
        got = detector.features(None, Window(0, 10))  # type: ignore[arg-type]
    assert_same_frame(got, pandas_features(detector, None, Window(0, 10), gpus.copy()))  # type: ignore[arg-type]


CLOCKS = st.sampled_from([math.nan, 0.0, -5.0, 1000.0, 1500.0, math.inf]) | st.floats(0, 3000)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(CLOCKS, CLOCKS, CLOCKS, CLOCKS, st.booleans()), max_size=12))
def test_score_is_the_drop_below_the_highest_reference_as_pandas_takes_it(
    rows: list[tuple[float, float, float, float, bool]],
):
    """The score of a throttled GPU: 1 - its clock over the highest of its references (NaN ones skipped),
    0 without any reference or where that is NaN, clipped to [0, 1]; 0 for a GPU with no reason."""
    columns = ["node_peers_mhz", "fleet_peers_mhz", "past_mhz", "sm_clock_mhz", "x"]
    features = pd.DataFrame(rows, columns=columns, dtype=float)
    features["reasons"] = [["sw_thermal"] if throttled else [] for throttled in features.pop("x")]
    reference = features[["node_peers_mhz", "fleet_peers_mhz", "past_mhz"]].max(axis=1, skipna=True)
    drop = (1 - features["sm_clock_mhz"] / reference).fillna(0).clip(lower=0, upper=1)
    expected = np.where(features["reasons"].map(len) > 0, drop, 0.0)
    assert np.array_equal(GpuThrottle().score(features), expected)

"""link_flap, link_down and congestion compute on the tape the very frames their ClickHouse SQL gave
before they moved onto it (kept here as the reference): on every window of every scenario of
test_links.py and test_congestion.py, alone or under the runner's warm tape, and on a conformance
fleet stepped window by window."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from analytics.detectors import congestion, links
from analytics.detectors.base import Window, frame
from analytics.detectors.counters import (
    LAST,
    MAX_CANDIDATES,
    STEADY_RATE,
    STEADY_SECONDS,
    series_parameters,
    series_sql,
    steady_increase,
)
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
from analytics.store.protocols import Reader
from tests.analytics.detectors import test_congestion, test_links
from tests.analytics.detectors.replay import play, scenarios
from tests.support.fleetdata import SimulatedFleet

L = links
UP = f"multiIf(metric = '{L.STATE}', {L.ACTIVE}, metric = '{L.PHYSICAL_STATE}', {L.LINK_UP}, {L.CARRIER_UP})"
RECENT_STEPS = "arrayZip(arrayPopBack(recent), arrayPopFront(recent))"
LINK_SERIES = series_sql(
    f"{UP} AS up",
    f"metric NOT IN ('{L.LINK_DOWNED}', '{L.CARRIER_DOWN}') AS gauge",
    "length(inside) AS samples",
    f"{LAST} AS last",
    f"arrayCount(step -> step.1.2 = up AND step.2.2 != up, {RECENT_STEPS}) AS falls",
    "arrayAll(point -> point.2 != up, inside) AS down_inside",
    "points[-1].1 - if(last_up_t > 0, last_up_t, recent[1].1) AS down_s",
    f"{steady_increase(RECENT_STEPS)} AS increase",
    lookback_aggregates=(
        f"maxIf(t, value = {UP}) AS last_up_t",
        "arraySort(point -> point.1, groupArray((t, value))) AS recent",
    ),
)
LINK_SQL = f"""
SELECT node, if(netdev, labels['device'], concat(labels['device'], ':', labels['port'])) AS component,
    '' AS job, startsWith(metric, 'node_network_') AS netdev,
    countIf(metric IN ('{L.STATE}', '{L.CARRIER}') AND samples > 0) > 0 AS reported,
    maxIf(last, metric IN ('{L.STATE}', '{L.CARRIER}') AND samples > 0) AS state,
    maxIf(last, metric = '{L.PHYSICAL_STATE}' AND samples > 0) AS physical_state,
    reported AND if(netdev, state = {L.CARRIER_UP}, state = {L.ACTIVE} AND physical_state = {L.LINK_UP})
        AS up_now,
    reported AND maxIf(down_inside, gauge AND samples > 0) AS down_whole_window,
    maxIf(down_s, gauge AND samples > 0) AS down_s,
    maxIf(falls, gauge) AS state_falls,
    sumIf(increase, NOT gauge) AS link_downed,
    greatest(state_falls, link_downed) AS downs
FROM ({LINK_SERIES})
GROUP BY node, netdev, component
QUALIFY NOT netdev OR (NOT match(component, {{ignored:String}}) AND min(netdev) OVER (PARTITION BY node))
ORDER BY node, component
"""
C = congestion
CONGESTION_SQL = f"""
SELECT *, medianExact(abs(per_s - fleet_median_per_s)) OVER (PARTITION BY signal) AS fleet_mad_per_s
FROM (
    SELECT *, medianExact(per_s) OVER (PARTITION BY signal) AS fleet_median_per_s
    FROM (
        SELECT node, concat(labels['device'], ':', labels['port']) AS component, '' AS job,
            sumIf(rate, metric = '{C.ECN_MARKED}') AS ecn_marks_per_s,
            sumIf(rate, metric = '{C.CNP_SENT}') AS cnp_sent_per_s,
            sumIf(rate, metric = '{C.CNP_HANDLED}') AS cnp_handled_per_s,
            sumIf(rate, metric = '{C.TRANSMIT_WAIT}') AS transmit_wait_per_s,
            ecn_marks_per_s + cnp_handled_per_s AS notifications_per_s,
            countIf(metric IN ('{C.ECN_MARKED}', '{C.CNP_HANDLED}') AND steady_s > 0) > 0 AS notified,
            if(notified, '{C.NOTIFICATIONS}', '{C.WAIT}') AS signal,
            if(notified, notifications_per_s, transmit_wait_per_s) AS per_s
        FROM ({series_sql(f"{STEADY_RATE} AS rate", f"{STEADY_SECONDS} AS steady_s")})
        GROUP BY node, component
        HAVING max(steady_s) > 0
    )
)
ORDER BY node, component
"""


def old_links(source: Reader, window: Window, lookback_s: float, ignored: str) -> pd.DataFrame:
    parameters = series_parameters(L.LINK_METRICS, window.start, window.end, lookback_s) | {
        "ignored": ignored
    }
    return frame(source.query(LINK_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))


def old_ports(source: Reader, window: Window) -> pd.DataFrame:
    parameters = series_parameters(C.CONGESTION_METRICS, window.start, window.end)
    return frame(source.query(CONGESTION_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))


def assert_same_frame(new: pd.DataFrame, old: pd.DataFrame) -> None:
    """The same columns, rows, order and values; an empty frame's columns alone (SQL's come untyped).
    Text is text whether pandas holds it as Python strings or Arrow's (the tape keeps Python strings);
    every other dtype must match."""
    if old.empty:
        assert new.empty and list(new.columns) == list(old.columns)
    else:
        pd.testing.assert_frame_equal(text_as_objects(new), text_as_objects(old), check_exact=True)


def text_as_objects(columns: pd.DataFrame) -> pd.DataFrame:
    """`columns` with its text as Python strings (object columns) wherever pandas holds Arrow strings."""
    text = [name for name, dtype in columns.dtypes.items() if isinstance(dtype, pd.StringDtype)]
    return columns.astype(dict.fromkeys(text, object)) if text else columns


class Compared:
    """Wraps a features function so that each call also runs the old SQL and compares."""

    def __init__(self, new: Callable[..., pd.DataFrame], old: Callable[..., pd.DataFrame]) -> None:
        self._new, self._old = new, old
        self.rows = 0

    def __call__(self, source: Reader, window: Window, *args: Any) -> pd.DataFrame:
        new = self._new(source, window, *args)
        assert_same_frame(new, self._old(source, window, *args))
        self.rows += len(new)
        return new


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[Compared]:
    checks = [Compared(links.links, old_links), Compared(congestion.ports, old_ports)]
    monkeypatch.setattr(links, "links", checks[0])
    monkeypatch.setattr(congestion, "ports", checks[1])
    return checks


SCENARIOS = scenarios(test_links, test_congestion)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_gives_the_frames_the_sql_gave(
    scenario: Callable[..., None], compared: list[Compared], request: pytest.FixtureRequest
):
    play(scenario, request)
    assert sum(check.rows for check in compared) > 0


def test_a_conformance_fleet_stepped_by_the_runner_gives_the_frames_the_sql_gave(
    store: Store, tmp_path: Path, compared: list[Compared]
):
    """Flaps, a link down, a reboot, a scrape gap and congestion, every window through one runner's
    tape, warm from the second window on."""
    runner = DetectionRunner([links.LinkFlap(), links.LinkDown(), congestion.Congestion()])
    with SimulatedFleet(store, tmp_path, nodes=6, gpus=0) as fleet:
        windows = [fleet.tick() for _ in range(3)]
        test_links.flap(fleet, "vela-002", 1)
        fleet["vela-003"].sysfs.set_link(0, up=False)
        fleet["vela-004"].sysfs.set_congestion(1, 0.2)
        windows += [fleet.tick() for _ in range(4)]
        fleet.restart("vela-002")
        fleet["vela-003"].sysfs.set_link(0, up=True)
        windows += [fleet.tick(skip={"vela-005"}) for _ in range(2)]
        windows += [fleet.tick() for _ in range(3)]
        for window in windows:
            runner.step(store, window)
    assert all(check.rows > 0 for check in compared)

"""link_flap, link_down and congestion compute on the tape the very frames their ClickHouse SQL gave
before they moved onto it (kept here as the reference): on every window of every scenario of
test_links.py and test_congestion.py, alone or under the runner's warm tape, and on a conformance
fleet stepped window by window."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from analytics.detectors import congestion, links
from analytics.detectors.base import Window
from analytics.detectors.counters import (
    LAST,
    STEADY_RATE,
    STEADY_SECONDS,
    series_sql,
    steady_increase,
)
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
from analytics.store.protocols import Reader
from tests.analytics.detectors import test_congestion, test_links
from tests.analytics.detectors.replay import Compared, compare, play_compared, scenarios, series_sql_frame
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
    return series_sql_frame(source, LINK_SQL, L.LINK_METRICS, window, lookback_s, ignored=ignored)


def old_ports(source: Reader, window: Window) -> pd.DataFrame:
    return series_sql_frame(source, CONGESTION_SQL, C.CONGESTION_METRICS, window)


@pytest.fixture
def compared(monkeypatch: pytest.MonkeyPatch) -> list[Compared]:
    return [
        compare(monkeypatch, links, "links", old_links),
        compare(monkeypatch, congestion, "ports", old_ports),
    ]


SCENARIOS = scenarios(test_links, test_congestion)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_scenario_gives_the_frames_the_sql_gave(
    scenario: Callable[..., None], compared: list[Compared], request: pytest.FixtureRequest
):
    play_compared(scenario, request, *compared)


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

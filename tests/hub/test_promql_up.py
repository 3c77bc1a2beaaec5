"""Scrape outcomes (the `targets` table) answer PromQL as Prometheus names a scrape's own series: `up`,
`scrape_duration_seconds` and `scrape_samples_scraped`, labelled `instance` and `node`. Target statuses
stored in the hub, the same values remote-written as plain series to a real Prometheus, the same queries
asked of both through `promtool` give the same answers; the catalog endpoints list them; a target name
holding quotes, backslashes and SQL is selected as text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics.store import Store
from analytics.store.records import TargetStatus
from tests.support.promqlpeers import (
    T0_MS,
    Point,
    compare_catalog,
    compare_instant,
    compare_range,
    get,
    hub_filled_and_prometheus,
    minutes,
    quoted,
)

pytestmark = pytest.mark.integration

HOSTILE = "a\"b\\c'; DROP TABLE targets; --"  # a target name a query must match as text, never run
TARGETS = {  # target -> (node, scrape interval in s); "" is a target whose node is not known
    "10.0.0.1:9400": ("n0", 15),
    "10.0.0.2:9400": ("n1", 15),
    "10.0.0.3:9400": ("n1", 15),
    HOSTILE: ("", 30),
}
DOWN = {"10.0.0.2:9400": (20, 30)}  # minutes from..to a target's scrapes fail
GONE = {"10.0.0.3:9400": (40, 52)}  # minutes from..to a target is not scraped at all: past the lookback


def statuses() -> list[TargetStatus]:
    """An hour of scrapes of each target, each target's scrapes offset by its index in seconds."""
    rows = []
    for index, (target, (node, interval_s)) in enumerate(TARGETS.items()):
        for k in range(3600 // interval_s):
            minute = k * interval_s / 60
            if GONE.get(target, (99, 99))[0] <= minute < GONE.get(target, (99, 99))[1]:
                continue
            down = DOWN.get(target, (99, 99))[0] <= minute < DOWN.get(target, (99, 99))[1]
            duration = 0.0125 * (1 + index) + k % 5 * 0.001
            samples = 0 if down else 1000 + 10 * index + k % 3
            error = "connection refused" if down else ""
            ts = (T0_MS + k * interval_s * 1000 + index * 1000) / 1000
            rows.append(TargetStatus(ts, target, node, not down, duration, samples, error))
    return rows


def as_points(rows: list[TargetStatus]) -> Iterator[Point]:
    """The plain samples a Prometheus gets for `rows`: what the hub must make of them."""
    for row in rows:
        labels = {"instance": row.target} | ({"node": row.node} if row.node else {})
        values = {"up": float(row.up), "scrape_duration_seconds": row.duration_s}
        values["scrape_samples_scraped"] = float(row.samples)
        for name, value in values.items():
            yield labels | {"__name__": name}, round(row.ts * 1000), value


@pytest.fixture(scope="module")
def peers(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The hub holding the target statuses, Prometheus the same values as plain series."""
    rows = statuses()

    def fill(store: Store) -> None:
        assert store.insert_targets(rows, token="promql-up") == len(rows)

    with hub_filled_and_prometheus(fill, as_points(rows), chdb_dir, tmp_path_factory.mktemp("up")) as both:
        yield both


NONE = 'up{instance="nowhere:9400"}'  # no such target: an empty answer on both sides
ESCAPED = quoted(HOSTILE)
QUERIES = [
    "up",
    "up == 0",
    'up{node="n1"}',
    'up{node=""}',
    f'up{{instance="{ESCAPED}"}}',
    'scrape_samples_scraped{instance=~".*DROP TABLE.*"}',
    '{__name__=~"up|scrape_.+", instance="10.0.0.2:9400"}',
    NONE,
    "avg_over_time(up[5m])",
    "min by (node) (up)",
    "count(up == 0)",
    "scrape_duration_seconds",
    "avg by (node) (scrape_duration_seconds)",
    "max by (instance) (scrape_duration_seconds)",
    "sum by (node) (scrape_samples_scraped)",
    "count_over_time(up[2m]) - sum_over_time(up[2m])",
]


@pytest.mark.parametrize("query", QUERIES)
def test_scrape_series_answer_instant_and_range_queries_as_prometheus_does(peers, query):
    """At times before, in and after a target's failures and absence, and over ranges whose step is
    shorter than the 5 m lookback and longer (samples between evaluation times left unread)."""
    times = [minutes(m) for m in (0, 0.3, 12.25, 25, 30.1, 44, 46.5, 52.2, 61, 80)]
    compared = compare_instant(peers, query, times)
    for step in ("20s", "7m", "6m17s"):
        compared += compare_range(peers, query, minutes(-5), minutes(70), step)
    assert compared or query == NONE, "nothing compared"


def test_the_failing_target_is_the_one_up_names(peers):
    status, answer = get(peers["hub"], "/api/v1/query", {"query": "up == 0", "time": str(minutes(25) / 1000)})
    assert status == 200
    assert [one["metric"] for one in answer["data"]["result"]] == [
        {"__name__": "up", "instance": "10.0.0.2:9400", "node": "n1"}
    ]


WINDOW = {"start": str(minutes(-10) / 1000), "end": str(minutes(70) / 1000)}
CATALOG_REQUESTS = {  # endpoint -> the match[] selectors asked of it
    "/api/v1/series": ('up{node="n1"}', f'{{__name__=~"scrape_.+", instance="{ESCAPED}"}}'),
    "/api/v1/labels": ("scrape_duration_seconds",),
    "/api/v1/label/instance/values": ("up",),
    "/api/v1/label/node/values": ('{__name__=~"up|scrape_.+"}',),
}


def test_the_catalog_lists_scrape_series_as_prometheus_does(peers):
    for path, selectors in CATALOG_REQUESTS.items():
        for match in selectors:
            compare_catalog(peers, path, WINDOW | {"match[]": match})


def test_metadata_names_the_scrape_metrics(peers):
    status, answer = get(peers["hub"], "/api/v1/metadata", WINDOW)
    assert status == 200
    assert sorted(answer["data"]) == ["scrape_duration_seconds", "scrape_samples_scraped", "up"]

"""Scrape outcomes (the `targets` table) answer PromQL as Prometheus names a scrape's own series: `up`,
`scrape_duration_seconds` and `scrape_samples_scraped`, labelled `instance` and `node`. Target statuses
stored in the hub, the same values remote-written as plain series to a real Prometheus, the same queries
asked of both through `promtool` give the same answers; the catalog endpoints list them; a target name
holding quotes, backslashes and SQL is selected as text."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics.store.records import TargetStatus
from tests.support import remote_write
from tests.support.promqlpeers import compare_instant, compare_range, get, hub_and_prometheus

pytestmark = pytest.mark.integration

MINUTE_MS = 60_000
T0_MS = (int(time.time()) - 2 * 3600) // 60 * MINUTE_MS  # inside both stores' windows, on a whole minute
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


def as_series(rows: list[TargetStatus]) -> list[remote_write.Series]:
    """The plain series a Prometheus gets for `rows`: what the hub must make of them."""
    series: dict[tuple, list[tuple[int, float]]] = {}
    for row in rows:
        labels = {"instance": row.target} | ({"node": row.node} if row.node else {})
        values = {"up": float(row.up), "scrape_duration_seconds": row.duration_s}
        values["scrape_samples_scraped"] = float(row.samples)
        for name, value in values.items():
            key = tuple(sorted((labels | {"__name__": name}).items()))
            series.setdefault(key, []).append((round(row.ts * 1000), value))
    return [(dict(key), samples) for key, samples in series.items()]


@pytest.fixture(scope="module")
def peers(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The hub holding the target statuses, Prometheus the same values as plain series."""
    with hub_and_prometheus([], chdb_dir, tmp_path_factory.mktemp("up")) as both:
        rows = statuses()
        assert both["hub_app"].store.insert_targets(rows, token="promql-up") == len(rows)
        status, answer = remote_write.post(
            both["prometheus"], remote_write.snappy(remote_write.encode(as_series(rows)))
        )
        assert status == 204, answer
        yield both


def minutes(m: float) -> int:
    return T0_MS + round(m * MINUTE_MS)


NONE = 'up{instance="nowhere:9400"}'  # no such target: an empty answer on both sides
ESCAPED = HOSTILE.replace("\\", "\\\\").replace('"', '\\"')
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
def test_instant_queries_of_scrape_series_answer_as_prometheus_does(peers, query):
    times = [minutes(m) for m in (0, 0.3, 12.25, 25, 30.1, 44, 46.5, 52.2, 61, 80)]
    assert compare_instant(peers, query, times) or query == NONE, "nothing compared"


@pytest.mark.parametrize("query", QUERIES)
def test_range_queries_of_scrape_series_answer_as_prometheus_does(peers, query):
    assert compare_range(peers, query, minutes(-5), minutes(70), "20s") or query == NONE, "nothing compared"


@pytest.mark.parametrize(
    ("query", "step"),
    [("up", "7m"), ("avg_over_time(up[1m])", "5m"), ("avg by (node) (scrape_duration_seconds)", "6m17s")],
)
def test_range_queries_with_steps_past_their_reach_answer_as_prometheus_does(peers, query, step):
    assert compare_range(peers, query, minutes(1), minutes(66), step)


def test_the_failing_target_is_the_one_up_names(peers):
    status, answer = get(peers["hub"], "/api/v1/query", {"query": "up == 0", "time": str(minutes(25) / 1000)})
    assert status == 200
    assert [one["metric"] for one in answer["data"]["result"]] == [
        {"__name__": "up", "instance": "10.0.0.2:9400", "node": "n1"}
    ]


WINDOW = {"start": str(minutes(-10) / 1000), "end": str(minutes(70) / 1000)}


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("/api/v1/series", 'up{node="n1"}'),
        ("/api/v1/series", f'{{__name__=~"scrape_.+", instance="{ESCAPED}"}}'),
        ("/api/v1/labels", "scrape_duration_seconds"),
        ("/api/v1/label/instance/values", "up"),
        ("/api/v1/label/node/values", '{__name__=~"up|scrape_.+"}'),
    ],
)
def test_the_catalog_lists_scrape_series_as_prometheus_does(peers, path, match):
    ours, theirs = (get(peers[side], path, WINDOW | {"match[]": match}) for side in ("hub", "prometheus"))
    assert ours[0] == theirs[0] == 200
    key = (lambda one: sorted(one.items())) if path == "/api/v1/series" else None
    assert sorted(ours[1]["data"], key=key) == sorted(theirs[1]["data"], key=key)
    assert ours[1]["data"]


def test_metadata_names_the_scrape_metrics(peers):
    status, answer = get(peers["hub"], "/api/v1/metadata", WINDOW)
    assert status == 200
    assert sorted(answer["data"]) == ["scrape_duration_seconds", "scrape_samples_scraped", "up"]

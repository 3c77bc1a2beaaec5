"""Training step records answer PromQL as the series fleetlens_step_{duration,compute,comm,data}_seconds:
step records stored in the hub, the same values remote-written as plain series to a real Prometheus, the
same queries asked of both through `promtool` give the same answers; the catalog endpoints list them;
job names holding quotes, backslashes and SQL are selected as text."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics.store import Store
from collectors.steprecord import StepRecord
from hub.promql.evaluate import extrapolated_rate
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

HOSTILE = "a\"b\\c'; DROP TABLE steps; --"  # a job name a query must match as text, never run
JOBS = {"llm-7b": 4, HOSTILE: 2}  # job -> ranks; rank r runs on node n{r // 2}
STEPS = 120  # one every 30 s: an hour of steps
PHASES = {"compute_s": "compute", "comm_s": "comm", "data_s": "data"}


def records() -> list[StepRecord]:
    """Each job's ranks' steps, rank 3 slower from step 60; rank 1 without comm times and data times only
    on even steps (NULLs a series must skip); dp_rank and pp_stage set, tp_rank never."""
    rows = []
    for job, ranks in JOBS.items():
        for rank in range(ranks):
            for step in range(STEPS):
                duration = 1.0 + rank * 0.125 + step % 7 * 0.0625 + (0.75 if rank == 3 and step >= 60 else 0)
                rows.append(
                    StepRecord(
                        (T0_MS + step * 30_000 + rank * 1_000) / 1000,
                        job,
                        rank,
                        f"n{rank // 2}",
                        step,
                        duration,
                        compute_s=duration * 0.625,
                        comm_s=None if rank == 1 else duration * 0.25,
                        data_s=duration * 0.125 if step % 2 == 0 else None,
                        dp_rank=rank,
                        pp_stage=0,
                    )
                )
    return rows


def as_points(rows: list[StepRecord]) -> Iterator[Point]:
    """The plain samples a Prometheus gets for `rows`: what the hub must make of them."""
    for row in rows:
        labels = {"job": row.job, "rank": str(row.rank), "node": row.node, "dp_rank": str(row.dp_rank)}
        labels["pp_stage"] = str(row.pp_stage)
        values = {"duration": row.duration_s} | {
            name: getattr(row, column) for column, name in PHASES.items()
        }
        for name, value in values.items():
            if value is not None:
                yield labels | {"__name__": f"fleetlens_step_{name}_seconds"}, round(row.ts * 1000), value


def filled_with(rows: list[StepRecord], token: str) -> Callable[[Store], None]:
    """What stores `rows` in a hub's store, every one of them."""

    def fill(store: Store) -> None:
        assert store.insert_steps(rows, token=token) == len(rows)

    return fill


@pytest.fixture(scope="module")
def peers(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The hub holding the step records, Prometheus the same values as plain series."""
    rows = records()
    work = tmp_path_factory.mktemp("steps")
    with hub_filled_and_prometheus(
        filled_with(rows, "promql-steps"), as_points(rows), chdb_dir, work
    ) as both:
        yield both


NONE = 'fleetlens_step_duration_seconds{job="a"}'  # no such job: an empty answer on both sides
ESCAPED = quoted(HOSTILE)
QUERIES = [
    "fleetlens_step_duration_seconds",
    'fleetlens_step_duration_seconds{job="llm-7b"}',
    'fleetlens_step_duration_seconds{job="llm-7b", rank=~"1|3"}',
    'fleetlens_step_duration_seconds{rank!~"[0-2]"}',
    'fleetlens_step_compute_seconds{node="n1"}',
    "fleetlens_step_comm_seconds",
    "fleetlens_step_data_seconds",
    'fleetlens_step_duration_seconds{tp_rank=""}',
    'fleetlens_step_duration_seconds{dp_rank="2"}',
    '{__name__=~"fleetlens_step_.*", rank="0", node="n0"}',
    f'fleetlens_step_duration_seconds{{job="{ESCAPED}"}}',
    'fleetlens_step_compute_seconds{job=~".*DROP TABLE.*"}',
    NONE,
    "avg by (node) (fleetlens_step_duration_seconds)",
    'max_over_time(fleetlens_step_duration_seconds{job="llm-7b"}[5m])',
    "avg_over_time(fleetlens_step_duration_seconds[10m])",
    "sum by (job) (fleetlens_step_comm_seconds) / sum by (job) (fleetlens_step_duration_seconds)",
    "max by (node) (avg_over_time(fleetlens_step_duration_seconds[15m]))",
    "count_over_time(fleetlens_step_data_seconds[5m]) / count_over_time(fleetlens_step_duration_seconds[5m])",
]


@pytest.mark.parametrize("query", QUERIES)
def test_instant_queries_of_step_series_answer_as_prometheus_does(peers, query):
    times = [minutes(m) for m in (0, 0.3, 12.25, 30, 45.9, 62, 64.5, 80)]
    assert compare_instant(peers, query, times) or query == NONE, "nothing compared"


@pytest.mark.parametrize("query", QUERIES)
def test_range_queries_of_step_series_answer_as_prometheus_does(peers, query):
    assert compare_range(peers, query, minutes(-5), minutes(70), "20s") or query == NONE, "nothing compared"


@pytest.mark.parametrize(
    ("query", "step"),
    [
        ("fleetlens_step_duration_seconds", "7m"),
        ("max_over_time(fleetlens_step_duration_seconds[1m])", "5m"),
        ("avg by (node) (fleetlens_step_compute_seconds)", "6m17s"),
    ],
)
def test_range_queries_with_steps_past_their_reach_answer_as_prometheus_does(peers, query, step):
    assert compare_range(peers, query, minutes(1), minutes(66), step)


def test_the_slow_rank_stands_out_in_its_mean_step_time(peers):
    status, answer = get(
        peers["hub"],
        "/api/v1/query",
        {
            "query": 'avg_over_time(fleetlens_step_duration_seconds{job="llm-7b"}[10m])',
            "time": str(minutes(59.5) / 1000),
        },
    )
    assert status == 200
    means = {one["metric"]["rank"]: float(one["value"][1]) for one in answer["data"]["result"]}
    assert sorted(means) == ["0", "1", "2", "3"]
    assert means["3"] > max(means["0"], means["1"], means["2"]) + 0.5  # 0.75 s slower since minute 30


WINDOW = {"start": str(minutes(-10) / 1000), "end": str(minutes(70) / 1000)}


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("/api/v1/series", 'fleetlens_step_duration_seconds{job="llm-7b"}'),
        ("/api/v1/series", f'{{__name__=~"fleetlens_step_.*", job="{ESCAPED}"}}'),
        ("/api/v1/labels", "fleetlens_step_comm_seconds"),
        ("/api/v1/label/job/values", '{__name__=~"fleetlens_.+"}'),
        ("/api/v1/label/rank/values", "fleetlens_step_comm_seconds"),
    ],
)
def test_the_catalog_lists_step_series_as_prometheus_does(peers, path, match):
    compare_catalog(peers, path, WINDOW | {"match[]": match})


def test_metadata_names_the_step_metrics(peers):
    status, answer = get(peers["hub"], "/api/v1/metadata", WINDOW)
    assert status == 200
    assert sorted(answer["data"]) == [
        f"fleetlens_step_{name}_seconds" for name in sorted(("duration", *PHASES.values()))
    ]


def twin_records() -> list[StepRecord]:
    """Every 5 minutes two steps of one rank recorded in the same millisecond, the second longer."""
    return [
        StepRecord((T0_MS + k * 300_000) / 1000, "twin", 0, "n0", 2 * k + second, 1.0 + k + 2 * second)
        for k in range(13)
        for second in (0, 1)
    ]


@pytest.fixture(scope="module")
def twins(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The hub holding twin_records, Prometheus the first of each pair (it keeps one sample a time)."""
    rows = twin_records()
    firsts = [
        point
        for point in as_points([row for row in rows if row.step % 2 == 0])
        if point[0]["__name__"] == "fleetlens_step_duration_seconds"
    ]
    work = tmp_path_factory.mktemp("twins")
    with hub_filled_and_prometheus(filled_with(rows, "promql-twins"), firsts, chdb_dir, work) as both:
        yield both


@pytest.mark.parametrize("function", ["rate", "increase", "delta", "irate"])
def test_windows_of_steps_in_one_millisecond_have_no_rate_as_in_prometheus(twins, function):
    """A window holding only samples of one time has no rate (Prometheus holds one of them: too few)."""
    query = f"{function}(fleetlens_step_duration_seconds[1m])"
    compare_instant(twins, query, [minutes(m) for m in (0.5, 5.2, 30, 60)])
    compare_range(twins, query, minutes(-2), minutes(66), "20s")
    status, answer = get(twins["hub"], "/api/v1/query", {"query": query, "time": str(minutes(5.5) / 1000)})
    assert (status, answer["data"]["result"]) == (200, [])


def test_extrapolated_rate_of_samples_at_one_time_is_none():
    for is_counter, is_rate in ((True, True), (True, False), (False, False)):
        assert extrapolated_rate(([5_000, 5_000], [1.0, 2.0]), 0, 60_000, is_counter, is_rate) is None

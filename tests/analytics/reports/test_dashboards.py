"""The pages' metric queries read a week from the hourly rollup and give the numbers the 1-minute rollup
gives for the same range and buckets: means, minima, maxima and last values of gauges, counters' rates and
increases across a reset, with ranges that start and end inside an hour and past the hours rolled up so
far (read from samples_1m there)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import clickhouse_connect
import pandas as pd
import pytest

from analytics.reports import dashboards
from analytics.reports.dashboards import HOURLY, ROLLUP, frame
from analytics.store import Store, schema
from analytics.store.records import ScrapeBatch
from analytics.store.schema import Layout

INTERVAL_S = 60
HOURS = 30
START = time.time() // 3600 * 3600 - (HOURS + 2) * 3600  # recent enough that no TTL drops the rows
NODES = ("vela-001", "vela-002")
GAUGES = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK")
COUNTERS = dashboards.PORT_METRICS[1:]  # link_downed, bytes, CNPs
RESET_AT = 17 * 3600 + 1234  # vela-002's counters restart from zero here (its driver reloaded)
ROLLED_UNTIL = int(START) + 26 * 3600  # the roll-up's last hour ends here
MINUTES_ROLLED_UNTIL = int(START) + 29 * 3600 + 420  # and its last minute here


def scrape(node: int, at: float) -> ScrapeBatch:
    """One scrape of a node: 2 GPUs' gauges, one port's state and counters."""
    t = at - START
    gpus = [
        (name, {"gpu": str(gpu)}, (t * 7919 + gpu * 31 + node) % 97 + 0.25)
        for name in GAUGES
        for gpu in (0, 1)
    ]
    grown = t - RESET_AT if node == 1 and t >= RESET_AT else t
    port = {"device": "mlx5_0", "port": "1"}
    ports = [(dashboards.STATE_ID, port, 1.0 if int(t) % 5000 < 120 else 4.0)]
    ports += [(name, port, grown * (i + 1) * 1.5 + int(t) // 4000) for i, name in enumerate(COUNTERS)]
    names, labels, values = zip(*gpus, *ports, strict=True)
    return ScrapeBatch(f"{NODES[node]}:9400", NODES[node], at, list(names), list(labels), list(values))


@pytest.fixture(scope="module")
def week(chdb_dir: Path) -> Iterator[Store]:
    """HOURS of scrapes of both nodes, a minute apart, rolled up into hours up to ROLLED_UNTIL and into
    minutes up to MINUTES_ROLLED_UNTIL only, as if the roll-ups had not run since."""
    with Store.open(f"chdb://{chdb_dir}", database=f"test_{uuid.uuid4().hex[:12]}") as store:
        ticks = range(0, HOURS * 3600, INTERVAL_S)
        batches = [scrape(node, START + t + 7 * node) for t in ticks for node in range(len(NODES))]
        store.insert_samples(batches, token="week")
        client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
        try:
            client.command(schema.roll_up_minutes(Layout(store.database)))
            client.command(schema.roll_up_hours(Layout(store.database)))
            for table, time, until in (
                ("samples_1h", "hour", ROLLED_UNTIL),
                ("samples_1m", "minute", MINUTES_ROLLED_UNTIL),
            ):
                client.command(
                    f"ALTER TABLE {store.database}.{table} DELETE WHERE {time} >= toDateTime({until})",
                    settings={"mutations_sync": 2},
                )
        finally:
            client.close()
        yield store


RANGES = [  # longer than a day, neither end on an hour, past the hours rolled up; one ends on an hour
    (START + 1234.5, START + HOURS * 3600 - 777.25),
    (START + 3 * 3600 + 59.9, START + 28 * 3600 + 1.1),
    (START + 2 * 3600, START + 29 * 3600),
]


def same(hourly: pd.DataFrame, minutes: pd.DataFrame) -> None:
    assert not hourly.empty
    pd.testing.assert_frame_equal(hourly, minutes, check_exact=False, rtol=1e-12)


@pytest.mark.parametrize(("start", "end"), RANGES)
def test_the_gpu_matrix_reads_the_hourly_rollup_and_shows_the_minute_rollups_numbers(week, start, end):
    assert dashboards.resolution(start, end) is HOURLY
    parameters = {"start": start, "end": end, "metrics": [GAUGES[0]]}
    minutes = frame(week, dashboards._gpu_matrix_sql(ROLLUP), parameters)
    same(dashboards.gpu_matrix(week, GAUGES[0], start, end), minutes)


@pytest.mark.parametrize(("start", "end"), RANGES)
def test_the_port_matrix_reads_the_hourly_rollup_and_shows_the_same_rates_and_flaps(week, start, end):
    """Buckets of whole hours; the counters' reset on vela-002 counts from zero in both."""
    hourly = dashboards.port_matrix(week, start, end)
    bucket_s = dashboards.HOUR_S * -(-dashboards.bucket_seconds(start, end, dashboards.PORT_BUCKETS) // 3600)
    parameters = {"start": start, "end": end, "metrics": dashboards.PORT_METRICS, "bucket_s": bucket_s}
    minutes = frame(week, dashboards._port_matrix_sql(ROLLUP), parameters)
    same(hourly, minutes)
    assert set(hourly["state"]) == {"active"} and hourly["flaps"].min() > 0
    assert (hourly["rx_bytes_per_s"] > 0).all()


@pytest.mark.parametrize(("start", "end"), RANGES)
def test_a_node_series_in_whole_hour_buckets_reads_the_hourly_rollup_with_the_same_points(week, start, end):
    """Means of gauges and rates of counters (none across the reset) per bucket of two hours."""
    metrics = [*GAUGES, *COUNTERS]
    counters = [name for name in metrics if dashboards.METRICS[name].counter]
    parameters = {"start": start, "end": end, "node": NODES[1], "metrics": metrics, "counters": counters}
    parameters["bucket_s"] = 7200
    assert dashboards.resolution(start, end, 7200) is HOURLY
    assert dashboards.resolution(start, end, 1800) is ROLLUP
    hourly = frame(week, dashboards._node_series_sql(HOURLY), parameters, times=["ts"])
    same(hourly, frame(week, dashboards._node_series_sql(ROLLUP), parameters, times=["ts"]))


HOURS_FROM_RAW = f"""
SELECT series_id, toStartOfHour(ts) AS hour, min(value), max(value), avg(value), argMax(value, ts), count()
FROM samples WHERE hour < toDateTime({ROLLED_UNTIL}) GROUP BY series_id, hour ORDER BY series_id, hour
"""
HOURS_FROM_ROLLUP = """
SELECT series_id, hour, min(min), max(max), sum(sum) / sum(count), max(last).2, sum(count)
FROM samples_1h GROUP BY series_id, hour ORDER BY series_id, hour
"""


def test_the_hourly_rollup_has_each_hours_min_max_mean_and_last_raw_value(week):
    raw, rollup = week.query(HOURS_FROM_RAW).rows, week.query(HOURS_FROM_ROLLUP).rows
    assert len(raw) == len(rollup) > 20
    for expected, got in zip(raw, rollup, strict=True):
        assert got[:4] == expected[:4] and got[5:] == expected[5:]
        assert got[4] == pytest.approx(expected[4], rel=1e-12)


# --- the minutes not rolled up yet --------------------------------------------------------------------------

RECENT_HOURS = 26  # up to now: the last minutes are too recent to be rolled up


def recent_pages(store: Store, now: float) -> dict[str, pd.DataFrame]:
    """What the pages show over ranges that end now: the 1-minute rollup (a day) and the hourly one."""
    day, longer = (now - 86400 + 0.5, now), (now - RECENT_HOURS * 3600 + 1.5, now)
    assert dashboards.resolution(*day) is ROLLUP and dashboards.resolution(*longer) is HOURLY
    pages = {}
    for name, (start, end) in (("day", day), ("longer", longer)):
        pages[f"gpus {name}"] = dashboards.gpu_matrix(store, GAUGES[0], start, end)
        pages[f"ports {name}"] = dashboards.port_matrix(store, start, end)
        pages[f"node {name}"] = dashboards.node_series(store, NODES[1], start, end, [*GAUGES, *COUNTERS])
    pages["metrics_1m"] = frame(
        store,
        "SELECT ts, metric, node, labels, min, max, avg, sum, count, last FROM metrics_1m"
        " ORDER BY metric, node, toString(labels), ts",
        {},
        max_rows=1_000_000,
    )
    return pages


def test_pages_over_a_range_ending_now_show_the_same_numbers_with_the_minutes_rolled_up_or_not(chdb_dir):
    """Before any roll-up every minute is read from raw samples; after the hub's roll-ups (minutes, then
    hours) the rollups hold all but the last minutes, which are still read from raw samples."""
    now = time.time()
    first = now // 60 * 60 - RECENT_HOURS * 3600
    with Store.open(f"chdb://{chdb_dir}", database=f"test_{uuid.uuid4().hex[:12]}") as store:
        ticks = [first + t for t in range(0, RECENT_HOURS * 3600, INTERVAL_S)]
        ticks += [now - 300 + t for t in range(0, 300, 10)]  # the last minutes every 10 s
        store.insert_samples(
            [scrape(node, at + 7 * node) for at in ticks for node in range(len(NODES))], token="recent"
        )
        unrolled = recent_pages(store, now)
        assert store.query("SELECT count() FROM samples_1m").rows == [(0,)]
        with clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir)) as client:
            # all but the last minutes at once, then the last ones as the hub rolls them: one by one
            until = f"toDateTime({int(now) // 60 * 60 - 600})"
            client.command(schema.roll_up_minutes(Layout(store.database), until=until))
        assert 0 < store.roll_up_minutes() <= 10
        store.roll_up_hours()
        rolled = store.query(
            "SELECT (SELECT toUnixTimestamp(max(minute)) + 60 FROM samples_1m),"
            " (SELECT toUnixTimestamp(max(hour)) + 3600 FROM samples_1h)"
        ).rows[0]
        assert now - 300 < rolled[0] <= time.time() - schema.ROLL_UP_MINUTES_AFTER_S  # the last are not
        assert now - 2 * 3600 < rolled[1] <= now - schema.ROLL_UP_AFTER_S
        for name, page in recent_pages(store, now).items():
            assert not page.empty, name
            pd.testing.assert_frame_equal(page, unrolled[name], check_exact=False, rtol=1e-12, obj=name)

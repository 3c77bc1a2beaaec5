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
    """HOURS of scrapes of both nodes, a minute apart, rolled up into hours up to ROLLED_UNTIL only, as if
    the roll-up had not run since."""
    with Store.open(f"chdb://{chdb_dir}", database=f"test_{uuid.uuid4().hex[:12]}") as store:
        ticks = range(0, HOURS * 3600, INTERVAL_S)
        batches = [scrape(node, START + t + 7 * node) for t in ticks for node in range(len(NODES))]
        store.insert_samples(batches, token="week")
        client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
        try:
            client.command(schema.roll_up_hours(Layout(store.database)))
            client.command(
                f"ALTER TABLE {store.database}.samples_1h DELETE WHERE hour >= toDateTime({ROLLED_UNTIL})",
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

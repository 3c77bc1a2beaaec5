"""The schema as DDL text: single node (run for real in test_store) and cluster mode, which no server here
is new enough to run, so it is checked as text and parsed by ClickHouse's own parser (EXPLAIN AST)."""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from pathlib import Path

import clickhouse_connect
import pytest

from analytics.errors import SchemaError
from analytics.store import Store, clickhouse, schema
from analytics.store.records import ScrapeBatch
from analytics.store.schema import Layout, Retention, ddl, retention_changes

CLUSTER = "fleet-prod"
CREATE = re.compile(
    r"CREATE (?:TABLE|DATABASE|VIEW|MATERIALIZED VIEW|OR REPLACE VIEW)(?: IF NOT EXISTS)? (\S+)"
)
ADD_COLUMN = re.compile(r"ALTER TABLE (\S+)(?: ON CLUSTER '[^']+')? ADD COLUMN IF NOT EXISTS (\w+) ")
INDEX = re.compile(
    r"ALTER TABLE (\S+)(?: ON CLUSTER '[^']+')? (?:ADD INDEX IF NOT EXISTS|MATERIALIZE INDEX) (\w+)"
)
MODIFY_SETTING = re.compile(r"ALTER TABLE (\S+)(?: ON CLUSTER '[^']+')? MODIFY SETTING ")
DROP_VIEW = re.compile(r"DROP VIEW IF EXISTS (\S+)")
DELETE = re.compile(r"ALTER TABLE (\S+)(?: ON CLUSTER '[^']+')? DELETE WHERE ")
BACKFILL = re.compile(r"INSERT INTO (\S+)\n.*?\nFROM (\S+)\n", re.DOTALL)


def created(statements: list[str]) -> list[str | None]:
    """What each statement creates (None for one that alters what exists)."""
    return [match.group(1) if (match := CREATE.match(statement)) else None for statement in statements]


def by_name(statements: list[str]) -> dict[str, str]:
    """The CREATE statements by what they create."""
    return {name: s for name, s in zip(created(statements), statements, strict=True) if name is not None}


def test_cluster_ddl_runs_every_create_on_the_cluster() -> None:
    """Every statement but a backfill's INSERT, which goes through the Distributed tables from one node."""
    statements = [s for s in ddl("fleet", cluster=CLUSTER) if not BACKFILL.match(s)]
    assert all(
        CREATE.match(s) or ADD_COLUMN.match(s) or INDEX.match(s) or DROP_VIEW.match(s) or DELETE.match(s)
        for s in statements
    )
    assert all(f"ON CLUSTER '{CLUSTER}'" in s.splitlines()[0] for s in statements)


def test_the_hourly_roll_up_reads_and_writes_the_tables_readers_use_after_creating_its_table() -> None:
    for cluster in (None, CLUSTER):
        statements = ddl("fleet", cluster=cluster)
        [(at, fill)] = [(i, m) for i, s in enumerate(statements) if (m := BACKFILL.match(s))]
        assert fill.groups() == ("fleet.samples_1h", "fleet.samples_1m")
        assert created(statements).index("fleet.samples_1h") < at
        assert statements[at] == schema.roll_up_hours(Layout("fleet", cluster))


def test_cluster_tables_are_replicated_with_a_path_of_their_own() -> None:
    engines = [
        re.search(r"ENGINE = (\w+)\('([^']+)', '([^']+)'(?:, \w+)?\)", s)  # then a version column
        for s in ddl("fleet", cluster=CLUSTER)
        if "MergeTree" in s
    ]
    assert engines and all(e and e.group(1).startswith("Replicated") for e in engines)
    paths = [e.group(2) for e in engines]
    assert len(set(paths)) == len(paths)
    sharded = [p for p in paths if "schema_migrations" not in p]
    assert all("{shard}" in p and p.endswith("_local") for p in sharded)
    assert all("{replica}" in e.group(3) for e in engines)


def test_cluster_distributed_tables_sit_on_local_tables_created_before_them() -> None:
    statements = ddl("fleet", cluster=CLUSTER)
    names = created(statements)
    distributed = [
        (i, re.search(r"Distributed\('([^']+)', (\w+), (\w+)", s)) for i, s in enumerate(statements)
    ]
    distributed = [(i, m) for i, m in distributed if m]
    assert {names[i] for i, _ in distributed} >= {f"fleet.{t}" for t in ("samples", "series", "metrics")}
    for i, match in distributed:
        assert match.groups() == (CLUSTER, "fleet", names[i].split(".")[1] + "_local")
        assert names.index(f"fleet.{match.group(3)}") < i


def test_cluster_views_and_rollup_read_shard_local_tables() -> None:
    """A view or materialized view on a shard must read that shard's data, never a Distributed table."""
    statements = by_name(ddl("fleet", cluster=CLUSTER))
    views = ("metrics_local", "metrics_1m_local", "metrics_1h_local", "samples_1m_mv")
    for name in (f"fleet.{view}" for view in views):
        sources = re.findall(r"(?:FROM|JOIN) (fleet\.\w+)", statements[name])
        assert sources and all(source.endswith("_local") for source in sources), (name, sources)
    assert " TO fleet.samples_1m_local " in statements["fleet.samples_1m_mv"]


def test_tables_joined_by_a_view_are_sharded_by_the_join_key() -> None:
    """metrics joins samples with series on each shard: both must put a series on the same shard."""
    statements = by_name(ddl("fleet", cluster=CLUSTER))
    for table in ("samples", "series", "samples_1m", "samples_1h"):
        assert statements[f"fleet.{table}"].rstrip().endswith("_local, series_id)")


def test_single_node_ddl_has_no_cluster_constructs() -> None:
    text = "\n".join(ddl("fleet"))
    for construct in ("ON CLUSTER", "Replicated", "Distributed", "_local"):
        assert construct not in text


def test_cluster_and_single_node_ddl_parse_in_clickhouse(chdb_dir: Path) -> None:
    """EXPLAIN AST parses a statement without running it: the cluster DDL needs no cluster for that."""
    parser = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
    try:
        for statement in ddl("fleet") + ddl("fleet", cluster=CLUSTER):
            parser.query(f"EXPLAIN AST {statement}")
    finally:
        parser.close()


def test_ttls_follow_the_retention() -> None:
    statements = by_name(
        ddl("fleet", retention=Retention(raw_days=3, rollup_days=30, steps_days=7, targets_days=2))
    )
    assert "TTL toDateTime(ts) + toIntervalDay(3)\n" in statements["fleet.samples"]
    assert "TTL minute + toIntervalDay(30)\n" in statements["fleet.samples_1m"]
    assert "TTL hour + toIntervalDay(30)\n" in statements["fleet.samples_1h"]
    assert "TTL greatest(toDateTime(ts) + toIntervalDay(7), keep_until)\n" in statements["fleet.steps"]
    assert "TTL toDateTime(ts) + toIntervalDay(2)\n" in statements["fleet.targets"]
    assert "TTL" not in statements["fleet.actions"]  # the audit trail is kept


def test_retention_changes_alter_only_tables_whose_ttl_differs() -> None:
    """engine_full as system.tables shows it: samples kept 15 days, steps 90 (the default)."""
    retention = Retention(raw_days=30)
    engines = {
        "samples": "MergeTree ORDER BY (metric) TTL toDateTime(ts) + toIntervalDay(15)",
        "steps": "MergeTree ORDER BY (job) TTL greatest(toDateTime(ts) + toIntervalDay(90), keep_until) "
        "SETTINGS x = 1",
    }
    new_ttl = "MODIFY TTL toDateTime(ts) + toIntervalDay(30)"
    assert retention_changes(Layout("fleet", retention=retention), engines) == [
        f"ALTER TABLE fleet.samples {new_ttl}"
    ]
    # a TTL that is a prefix of the one asked for is not taken for it: 1 day is not 15
    assert retention_changes(Layout("fleet", retention=Retention(raw_days=1)), engines) == [
        "ALTER TABLE fleet.samples MODIFY TTL toDateTime(ts) + toIntervalDay(1)"
    ]
    # a store from before steps.keep_until has the TTL without it: the one with it replaces it
    old_steps = {"steps": "MergeTree ORDER BY (job) TTL toDateTime(ts) + toIntervalDay(90) SETTINGS x = 1"}
    assert retention_changes(Layout("fleet"), old_steps) == [
        "ALTER TABLE fleet.steps MODIFY TTL greatest(toDateTime(ts) + toIntervalDay(90), keep_until)"
    ]
    clustered = Layout("fleet", cluster=CLUSTER, retention=retention)
    assert retention_changes(clustered, {f"{name}_local": engine for name, engine in engines.items()}) == [
        f"ALTER TABLE fleet.samples_local ON CLUSTER '{CLUSTER}' {new_ttl}"
    ]


@pytest.mark.parametrize("days", [0, -1, 1.5, "15"])
def test_retention_must_be_whole_days(days: object) -> None:
    with pytest.raises(SchemaError, match="raw_days"):
        Retention(raw_days=days)


@pytest.mark.parametrize(
    ("database", "cluster"), [("fleet; DROP DATABASE x", None), ("1fleet", None), ("fleet", "c' OR '1")]
)
def test_names_that_could_inject_sql_are_refused(database: str, cluster: str | None) -> None:
    with pytest.raises(SchemaError):
        ddl(database, cluster=cluster)


def test_migrations_are_numbered_in_order() -> None:
    versions = [migration.version for migration in schema.MIGRATIONS]
    assert versions == sorted(set(versions)) and versions[0] == 1


# --- the hourly rollup's migration ------------------------------------------------------------------------

HOUR_S = 3600
HOURLY_AGGREGATES = """
SELECT series_id, hour, min(min), max(max), sum(sum), sum(count), max(last)
FROM samples_1h GROUP BY series_id, hour ORDER BY series_id, hour
"""
MINUTES_BY_HOUR = """
SELECT series_id, toStartOfHour(minute) AS hour, min(min), max(max), sum(sum), sum(count), max(last)
FROM samples_1m GROUP BY series_id, hour ORDER BY series_id, hour
"""


def build(
    client: clickhouse_connect.driver.Client, layout: Layout, migrations: list[schema.Migration]
) -> None:
    """A database with `migrations` applied and recorded, as an older fleetlens left it."""
    for statement in schema.bootstrap(layout) + [s for m in migrations for s in m.statements(layout)]:
        client.command(statement)
    client.insert(
        layout.name("schema_migrations"),
        [[m.version, m.description, 0] for m in migrations],
        column_names=["version", "description", "applied_at"],
    )


def open_store_from_before_the_hourly_rollup(chdb_dir: Path, samples: list[list]) -> str:
    """A database as fleetlens built it before migration 6, at schema version 5, holding `samples` (rows
    of metric, node, series_id, ts in ms, value) in samples and the 1-minute rollup; returns its name."""
    database = f"test_{uuid.uuid4().hex[:12]}"
    layout = Layout(database)
    client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
    try:
        build(client, layout, [m for m in schema.MIGRATIONS if m.version <= 5])
        client.insert(
            f"{database}.samples", samples, column_names=["metric", "node", "series_id", "ts", "value"]
        )
        tables = client.query(f"SHOW TABLES FROM {database}").result_rows
    finally:
        client.close()
    assert ("samples_1h",) not in tables
    return database


def roll_up(chdb_dir: Path, database: str) -> None:
    """What the store's owner runs now and then: minutes, then hours."""
    client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
    try:
        client.command(schema.roll_up_minutes(Layout(database)))
        client.command(schema.roll_up_hours(Layout(database)))
    finally:
        client.close()


def test_a_store_from_before_the_hourly_rollup_gets_it_filled_from_its_minutes(chdb_dir: Path) -> None:
    """Migration 6 fills samples_1h with the hours of what samples_1m holds (the same min, max, sum, count
    and last per series and hour); rolling up again adds nothing, until samples of a later hour come."""
    start = int(time.time()) // HOUR_S * HOUR_S - 3 * 86400 - 1_234  # not on an hour: the first is partial
    samples = [
        ["DCGM_FI_DEV_GPU_TEMP", "vela-001", series, (start + 37 * i + series) * 1000, (i * 7919 % 101) / 3]
        for series in (1, 2)
        for i in range(400)  # over 4 hours
    ]
    database = open_store_from_before_the_hourly_rollup(chdb_dir, samples)
    with Store.open(f"chdb://{chdb_dir}", database=database) as store:
        assert store.query("SELECT max(version) FROM schema_migrations").rows == [(schema.LATEST_VERSION,)]
        minutes_by_hour = store.query(MINUTES_BY_HOUR).rows
        assert len(minutes_by_hour) == 2 * 5
        assert store.query(HOURLY_AGGREGATES).rows == minutes_by_hour
        roll_up(chdb_dir, database)  # a migration interrupted after its fill is applied again
        assert store.query(HOURLY_AGGREGATES).rows == minutes_by_hour
        later = start + 400 * 37 + HOUR_S  # in the hour after the last one rolled up
        store.insert_samples(
            [ScrapeBatch("t:9400", "vela-001", later, ["DCGM_FI_DEV_GPU_TEMP"], [{"gpu": "0"}], [99.0])],
            token="after",
        )
        assert store.query("SELECT sum(count) FROM samples_1h").rows == [(800,)]
        roll_up(chdb_dir, database)
        assert store.query(HOURLY_AGGREGATES).rows == store.query(MINUTES_BY_HOUR).rows
        assert store.query("SELECT sum(count), max(max) FROM samples_1h").rows == [(801, 99.0)]


def test_the_roll_up_leaves_the_hours_that_ended_less_than_roll_up_after_s_ago(store: Store, chdb_dir: Path):
    now = time.time()
    store.insert_samples(
        [ScrapeBatch("t:9400", "n", at, ["m"], [{}], [1.0]) for at in (now - 2 * HOUR_S, now - 1)],
        token="recent",
    )
    roll_up(chdb_dir, store.database)
    [(hours, rolled_until)] = store.query(
        "SELECT count(), toUnixTimestamp(max(hour)) + 3600 FROM samples_1h"
    ).rows
    assert hours == 1 and rolled_until <= now - schema.ROLL_UP_AFTER_S


# --- the 1-minute rollup's migration off the view ----------------------------------------------------------

METRICS_1M = (
    "SELECT ts, metric, node, labels, min, max, avg, sum, count, last FROM metrics_1m ORDER BY node, ts"
)


def test_a_store_with_the_minute_view_loses_it_and_reads_the_same_minutes(chdb_dir: Path) -> None:
    """Migration 7 drops the view and deletes the minutes that ended less than ROLL_UP_MINUTES_AFTER_S ago,
    which readers then read from raw samples until the roll-up rolls them again: metrics_1m shows the
    rows the view's rollup gave (read as metrics_1m read it before). Samples stored after it reach
    samples_1m by the roll-up only."""
    now = int(time.time())
    layout = Layout(f"test_{uuid.uuid4().hex[:12]}")
    database = layout.database
    client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
    try:
        build(client, layout, [m for m in schema.MIGRATIONS if m.version <= 6])
        for statement in schema.rollup_metrics("metrics_1m", schema.SAMPLES_1M).create(layout):
            client.command(statement)  # metrics_1m as it was: the rollup's rows only
        samples = [
            ["m", f"n{n}", n, (now - 900 + 13 * i + n) * 1000, i * 7 % 11 / 3]
            for n in (1, 2)
            for i in range(69)
        ]
        client.insert(
            f"{database}.samples", samples, column_names=["metric", "node", "series_id", "ts", "value"]
        )
        before = client.query(METRICS_1M.replace("metrics_1m", f"{database}.metrics_1m")).result_rows
        cut = (int(time.time()) - schema.ROLL_UP_MINUTES_AFTER_S) // 60 * 60
    finally:
        client.close()
    assert len(before) > 2 * 12
    with Store.open(f"chdb://{chdb_dir}", database=database) as store:
        assert store.query(METRICS_1M).rows == before
        with clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir)) as client:
            assert ("samples_1m_mv",) not in client.query(f"SHOW TABLES FROM {database}").result_rows
        [(rolled, recent)] = store.query(
            "SELECT count(), countIf(minute >= toDateTime({cut:UInt32})) FROM samples_1m",
            parameters={"cut": cut},
        ).rows
        assert rolled > 0 and recent == 0
        store.insert_samples([ScrapeBatch("t:9400", "n1", now, ["m"], [{}], [5.0])], token="after")
        assert store.query("SELECT count() FROM samples_1m").rows == [(rolled,)]
        assert store.query("SELECT sum(count) FROM metrics_1m").rows == [(len(samples) + 1,)]


def test_a_store_from_before_the_steps_ts_index_gets_it_and_reads_by_it(chdb_dir: Path) -> None:
    """Migration 8 adds the minmax index on steps.ts to a store built without it (its rows kept), and a
    window's read of steps then skips the granules outside the window by it."""
    now = int(time.time())
    layout = Layout(f"test_{uuid.uuid4().hex[:12]}")
    database = layout.database
    index_line = f",\n    INDEX {schema.STEPS_TS_INDEX}"
    old_steps = dataclasses.replace(schema.STEPS, columns=schema.STEPS.columns.replace(index_line, ""))
    old = [
        dataclasses.replace(m, objects=tuple(old_steps if o is schema.STEPS else o for o in m.objects))
        for m in schema.MIGRATIONS
        if m.version <= 7
    ]
    rows = [[(now - 3600 + i) * 1000, "llm", i % 4, "n", i, 1.0, 1, "otlp"] for i in range(3600)]
    with clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir)) as client:
        build(client, layout, old)
        columns = ["ts", "job", "rank", "node", "step", "duration_s", "steps", "source"]
        client.insert(f"{database}.steps", rows, column_names=columns)
        assert "INDEX" not in client.query(f"SHOW CREATE TABLE {database}.steps").result_rows[0][0]
    with Store.open(f"chdb://{chdb_dir}", database=database) as store:
        assert store.query("SELECT count() FROM steps").rows == [(len(rows),)]
        window = f"ts >= toDateTime({now - 60})"
        assert store.query(f"SELECT count() FROM steps WHERE {window}").rows == [(60,)]
        with clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir)) as client:
            plan = client.query(
                f"EXPLAIN indexes = 1 SELECT count() FROM {database}.steps WHERE {window}"
            ).result_rows
        assert "ts_minmax" in "\n".join(row[0] for row in plan)


# --- tiered merges ----------------------------------------------------------------------------------------

TIERED = ("samples", "steps", "targets")


def create_table(client: clickhouse_connect.driver.Client, layout: Layout, table: str) -> str:
    return client.query(f"SHOW CREATE TABLE {layout.name(table)}").result_rows[0][0]


def altered(layout: Layout, engines: dict[str, str]) -> list[str]:
    """The tables merge_changes switches to tiered merges."""
    return [m.group(1) for s in schema.merge_changes(layout, engines) if (m := MODIFY_SETTING.match(s))]


def test_tiered_merges_alter_the_tables_that_hold_the_rows_where_they_lack_them() -> None:
    """In a cluster, each shard's local table (a Distributed table has no parts to merge); a table that
    has them already, or is not created yet, is left alone."""
    for cluster, suffix in ((None, ""), (CLUSTER, "_local")):
        layout = Layout("fleet", cluster)
        engines = {
            f"{table}{suffix}": "MergeTree ORDER BY ts SETTINGS index_granularity = 8192" for table in TIERED
        }

        assert altered(layout, engines) == [f"fleet.{table}{suffix}" for table in TIERED]
        engines[f"samples{suffix}"] = f"MergeTree ORDER BY ts SETTINGS {schema.TIERED_MERGES}"
        del engines[f"targets{suffix}"]
        assert altered(layout, engines) == [f"fleet.steps{suffix}"]
        assert all(layout.on_cluster in s for s in schema.merge_changes(layout, engines))


def engine_of(client: clickhouse_connect.driver.Client, layout: Layout, table: str) -> str:
    return client.query(f"SHOW CREATE TABLE {layout.name(table)}").result_rows[0][0]


def test_opening_a_store_gives_its_tables_tiered_merges_and_keeps_their_rows(chdb_dir: Path) -> None:
    """A store built by the migrations alone (as before tiered merges) gets them when it is opened."""
    layout = Layout(f"test_{uuid.uuid4().hex[:12]}")
    now_ms = int(time.time()) * 1000
    samples = [["DCGM_FI_DEV_GPU_TEMP", "vela-001", 1, now_ms - 1000 * i, float(i)] for i in range(100)]
    with clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir)) as client:
        build(client, layout, list(schema.MIGRATIONS))
        client.insert(
            layout.name("samples"), samples, column_names=["metric", "node", "series_id", "ts", "value"]
        )
        assert all(schema.TIERED_MERGES not in engine_of(client, layout, table) for table in TIERED)
    with Store.open(f"chdb://{chdb_dir}", database=layout.database) as store:
        assert store.query("SELECT count(), sum(value) FROM samples").rows == [(100, sum(range(100)))]
    with clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir)) as client:
        assert all(schema.TIERED_MERGES in engine_of(client, layout, table) for table in TIERED)


class ServerWithoutTieredMerges:
    """A real session that answers as a server without the merge selector setting would: the engine
    itself refuses the setting, under a name it does not know."""

    def __init__(self, client: clickhouse_connect.driver.Client) -> None:
        self.client = client

    def command(self, statement: str) -> object:
        return self.client.command(
            statement.replace("merge_selector_algorithm", "merge_selector_unknown_here")
        )

    def __getattr__(self, name: str) -> object:
        return getattr(self.client, name)


def test_a_server_that_refuses_tiered_merges_still_opens_the_store_and_says_so(
    chdb_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    layout = Layout(f"test_{uuid.uuid4().hex[:12]}")
    with clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir)) as client:
        clickhouse._migrate(ServerWithoutTieredMerges(client), layout)
        assert client.query(f"SELECT max(version) FROM {layout.name('schema_migrations')}").result_rows == [
            (schema.LATEST_VERSION,)
        ]
        assert schema.TIERED_MERGES not in engine_of(client, layout, "samples")
    [warning] = [r for r in caplog.records if r.name == "fleetlens.store"]
    assert "default merges" in warning.getMessage() and "UNKNOWN_SETTING" in warning.getMessage()


def test_merges_write_each_sample_once_while_its_rounds_are_few(store: Store, chdb_dir: Path) -> None:
    """Sixty rounds inserted one by one, as the hub inserts them, are merged ten at a time: every sample is
    written once more by merges, not again with each few new rounds. ClickHouse's default selector merged
    the one big part of the day with every few new ones: each sample was rewritten 8-12 times within the
    first minutes, 60% of the hub's CPU (bench/ingest.py)."""
    rounds, series = 60, 200
    start = time.time() // 86400 * 86400 - 43200  # yesterday noon: one day's partition
    for i in range(rounds):
        batch = ScrapeBatch(
            "t:9400", "vela-001", start + i, ["DCGM_FI_DEV_GPU_TEMP"] * series,
            [{"gpu": str(gpu)} for gpu in range(series)], [float(i)] * series,
        )  # fmt: skip
        store.insert_samples([batch], token=f"round-{i}")
    parts = f"FROM system.parts WHERE database = '{store.database}' AND table = 'samples'"
    with clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir)) as client:
        deadline = time.monotonic() + 60
        while client.query(f"SELECT count() {parts} AND active AND level = 0").result_rows[0][0] >= 10:
            assert time.monotonic() < deadline, "the rounds' parts were not merged within a minute"
            time.sleep(0.2)
        merged = client.query(f"SELECT sum(rows) {parts} AND level > 0").result_rows[0][0]
    assert rounds * series - 9 * series <= merged <= rounds * series

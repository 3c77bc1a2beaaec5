"""The store on a real embedded ClickHouse (chDB): migrations, round trips, dedup, rollup, TTLs, queries.

All tests share the session's chDB directory (one per process) and each gets a database of its own.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import fields, replace
from pathlib import Path

import clickhouse_connect
import pytest

from analytics.errors import QueryError, SchemaError, StoreRejected, StoreUnavailable
from analytics.store import Retention, Store, schema
from analytics.store.clickhouse import series_id
from analytics.store.readonly import MAX_IDLE, PARSER_FUNCTIONS, ReadSessions, session_settings
from analytics.store.records import Anomaly, ScrapeBatch, TargetStatus
from collectors.steprecord import StepRecord
from fleetlens.config import ExporterConfig
from fleetlens.exporter_cli import build_exporter
from tests.conftest import REPO
from tests.support.peers import free_port

NOW = time.time() // 60 * 60 - 600  # a whole minute, recent enough that no TTL drops it


def exporter_batch(sysfs: Path, node: str, ts: float) -> ScrapeBatch:
    """One scrape of a real exporter (simulated GPUs, procfs fixture NICs), as the hub hands it on."""
    exporter = build_exporter(ExporterConfig(gpu_backend="sim", sysfs_root=sysfs, node=node))
    try:
        samples = [sample for family in exporter.collect() for sample in family.samples]
    finally:
        exporter.close()
    return ScrapeBatch(
        target=f"{node}:9400",
        node=node,
        ts=ts,
        names=[s.name for s in samples],
        labels=[dict(s.labels) for s in samples],
        values=[float(s.value) for s in samples],
    )


def gpu_temps(ts: float, *temps: float, node: str = "vela-001") -> ScrapeBatch:
    """A batch of DCGM_FI_DEV_GPU_TEMP for GPUs 0, 1, ... of `node`."""
    return ScrapeBatch(
        f"{node}:9400",
        node,
        ts,
        ["DCGM_FI_DEV_GPU_TEMP"] * len(temps),
        [{"gpu": str(i), "Hostname": node} for i in range(len(temps))],
        list(temps),
    )


def scalar(store: Store, sql: str) -> object:
    return store.query(sql).rows[0][0]


def catalog(chdb_dir: Path, store: Store, sql: str) -> list[tuple]:
    """What ClickHouse's own catalog (system tables, SHOW, DESCRIBE) says of the store's database: read
    on a plain client, since the store's queries read only the project's tables."""
    with raw_client(chdb_dir) as client:
        client.database = store.database
        return client.query(sql, parameters={"db": store.database}).result_rows


def other_database() -> str:
    return f"test_{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def raw_client(chdb_dir: Path) -> Iterator[clickhouse_connect.driver.Client]:
    """A plain clickhouse-connect client on the session's engine, for what the store refuses to do."""
    client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
    try:
        yield client
    finally:
        client.close()


# --- schema and migrations ---------------------------------------------------------------------------


def test_migrations_are_applied_once_and_recorded(store: Store, chdb_dir: Path) -> None:
    recorded = store.query("SELECT version, count() FROM schema_migrations GROUP BY version ORDER BY version")
    assert recorded.rows == [(migration.version, 1) for migration in schema.MIGRATIONS]
    tables = {
        row[0]
        for row in catalog(chdb_dir, store, "SELECT name FROM system.tables WHERE database = {db:String}")
    }
    assert tables >= {"series", "samples", "samples_1m", "metrics", "metrics_1m", "steps", "targets"}
    assert tables >= {"anomalies", "alerts", "actions", "schema_migrations"}


def test_reopening_keeps_data_and_applies_nothing_again(chdb_dir: Path) -> None:
    dsn, database = f"chdb://{chdb_dir}", other_database()
    with Store.open(dsn, database=database) as first:
        first.insert_samples([gpu_temps(NOW, 41.0, 43.5)], token="t1")
        applied = first.query("SELECT version, applied_at FROM schema_migrations ORDER BY version").rows
    with Store.open(dsn, database=database) as again:
        assert (
            again.query("SELECT version, applied_at FROM schema_migrations ORDER BY version").rows == applied
        )
        assert again.query("SELECT value FROM metrics ORDER BY value").rows == [(41.0,), (43.5,)]


def test_a_schema_newer_than_this_code_is_refused(chdb_dir: Path) -> None:
    dsn, database = f"chdb://{chdb_dir}", other_database()
    Store.open(dsn, database=database).close()
    future = schema.LATEST_VERSION + 1
    with raw_client(chdb_dir) as client:
        client.insert(
            f"{database}.schema_migrations",
            [[future, "from a newer fleetlens", 0]],
            column_names=["version", "description", "applied_at"],
        )
    with pytest.raises(SchemaError, match=f"schema version {future}, newer than this fleetlens"):
        Store.open(dsn, database=database)


@pytest.mark.parametrize("dsn", ["postgres://db:5432/fleet", "chdb://", "http:///fleet", "./data"])
def test_a_bad_dsn_is_a_schema_error_naming_it(dsn: str) -> None:
    with pytest.raises(SchemaError, match=re.escape(dsn)):
        Store.open(dsn)


def test_a_dsn_password_never_reaches_the_message() -> None:
    with pytest.raises(SchemaError) as refused:
        Store.open("clickhouse://admin:hunter2@db:9000/fleet")
    assert "hunter2" not in str(refused.value) and "admin:***@db" in str(refused.value)


def test_an_unreachable_server_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{(port := free_port())}"):
        Store.open(f"http://127.0.0.1:{port}/fleet")


def test_a_second_chdb_directory_in_one_process_is_store_unavailable(store: Store, tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match=str(tmp_path)):
        Store.open(f"chdb://{tmp_path}")


def test_ttls_follow_the_retention_and_a_new_retention_applies_on_open(chdb_dir: Path) -> None:
    dsn, database = f"chdb://{chdb_dir}", other_database()
    retention = Retention(raw_days=3, rollup_days=30, steps_days=7, targets_days=2)
    with Store.open(dsn, database=database, retention=retention) as store:
        shown = {
            t: catalog(chdb_dir, store, f"SHOW CREATE TABLE {t}")[0][0]
            for t in ("samples", "samples_1m", "steps", "targets")
        }
    assert "TTL toDateTime(ts) + toIntervalDay(3)" in shown["samples"]
    assert "TTL minute + toIntervalDay(30)" in shown["samples_1m"]
    assert "TTL greatest(toDateTime(ts) + toIntervalDay(7), keep_until)" in shown["steps"]
    assert "TTL toDateTime(ts) + toIntervalDay(2)" in shown["targets"]
    with Store.open(dsn, database=database, retention=Retention(raw_days=5, rollup_days=30)) as store:
        assert (
            "TTL toDateTime(ts) + toIntervalDay(5)"
            in catalog(chdb_dir, store, "SHOW CREATE TABLE samples")[0][0]
        )
        assert (
            "TTL minute + toIntervalDay(30)" in catalog(chdb_dir, store, "SHOW CREATE TABLE samples_1m")[0][0]
        )


def test_docs_describe_every_column_of_every_table_and_view(store: Store, chdb_dir: Path) -> None:
    docs = (REPO / "docs" / "schema.md").read_text()
    sections = dict(re.findall(r"^## `(\w+)`\n(.*?)(?=^## |\Z)", docs, flags=re.M | re.S))
    objects = catalog(
        chdb_dir,
        store,
        "SELECT name FROM system.tables WHERE database = {db:String} AND engine != 'MaterializedView'",
    )
    assert {name for (name,) in objects} == schema.READABLE  # what queries may read is every one of them
    for (name,) in objects:
        assert name in sections, f"docs/schema.md has no section for {name}"
        for column in store.query(f"SELECT * FROM {name} WHERE 0").columns:
            assert f"`{column}`" in sections[name], f"docs/schema.md does not describe {name}.{column}"


# --- samples --------------------------------------------------------------------------------------------


def test_exporter_samples_read_back_exactly_through_the_metrics_view(store: Store, procfs_sys: Path) -> None:
    batch = exporter_batch(procfs_sys, "vela-001", NOW + 0.123)
    assert store.insert_samples([batch], token="scrape-1") == len(batch) > 400
    rows = store.query(
        "SELECT toUnixTimestamp64Milli(ts), metric, node, labels, value FROM metrics", max_rows=len(batch)
    ).rows
    stored = sorted((metric, sorted(labels.items()), value) for _, metric, _, labels, value in rows)
    sent = sorted(
        (name, sorted(labels.items()), value)
        for name, labels, value in zip(batch.names, batch.labels, batch.values, strict=True)
    )
    assert stored == sent
    assert {(ms, node) for ms, _, node, _, _ in rows} == {(round(batch.ts * 1000), "vela-001")}


def test_the_metrics_view_has_its_documented_columns(store: Store) -> None:
    empty = store.query("SELECT * FROM metrics WHERE 0")  # an empty result still names its columns
    assert list(zip(empty.columns, empty.types, strict=True)) == [
        ("ts", "DateTime64(3, 'UTC')"),
        ("metric", "String"),
        ("node", "String"),
        ("labels", "Map(String, String)"),
        ("value", "Float64"),
    ]


def test_a_series_row_is_written_once_and_duplicates_never_double_samples(
    store: Store, chdb_dir: Path
) -> None:
    for tick in range(3):
        store.insert_samples([gpu_temps(NOW + tick, 40.0 + tick, 50.0 + tick)], token=f"t{tick}")
    assert scalar(store, "SELECT count() FROM series") == 2
    # a restarted hub does not know the series yet and registers them again: harmless
    with Store.open(f"chdb://{chdb_dir}", database=store.database) as restarted:
        restarted.insert_samples([gpu_temps(NOW + 3, 43.0, 53.0)], token="t3")
    assert scalar(store, "SELECT count() FROM metrics") == 8
    assert scalar(store, "SELECT count() FROM metrics WHERE labels['gpu'] = '1'") == 4


def test_series_that_appear_in_a_later_scrape_are_registered(store: Store) -> None:
    store.insert_samples([gpu_temps(NOW, 40.0)], token="one-gpu")
    store.insert_samples([gpu_temps(NOW + 1, 41.0, 60.0)], token="gpu-1-appears")
    rows = store.query("SELECT labels['gpu'], value FROM metrics ORDER BY ts, labels['gpu']").rows
    assert rows == [("0", 40.0), ("0", 41.0), ("1", 60.0)]


def test_samples_of_many_targets_read_back_as_sent_when_their_series_change_between_scrapes(
    store: Store,
) -> None:
    # the samples block reuses each target's encoded series columns while its series stay the same
    def scrape(ts: float, node: str, *metrics: str) -> ScrapeBatch:
        labels = [{"gpu": str(i), "π": "ünïcode"} for i in range(len(metrics))]
        return ScrapeBatch(
            f"{node}:9400", node, ts, list(metrics), labels, [ts + i for i in range(len(metrics))]
        )

    rounds = [
        [scrape(NOW, "nœud-1", "a", "b"), scrape(NOW, "vela-002", "c")],
        [scrape(NOW + 1, "nœud-1", "a", "b"), scrape(NOW + 1, "vela-002", "c", "d_ß")],  # a series appears
        [scrape(NOW + 2, "nœud-1", "b"), scrape(NOW + 2, "vela-002", "c", "d_ß")],  # and one goes
    ]
    for i, batches in enumerate(rounds):
        assert store.insert_samples(batches, token=f"round-{i}") == sum(map(len, batches))
    sent = sorted(
        (series_id(name, b.node, labels), name, b.node, round(b.ts * 1000), value)
        for batches in rounds
        for b in batches
        for name, labels, value in zip(b.names, b.labels, b.values, strict=True)
    )
    stored = store.query(
        "SELECT series_id, metric, node, toUnixTimestamp64Milli(ts), value FROM samples "
        "ORDER BY series_id, metric, node, ts"
    ).rows
    assert sorted(stored) == sent


def test_the_same_rows_are_stored_once_under_the_same_token_another_one_or_after_a_restart(
    store: Store, chdb_dir: Path
) -> None:
    batch = gpu_temps(NOW, 40.0, 41.0)
    step = StepRecord(NOW, "job-a", 0, "vela-001", 10, 0.52)
    status = TargetStatus(NOW, "vela-001:9400", "vela-001", True, 0.004, 2)
    with Store.open(f"chdb://{chdb_dir}", database=store.database) as restarted:
        for writer, token in ((store, "first"), (store, "first"), (store, "second"), (restarted, "third")):
            dropped = [
                writer.insert_samples([batch], token=token).duplicates,
                writer.insert_steps([step], token=token).duplicates,
                writer.insert_targets([status], token=token).duplicates,
            ]
        assert dropped == [2, 1, 1]  # the last insert: a new process learns what the store holds
    assert scalar(store, "SELECT count() FROM samples") == 2
    assert scalar(store, "SELECT sum(count) FROM metrics_1m") == 2  # the rollup saw the replays dropped too
    assert scalar(store, "SELECT count() FROM steps") == 1
    assert scalar(store, "SELECT count() FROM targets") == 1


def test_the_rollup_holds_each_minutes_min_max_sum_count_and_last_by_time(store: Store) -> None:
    # separate inserts (separate parts), the latest sample of the minute arriving before an earlier one
    for offset, temp in ((10, 5.0), (20, 3.0), (0, 1.0), (60, 7.0)):
        store.insert_samples([gpu_temps(NOW + offset, temp)], token=f"at-{offset}")
    rows = store.query(
        "SELECT toUnixTimestamp(ts) - {now:UInt32}, min, max, sum, count, avg, last FROM metrics_1m"
        " WHERE metric = 'DCGM_FI_DEV_GPU_TEMP' AND labels['gpu'] = '0' ORDER BY ts",
        parameters={"now": int(NOW)},
    ).rows
    assert rows == [(0, 1.0, 5.0, 9.0, 3, 3.0, 3.0), (60, 7.0, 7.0, 7.0, 1, 7.0, 7.0)]


# --- steps and targets ----------------------------------------------------------------------------------


def test_steps_and_targets_read_back_with_their_missing_values(store: Store) -> None:
    steps = [
        StepRecord(
            NOW, "job-a", 3, "vela-002", 100, 0.61, 0.40, 0.15, 0.06, dp_rank=1, pp_stage=0, tp_rank=3
        ),
        StepRecord(NOW + 1, "job-a", 4, "vela-002", 164, 0.58, steps=64, source="otlp"),
    ]
    store.insert_steps(steps, token="steps")
    store.insert_targets(
        [TargetStatus(NOW, "vela-002:9400", "vela-002", False, 2.0, 0, "timeout")], token="t"
    )
    columns = ", ".join(field.name for field in fields(StepRecord) if field.name != "ts")
    rows = store.query(f"SELECT toUnixTimestamp64Milli(ts) / 1000, {columns} FROM steps ORDER BY rank").rows
    assert [StepRecord(*row) for row in rows] == steps
    assert store.query("SELECT up, samples, error FROM targets").rows == [(0, 0, "timeout")]


def test_anomalies_read_back_and_a_closed_anomaly_replaces_its_open_row(store: Store) -> None:
    opened = Anomaly(
        id="a1",
        start=NOW + 0.5,
        end=None,
        kind="slow_node",
        node="vela-003",
        component="",
        job="llm",
        severity="warning",
        score=0.12,
        evidence='{"ratio": 1.12}',
        detector="slow_node",
        detector_version="1",
    )
    flapping = replace(opened, id="a2", kind="link_flap", component="mlx5_1:1", detector="link_flap")
    closed = replace(opened, end=NOW + 60.25, severity="critical")
    assert store.insert_anomalies([opened, flapping], token="open") == 2
    for _ in range(2):  # the second is a replay
        store.insert_anomalies([closed], token="close")
    rows = store.query(
        "SELECT id, toUnixTimestamp64Milli(start), toUnixTimestamp64Milli(end), component, severity, evidence"
        " FROM anomalies FINAL ORDER BY id"
    ).rows
    start_ms = round((NOW + 0.5) * 1000)
    assert rows == [
        ("a1", start_ms, round((NOW + 60.25) * 1000), "", "critical", '{"ratio": 1.12}'),
        ("a2", start_ms, None, "mlx5_1:1", "warning", '{"ratio": 1.12}'),
    ]
    assert scalar(store, "SELECT count() FROM anomalies") == 3
    with pytest.raises(StoreRejected, match="anomalies: a row has a bad start"):
        store.insert_anomalies([replace(opened, start=None)], token="no start")


@pytest.mark.parametrize(
    "insert",
    [
        lambda s: s.insert_samples([ScrapeBatch("t", "n", NOW, ["m"], [{}], ["hot"])], token="x"),
        lambda s: s.insert_steps([StepRecord(NOW, "job", 0, "n", 1, duration_s="slow")], token="x"),
        lambda s: s.insert_steps([StepRecord(NOW, "job", -1, "n", 1, 0.5)], token="x"),
        lambda s: s.insert_targets([TargetStatus("yesterday", "t", "n", True, 0.1, 3)], token="x"),
    ],
    ids=["sample value not a number", "step duration not a number", "negative rank", "ts not a number"],
)
def test_bad_rows_are_rejected_and_nothing_of_them_is_stored(store: Store, insert) -> None:
    with pytest.raises(StoreRejected):
        insert(store)
    assert scalar(store, "SELECT (SELECT count() FROM samples) + (SELECT count() FROM steps)") == 0


# --- queries --------------------------------------------------------------------------------------------


def test_a_query_stops_at_max_rows_and_says_so(store: Store) -> None:
    cut = store.query("SELECT number FROM numbers(1000000000)", max_rows=10)
    assert cut.rows == [(n,) for n in range(10)] and cut.truncated
    whole = store.query("SELECT number FROM numbers(10)", max_rows=10)
    assert len(whole.rows) == 10 and not whole.truncated
    assert (whole.columns, whole.types) == (["number"], ["UInt64"])


def test_any_number_of_row_limits_keeps_a_bounded_number_of_sessions(store: Store) -> None:
    for max_rows in range(1, 300, 7):  # as a client choosing max_rows freely would
        assert len(store.query("SELECT number FROM numbers(500)", max_rows=max_rows).rows) == max_rows
    idle = sum(map(len, store._reads._idle.values()))  # the read sessions open between queries
    assert 1 <= idle <= MAX_IDLE


class OlderServer:
    """A real session that answers as a ClickHouse server older than 26.8 would: it has no
    parseQueryToJSON. Everything else is the real engine's answer."""

    def __init__(self, client: clickhouse_connect.driver.Client) -> None:
        self.client = client

    def query(self, sql: str, parameters: dict | None = None):
        if sql == PARSER_FUNCTIONS:
            return self.client.query("SELECT 0")
        if "parseQueryToJSON" in sql:
            raise AssertionError("a server without the function was asked to parse")
        return self.client.query(sql, parameters=parameters)

    def close(self) -> None:
        self.client.close()


def test_a_server_that_cannot_parse_for_checking_has_statements_parsed_here(store: Store, chdb_dir: Path):
    def connect(settings: dict) -> OlderServer:
        return OlderServer(
            clickhouse_connect.get_client(
                interface="chdb", path=str(chdb_dir), database=store.database, settings=settings
            )
        )

    parsers = []

    def local_parser() -> clickhouse_connect.driver.Client:
        parsers.append(clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir)))
        return parsers[-1]

    reads = ReadSessions(connect, store.database, schema.READABLE, local_parser=local_parser)
    try:
        assert reads.query("SELECT count() FROM steps").rows == [(0,)]
        with pytest.raises(QueryError, match="function file\\(\\) is not accepted"):
            reads.query("SELECT file('/etc/passwd')")
        assert len(parsers) == 1  # opened once, on the first query
    finally:
        reads.close()


def test_a_query_stops_at_max_seconds(store: Store) -> None:
    started = time.monotonic()
    with pytest.raises(QueryError, match="TIMEOUT_EXCEEDED"):
        store.query("SELECT count() FROM numbers(1e12) WHERE sipHash64(number) % 7 = 3", max_seconds=0.3)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO steps (job) VALUES ('x')",
        "DROP TABLE samples",
        "ALTER TABLE samples DELETE WHERE 1",
        "TRUNCATE TABLE samples",
        "CREATE TABLE t (a Int8) ENGINE = Memory",
        "OPTIMIZE TABLE samples FINAL",
        "SET readonly = 0",
        "KILL QUERY WHERE 1",
        "SELECT 1; DROP TABLE samples",
        "SELECT 1 /* ; */; DROP TABLE samples",
        "INSERT INTO FUNCTION file('{out}', 'CSV') SELECT 1",
        "SELECT 1 INTO OUTFILE '{out}'",
        "SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "SELECT * FROM url('http://127.0.0.1:9/', 'CSV', 'a String')",
        "  -- a comment\n  drop table samples",
    ],
)
def test_writes_and_outside_access_are_refused(store: Store, tmp_path: Path, sql: str) -> None:
    store.insert_samples([gpu_temps(NOW, 40.0)], token="before")
    out = tmp_path / "out.csv"
    with pytest.raises(QueryError):
        store.query(sql.format(out=out))
    assert not out.exists()
    assert scalar(store, "SELECT count() FROM samples") == 1


def test_read_statements_with_tricky_text_are_accepted(store: Store) -> None:
    assert store.query("SELECT 'DROP TABLE x; INTO OUTFILE' AS s;").rows == [("DROP TABLE x; INTO OUTFILE",)]
    assert store.query("-- what is stored\nEXPLAIN SELECT count() FROM samples").rows
    assert store.query("WITH 2 AS two SELECT two * {n:UInt8}", parameters={"n": 21}).rows == [(42,)]


def test_no_query_can_lift_the_limits(store: Store) -> None:
    for sql in (
        "SELECT 1 SETTINGS readonly = 0",
        'SELECT number FROM numbers(9) SETTINGS "max_result_rows"=0',
    ):
        with pytest.raises(QueryError, match="SETTINGS"):
            store.query(sql)


def test_read_sessions_refuse_writes_and_setting_changes_even_without_the_policy(
    chdb_dir: Path, tmp_path: Path
) -> None:
    """The second line of defence: a read session's own settings, whatever reaches it."""
    client = clickhouse_connect.get_client(
        interface="chdb", path=str(chdb_dir), settings=session_settings(max_rows=10, max_seconds=7)
    )
    try:
        assert client.query(
            "SELECT getSetting('readonly'), getSetting('max_execution_time')"
        ).result_rows == [(1, 7.0)]
        out = tmp_path / "out.csv"
        for sql in (
            f"INSERT INTO FUNCTION file('{out}', 'CSV') SELECT 1",
            "SELECT * FROM file('/etc/hostname', 'LineAsString')",
            "SET readonly = 0",
            "SELECT 1 SETTINGS max_execution_time = 0",
            "CREATE TABLE t (a Int8) ENGINE = Memory",
        ):
            with pytest.raises(clickhouse_connect.driver.exceptions.ClickHouseError, match="readonly"):
                client.query(sql)
        assert not out.exists()
    finally:
        client.close()


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "SELECT count( FROM samples",
            r"^SYNTAX_ERROR: Syntax error: failed at position 20 \(samples\)",
        ),
        (
            "SELECT * FROM no_such_table",
            r"^FROM no_such_table: queries read only fleetlens's tables and views",
        ),
        ("SELECT nope FROM steps", r"^UNKNOWN_IDENTIFIER: .*`nope`"),
    ],
)
def test_query_errors_are_one_short_line(store: Store, sql: str, expected: str) -> None:
    with pytest.raises(QueryError) as refused:
        store.query(sql)
    assert re.match(expected, str(refused.value)), str(refused.value)
    assert "\n" not in str(refused.value) and "SETTINGS" not in str(refused.value)


def test_two_writers_rolling_up_the_same_minutes_and_hours_at_once_store_them_once(store):
    hour = (time.time() // 3600 - 3) * 3600  # ended long enough ago to be rolled up
    store.insert_samples([gpu_temps(hour + m * 60, 50.0 + m) for m in range(3)], token="an-old-hour")
    writers = [store.session(), store.session()]  # two hubs sharing one store
    both_read_the_hours = threading.Barrier(2)
    for writer in writers:  # each reads which hours to roll before either has written them
        read = writer._client.query

        def read_then_wait(*args, read=read, **kwargs):
            answer = read(*args, **kwargs)
            both_read_the_hours.wait(timeout=30)
            return answer

        writer._client.query = read_then_wait

    def roll_up(writer: Store) -> None:  # as each hub's roll-up thread does
        assert writer.roll_up_minutes() == 3
        writer.roll_up_hours()

    threads = [threading.Thread(target=roll_up, args=(writer,)) for writer in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert store.query("SELECT count(), sum(count), min(min), max(max) FROM samples_1m").rows == [
        (3, 3, 50.0, 52.0)
    ]
    assert store.query("SELECT count, min, max FROM metrics_1h").rows == [(3, 50.0, 52.0)]


def test_pieces_of_scrapes_stored_apart_read_back_under_their_own_series(store: Store) -> None:
    # remote write spreads a scrape over requests: its pieces come in any order and share the receiver's
    # labels dicts, which the store also meets under another metric or node, or as copies (a spool replay)
    labels = [{"gpu": str(i), "Hostname": "vela-001"} for i in range(4)]

    def piece(ts: float, order: list[int], metric: str = "temp", node: str = "vela-001") -> ScrapeBatch:
        chosen = [labels[i] for i in order]
        return ScrapeBatch(f"{node}:9400", node, ts, [metric] * len(order), chosen, [ts + i for i in order])

    copies = piece(NOW + 4, [0, 1, 2, 3])
    inserts = [
        [piece(NOW, [0, 1, 2, 3])],
        [piece(NOW + 1, [3, 1])],
        [piece(NOW + 1, [2, 0]), piece(NOW + 2, [1])],
        [piece(NOW + 3, [1, 0], metric="power"), piece(NOW + 3, [2], node="vela-002")],
        [replace(copies, labels=[dict(one) for one in copies.labels])],
        [piece(NOW + 5, [0, 1, 2, 3])],
    ]
    for i, batches in enumerate(inserts):
        store.insert_samples(batches, token=f"insert-{i}")
    sent = sorted(
        (series_id(name, b.node, one), name, b.node, round(b.ts * 1000), value)
        for batches in inserts
        for b in batches
        for name, one, value in zip(b.names, b.labels, b.values, strict=True)
    )
    stored = store.query(
        "SELECT series_id, metric, node, toUnixTimestamp64Milli(ts), value FROM samples"
    ).rows
    assert sorted(stored) == sent
    assert scalar(store, "SELECT count(DISTINCT series_id) FROM series") == 4 + 2 + 1

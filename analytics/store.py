"""The store: the only module that talks to ClickHouse, through clickhouse-connect.

    store = Store.open("chdb://./data")              # embedded chDB in ./data, database "fleetlens"
    store = Store.open("http://ch1:8123/fleet", cluster="fleet")   # a server or cluster, same SQL
    store.insert_samples(batches, token="scrape-42")  # idempotent on token
    store.query("SELECT node, max(value) FROM metrics WHERE metric = 'DCGM_FI_DEV_GPU_TEMP' GROUP BY node")

Opening applies the schema's migrations (analytics.schema) and brings the TTLs in line with `retention`.
Every insert carries its token to ClickHouse as insert_deduplication_token, so a batch replayed after a
crash or a timeout is stored once. Failures are StoreUnavailable (retry later: the hub spools) or
StoreRejected (the data itself is bad).

query() is read-only twice over: ClickHouse's `readonly=2` setting, and, because chDB (like
clickhouse-local) lets `INSERT INTO FUNCTION file(...)`, `INTO OUTFILE` and the file()/url() table
functions through under readonly, a check here that accepts one SELECT/WITH/SHOW/DESCRIBE/EXPLAIN/EXISTS
statement touching no files, URLs or remote servers, with no SETTINGS clause of its own (a server would
let one lift the row and time limits).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields
from itertools import repeat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import clickhouse_connect
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError, OperationalError

from analytics import schema
from analytics.errors import QueryError, SchemaError, StoreRejected, StoreUnavailable
from analytics.records import (
    ActionRow,
    AlertChange,
    Anomaly,
    NotificationRow,
    QueryResult,
    ScrapeBatch,
    SilenceRow,
    StepRow,
    TargetStatus,
)
from analytics.schema import Layout, Retention

__all__ = ["DEFAULT_DATABASE", "DEFAULT_DSN", "Retention", "Store", "series_id"]

DEFAULT_DSN = "chdb://./data"
DEFAULT_DATABASE = "fleetlens"
MAX_KNOWN_SERIES = 2_000_000  # past this the known-series memo starts over (see KnownSeries)

# ClickHouse error codes that mean "not now" rather than "never": TIMEOUT_EXCEEDED, TOO_SLOW,
# TOO_MANY_SIMULTANEOUS_QUERIES, NO_FREE_CONNECTION, SOCKET_TIMEOUT, NETWORK_ERROR, NO_ZOOKEEPER, ABORTED,
# MEMORY_LIMIT_EXCEEDED, TABLE_IS_READ_ONLY, NOT_ENOUGH_SPACE, TOO_MANY_PARTS, ALL_CONNECTION_TRIES_FAILED,
# TOO_FEW_LIVE_REPLICAS, UNKNOWN_STATUS_OF_INSERT, KEEPER_EXCEPTION.
TRANSIENT_CODES = frozenset({159, 160, 202, 203, 209, 210, 225, 236, 241, 242, 243, 252, 279, 285, 319, 999})

SERIES_COLUMNS = ("series_id", "metric", "node", "labels", "first_seen")
# Samples as sent: metric and node go as plain String, which ClickHouse turns into the table's
# LowCardinality on arrival (clickhouse-connect's LowCardinality encoder is a Python loop per row).
SAMPLE_COLUMNS = {
    "metric": "String",
    "node": "String",
    "series_id": "UInt64",
    "ts": "DateTime64(3, 'UTC')",
    "value": "Float64",
}

READ_STATEMENTS = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")
# String literals, quoted identifiers and comments: blanked (same length) before a statement is checked.
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`(?:[^`\\]|\\.)*`|--[^\n]*|/\*.*?\*/", re.S)
_OUTSIDE_ACCESS = re.compile(
    r"\bINTO\s+OUTFILE\b|\b(?:file|url|urlCluster|s3|s3Cluster|gcs|azureBlobStorage|hdfs|remote|remoteSecure"
    r"|mysql|postgresql|mongodb|redis|sqlite|jdbc|odbc|executable|deltaLake|iceberg|hudi)\s*\(",
    re.I,
)
_SETTINGS_CLAUSE = re.compile(r"\bSETTINGS\s+\w+\s*=", re.I)  # would override the limits (on a server)


def series_id(metric: str, node: str, labels: Mapping[str, str]) -> int:
    """The UInt64 identity of a series: 8 bytes of BLAKE2b over metric, node and the sorted labels.

    Stable across processes and hubs (unlike hash()), so every hub of a sharded fleet agrees."""
    canonical = json.dumps([metric, node, sorted(labels.items())], ensure_ascii=False, separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=8).digest(), "big")


SeriesRow = tuple[int, str, str, Mapping[str, str], int]  # series_id, metric, node, labels, first_seen (ms)


class KnownSeries:
    """The series whose row this process has stored, so each is inserted once, and each target's last
    batch with its ids.

    An exporter serves the same series in the same order scrape after scrape, so a batch whose node,
    names and labels equal its target's previous batch (in this call or an earlier one) reuses its ids:
    one list comparison instead of a lookup per sample. Past `limit` series (label churn) the memo starts
    over; registering a series again is harmless (the series table merges duplicates).
    """

    def __init__(self, limit: int = MAX_KNOWN_SERIES) -> None:
        self._limit = limit
        self._ids: dict[tuple[str, str, tuple[tuple[str, str], ...]], int] = {}
        self._last: dict[str, tuple[ScrapeBatch, list[int]]] = {}

    def resolve(self, batches: Sequence[ScrapeBatch]) -> tuple[list[list[int]], list[SeriesRow]]:
        """The series ids of every batch's samples, and the rows of the series not stored yet."""
        ids_per_batch = []
        new: dict[int, SeriesRow] = {}
        latest = dict(self._last)  # a call may hold several scrapes of one target (a spool replay, a sim)
        for batch in batches:
            last = latest.get(batch.target)
            if last and (last[0].node, last[0].names, last[0].labels) == (
                batch.node,
                batch.names,
                batch.labels,
            ):
                ids_per_batch.append(last[1])
                continue
            ids = []
            for metric, labels in zip(batch.names, batch.labels, strict=True):
                sid = self._ids.get((batch.node, metric, tuple(labels.items())))
                if sid is None:
                    sid = series_id(metric, batch.node, labels)
                    new.setdefault(sid, (sid, metric, batch.node, labels, _millis(batch.ts)))
                ids.append(sid)
            ids_per_batch.append(ids)
            latest[batch.target] = (batch, ids)
        return ids_per_batch, list(new.values())

    def remember(
        self, batches: Sequence[ScrapeBatch], ids_per_batch: list[list[int]], stored: list[SeriesRow]
    ) -> None:
        """Note that the `stored` series rows are in the store, and each batch as its target's last."""
        if len(self._ids) + len(stored) > self._limit:
            self._ids.clear()
            self._last.clear()
        for sid, metric, node, labels, _first_seen in stored:
            self._ids[(node, metric, tuple(labels.items()))] = sid
        for batch, ids in zip(batches, ids_per_batch, strict=True):
            self._last[batch.target] = (batch, ids)


class Store:
    """A ClickHouse database holding fleetlens's schema; build it with Store.open()."""

    def __init__(self, client: Client, layout: Layout) -> None:
        self._client = client
        self._layout = layout
        self._series = KnownSeries()
        self._insert_settings = {"insert_distributed_sync": 1} if layout.cluster else {}

    @classmethod
    def open(
        cls,
        dsn: str = DEFAULT_DSN,
        *,
        database: str | None = None,
        cluster: str | None = None,
        retention: Retention | None = None,
    ) -> Store:
        """Connect, apply the migrations this database lacks and bring its TTLs in line with `retention`.

        Raises SchemaError (bad DSN or names, a schema newer than this code, a failed migration) or
        StoreUnavailable (no server, or the chDB directory is held by another process)."""
        client, dsn_database = _connect(dsn)
        try:
            layout = Layout(database or dsn_database or DEFAULT_DATABASE, cluster, retention or Retention())
            _migrate(client, layout)
            client.database = layout.database
        except ClickHouseError as error:
            client.close()
            failure = StoreUnavailable if _unreachable(error) else SchemaError
            raise failure(f"opening {_shown(dsn)}: {_short(error)}") from error
        except BaseException:
            client.close()
            raise
        return cls(client, layout)

    def insert_samples(self, batches: Sequence[ScrapeBatch], *, token: str) -> int:
        """Store every sample of `batches` (and the series rows of series new to this process); returns the
        number of samples sent. The series and the samples inserts each carry a token derived from `token`."""
        ids_per_batch, new_series = self._series.resolve(batches)
        if new_series:
            self._insert("series", SERIES_COLUMNS, new_series, f"{token}/series")
        self._series.remember(batches, ids_per_batch, new_series)
        columns = _sample_columns(batches, ids_per_batch)
        if not columns[0]:
            return 0
        self._insert("samples", SAMPLE_COLUMNS, columns, f"{token}/samples", column_oriented=True)
        return len(columns[0])

    def insert_targets(self, statuses: Sequence[TargetStatus], *, token: str) -> int:
        """Store one row per scrape outcome; returns the number of rows sent."""
        return self._insert_records("targets", TargetStatus, statuses, token)

    def insert_steps(self, rows: Sequence[StepRow], *, token: str) -> int:
        """Store training step rows; returns the number of rows sent."""
        return self._insert_records("steps", StepRow, rows, token)

    def insert_anomalies(self, rows: Sequence[Anomaly], *, token: str) -> int:
        """Store anomaly rows; an anomaly written again under its id (when it ends) replaces the earlier
        row on merge (read with FINAL). Returns the number of rows sent."""
        return self._insert_records(
            "anomalies", Anomaly, rows, token, times=("start", "end"), nullable_times=("end",)
        )

    def insert_alert_changes(self, rows: Sequence[AlertChange], *, token: str) -> int:
        """Store alert state changes; returns the number of rows sent."""
        return self._insert_records(
            "alerts",
            AlertChange,
            rows,
            token,
            times=("ts", "starts_at", "ends_at"),
            nullable_times=("ends_at",),
        )

    def insert_actions(self, rows: Sequence[ActionRow], *, token: str) -> int:
        """Store drain controller decisions; returns the number of rows sent."""
        return self._insert_records("actions", ActionRow, rows, token)

    def insert_silences(self, rows: Sequence[SilenceRow], *, token: str) -> int:
        """Store silences (a row under an existing id replaces it, read with FINAL)."""
        return self._insert_records(
            "silences", SilenceRow, rows, token, times=("starts_at", "ends_at", "updated_at")
        )

    def insert_notifications(self, rows: Sequence[NotificationRow], *, token: str) -> int:
        """Store delivery outcomes; returns the number of rows sent."""
        return self._insert_records("notifications", NotificationRow, rows, token)

    def query(
        self,
        sql: str,
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = 10_000,
        max_seconds: float = 10.0,
    ) -> QueryResult:
        """Run one read-only statement; at most `max_rows` rows come back (`truncated` says when more
        matched) and ClickHouse stops it after `max_seconds`. Raises QueryError, or StoreUnavailable."""
        if max_rows < 1 or max_seconds <= 0:
            raise QueryError(f"limits must be positive: max_rows={max_rows}, max_seconds={max_seconds}")
        statement = read_only_statement(sql)
        settings = {
            "readonly": 2,
            "max_result_rows": max_rows + 1,
            "result_overflow_mode": "break",
            "max_execution_time": max_seconds,
            "timeout_overflow_mode": "throw",
        }
        started = time.perf_counter()
        try:
            result = self._client.query(statement, parameters=parameters, settings=settings)
        except ClickHouseError as error:
            if _unreachable(error):
                raise StoreUnavailable(f"query: {_short(error)}") from error
            raise QueryError(_short(error)) from error
        rows = result.result_rows
        return QueryResult(
            columns=list(result.column_names),
            types=[column_type.name for column_type in result.column_types],
            rows=[tuple(row) for row in rows[:max_rows]],
            truncated=len(rows) > max_rows,
            elapsed_s=time.perf_counter() - started,
        )

    def close(self) -> None:
        """Release the connection (and, for chDB, the engine, so another directory can be opened)."""
        self._client.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _insert_records(
        self,
        table: str,
        record: type,
        records: Sequence[Any],
        token: str,
        times: Sequence[str] = ("ts",),
        nullable_times: Sequence[str] = (),
    ) -> int:
        """Insert dataclass records whose fields are the table's columns; the `times` columns (unix
        seconds) go in as milliseconds, and None in a `nullable_times` column as NULL."""
        if not records:
            return 0
        names = [f.name for f in fields(record)]
        columns = {name: [getattr(r, name) for r in records] for name in names}
        for name in times:
            try:
                columns[name] = [
                    None if ts is None and name in nullable_times else _millis(ts) for ts in columns[name]
                ]
            except (TypeError, ValueError, OverflowError) as error:
                raise StoreRejected(f"{table}: a row has a bad {name}: {error}") from error
        self._insert(table, names, list(columns.values()), token, column_oriented=True)
        return len(records)

    def _insert(
        self,
        table: str,
        columns: Sequence[str] | Mapping[str, str],
        data: Sequence,
        token: str,
        column_oriented: bool = False,
    ) -> None:
        """Insert `data` into `columns` (names, or names -> wire types); `token` makes a replay a no-op."""
        settings = {"insert_deduplication_token": token, **self._insert_settings}
        types = list(columns.values()) if isinstance(columns, Mapping) else None
        try:
            self._client.insert(
                table,
                data,
                column_names=list(columns),
                column_type_names=types,
                settings=settings,
                column_oriented=column_oriented,
            )
        except (TypeError, ValueError, OverflowError) as error:
            raise StoreRejected(f"{table}: rows do not fit the table's column types: {error}") from error
        except ClickHouseError as error:
            raise _store_error(f"insert into {table}", error) from error


def _sample_columns(batches: Sequence[ScrapeBatch], ids_per_batch: list[list[int]]) -> list[list]:
    """The samples of `batches` as the columns of SAMPLE_COLUMNS."""
    metrics: list[str] = []
    nodes: list[str] = []
    ids: list[int] = []
    stamps: list[int] = []
    values: list[float] = []
    for batch, batch_ids in zip(batches, ids_per_batch, strict=True):
        count = len(batch.values)
        metrics.extend(batch.names)
        nodes.extend(repeat(batch.node, count))
        ids.extend(batch_ids)
        stamps.extend(repeat(_millis(batch.ts), count))
        values.extend(batch.values)
    return [metrics, nodes, ids, stamps, values]


def _millis(ts: float) -> int:
    """Unix seconds as the integer milliseconds that DateTime64(3) columns take."""
    return round(ts * 1000)


def read_only_statement(sql: str) -> str:
    """`sql` without a trailing semicolon, if it is one read-only statement touching nothing outside the
    database; else QueryError saying why."""
    bare = _QUOTED.sub(lambda match: " " * len(match.group()), sql)
    words = bare.replace("(", " ").split()
    if not words:
        raise QueryError("empty statement")
    keyword = words[0].upper()
    if keyword not in READ_STATEMENTS:
        raise QueryError(f"only read statements ({', '.join(READ_STATEMENTS)}) are accepted, not {keyword}")
    end = bare.rfind(";")
    if end >= 0 and (bare[end + 1 :].strip() or ";" in bare[:end]):
        raise QueryError("one statement per query")
    if _SETTINGS_CLAUSE.search(bare):
        raise QueryError("a SETTINGS clause is not accepted: the store sets the query's limits")
    if found := _OUTSIDE_ACCESS.search(bare):
        raise QueryError(
            f"files, URLs and remote servers are out of reach of queries: {found.group().strip()}"
        )
    return sql[:end] if end >= 0 else sql


def _connect(dsn: str) -> tuple[Client, str | None]:
    """A client for `dsn` and the database it names (None when it names none)."""
    parts = urlsplit(dsn)
    try:
        if dsn.startswith("chdb://"):
            location = dsn.removeprefix("chdb://")
            if not location:
                raise SchemaError(f"DSN {dsn!r}: expected chdb://<directory>, e.g. chdb://./data")
            Path(location).mkdir(parents=True, exist_ok=True)
            return clickhouse_connect.get_client(interface="chdb", path=location), None
        if parts.scheme in ("http", "https") and parts.hostname:
            server = urlunsplit((parts.scheme, parts.netloc, "", parts.query, ""))
            return clickhouse_connect.get_client(dsn=server), parts.path.strip("/") or None
    except ClickHouseError as error:
        raise StoreUnavailable(f"cannot reach the store at {_shown(dsn)}: {_short(error)}") from error
    except OSError as error:
        raise StoreUnavailable(f"cannot create the chDB directory for {_shown(dsn)}: {error}") from error
    raise SchemaError(f"DSN {_shown(dsn)!r}: expected chdb://<directory> or http(s)://host:8123/<database>")


def _migrate(client: Client, layout: Layout) -> None:
    """Apply the migrations `layout.database` lacks, in order, recording each; then align the TTLs."""
    _run(client, schema.bootstrap(layout), "create the database")
    applied = client.query(f"SELECT max(version) FROM {layout.name('schema_migrations')}").result_rows[0][0]
    if applied > schema.LATEST_VERSION:
        raise SchemaError(
            f"database {layout.database} has schema version {applied}, newer than this fleetlens "
            f"(version {schema.LATEST_VERSION}); upgrade fleetlens or open another database"
        )
    for migration in schema.MIGRATIONS:
        if migration.version <= applied:
            continue
        _run(client, migration.statements(layout), f"migration {migration.version} ({migration.description})")
        client.insert(
            layout.name("schema_migrations"),
            [[migration.version, migration.description, _millis(time.time())]],
            column_names=["version", "description", "applied_at"],
        )
    engines = client.query(
        "SELECT name, engine_full FROM system.tables WHERE database = {db:String}",
        parameters={"db": layout.database},
    ).result_rows
    _run(client, schema.retention_changes(layout, dict(engines)), "apply the retention")


def _run(client: Client, statements: Sequence[str], what: str) -> None:
    """Run DDL statements in order; a failing one becomes a SchemaError naming it and `what` it was for."""
    for statement in statements:
        try:
            client.command(statement)
        except ClickHouseError as error:
            if _unreachable(error):
                raise
            raise SchemaError(f"{what} failed at {statement.splitlines()[0]!r}: {_short(error)}") from error


def _unreachable(error: ClickHouseError) -> bool:
    """True when ClickHouse never answered (a transport failure carries no ClickHouse error code)."""
    return isinstance(error, OperationalError) and getattr(error, "code", None) is None


def _store_error(what: str, error: ClickHouseError) -> StoreUnavailable | StoreRejected:
    """StoreUnavailable for transport failures and ClickHouse's transient codes, StoreRejected otherwise."""
    transient = _unreachable(error) or getattr(error, "code", None) in TRANSIENT_CODES
    return (StoreUnavailable if transient else StoreRejected)(f"{what}: {_short(error)}")


def _short(error: Exception) -> str:
    """ClickHouse's message cut to what an operator needs: the error name and its first sentence, without
    the echoed statement, the list of expected tokens and the version trailer."""
    name = getattr(error, "name", None)
    text = str(error).split("DB::Exception: ")[-1]
    text = re.split(r"\n|\. In scope |\. Expected one of|\s\(version ", text)[0].strip()
    text = re.sub(r"(\(line \d+, col \d+\)):.*", r"\1", text)  # drop the echo of the statement's rest
    text = re.sub(r"\s*\([A-Z_]+\)$", "", text)
    return f"{name}: {text}" if name else text


def _shown(dsn: str) -> str:
    """The DSN with its password masked, fit for messages and logs."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    return dsn.replace(f":{parts.password}@", ":***@", 1)

"""The store's schema: every table and view as ClickHouse DDL, for one node or a cluster, and its migrations.

docs/schema.md lists every table and view with its columns; docs/performance.md measures the layout.

Samples: labels live once per series in `series`; `samples` holds (metric, node, series_id, ts, value)
ordered by (metric, node, series_id, ts), ts Delta+ZSTD, value FPC+ZSTD, partitioned by day, so that the
commonest filters (`metric = ...`, `node = ...`) are primary-key lookups and raw samples expire a whole
part at a time. The `metrics*` views are the stable interface readers query.

Merges: the tables the hub appends to every few seconds (samples, steps, targets) merge in tiers
(TIERED_MERGES, ClickHouse's Trivial selector, which Store.open sets where a table lacks it; a server that
refuses it keeps its default merges, and the log says so), so that a row is rewritten once per level.

Rollups have no materialized view: roll_up_minutes() rolls the raw samples of every whole minute after the
last one rolled, once it is ROLL_UP_MINUTES_AFTER_S old, into samples_1m; roll_up_hours() rolls whole
hours of minutes, once ROLL_UP_AFTER_S old, into samples_1h. Readers read a rollup up to its last period
and the finer rows after it (minute_rows), so a late roll-up costs speed, not numbers; samples that
arrive for a period already rolled up reach raw samples only.

Cluster mode: every table is a Replicated*MergeTree `<name>_local` on each shard plus a Distributed
`<name>` over them (sharded by series_id where a view joins, so each join is shard-local); readers and
writers always use the plain name.

Migrations are applied in order and recorded in schema_migrations; every statement is idempotent, so a
migration interrupted halfway is simply applied again. A table's CREATE shows its latest columns, and
AddColumn is a no-op on a fresh database and an ALTER on an old one. TTLs are not migrated: Store.open
brings them in line with the code's (retention_changes).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from analytics.errors import SchemaError

DEDUP_WINDOW = 10_000  # recent insert blocks whose tokens each table remembers, for replays after a crash
# Merges of tables the hub appends to every few seconds: ten parts of one level into one of the next (see
# "Merges" in the module doc).
TIERED_MERGES = "merge_selector_algorithm = 'Trivial'"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CLUSTER_NAME = re.compile(r"[A-Za-z0-9_.-]+\Z")


@dataclass(frozen=True)
class Retention:
    """How many days each kind of data is kept (enforced by ClickHouse TTLs)."""

    raw_days: int = 15
    rollup_days: int = 400
    steps_days: int = 90
    targets_days: int = 15

    def __post_init__(self) -> None:
        for name, days in vars(self).items():
            if not isinstance(days, int) or days < 1:
                raise SchemaError(f"retention {name}: a whole number of days >= 1, got {days!r}")


@dataclass(frozen=True)
class Layout:
    """Where the schema goes: a database, on one node or ON CLUSTER, with its retention."""

    database: str
    cluster: str | None = None
    retention: Retention = field(default_factory=Retention)

    def __post_init__(self) -> None:
        if not _IDENTIFIER.match(self.database):
            raise SchemaError(f"database name {self.database!r}: letters, digits and _ only")
        if self.cluster is not None and not _CLUSTER_NAME.match(self.cluster):
            raise SchemaError(f"cluster name {self.cluster!r}: letters, digits, _, . and - only")

    @property
    def on_cluster(self) -> str:
        return f" ON CLUSTER '{self.cluster}'" if self.cluster else ""

    def name(self, table: str) -> str:
        """The qualified name readers and writers use."""
        return f"{self.database}.{table}"

    def local(self, table: str) -> str:
        """The qualified name of the table that holds the data on this node."""
        return f"{self.database}.{table}_local" if self.cluster else self.name(table)

    def distributed(self, table: str, sharding_key: str | None = None) -> str:
        """A Distributed table `table` over `<table>_local` on every shard."""
        key = f", {sharding_key}" if sharding_key else ""
        return (
            f"CREATE TABLE IF NOT EXISTS {self.name(table)}{self.on_cluster} AS {self.local(table)}\n"
            f"ENGINE = Distributed('{self.cluster}', {self.database}, {table}_local{key})"
        )


@dataclass(frozen=True)
class Expiry:
    """When a table's rows expire: `time` (a DateTime expression of the row's time) plus the retention's
    `days` field, or at the row's `kept_until` column when that is later (rows kept on purpose).

    `ttl` is spelled as ClickHouse prints it back in system.tables, so that the TTL a table has can be
    compared with the one the retention asks for (retention_changes)."""

    time: str
    days: str
    kept_until: str | None = None

    def ttl(self, retention: Retention) -> str:
        expires = f"{self.time} + toIntervalDay({getattr(retention, self.days)})"
        return f"greatest({expires}, {self.kept_until})" if self.kept_until else expires


@dataclass(frozen=True)
class Table:
    """A MergeTree-family table; `sharded=False` keeps one full replica on every node of a cluster."""

    name: str
    columns: str
    order_by: str
    engine: str = "MergeTree"
    partition_by: str | None = None
    expiry: Expiry | None = None
    ttl_drops_whole_parts: bool = False
    sharding_key: str = "rand()"
    sharded: bool = True
    tiered_merges: bool = False  # TIERED_MERGES: for a table the hub appends to every few seconds
    version: str | None = None  # a ReplacingMergeTree's version column: the row with its highest value stays

    def ttl_for(self, layout: Layout) -> str | None:
        return self.expiry.ttl(layout.retention) if self.expiry else None

    def create(self, layout: Layout) -> list[str]:
        target = self.target(layout)
        clauses = [f"ENGINE = {self._engine(layout, target)}"]
        if self.partition_by:
            clauses.append(f"PARTITION BY {self.partition_by}")
        clauses.append(f"ORDER BY ({self.order_by})")
        if self.expiry:
            clauses.append(f"TTL {self.ttl_for(layout)}")
        clauses.append(f"SETTINGS {', '.join(self._settings(layout))}")
        body = "\n".join(clauses)
        statements = [f"CREATE TABLE IF NOT EXISTS {target}{layout.on_cluster}\n(\n{self.columns}\n)\n{body}"]
        if layout.cluster and self.sharded:
            statements.append(layout.distributed(self.name, self.sharding_key))
        return statements

    def _engine(self, layout: Layout, target: str) -> str:
        version = [self.version] if self.version else []
        if not layout.cluster:
            return f"{self.engine}({version[0]})" if version else self.engine
        shard, replica = ("{shard}", "{replica}") if self.sharded else ("all", "{shard}-{replica}")
        arguments = ", ".join([f"'/clickhouse/tables/{shard}/{target}'", f"'{replica}'", *version])
        return f"Replicated{self.engine}({arguments})"

    def _settings(self, layout: Layout) -> list[str]:
        window = "replicated" if layout.cluster else "non_replicated"
        settings = [f"{window}_deduplication_window = {DEDUP_WINDOW}"]
        if self.ttl_drops_whole_parts:
            settings.append("ttl_only_drop_parts = 1")
        return settings

    def target(self, layout: Layout) -> str:
        """The table this one's data lives in: its local table on each shard, or itself."""
        return layout.local(self.name) if self.sharded else layout.name(self.name)

    def created_as(self, layout: Layout, engines: Mapping[str, str]) -> str | None:
        """The engine_full of target() in `engines` (system.tables of the database: name -> engine_full);
        None before the table is created."""
        return engines.get(self.target(layout).split(".", 1)[1])


@dataclass(frozen=True)
class View:
    """A view over `sources` (named as {placeholders} in `select`); Distributed over shards in a cluster."""

    name: str
    select: str
    sources: tuple[str, ...]

    def create(self, layout: Layout) -> list[str]:
        select = self.select.format(**{source: layout.local(source) for source in self.sources})
        view = f"CREATE OR REPLACE VIEW {layout.local(self.name)}{layout.on_cluster} AS\n{select}"
        return [view, layout.distributed(self.name)] if layout.cluster else [view]


@dataclass(frozen=True)
class MaterializedView:
    """Turns every insert into `source` into rows of `target` (on each shard, between local tables)."""

    name: str
    source: str
    target: str
    select: str

    def create(self, layout: Layout) -> list[str]:
        select = self.select.format(source=layout.local(self.source))
        return [
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {layout.name(self.name)}{layout.on_cluster}"
            f" TO {layout.local(self.target)} AS\n{select}"
        ]


@dataclass(frozen=True)
class AddColumn:
    """Adds `column` (its DDL: name, type, DEFAULT) to an existing `table`, and to the Distributed table
    over it in a cluster, which does not follow its local tables' columns by itself. Rows already
    stored read the column's DEFAULT. A no-op where the table has the column (a fresh database, whose
    CREATE already lists it)."""

    table: str
    column: str

    def create(self, layout: Layout) -> list[str]:
        targets = [layout.local(self.table)]
        if layout.cluster:
            targets.append(layout.name(self.table))
        return [
            f"ALTER TABLE {target}{layout.on_cluster} ADD COLUMN IF NOT EXISTS {self.column}"
            for target in targets
        ]


@dataclass(frozen=True)
class AddIndex:
    """Adds the data-skipping index `index` (its DDL: name, expression, TYPE, GRANULARITY) to `table`'s
    local tables, and builds it for the parts already stored (a mutation, in the background). A no-op
    where the table has it (a fresh database, whose CREATE already lists it)."""

    table: str
    index: str

    def create(self, layout: Layout) -> list[str]:
        local, name = layout.local(self.table), self.index.split()[0]
        return [
            f"ALTER TABLE {local}{layout.on_cluster} ADD INDEX IF NOT EXISTS {self.index}",
            f"ALTER TABLE {local}{layout.on_cluster} MATERIALIZE INDEX {name}",
        ]


@dataclass(frozen=True)
class Fill:
    """Fills a table the migration adds from what the store already holds: `statement` of the layout."""

    statement: Callable[[Layout], str]

    def create(self, layout: Layout) -> list[str]:
        return [self.statement(layout)]


@dataclass(frozen=True)
class DropView:
    """Drops the view (or materialized view) `name` where it exists."""

    name: str

    def create(self, layout: Layout) -> list[str]:
        return [f"DROP VIEW IF EXISTS {layout.name(self.name)}{layout.on_cluster}"]


SchemaObject = Table | View | MaterializedView | AddColumn | AddIndex | Fill | DropView


@dataclass(frozen=True)
class Migration:
    """One step of the schema: applied once per database, in version order."""

    version: int
    description: str
    objects: tuple[SchemaObject, ...]

    def statements(self, layout: Layout) -> list[str]:
        return [statement for item in self.objects for statement in item.create(layout)]


TS = "DateTime64(3, 'UTC')"

SCHEMA_MIGRATIONS = Table(
    name="schema_migrations",
    columns=f"    version UInt32,\n    description String,\n    applied_at {TS}",
    order_by="version",
    sharded=False,
)

SERIES = Table(
    name="series",
    columns=f"""    series_id UInt64,
    metric LowCardinality(String),
    node LowCardinality(String),
    labels SimpleAggregateFunction(any, Map(String, String)) CODEC(ZSTD(3)),
    first_seen SimpleAggregateFunction(min, {TS})""",
    engine="AggregatingMergeTree",
    order_by="metric, node, series_id",
    sharding_key="series_id",
)

SAMPLES = Table(
    name="samples",
    columns=f"""    metric LowCardinality(String),
    node LowCardinality(String),
    series_id UInt64,
    ts {TS} CODEC(Delta, ZSTD(1)),
    value Float64 CODEC(FPC, ZSTD(1))""",
    order_by="metric, node, series_id, ts",
    partition_by="toDate(ts)",
    expiry=Expiry("toDateTime(ts)", "raw_days"),
    ttl_drops_whole_parts=True,
    sharding_key="series_id",
    tiered_merges=True,
)


def rollup_table(name: str, time: str) -> Table:
    """A rollup of samples into periods named by `time` (their start): min, max, sum, count and last."""
    return Table(
        name=name,
        columns=f"""    metric LowCardinality(String),
    node LowCardinality(String),
    series_id UInt64,
    {time} DateTime('UTC') CODEC(DoubleDelta, ZSTD(1)),
    min SimpleAggregateFunction(min, Float64) CODEC(FPC, ZSTD(1)),
    max SimpleAggregateFunction(max, Float64) CODEC(FPC, ZSTD(1)),
    sum SimpleAggregateFunction(sum, Float64) CODEC(FPC, ZSTD(1)),
    count SimpleAggregateFunction(sum, UInt64) CODEC(T64, ZSTD(1)),
    last SimpleAggregateFunction(max, Tuple(ts {TS}, value Float64)) CODEC(ZSTD(1))""",
        engine="AggregatingMergeTree",
        order_by=f"metric, node, series_id, {time}",
        partition_by=f"toDate({time})",
        expiry=Expiry(time, "rollup_days"),
        ttl_drops_whole_parts=True,
        sharding_key="series_id",
    )


# Each raw sample as a row of the 1-minute rollup, its minute named `minute`: what readers aggregate for the
# minutes not rolled up yet, and what migration 1's materialized view wrote into samples_1m on every insert.
SAMPLE_AS_MINUTE = """metric, node, series_id, toStartOfMinute(ts) AS minute,
    value AS min, value AS max, value AS sum, toUInt64(1) AS count, (ts, value) AS last"""


def rollup_view(table: Table) -> MaterializedView:
    """Every sample inserted, as one row of the 1-minute rollup `table`: migration 1's, dropped by 7."""
    return MaterializedView(
        name=f"{table.name}_mv",
        source="samples",
        target=table.name,
        select=f"SELECT {SAMPLE_AS_MINUTE}\nFROM {{source}}",
    )


def rollup_metrics(name: str, table: Table, rows: str = "", sources: tuple[str, ...] = ()) -> View:
    """The rollup `table` as the metrics view's rows: one per series and period, labels joined. `rows`
    (a SELECT over `sources`, named as {placeholders}) stands in for the table's rows where given."""
    time = table.order_by.rsplit(", ", 1)[1]
    return View(
        name=name,
        select=f"""SELECT m.{time} AS ts, CAST(m.metric, 'String') AS metric, CAST(m.node, 'String') AS node,
    CAST(r.labels, 'Map(String, String)') AS labels,
    CAST(m.min, 'Float64') AS min, CAST(m.max, 'Float64') AS max, m.sum / m.count AS avg,
    m.sum AS sum, m.count AS count, m.last.2 AS last
FROM (
    SELECT metric, node, series_id, {time}, min(min) AS min, max(max) AS max, sum(sum) AS sum,
        sum(count) AS count, max(last) AS last
    FROM {f"({rows})" if rows else f"{{{table.name}}}"}
    GROUP BY metric, node, series_id, {time}
) AS m
ANY LEFT JOIN {{series}} AS r ON m.series_id = r.series_id""",
        sources=(table.name, *sources, "series"),
    )


SAMPLES_1M = rollup_table("samples_1m", "minute")
SAMPLES_1M_MV = rollup_view(SAMPLES_1M)
SAMPLES_1H = rollup_table("samples_1h", "hour")
ROLL_UP_AFTER_S = 600  # an hour is rolled up this long after it ends: samples come in up to that late
# A minute is rolled up this long after it ends. A scraped round is stored within a second or two of its
# scrape; rounds queued behind a slow store (hub.rounds.MAX_PENDING_ROUNDS, 10 s at 1 s) and remote write
# batches (sent within 5 s, retried with a backoff of at most 5 s) within a minute. Rounds replayed from
# the spool after a longer outage come later and reach raw samples only.
ROLL_UP_MINUTES_AFTER_S = 120


# The end of the minutes old enough to roll up now (SQL): those that ended ROLL_UP_MINUTES_AFTER_S ago.
MINUTES_DUE = f"toStartOfMinute(now() - toIntervalSecond({ROLL_UP_MINUTES_AFTER_S}))"


def rolled_minutes(samples_1m: str) -> str:
    """The end of the minutes rolled up into `samples_1m` (the table's name) so far: the minute after its
    last. Minutes from there on are read from raw samples."""
    return f"(SELECT max(minute) + 60 FROM {samples_1m})"


def minute_rows(samples_1m: str, samples: str, where: str = "1") -> str:
    """The 1-minute rollup's rows that match `where` (on metric, node, series_id and minute), as a UNION
    ALL: samples_1m's up to the last minute rolled up, then every raw sample as a row of its minute, as
    the materialized view wrote them. Readers group by series and minute whatever the rows' source, so
    what is rolled up changes their speed, never their numbers."""
    rolled = rolled_minutes(samples_1m)
    return f"""SELECT metric, node, series_id, minute, min, max, sum, count, last FROM {samples_1m}
        WHERE {where} AND minute < {rolled}
        UNION ALL SELECT {SAMPLE_AS_MINUTE} FROM {samples}
        WHERE {where} AND ts >= {rolled}"""


def roll_up_minutes(layout: Layout, since: str = "", until: str = "") -> str:
    """Rolls the raw samples of the whole minutes from `since` to `until` (SQL DateTime expressions) into
    samples_1m; by default every minute after samples_1m's last one that ended ROLL_UP_MINUTES_AFTER_S
    ago (Store.roll_up_minutes rolls them one insert per minute, for several writers at once). Through
    the Distributed tables in a cluster: the rows land on their shard."""
    minutes, samples = layout.name("samples_1m"), layout.name("samples")
    since = since or rolled_minutes(minutes)
    until = until or MINUTES_DUE
    # Grouped by samples' sort key (metric, node, series_id) and the minute, read in that order: each
    # series' rows are aggregated as they stream by, without a hash table of every series. A minute of 192
    # nodes at 1 s (7.5 M samples) took 0.13 us of CPU per sample so, 0.38 us by a hash on series_id.
    return f"""INSERT INTO {minutes}
SELECT metric, node, series_id, toStartOfMinute(ts) AS minute,
    min(value) AS min, max(value) AS max, sum(value) AS sum, count() AS count, max((ts, value)) AS last
FROM {samples}
WHERE ts >= {since} AND ts < {until}
GROUP BY metric, node, series_id, minute
SETTINGS optimize_aggregation_in_order = 1"""


def roll_up_hours(layout: Layout, since: str = "", until: str = "") -> str:
    """Rolls the 1-minute rollup's whole hours from `since` to `until` (SQL DateTime expressions) into
    samples_1h; by default every hour after samples_1h's last one that ended ROLL_UP_AFTER_S ago and
    whose samples are all rolled into minutes, so each hour once however often it runs (see
    Store.roll_up_hours for several writers at once). Through the Distributed tables in a cluster, where
    one node runs it: the rows land on their shard."""
    hourly, minutes = layout.name("samples_1h"), layout.name("samples_1m")
    since = since or f"(SELECT max(hour) + 3600 FROM {hourly})"
    until = until or hours_rolled_up_until(layout)
    return f"""INSERT INTO {hourly}
SELECT metric, node, series_id, toStartOfHour(minute) AS hour, min(min) AS min, max(max) AS max,
    sum(sum) AS sum, sum(count) AS count, max(last) AS last
FROM {minutes}
WHERE minute >= {since} AND minute < {until}
GROUP BY metric, node, series_id, hour"""


def minutes_pending(layout: Layout) -> str:
    """The time of the earliest raw sample not rolled up into minutes yet (NULL when none is): hours
    from its own on must wait for it, or they would miss it for good."""
    samples, minutes = layout.name("samples"), layout.name("samples_1m")
    return f"(SELECT minOrNull(ts) FROM {samples} WHERE ts >= {rolled_minutes(minutes)})"


def hours_rolled_up_until(layout: Layout) -> str:
    """The end of the hours to roll up now: those that ended ROLL_UP_AFTER_S ago and before the earliest
    raw sample not rolled into minutes yet."""
    return (
        f"least(toStartOfHour(now() - toIntervalSecond({ROLL_UP_AFTER_S})),"
        f" toStartOfHour(ifNull({minutes_pending(layout)}, now())))"
    )


def trim_minutes_the_view_left_partial(layout: Layout) -> str:
    """Deletes the 1-minute rollup's rows of the minutes that ended less than ROLL_UP_MINUTES_AFTER_S ago
    (the last of them written by the materialized view, just dropped, only in part): the roll-up rolls
    them again from raw samples, whole. Readers read raw samples for them meanwhile. The time is taken
    when the migration runs, a constant in the statement, so that every replica deletes the same rows."""
    cut = (int(time.time()) - ROLL_UP_MINUTES_AFTER_S) // 60 * 60
    return (
        f"ALTER TABLE {layout.local('samples_1m')}{layout.on_cluster}"
        f" DELETE WHERE minute >= toDateTime({cut}) SETTINGS mutations_sync = 2"
    )


METRICS = View(
    name="metrics",
    select="""SELECT s.ts AS ts, CAST(s.metric, 'String') AS metric, CAST(s.node, 'String') AS node,
    CAST(r.labels, 'Map(String, String)') AS labels, s.value AS value
FROM {samples} AS s
ANY LEFT JOIN {series} AS r ON s.series_id = r.series_id""",
    sources=("samples", "series"),
)

METRICS_1M = rollup_metrics(
    "metrics_1m", SAMPLES_1M, minute_rows("{samples_1m}", "{samples}"), sources=("samples",)
)
METRICS_1H = rollup_metrics("metrics_1h", SAMPLES_1H)

# Imported history kept on purpose (`fleetlens steps import --keep-days N`): a row expires at the later of
# ts + steps_days and keep_until; the default (1970) leaves steps_days alone.
STEPS_KEEP_UNTIL = "keep_until DateTime('UTC') DEFAULT toDateTime(0)"
# Steps are sorted by job, step and rank, but read by time: every window's detectors read the last seconds
# of steps. Without an index on ts each such read scanned its month's partition: a 10 s read of six days of
# 256 ranks (33 M rows) took 35 ms of CPU, with this index 11 ms.
STEPS_TS_INDEX = "ts_minmax ts TYPE minmax GRANULARITY 1"

STEPS = Table(
    name="steps",
    columns=f"""    ts {TS} CODEC(Delta, ZSTD(1)),
    job LowCardinality(String),
    rank UInt32,
    node LowCardinality(String),
    step UInt64 CODEC(Delta, ZSTD(1)),
    duration_s Float64 CODEC(Gorilla, ZSTD(1)),
    compute_s Nullable(Float64),
    comm_s Nullable(Float64),
    data_s Nullable(Float64),
    dp_rank Nullable(UInt32),
    pp_stage Nullable(UInt32),
    tp_rank Nullable(UInt32),
    steps UInt32,
    source LowCardinality(String),
    {STEPS_KEEP_UNTIL},
    INDEX {STEPS_TS_INDEX}""",
    order_by="job, step, rank",
    partition_by="toYYYYMM(ts)",
    expiry=Expiry("toDateTime(ts)", "steps_days", kept_until="keep_until"),
    tiered_merges=True,
)

TARGETS = Table(
    name="targets",
    columns=f"""    ts {TS} CODEC(DoubleDelta, ZSTD(1)),
    target LowCardinality(String),
    node LowCardinality(String),
    up UInt8,
    duration_s Float64 CODEC(Gorilla, ZSTD(1)),
    samples UInt32 CODEC(T64, ZSTD(1)),
    error String CODEC(ZSTD(3))""",
    order_by="target, ts",
    partition_by="toYYYYMM(ts)",
    expiry=Expiry("toDateTime(ts)", "targets_days"),
    tiered_merges=True,
)

# the shared_fault anomaly that explains a per-node one while it does (analytics.detectors.shared_faults)
ANOMALIES_EXPLAINED_BY = "explained_by String DEFAULT ''"

ANOMALIES = Table(
    name="anomalies",
    columns=f"""    start {TS},
    end Nullable({TS}),
    kind LowCardinality(String),
    node LowCardinality(String),
    component String,
    job String,
    severity LowCardinality(String),
    score Float64,
    evidence String CODEC(ZSTD(3)),
    detector LowCardinality(String),
    detector_version LowCardinality(String),
    id String,
    {ANOMALIES_EXPLAINED_BY}""",
    engine="ReplacingMergeTree",
    order_by="node, kind, start, id",
    partition_by="toYYYYMM(start)",
)

ALERTS = Table(
    name="alerts",
    columns=f"""    ts {TS},
    fingerprint String,
    alertname LowCardinality(String),
    state LowCardinality(String),
    labels Map(String, String),
    annotations Map(String, String),
    starts_at {TS},
    ends_at Nullable({TS})""",
    order_by="alertname, fingerprint, ts",
    partition_by="toYYYYMM(ts)",
)

ACTIONS = Table(
    name="actions",
    columns=f"""    ts {TS},
    action LowCardinality(String),
    node LowCardinality(String),
    job String,
    reason String,
    mode LowCardinality(String),
    outcome LowCardinality(String),
    decision_id String""",
    order_by="node, ts",
    partition_by="toYYYYMM(ts)",
)

SILENCES = Table(
    name="silences",
    columns=f"""    id String,
    matchers String,
    starts_at {TS},
    ends_at {TS},
    created_by String,
    comment String,
    updated_at {TS}""",
    engine="ReplacingMergeTree",
    order_by="id",
    sharding_key="cityHash64(id)",  # a silence and its expiry on one shard, so FINAL sees both
)

NOTIFICATIONS = Table(
    name="notifications",
    columns=f"""    ts {TS},
    receiver LowCardinality(String),
    ok UInt8,
    attempts UInt32,
    status Nullable(UInt16),
    error String,
    fingerprints Array(String),
    states Array(LowCardinality(String))""",
    order_by="receiver, ts",
    partition_by="toYYYYMM(ts)",
)

# One row per edge of the topology as one source's reporter said it (analytics.store.topology): an edge
# still in force has valid_to NULL; when its reporter stops reporting it, the same row is written again
# with valid_to set and closed = 1, which replaces the open row on merge (read with FINAL) whatever order
# the two reached the table in. In a cluster, a reporter's rows are on one shard, so FINAL sees both.
TOPOLOGY = Table(
    name="topology",
    columns=f"""    child_kind LowCardinality(String),
    child String,
    parent_kind LowCardinality(String),
    parent String,
    source LowCardinality(String),
    reporter String,
    valid_from {TS},
    valid_to Nullable({TS}),
    closed UInt8""",
    engine="ReplacingMergeTree",
    version="closed",
    order_by="source, reporter, child_kind, child, parent_kind, parent, valid_from",
    sharding_key="cityHash64(source, reporter)",
)

# One row per job on a node as its scheduler said it (analytics.store.placements), dated like the
# topology: a placement still in force has valid_to NULL; when it ends, the same row is written again with
# valid_to set and closed = 1, which replaces the open one on merge (read with FINAL). A source's rows are
# on one shard, so FINAL sees both.
PLACEMENTS = Table(
    name="placements",
    columns=f"""    source LowCardinality(String),
    job String,
    user String,
    node String,
    gpus Array(UInt16),
    valid_from {TS},
    valid_to Nullable({TS}),
    closed UInt8""",
    engine="ReplacingMergeTree",
    version="closed",
    order_by="source, job, user, node, gpus, valid_from",
    sharding_key="cityHash64(source)",
)

# One row per active check's verdict on one target (collectors.checks, posted by `fleetlens checks run`),
# kept as long as the rollups: few rows, and a node's health history is read over months.
CHECKS = Table(
    name="checks",
    columns=f"""    node LowCardinality(String),
    check LowCardinality(String),
    target String,
    status LowCardinality(String),
    value Nullable(Float64),
    unit LowCardinality(String),
    threshold Nullable(Float64),
    evidence String CODEC(ZSTD(3)),
    started {TS},
    duration_s Float64""",
    order_by="node, check, target, started",
    partition_by="toYYYYMM(started)",
    expiry=Expiry("toDateTime(started)", "rollup_days"),
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "series, samples, 1-minute rollup, metrics and metrics_1m views",
        (SERIES, SAMPLES, SAMPLES_1M, SAMPLES_1M_MV, METRICS, METRICS_1M),
    ),
    Migration(2, "steps and targets", (STEPS, TARGETS)),
    Migration(3, "anomalies, alerts and actions", (ANOMALIES, ALERTS, ACTIONS)),
    Migration(4, "silences and notifications", (SILENCES, NOTIFICATIONS)),
    Migration(
        5, "steps.keep_until: imported history kept past steps_days", (AddColumn("steps", STEPS_KEEP_UNTIL),)
    ),
    Migration(
        6,
        "1-hour rollup, filled from the 1-minute rollup, and the metrics_1h view",
        (SAMPLES_1H, Fill(roll_up_hours), METRICS_1H),
    ),
    Migration(
        7,
        "1-minute rollup rolled up from raw samples by the store's owner, not by a view on every insert",
        (METRICS_1M, DropView(SAMPLES_1M_MV.name), Fill(trim_minutes_the_view_left_partial)),
    ),
    Migration(
        8,
        "steps: a minmax index on ts, which every window's reads of steps filter on",
        (AddIndex("steps", STEPS_TS_INDEX),),
    ),
    Migration(9, "topology: child -> parent edges by source, each with its validity", (TOPOLOGY,)),
    Migration(
        10,
        "anomalies.explained_by: the shared fault (a leaf, a host...) that explains a per-node anomaly",
        (AddColumn("anomalies", ANOMALIES_EXPLAINED_BY),),
    ),
    Migration(
        11, "placements: which job ran on which node with which GPUs, from when to when", (PLACEMENTS,)
    ),
    Migration(12, "checks: active health checks' verdicts per node, check and target", (CHECKS,)),
)
LATEST_VERSION = MIGRATIONS[-1].version
# What queries may read: every table and view, by the name readers use (not the materialized view).
READABLE = frozenset(
    item.name for migration in MIGRATIONS for item in migration.objects if isinstance(item, Table | View)
) | {SCHEMA_MIGRATIONS.name}
TABLES = tuple(item for migration in MIGRATIONS for item in migration.objects if isinstance(item, Table))
EXPIRING_TABLES = tuple(table for table in TABLES if table.expiry)
TIERED_TABLES = tuple(table for table in TABLES if table.tiered_merges)


def bootstrap(layout: Layout) -> list[str]:
    """What must exist before migrations can be read: the database and schema_migrations."""
    database = f"CREATE DATABASE IF NOT EXISTS {layout.database}{layout.on_cluster}"
    return [database, *SCHEMA_MIGRATIONS.create(layout)]


def ddl(database: str, cluster: str | None = None, retention: Retention | None = None) -> list[str]:
    """Every statement that builds the latest schema from nothing, in order."""
    layout = Layout(database, cluster, retention or Retention())
    return bootstrap(layout) + [s for migration in MIGRATIONS for s in migration.statements(layout)]


def merge_changes(layout: Layout, engines: Mapping[str, str]) -> list[str]:
    """ALTERs that switch to tiered merges the tables that merge in tiers (in `engines`: local table name ->
    system.tables.engine_full) and do not yet. Not part of a table's CREATE: a server that refuses the
    setting (one from before it, or one that allows no experimental setting: ClickHouse marks it so) must
    still open the store, with ClickHouse's default merges."""
    return [
        f"ALTER TABLE {table.target(layout)}{layout.on_cluster} MODIFY SETTING {TIERED_MERGES}"
        for table in TIERED_TABLES
        if (engine := table.created_as(layout, engines)) is not None and TIERED_MERGES not in engine
    ]


def retention_changes(layout: Layout, engines: Mapping[str, str]) -> list[str]:
    """ALTERs for the tables whose TTL (in `engines`: local table name -> system.tables.engine_full)
    differs from `layout.retention`; tables not yet created are left to their migration."""
    changes = []
    for table in EXPIRING_TABLES:
        engine, ttl = table.created_as(layout, engines), table.ttl_for(layout)
        # the whole TTL, so that toIntervalDay(1) is not taken for a prefix of toIntervalDay(15)
        if engine is not None and not re.search(rf"TTL {re.escape(ttl)}(?:\s|$)", engine):
            changes.append(f"ALTER TABLE {table.target(layout)}{layout.on_cluster} MODIFY TTL {ttl}")
    return changes

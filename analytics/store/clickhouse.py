"""The store: the only module that talks to ClickHouse, through clickhouse-connect.

    store = Store.open("chdb://./data")              # embedded chDB in ./data, database "fleetlens"
    store = Store.open("http://ch1:8123/fleet", cluster="fleet")   # a server or cluster, same SQL
    store.insert_samples(batches, token="scrape-42")  # idempotent on token
    store.insert_steps(rows, token="job-42", keep_until=time.time() + 365 * 86400)  # kept a year, any age
    store.query("SELECT node, max(value) FROM metrics WHERE metric = 'DCGM_FI_DEV_GPU_TEMP' GROUP BY node")
    store.replace_links(Source.INVENTORY, links, time.time())  # the topology as one source says it now
    store.topology_at(ts)                             # the edges in force then, source precedence applied

Opening applies the schema's migrations (analytics.store.schema) and brings the TTLs in line with `retention`.
Every insert carries its token to ClickHouse as insert_deduplication_token, so a batch replayed after a
crash or a timeout is stored once. Failures are StoreUnavailable (retry later: the hub spools) or
StoreRejected (the data itself is bad).

Inserts into the tables with a TTL (samples, targets, steps) never send a row that the TTL would drop at
once: rows older than the table's retention cutoff, computed when the insert runs, are split off and
reported in the result (analytics.store.retention.Inserted: an int, the rows sent, with `refused` and
`cutoff`), unless `insert_steps` is told to keep them (`keep_until`).

query() takes SQL from anyone (the hub's query API, the CLI, the UI's SQL box): readonly.py runs it on
read-only sessions of its own, and only what sqlpolicy.py accepts, on the parse tree ClickHouse
builds: one SELECT over the project's tables. Queries and inserts never share a session, and a long query
never holds up an insert. query_json() is the hub's API's: ClickHouse's limits on memory, reads, result
and threads too (readonly.ReadLimits), and the rows as the JSON ClickHouse writes, bounded in bytes.

A Store is thread-safe. `session()` opens another one on the same store, with sessions of its own for
writing and reading, for a consumer that should not wait for the others' statements (the hub's writer
and detection loop beside its API).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import struct
import sys
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import clickhouse_connect
import numpy as np
import numpy.typing as npt
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from analytics.errors import AddressError, SchemaError, StoreRejected, StoreUnavailable
from analytics.store import checks, placements, schema, topology
from analytics.store.clickhouse_errors import short, store_error, unreachable
from analytics.store.ledger import (
    Admitted,
    Ledgers,
    RecordLedger,
    RecordLookup,
    SampleRows,
    StepRows,
    TargetRows,
)
from analytics.store.protocols import FrameResult, NumbersResult
from analytics.store.readonly import Connect, JsonRows, ReadLimits, ReadSessions
from analytics.store.records import (
    STEP_COLUMNS,
    ActionRow,
    AlertChange,
    Anomaly,
    CheckRow,
    NotificationRow,
    Placement,
    QueryResult,
    ScrapeBatch,
    SilenceRow,
    TargetStatus,
)
from analytics.store.redact import redacted
from analytics.store.retention import Cutoff, Inserted
from analytics.store.schema import Layout, Retention
from analytics.store.topology import Changes
from analytics.topology.model import Edge, Link, Source

__all__ = ["DEFAULT_DATABASE", "DEFAULT_DSN", "Retention", "Store", "series_id"]

log = logging.getLogger("fleetlens.store")

DEFAULT_DSN = "chdb://./data"
DEFAULT_DATABASE = "fleetlens"
MAX_KNOWN_SERIES = 2_000_000  # past this the known-series memo starts over (see KnownSeries)
MAX_KEYS = 1 << 16  # past this many metric or node names the samples blocks' dictionaries start over
ROLL_UP_MINUTES_AT_ONCE = 60  # minutes one roll_up_minutes call rolls at most: a lagging roll-up catches up

SERIES_COLUMNS = ("series_id", "metric", "node", "labels", "first_seen")
KEEP_UNTIL_MAX_S = (1 << 32) - 1  # the latest time the steps.keep_until DateTime column holds (2106)
# Samples as sent: one block of ClickHouse's Native format per insert, encoded here rather than by
# clickhouse-connect (a Python loop per value). Metric and node go as the table's LowCardinality(String),
# a dictionary and an index per row (LowCardinalityKeys), so that ClickHouse need not look each row's
# string up in a dictionary of its own on arrival, as it did for plain String (bench/rollup.py).
SAMPLE_COLUMNS = {
    "metric": "LowCardinality(String)",
    "node": "LowCardinality(String)",
    "series_id": "UInt64",
    "ts": "DateTime64(3, 'UTC')",
    "value": "Float64",
}


def series_id(metric: str, node: str, labels: Mapping[str, str]) -> int:
    """The UInt64 identity of a series: 8 bytes of BLAKE2b over metric, node and the sorted labels.

    Stable across processes and hubs (unlike hash()), so every hub of a sharded fleet agrees."""
    canonical = json.dumps([metric, node, sorted(labels.items())], ensure_ascii=False, separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(canonical.encode(), digest_size=8).digest(), "big")


SeriesRow = tuple[int, str, str, Mapping[str, str], int]  # series_id, metric, node, labels, first_seen (ms)


class LowCardinalityKeys:
    """The dictionary of a LowCardinality(String) column of the samples blocks: every value met since it
    (re)started, numbered in the order met. A row is sent as its value's number (UInt32), and each block
    carries the whole dictionary, whose encoding grows as values are added rather than being built per
    block. The metric and node names of a fleet are few (hundreds), so the dictionary is small beside
    a block's rows; past MAX_KEYS (names that churn) its owner starts it over."""

    def __init__(self) -> None:
        self._numbers: dict[str, int] = {}
        self._encoded = bytearray()

    def __len__(self) -> int:
        return len(self._numbers)

    def numbers(self, values: Iterable[str]) -> array:
        """The number of each value, adding those not met yet."""
        numbers = array("I")
        known = self._numbers
        for value in values:
            number = known.get(value)
            if number is None:
                number = known[value] = len(known)
                self._encoded += _native_string(value)
            numbers.append(number)
        return numbers

    def column(self, rows: bytes) -> bytes:
        """A Native LowCardinality(String) column of `rows` (the UInt32 numbers, little-endian): the
        serialization version, the index type (UInt32, with a dictionary of its own that the block
        brings along), the dictionary's values, then the row count and the rows."""
        head = _UINT64S.pack(
            LC_KEYS_VERSION, LC_UINT32_INDEXES | LC_ADDITIONAL_KEYS | LC_UPDATE_DICTIONARY, len(self._numbers)
        )
        return b"".join((head, self._encoded, _UINT64.pack(len(rows) // 4), rows))


@dataclass(frozen=True, slots=True)
class SeriesColumns:
    """A batch's series as the metric, node and series_id columns of a Native samples block, the metric
    and node as numbers in the KnownSeries' dictionaries.

    A target sends the same series scrape after scrape, so these bytes are encoded once per target and
    reused: per scrape only the ts and value columns are new."""

    ids: list[int]
    metric: bytes
    node: bytes
    series_id: bytes

    @classmethod
    def encode(
        cls,
        node: str,
        names: Sequence[str],
        ids: list[int],
        metrics: LowCardinalityKeys,
        nodes: LowCardinalityKeys,
    ) -> SeriesColumns:
        return cls(
            ids, _le(metrics.numbers(names)), _le(nodes.numbers((node,))) * len(ids), _le(array("Q", ids))
        )


class KnownSeries:
    """The series whose row this process has stored, so each is inserted once, and each target's last
    batch with its series columns.

    An exporter serves the same series in the same order scrape after scrape, so a batch whose node,
    names and labels equal its target's previous batch (in this call or an earlier one) reuses its ids and
    their encoded columns: one list comparison (of the parser's shared objects) instead of a lookup per
    sample. Any other batch (a piece of a scrape that remote write's queue shards split) looks its series
    up one by one, first by the identity of its labels dict (the parsers and the remote write receiver
    share one per series), which costs a dict lookup, not a tuple of the labels built and hashed. Past
    `limit` series (label churn) the memo starts over; registering a series again is harmless
    (the series table merges duplicates). `metrics` and `nodes` are the dictionaries that the batches'
    columns number their names in; past `max_keys` names in either, both start over, and with them the
    batches that hold numbers in them, at the start of the next resolve().
    """

    def __init__(self, limit: int = MAX_KNOWN_SERIES, max_keys: int = MAX_KEYS) -> None:
        self._limit = limit
        self._max_keys = max_keys
        self._ids: dict[tuple[str, str, tuple[tuple[str, str], ...]], int] = {}
        # id(labels) -> (metric, node, series id, labels): holding the dict keeps its id its own
        self._objects: dict[int, tuple[str, str, int, Mapping[str, str]]] = {}
        self._last: dict[str, tuple[ScrapeBatch, SeriesColumns]] = {}
        self.metrics = LowCardinalityKeys()
        self.nodes = LowCardinalityKeys()

    def resolve(self, batches: Sequence[ScrapeBatch]) -> tuple[list[SeriesColumns], list[SeriesRow]]:
        """The series columns of every batch, and the rows of the series not stored yet. The columns
        number the names in `metrics` and `nodes` as they are until the next call."""
        if max(len(self.metrics), len(self.nodes)) > self._max_keys:
            self.metrics, self.nodes = LowCardinalityKeys(), LowCardinalityKeys()
            self._last.clear()
        columns = []
        new: dict[int, SeriesRow] = {}
        latest = dict(self._last)  # a call may hold several scrapes of one target (a spool replay, a sim)
        for batch in batches:
            last = latest.get(batch.target)
            if last and (last[0].node, last[0].names, last[0].labels) == (
                batch.node,
                batch.names,
                batch.labels,
            ):
                columns.append(last[1])
                continue
            ids = self._ids_of(batch, new)
            columns.append(SeriesColumns.encode(batch.node, batch.names, ids, self.metrics, self.nodes))
            latest[batch.target] = (batch, columns[-1])
        return columns, list(new.values())

    def _ids_of(self, batch: ScrapeBatch, new: dict[int, SeriesRow]) -> list[int]:
        """The series id of each sample of `batch`, each series looked up by its labels dict's identity,
        else by its labels; a series not stored yet is added to `new`."""
        node, objects, ids = batch.node, self._objects, []
        for metric, labels in zip(batch.names, batch.labels, strict=True):
            known = objects.get(id(labels))
            if known is not None and known[0] == metric and known[1] == node:
                ids.append(known[2])
                continue
            sid = self._ids.get((node, metric, tuple(labels.items())))
            if sid is None:
                sid = series_id(metric, node, labels)
                new.setdefault(sid, (sid, metric, node, labels, _millis(batch.ts)))
            else:  # stored, but met as another dict (a spool replay) or under another metric or node
                objects[id(labels)] = (metric, node, sid, labels)
            ids.append(sid)
        return ids

    def remember(
        self, batches: Sequence[ScrapeBatch], columns: list[SeriesColumns], stored: list[SeriesRow]
    ) -> None:
        """Note that the `stored` series rows are in the store, and each batch as its target's last."""
        if len(self._ids) + len(stored) > self._limit:
            self._ids.clear()
            self._last.clear()
        if len(self._objects) > 2 * len(self._ids):  # labels met as ever new dicts (spool replays) or none
            self._objects.clear()
        for sid, metric, node, labels, _first_seen in stored:
            self._ids[(node, metric, tuple(labels.items()))] = sid
            self._objects[id(labels)] = (metric, node, sid, labels)
        for batch, encoded in zip(batches, columns, strict=True):
            self._last[batch.target] = (batch, encoded)


class Store:
    """A ClickHouse database holding fleetlens's schema; build it with Store.open()."""

    def __init__(self, client: Client, layout: Layout, connect: Connect) -> None:
        self._client = client  # this session's writes; its queries run on read sessions of its own
        self._layout = layout
        self._connect = connect
        self._reads = ReadSessions(connect, layout.database, schema.READABLE)
        self._sessions: list[Store] | None = []  # opened by session(); None for a session itself
        self._series = KnownSeries()
        self._ledgers = Ledgers()  # a session shares its opener's (session())
        self._sample_rows = SampleRows(self._lookup, layout.name("samples"))
        self._step_rows = StepRows(self._lookup, layout.name("steps"))
        self._target_rows = TargetRows(self._lookup, layout.name("targets"))
        self._lock = threading.Lock()  # one insert at a time on this session, and KnownSeries with it
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
        connector, dsn_database = _connector(dsn)
        client = _open_session(connector, dsn, {})
        try:
            layout = Layout(database or dsn_database or DEFAULT_DATABASE, cluster, retention or Retention())
            _migrate(client, layout)
            client.database = layout.database
        except ClickHouseError as error:
            client.close()
            failure = StoreUnavailable if unreachable(error) else SchemaError
            raise failure(f"opening {redacted(dsn)}: {short(error)}") from error
        except BaseException:
            client.close()
            raise

        def connect(settings: Mapping[str, Any]) -> Client:
            return connector({**settings}, layout.database)

        return cls(client, layout, connect)

    @property
    def database(self) -> str:
        """The database holding the schema, which queries read."""
        return self._layout.database

    @property
    def retention(self) -> Retention:
        """How long each kind of row is kept; inserts refuse rows already past it."""
        return self._layout.retention

    def cutoff(self, table: str, now: float | None = None) -> Cutoff:
        """The retention cutoff of `table` (samples, targets or steps) at `now`, by default this moment."""
        return Cutoff.of(self._layout.retention, table, time.time() if now is None else now)

    def session(self) -> Store:
        """Another session on this store, for a consumer that should wait for no other's statements: its
        inserts and its queries (on read sessions of its own) share nothing with this store's. It is
        closed with this store. StoreUnavailable when it cannot be opened."""
        if self._sessions is None:
            raise TypeError("open sessions from the Store that Store.open() returned")
        try:
            client = self._connect({})
        except ClickHouseError as error:
            raise StoreUnavailable(f"opening a session: {short(error)}") from error
        sibling = Store(client, self._layout, self._connect)
        sibling._sessions = None
        sibling._ledgers = self._ledgers
        with self._lock:
            self._sessions.append(sibling)
        return sibling

    def insert_samples(self, batches: Sequence[ScrapeBatch], *, token: str) -> Inserted:
        """Store every sample of `batches` not stored yet (and the series rows of series new to this
        process); returns the number of samples sent, and those refused: batches older than the samples
        cutoff, samples whose (series, ts) the store holds or an earlier one of `batches` has (Inserted:
        duplicates with the same value, conflicts with another; analytics.store.ledger). The series and
        the samples inserts each carry a token derived from `token`."""
        cutoff = self.cutoff("samples")
        batches, old = cutoff.split(batches, _ts)
        refused = sum(len(batch) for batch in old)
        ledger = self._ledgers.samples
        with ledger.lock, self._lock:
            series, new_series = self._series.resolve(batches)
            if new_series:
                self._insert("series", SERIES_COLUMNS, new_series, f"{token}/series")
            self._series.remember(batches, series, new_series)
            with self._failures("samples"):
                admitted = ledger.admit(batches, [columns.ids for columns in series], self._sample_rows)
            batches, series = self._kept_samples(batches, series, admitted.keep)
            rows = sum(len(batch) for batch in batches)
            dropped = {"duplicates": admitted.duplicates, "conflicts": admitted.conflicts}
            if not rows:
                return Inserted(0, refused, cutoff, **dropped)
            self._insert_native(
                "samples",
                lambda: _samples_block(batches, series, rows, self._series.metrics, self._series.nodes),
                f"{token}/samples",
            )
            return Inserted(rows, refused, cutoff, **dropped)

    def _kept_samples(
        self, batches: Sequence[ScrapeBatch], series: list[SeriesColumns], keep: Sequence[np.ndarray | None]
    ) -> tuple[list[ScrapeBatch], list[SeriesColumns]]:
        """`batches` and their series columns with only the samples `keep` marks (None: all of them)."""
        if all(mask is None for mask in keep):
            return list(batches), series
        kept_batches, kept_series = [], []
        for batch, columns, mask in zip(batches, series, keep, strict=True):
            if mask is not None:
                positions = np.flatnonzero(mask).tolist()
                if not positions:
                    continue
                names = [batch.names[i] for i in positions]
                batch = ScrapeBatch(
                    batch.target,
                    batch.node,
                    batch.ts,
                    names,
                    [batch.labels[i] for i in positions],
                    [batch.values[i] for i in positions],
                )
                ids = [columns.ids[i] for i in positions]
                known = self._series
                columns = SeriesColumns.encode(batch.node, names, ids, known.metrics, known.nodes)
            kept_batches.append(batch)
            kept_series.append(columns)
        return kept_batches, kept_series

    def insert_targets(self, statuses: Sequence[TargetStatus], *, token: str) -> Inserted:
        """Store one row per scrape outcome, but those whose (target, node, ts) is stored or earlier in
        `statuses` (analytics.store.ledger); returns the number of rows sent, and those refused as older
        than the targets cutoff or already stored (Inserted)."""
        cutoff = self.cutoff("targets")
        statuses, old = cutoff.split(statuses, _ts)
        admitted = self._insert_new_records(
            "targets", _columns(TargetStatus), statuses, token, self._ledgers.targets, self._target_rows
        )
        return _inserted(admitted, len(old), cutoff)

    def insert_steps(self, rows: Sequence[Any], *, token: str, keep_until: float | None = None) -> Inserted:
        """Store training step rows, but those whose (job, rank, step) is stored or earlier in `rows`
        (analytics.store.ledger: the first one stays, a different duration_s is a conflict); returns the
        number of rows sent, and those refused as older than the steps cutoff or already stored
        (Inserted).

        `keep_until` (unix seconds) keeps every row until then whatever its age, so that none is refused:
        imported history (analytics.store.retention.keep_until). One that has passed keeps nothing (a
        kept batch that waited in a spool that long): the rows are then split by the cutoff as any."""
        now = time.time()
        ledger, lookup = self._ledgers.steps, self._step_rows
        if keep_until is not None and _keep_until_seconds(keep_until) > now:
            kept = {"keep_until": _keep_until_seconds(keep_until)}
            return _inserted(
                self._insert_new_records("steps", STEP_COLUMNS, rows, token, ledger, lookup, constants=kept)
            )
        cutoff = self.cutoff("steps", now)
        rows, old = cutoff.split(rows, _ts)
        admitted = self._insert_new_records("steps", STEP_COLUMNS, rows, token, ledger, lookup)
        return _inserted(admitted, len(old), cutoff)

    def stored_scrapes(self, statuses: Sequence[TargetStatus]) -> set[tuple[str, int]]:
        """The (node, ts in ms) of those of `statuses` whose scrape has samples stored: what a hub that
        died between a round's samples and its scrape rows asks when it starts again (hub.rounds).
        StoreUnavailable when the store cannot say."""
        with self._lock, self._failures("samples"):
            return self._sample_rows.stored_scrapes({(s.node, _millis(s.ts)) for s in statuses})

    def insert_anomalies(self, rows: Sequence[Anomaly], *, token: str) -> int:
        """Store anomaly rows, their evidence as the text analytics.evidence.to_json wrote
        (analytics.detectors.runner.store_anomalies); an anomaly written again under its id (when it ends)
        replaces the earlier row on merge (read with FINAL). Returns the number of rows sent."""
        return self._insert_records(
            "anomalies", _columns(Anomaly), rows, token, times=("start", "end"), nullable_times=("end",)
        )

    def insert_alert_changes(self, rows: Sequence[AlertChange], *, token: str) -> int:
        """Store alert state changes; returns the number of rows sent."""
        return self._insert_records(
            "alerts",
            _columns(AlertChange),
            rows,
            token,
            times=("ts", "starts_at", "ends_at"),
            nullable_times=("ends_at",),
        )

    def insert_actions(self, rows: Sequence[ActionRow], *, token: str) -> int:
        """Store drain controller decisions; returns the number of rows sent."""
        return self._insert_records("actions", _columns(ActionRow), rows, token)

    def insert_silences(self, rows: Sequence[SilenceRow], *, token: str) -> int:
        """Store silences (a row under an existing id replaces it, read with FINAL)."""
        return self._insert_records(
            "silences", _columns(SilenceRow), rows, token, times=("starts_at", "ends_at", "updated_at")
        )

    def insert_notifications(self, rows: Sequence[NotificationRow], *, token: str) -> int:
        """Store delivery outcomes; returns the number of rows sent."""
        return self._insert_records("notifications", _columns(NotificationRow), rows, token)

    def insert_checks(self, rows: Sequence[CheckRow]) -> int:
        """Store active checks' verdicts (analytics.store.checks); the same rows sent again are stored once.
        Returns the number of rows sent."""
        return self._insert_records(
            "checks", checks.COLUMNS, rows, checks.insert_token(rows), times=("started",)
        )

    def checks_between(self, since: float, until: float, *, node: str | None = None) -> list[CheckRow]:
        """The checks started in [since, until), of `node` where given, earliest first."""
        return checks.checks_between(self, since, until, node=node)

    def replace_links(
        self,
        source: Source,
        links: Iterable[Link],
        now: float,
        *,
        reporter: str = "",
        unsaid: Callable[[Link], bool] | None = None,
    ) -> Changes:
        """Make `reporter` of `source` (its inventory file, one host's agent, an imported file) say exactly
        `links` from `now` on: its edges no longer said end at `now` unless `unsaid` accepts them (what
        this report does not speak for: importers.imported), new links start there, the rest stay
        (analytics.store.topology). Saying the same again writes nothing. StoreRejected when `now` is
        before its last change; StoreUnavailable."""
        with self._lock, self._failures("topology"):
            held = self._client.query(
                topology.open_edges(self._layout.name("topology")),
                parameters={"source": str(source), "reporter": reporter},
            ).result_rows
            plan = topology.replacement(source, reporter, links, held, now, unsaid)
            if plan.columns:
                self._insert("topology", topology.COLUMNS, plan.columns, plan.token, column_oriented=True)
        return plan.changes

    def replace_placements(self, source: Source, said: Iterable[Placement], now: float) -> Changes:
        """Make `source` (a scheduler) say exactly `said` from `now` on: its placements no longer said end
        at `now`, those said to have ended end at their own `until`, new ones start at their own `since`,
        the rest stay (analytics.store.placements). Saying the same again writes nothing. StoreRejected
        when `now` is before its last change or a placement is of another source; StoreUnavailable."""
        said = list(said)
        ended = sorted({placement.job for placement in said if placement.until is not None})
        with self._lock, self._failures("placements"):
            held = self._client.query(
                placements.held(self._layout.name("placements")),
                parameters={"source": str(source), "jobs": ended},
            ).result_rows
            plan = placements.replacement(source, said, held, now)
            if plan.columns:
                self._insert("placements", placements.COLUMNS, plan.columns, plan.token, column_oriented=True)
        return plan.changes

    def placements_between(
        self, since: float, until: float, *, node: str | None = None, job: str | None = None
    ) -> list[Placement]:
        """The placements in force at some time in [since, until), of `node` and/or `job` where given
        (analytics.store.placements)."""
        return placements.placements_between(self, since, until, node=node, job=job)

    def topology_at(self, ts: float) -> list[Edge]:
        """The topology's edges in force at `ts`, source precedence applied (analytics.store.topology)."""
        return topology.topology_at(self, ts)

    def roll_up_minutes(self, most: int = ROLL_UP_MINUTES_AT_ONCE) -> int:
        """Roll the raw samples of the whole minutes that ended ROLL_UP_MINUTES_AFTER_S ago into the
        1-minute rollup, up to `most` minutes (the earliest); returns how many were rolled. Readers read
        raw samples for the minutes not rolled yet (schema.minute_rows). One insert per minute, its token
        naming the minute: hubs sharing a store may run it at once, and the second insert of a minute is
        dropped. Minutes without samples are skipped, not rolled one by one."""
        samples, minutes = self._layout.name("samples"), self._layout.name("samples_1m")
        with self._failures("samples_1m"):
            found = self._client.query(
                f"SELECT DISTINCT toUnixTimestamp(toStartOfMinute(ts)) AS minute FROM {samples}"
                f" WHERE ts >= {schema.rolled_minutes(minutes)} AND ts < {schema.MINUTES_DUE}"
                f" ORDER BY minute LIMIT {int(most)}"
            ).result_rows
            for (minute,) in found:
                self._client.command(
                    schema.roll_up_minutes(
                        self._layout, f"toDateTime({minute})", f"toDateTime({minute + 60})"
                    ),
                    settings=self._settings(f"roll-up-minute-{minute}"),
                )
        return len(found)

    def roll_up_hours(self) -> None:
        """Roll the whole hours that ended a while ago, and whose samples are rolled into minutes, into
        the hourly rollup (schema.roll_up_hours), so that week-long reads stay cheap; the store's writer
        calls it now and then, after roll_up_minutes. Hubs sharing a store may run it at once: the
        insert's token names the hours it rolls, so the second is dropped."""
        hourly = self._layout.name("samples_1h")
        with self._failures("samples_1h"):
            since, until = self._client.query(
                f"SELECT toUnixTimestamp(max(hour)) + 3600, toUnixTimestamp(toStartOfHour("
                f"now() - toIntervalSecond({schema.ROLL_UP_AFTER_S}))) FROM {hourly}"
            ).result_rows[0]
            if since < until:  # once an hour: only then the raw samples are read for those not rolled
                pending = self._client.query(
                    f"SELECT toUnixTimestamp(toStartOfHour({schema.minutes_pending(self._layout)}))"
                ).result_rows[0][0]
                until = until if pending is None else min(until, pending)
            if since < until:
                self._client.command(
                    schema.roll_up_hours(self._layout, f"toDateTime({since})", f"toDateTime({until})"),
                    settings=self._settings(f"roll-up-hours-{since}-{until}"),
                )

    def query(
        self,
        sql: str,
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = 10_000,
        max_seconds: float = 10.0,
    ) -> QueryResult:
        """Run one read-only statement on a read session: one SELECT over the project's tables (see
        analytics.store.sqlpolicy); at most `max_rows` rows come back (`truncated` says when more matched) and
        ClickHouse stops it after `max_seconds`. QueryError says why it was refused; StoreUnavailable."""
        return self._reads.query(sql, parameters=parameters, max_rows=max_rows, max_seconds=max_seconds)

    def query_frame(
        self,
        sql: str,
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = 10_000,
        max_seconds: float = 10.0,
    ) -> FrameResult:
        """query(), checked and limited alike, its result as columns: for reads of many rows."""
        return self._reads.query_frame(sql, parameters=parameters, max_rows=max_rows, max_seconds=max_seconds)

    def query_numbers(
        self,
        sql: str,
        columns: Mapping[str, npt.DTypeLike],
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = 10_000,
        max_seconds: float = 10.0,
    ) -> NumbersResult:
        """query(), checked and limited alike, its numeric `columns` as numpy arrays: for reads of many
        numbers (ReadSessions.query_numbers)."""
        return self._reads.query_numbers(
            sql, columns, parameters=parameters, max_rows=max_rows, max_seconds=max_seconds
        )

    def query_json(
        self,
        sql: str,
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = 10_000,
        max_seconds: float = 10.0,
        limits: ReadLimits,
    ) -> JsonRows:
        """query() for SQL from outside (the hub's query API): run under `limits` as well, its rows the
        JSON ClickHouse writes, bounded in bytes as it arrives (ReadSessions.query_json)."""
        return self._reads.query_json(
            sql, parameters=parameters, max_rows=max_rows, max_seconds=max_seconds, limits=limits
        )

    def close(self) -> None:
        """Release the session and its read sessions; the store Store.open() returned closes the sessions
        it opened too (for chDB that ends the engine, so that another directory can be opened)."""
        for session in self._sessions or ():
            session.close()
        self._reads.close()
        with self._lock:
            self._client.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _insert_records(
        self,
        table: str,
        names: Sequence[str],
        records: Sequence[Any],
        token: str,
        times: Sequence[str] = ("ts",),
        nullable_times: Sequence[str] = (),
        constants: Mapping[str, Any] | None = None,
    ) -> int:
        """Insert records that have the table's column `names` as attributes, and the `constants` columns
        with one value for every row; the `times` columns (unix seconds) go in as milliseconds, and None
        in a `nullable_times` column as NULL."""
        if not records:
            return 0
        columns = _record_columns(table, names, records, times, nullable_times, constants)
        with self._lock:
            self._insert(table, list(columns), list(columns.values()), token, column_oriented=True)
        return len(records)

    def _insert_new_records(
        self,
        table: str,
        names: Sequence[str],
        records: Sequence[Any],
        token: str,
        ledger: RecordLedger,
        lookup: RecordLookup,
        constants: Mapping[str, Any] | None = None,
    ) -> Admitted:
        """_insert_records of the `records` that `ledger` admits (those not stored yet), under its lock."""
        with ledger.lock, self._lock:
            with self._failures(table):
                admitted = ledger.admit(records, lookup)
            if admitted.rows:
                columns = _record_columns(table, names, admitted.rows, ("ts",), (), constants)
                self._insert(table, list(columns), list(columns.values()), token, column_oriented=True)
        return admitted

    def _lookup(self, sql: str, parameters: Mapping[str, Any]) -> Sequence[tuple]:
        """A ledger's lookup on this session (whose lock the caller holds); its failures StoreErrors."""
        with self._failures("the ledger's lookup"):
            return self._client.query(sql, parameters=parameters).result_rows

    def _insert(
        self,
        table: str,
        columns: Sequence[str] | Mapping[str, str],
        data: Sequence,
        token: str,
        column_oriented: bool = False,
    ) -> None:
        """Insert `data` into `columns` (names, or names -> wire types); `token` makes a replay a no-op."""
        types = list(columns.values()) if isinstance(columns, Mapping) else None
        with self._failures(table):
            self._client.insert(
                table,
                data,
                column_names=list(columns),
                column_type_names=types,
                settings=self._settings(token),
                column_oriented=column_oriented,
            )

    def _insert_native(self, table: str, block: Callable[[], bytes], token: str) -> None:
        """Insert the Native block that `block()` encodes (names and types inside it) into `table`."""
        with self._failures(table):
            self._client.raw_insert(table, insert_block=block(), settings=self._settings(token), fmt="Native")

    def _settings(self, token: str) -> dict[str, Any]:
        return {"insert_deduplication_token": token, **self._insert_settings}

    @contextlib.contextmanager
    def _failures(self, table: str) -> Iterator[None]:
        """Rows that cannot be encoded for `table`'s columns become StoreRejected; the store's own
        failures StoreUnavailable or StoreRejected (analytics.store.clickhouse_errors)."""
        try:
            yield
        except (TypeError, ValueError, OverflowError, struct.error) as error:
            raise StoreRejected(f"{table}: rows do not fit the table's column types: {error}") from error
        except ClickHouseError as error:
            raise store_error(f"insert into {table}", error) from error


def _record_columns(
    table: str,
    names: Sequence[str],
    records: Sequence[Any],
    times: Sequence[str],
    nullable_times: Sequence[str],
    constants: Mapping[str, Any] | None,
) -> dict[str, list]:
    """The columns of `records` (see Store._insert_records); StoreRejected naming a bad time."""
    columns = {name: [getattr(r, name) for r in records] for name in names}
    columns.update({name: [value] * len(records) for name, value in (constants or {}).items()})
    for name in times:
        try:
            columns[name] = [
                None if ts is None and name in nullable_times else _millis(ts) for ts in columns[name]
            ]
        except (TypeError, ValueError, OverflowError) as error:
            raise StoreRejected(f"{table}: a row has a bad {name}: {error}") from error
    return columns


def _inserted(admitted: Admitted, refused: int = 0, cutoff: Cutoff | None = None) -> Inserted:
    """What an insert of `admitted` rows did, with `refused` rows older than `cutoff`."""
    return Inserted(
        len(admitted.rows), refused, cutoff, duplicates=admitted.duplicates, conflicts=admitted.conflicts
    )


def _ts(row: Any) -> float:
    """A row's time, which the retention cutoffs compare: every row with a TTL has it as `ts`."""
    return row.ts


def _keep_until_seconds(keep_until: float) -> int:
    """`keep_until` as the whole seconds steps.keep_until holds; StoreRejected when it is no such time."""
    number = isinstance(keep_until, int | float) and not isinstance(keep_until, bool)
    if not number or not 0 <= keep_until <= KEEP_UNTIL_MAX_S:
        raise StoreRejected(
            f"steps: keep_until must be unix seconds from 0 to {KEEP_UNTIL_MAX_S} (2106), got {keep_until!r}"
        )
    return math.ceil(keep_until)


def _columns(record: type) -> tuple[str, ...]:
    """The columns of a table whose rows are `record` dataclasses: its fields."""
    return tuple(field.name for field in fields(record))


def _samples_block(
    batches: Sequence[ScrapeBatch],
    series: Sequence[SeriesColumns],
    rows: int,
    metrics: LowCardinalityKeys,
    nodes: LowCardinalityKeys,
) -> bytes:
    """The samples of `batches` as one Native block of SAMPLE_COLUMNS: the series columns as encoded
    (metric and node numbered in `metrics` and `nodes`), each batch's time repeated, the values as one
    array."""
    values = array("d")
    for batch in batches:
        values.extend(batch.values)  # TypeError for a value that is no number
    columns = {
        "metric": metrics.column(b"".join(s.metric for s in series)),
        "node": nodes.column(b"".join(s.node for s in series)),
        "series_id": b"".join(s.series_id for s in series),
        "ts": b"".join(_INT64.pack(_millis(batch.ts)) * len(batch) for batch in batches),
        "value": _le(values),
    }
    parts = [_varint(len(columns)), _varint(rows)]
    for name, data in columns.items():
        parts += (_native_string(name), _native_string(SAMPLE_COLUMNS[name]), data)
    return b"".join(parts)


_INT64 = struct.Struct("<q")
_UINT64 = struct.Struct("<Q")
_UINT64S = struct.Struct("<3Q")
# A LowCardinality column in Native: its serialization version (shared dictionaries with additional keys),
# then per block a UInt64 of the index type (UInt32: 2) and flags: the block brings its dictionary along
# (additional keys) and it replaces any earlier one (update dictionary), as clickhouse-connect writes it.
LC_KEYS_VERSION = 1
LC_UINT32_INDEXES = 2
LC_ADDITIONAL_KEYS = 1 << 9
LC_UPDATE_DICTIONARY = 1 << 10


def _varint(number: int) -> bytes:
    """LEB128, as Native lengths and counts are written."""
    out = bytearray()
    while number >= 0x80:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _native_string(text: str) -> bytes:
    """A String value as Native writes it: its UTF-8 length, then the bytes."""
    data = text.encode()
    return _varint(len(data)) + data


def _le(numbers: array) -> bytes:
    """A numeric array's bytes little-endian, as Native wants them whatever this machine's order."""
    if sys.byteorder == "big":
        numbers.byteswap()
    return numbers.tobytes()


def _millis(ts: float) -> int:
    """Unix seconds as the integer milliseconds that DateTime64(3) columns take."""
    return round(ts * 1000)


# (settings, database) -> a new session on the store
Connector = Callable[[Mapping[str, Any], str | None], Client]


def _connector(dsn: str) -> tuple[Connector, str | None]:
    """How to open sessions on the store `dsn` names, and the database it names (None when it names none);
    AddressError for a DSN that is not understood."""
    try:
        parts = urlsplit(dsn)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError as error:
        raise AddressError(f"DSN {redacted(dsn)!r}: {error}") from None
    if dsn.startswith("chdb://"):
        location = dsn.removeprefix("chdb://")
        if not location:
            raise AddressError(f"DSN {dsn!r}: expected chdb://<directory>, e.g. chdb://./data")
        try:
            Path(location).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StoreUnavailable(f"cannot create the chDB directory for {dsn}: {error.strerror}") from error

        def embedded(settings: Mapping[str, Any], database: str | None) -> Client:
            return clickhouse_connect.get_client(
                interface="chdb", path=location, database=database, settings=dict(settings)
            )

        return embedded, None
    if parts.scheme in ("http", "https") and parts.hostname:
        server = urlunsplit((parts.scheme, parts.netloc, "", parts.query, ""))

        def remote(settings: Mapping[str, Any], database: str | None) -> Client:
            return clickhouse_connect.get_client(dsn=server, database=database or "", settings=dict(settings))

        return remote, parts.path.strip("/") or None
    raise AddressError(
        f"DSN {redacted(dsn)!r}: expected chdb://<directory> or http(s)://host:8123/<database>"
    )


def _open_session(connector: Connector, dsn: str, settings: Mapping[str, Any]) -> Client:
    try:
        return connector(settings, None)
    except ClickHouseError as error:
        raise StoreUnavailable(f"cannot reach the store at {redacted(dsn)}: {short(error)}") from error
    except ValueError as error:  # clickhouse-connect's own reading of the DSN
        raise AddressError(f"DSN {redacted(dsn)!r}: {error}") from error


def _migrate(client: Client, layout: Layout) -> None:
    """Apply the migrations `layout.database` lacks, in order, recording each; then align the TTLs and
    set tiered merges where a table lacks them."""
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
    engines = dict(
        client.query(
            "SELECT name, engine_full FROM system.tables WHERE database = {db:String}",
            parameters={"db": layout.database},
        ).result_rows
    )
    _run(client, schema.retention_changes(layout, engines), "apply the retention")
    _tier_merges(client, schema.merge_changes(layout, engines))


def _tier_merges(client: Client, statements: Sequence[str]) -> None:
    """Switch the tables that merge in tiers to them (schema's module doc, "Merges"); a store that refuses
    the setting opens all the same, with ClickHouse's default merges, and the log says so once."""
    try:
        _run(client, statements, "tiered merges")
    except SchemaError as refused:
        log.warning(
            "the store keeps ClickHouse's default merges, which cost the hub more CPU per sample: %s", refused
        )


def _run(client: Client, statements: Sequence[str], what: str) -> None:
    """Run DDL statements in order; a failing one becomes a SchemaError naming it and `what` it was for."""
    for statement in statements:
        try:
            client.command(statement)
        except ClickHouseError as error:
            if unreachable(error):
                raise
            raise SchemaError(f"{what} failed at {statement.splitlines()[0]!r}: {short(error)}") from error

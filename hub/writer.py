"""The hub's one path to the store: straight in while the store takes batches, through the spool while not.

    writer = Writer(store, Spool("/var/lib/fleetlens/spool", max_bytes=1 << 30))
    writer.write("steps", rows)           # from the receivers; never raises a StoreError
    writer.write_round(batches, statuses) # scraped samples and their scrape rows, together or not at all
    registry.register(writer)             # its metrics and the spool's, on the hub's /metrics
    writer.close()                        # stops replaying, tries once more; what is left stays on disk

Each record type has its store insert (STORE_INSERTS); rows of another type raise UnknownRecordType.
Each write gets a fresh uuid4 token that travels with its batch into the spool, so the store drops a
batch it already took (a crash between an insert and the deletion of its spool file).

Failure policy. StoreUnavailable spools the batch, and a background thread replays the spool, waiting
longer after each failed try (Backoff). StoreRejected sets the batch aside in the spool's rejected/,
never retried. While anything is spooled, new writes are spooled behind it, so the batches of one
writing thread reach the store in order. A round's target statuses go into the same spool file as its
samples (write_round), so the replay stores both or neither. The first failure after a good insert logs
that the store refuses writes and why, the first good insert after failures that it takes them again
(one line per change of state); `health()` says why while it lasts, for the hub's /healthz.

Nothing is lost in silence: rows the store keeps once (analytics.store.ledger) and drops again are
counted in fleetlens_hub_refused_rows{kind, reason="duplicate"} (the same value: a retry, a replay) or
{reason="conflict"} (another value, as Prometheus's duplicate sample for timestamp); rows older than
their table's retention, refused by the store or at the hub's doors, under reason="retention"
(`refused()`), the first of each kind logged with the cutoff. Step batches kept past the retention
(`keep_until`, imported history) carry it into the spool and back out to the store.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from analytics.errors import StoreError, StoreRejected, StoreUnavailable
from analytics.store.protocols import IngestWriter
from analytics.store.records import ScrapeBatch, TargetStatus
from collectors.steprecord import StepRecord
from hub.errors import UnknownRecordType
from hub.spool import ROW_TYPES, Kind, Row, Spool

log = logging.getLogger("fleetlens.hub.writer")

DUPLICATE, CONFLICT = "duplicate", "conflict"
REFUSED_REASONS = ("retention", DUPLICATE, CONFLICT)  # of fleetlens_hub_refused_rows
CONFLICT_WHAT = {  # what differed, by kind
    "samples": "a sample at a timestamp its series has",
    "steps": "a step's duration_s",
    "targets": "a scrape's up",
}
# The store's insert for each record type, called with (store, rows, token=..., keep_until=...): the
# method is looked up on each call, so that a store wrapped at its boundary (tests' outages) is honoured.
STORE_INSERTS: dict[type[Row], Callable[..., int]] = {
    ScrapeBatch: lambda store, rows, **options: store.insert_samples(rows, **options),
    TargetStatus: lambda store, rows, **options: store.insert_targets(rows, **options),
    StepRecord: lambda store, rows, **options: store.insert_steps(rows, **options),
}
INSERT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Written(enum.Enum):
    """What became of a write: in the store, in the spool (replayed later), set aside in the spool's
    rejected/ (the store refused it), or dropped (the spool was full); only DROPPED is falsy."""

    STORED = "stored"
    SPOOLED = "spooled"
    SET_ASIDE = "set aside"
    DROPPED = "dropped"

    def __bool__(self) -> bool:
        return self is not Written.DROPPED


@dataclass(frozen=True)
class Backoff:
    """Waits between replays while the store stays down: `initial_s`, doubling up to `maximum_s`.

    A store that is back is found within `maximum_s`, and a down one is not hammered every scrape.
    """

    initial_s: float = 0.5
    maximum_s: float = 30.0

    def delays(self) -> Iterator[float]:
        delay = self.initial_s
        while True:
            yield delay
            delay = min(delay * 2, self.maximum_s)


class _Histogram:
    """Bucket counts and sum of observations, exported as a Prometheus histogram."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last bucket is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        bounds = (*self.bounds, float("inf"))
        return [
            (floatToGoString(b), n) for b, n in zip(bounds, itertools.accumulate(self.counts), strict=True)
        ]


class Writer:
    """Writes batches to `store`, spooling what it cannot take now and replaying it in the background.

    `clock` times inserts; `sleep(seconds)` is the wait between failed replays, by default one that
    close() interrupts. Thread-safe: any number of threads may write.
    """

    def __init__(
        self,
        store: IngestWriter,
        spool: Spool,
        *,
        backoff: Backoff = Backoff(),
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self.store = store
        self.spool = spool
        self.backoff = backoff
        self._clock = clock
        self._closed = threading.Event()
        self._spooled = threading.Event()  # set when the spool may hold something to replay
        self._sleep = sleep or self._closed.wait
        self._lock = threading.Lock()
        self._inserted_rows: Counter[str] = Counter()
        self._refused_rows: Counter[tuple[str, str]] = Counter()  # (kind, reason)
        self._failures: Counter[tuple[str, str]] = Counter()
        self._latency = {kind: _Histogram(INSERT_BUCKETS_S) for kind in ROW_TYPES}
        self._refusing: tuple[float, str] | None = None  # since when (wall clock) and why the store refuses
        if spool.pending_entries:
            self._spooled.set()  # left by an earlier run
        self._replayer = threading.Thread(
            target=self._replay_until_closed, name="fleetlens-spool-replay", daemon=True
        )
        self._replayer.start()

    def write(
        self, kind: Kind, rows: Sequence[Row], *, keep_until: float | None = None, token: str | None = None
    ) -> Written:
        """Store `rows` now, or spool them behind what is already spooled; never raises a StoreError.
        Falsy (DROPPED) only when neither the store nor the spool could keep them (a full spool).

        `keep_until` (unix seconds) keeps step rows until then whatever their age (imported history).
        `token` names the batch for the store's deduplication: a sender that retries a request gives
        the same token, and the retry is dropped; by default every write is new."""
        return self._write(kind, rows, token or uuid.uuid4().hex, keep_until)

    def write_round(
        self,
        batches: Sequence[ScrapeBatch],
        statuses: Sequence[TargetStatus],
        *,
        token: str | None = None,
        hold: bool = False,
    ) -> Written:
        """Scraped samples and the target statuses of their scrapes, stored together or not at all:
        the samples first, then the statuses (token `<token>/targets`); if the samples are spooled or
        set aside, the statuses go in the same spool file (hub.spool), and if they are dropped, so are
        the statuses. With `hold`, statuses whose samples the store took are not written: the caller
        holds them to write with a later round's, and answers for them (hub.rounds' journal).
        What became of the samples: STORED, SPOOLED, SET_ASIDE or DROPPED (falsy)."""
        token = token or uuid.uuid4().hex
        if not batches:
            return Written.STORED if hold else self._write("targets", statuses, f"{token}/targets")
        written = self._write("samples", batches, token, statuses=statuses)
        if written is Written.STORED and statuses and not hold:
            self._write("targets", statuses, f"{token}/targets")
        return written

    def defer_round(self, batches: Sequence[ScrapeBatch], statuses: Sequence[TargetStatus]) -> None:
        """Spool a round without trying the store: for a caller that must not wait for it (a scrape loop
        whose earlier rounds the store is still taking); replayed in order behind the rest, its statuses
        with its samples."""
        token = uuid.uuid4().hex
        if batches:
            self._spool("samples", token, batches, statuses=statuses)
        elif statuses:
            self._spool("targets", token, statuses)

    def refused(self, kind: Kind, rows: int, why: str, reason: str = "retention") -> None:
        """Count `rows` of `kind` that were refused rather than stored (at the hub's door or by the
        store), and log the first of each kind and reason with `why`."""
        if rows <= 0:
            return
        with self._lock:
            first = (kind, reason) not in self._refused_rows
            self._refused_rows[kind, reason] += rows
        log.log(
            (logging.INFO if reason == DUPLICATE else logging.WARNING) if first else logging.DEBUG,
            "refused %d %s rows: %s (counted in fleetlens_hub_refused_rows)",
            rows,
            kind,
            why,
        )

    def health(self) -> str | None:
        """None while the store takes writes; else since when and why it refuses them, and what waits."""
        with self._lock:
            refusing = self._refusing
        if refusing is None:
            return None
        since, reason = refusing
        return (
            f"the store refuses writes since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(since))} "
            f"({reason}); {self.spool.pending_entries} batches spooled"
        )

    def close(self) -> None:
        """Stop the replay thread, then replay once more here; what the store cannot take stays spooled."""
        self._closed.set()
        self._spooled.set()
        self._replayer.join()
        self.spool.replay(self._insert)

    def collect(self) -> Iterator[Metric]:
        """The writer's metrics and its spool's, fresh on each call."""
        inserted = CounterMetricFamily(
            "fleetlens_hub_store_inserted_rows",
            "Rows sent in inserts the store took, by kind.",
            labels=["kind"],
        )
        refused = CounterMetricFamily(
            "fleetlens_hub_refused_rows",
            "Rows refused instead of stored, by kind and reason: retention (older than their table's "
            "retention cutoff, which the TTL would have dropped at once), duplicate (already stored with "
            "the same value: a retry, a replay, a repeat), conflict (already stored with another value, "
            "which stays: Prometheus's duplicate sample for timestamp).",
            labels=["kind", "reason"],
        )
        failures = CounterMetricFamily(
            "fleetlens_hub_store_insert_failures",
            "Inserts that failed, by kind and reason: unavailable (spooled) or rejected (set aside).",
            labels=["kind", "reason"],
        )
        latency = HistogramMetricFamily(
            "fleetlens_hub_store_insert_duration_seconds",
            "How long each insert into the store took, failed ones included.",
            labels=["kind"],
        )
        with self._lock:
            for kind, histogram in self._latency.items():
                inserted.add_metric([kind], self._inserted_rows[kind])
                latency.add_metric([kind], histogram.buckets(), histogram.sum)
            for (kind, reason), count in sorted(self._failures.items()):
                failures.add_metric([kind, reason], count)
            for kind in ROW_TYPES:  # every kind from the start, so that a rate() over it has a baseline
                for reason in REFUSED_REASONS:
                    refused.add_metric([kind, reason], self._refused_rows[kind, reason])
        yield from (inserted, refused, failures, latency)
        yield from self.spool.collect()

    def _write(
        self,
        kind: Kind,
        rows: Sequence[Row],
        token: str,
        keep_until: float | None = None,
        statuses: Sequence[TargetStatus] = (),
    ) -> Written:
        """write(); `statuses` (with samples) are spooled or set aside with them, not inserted."""
        if not rows:
            return Written.STORED
        if self.spool.pending_entries:
            return self._spool(kind, token, rows, keep_until, statuses)
        try:
            self._insert(kind, rows, token, keep_until)
        except StoreUnavailable:
            return self._spool(kind, token, rows, keep_until, statuses)
        except StoreRejected as error:
            self.spool.reject(kind, token, rows, str(error), keep_until, statuses)
            return Written.SET_ASIDE
        return Written.STORED

    def _spool(
        self,
        kind: Kind,
        token: str,
        rows: Sequence[Row],
        keep_until: float | None = None,
        statuses: Sequence[TargetStatus] = (),
    ) -> Written:
        kept = self.spool.put(kind, token, rows, keep_until, statuses)
        self._spooled.set()
        return Written.SPOOLED if kept else Written.DROPPED

    def _insert(self, kind: Kind, rows: Sequence[Row], token: str, keep_until: float | None = None) -> None:
        """One insert into the store, timed and counted, with what it refused; raises its StoreError, or
        UnknownRecordType for rows no store insert takes."""
        insert = STORE_INSERTS.get(type(rows[0]))
        if insert is None:
            raise UnknownRecordType(f"no store insert takes {type(rows[0]).__name__} rows (kind {kind!r})")
        kept = {} if keep_until is None else {"keep_until": keep_until}
        started = self._clock()
        try:
            written = insert(self.store, rows, token=token, **kept)
        except StoreError as error:
            unavailable = isinstance(error, StoreUnavailable)
            self._record(kind, started, failure="unavailable" if unavailable else "rejected")
            if unavailable:
                self._note_refusing(str(error))
            raise
        self._record(kind, started, written=written)
        self._note_refusing(None)
        if refused := getattr(written, "refused", 0):  # analytics.store.retention.Inserted
            self.refused(kind, refused, f"the store's insert: {written.cutoff.describe()}")
        if duplicates := getattr(written, "duplicates", 0):
            self.refused(
                kind, duplicates, "already stored with the same value (a retry or a repeat)", DUPLICATE
            )
        if conflicts := getattr(written, "conflicts", 0):
            self.refused(
                kind,
                conflicts,
                f"already stored with another value, which stays ({CONFLICT_WHAT[kind]})",
                CONFLICT,
            )

    def _note_refusing(self, reason: str | None) -> None:
        """Remember whether the store refuses writes, logging each change of that state once."""
        with self._lock:
            was = self._refusing
            if (was is None) == (reason is None):
                return
            self._refusing = None if reason is None else (time.time(), reason)
        if reason is not None:
            log.error("the store refuses writes: %s; spooling until it takes them again", reason)
        else:
            log.warning("the store takes writes again after %.0f s of refusing them", time.time() - was[0])

    def _record(self, kind: Kind, started: float, *, written: int = 0, failure: str = "") -> None:
        elapsed = self._clock() - started
        with self._lock:
            self._latency[kind].observe(elapsed)
            self._inserted_rows[kind] += written
            if failure:
                self._failures[kind, failure] += 1

    def _replay_until_closed(self) -> None:
        delays = self.backoff.delays()
        while True:
            self._spooled.wait()
            if self._closed.is_set():
                return
            self._spooled.clear()
            try:
                if self.spool.replay(self._insert):
                    delays = self.backoff.delays()
            except Exception:
                log.exception("spool replay failed; retrying later")
            if self.spool.pending_entries:
                self._sleep(next(delays))
                self._spooled.set()

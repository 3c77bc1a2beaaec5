"""The hub: scrapes the fleet's exporters, receives step times, and is the only writer of the store.

    scraper ──(ScrapeBatch, TargetStatus every interval)──▶ rounds ──▶ writer ──▶ store
    POST /api/v1/write (Prometheus remote write) ─(ScrapeBatch, TargetStatus from `up`)─▶ writer
    POST /v1/metrics (OTLP) ─┐                               │ (store down: spool on disk, replay in order)
    POST /api/v1/steps ──────┴──(StepRecord)──▶ writer          ▼
    POST /api/v1/sql ◀─────────── read-only SQL ────────── store (read sessions of its own)
    GET|POST /api/v1/{query,query_range,series,labels,metadata,...}, POST /api/v1/read ◀─ PromQL API ─ store
    POST /api/v1/silences, /api/v1/actions ─(silences, drain requests)─▶ store
    POST /api/v1/topology, hub.topology_file (hub.topology) ─(links, parsed by the hub)─▶ store
    POST /api/v1/checks (hub.checks) ─(active checks' verdicts)─▶ store
    GET /metrics (the hub's own), GET /healthz (HEAD too, as GET without the body)
    detection (each window) ──▶ anomalies in the store ──▶ alerting (hub.detect.Alerting)

Every POST needs a token with its scope (hub.auth: read, write, act); a hub with no token serves
POSTs to loopback clients only. /metrics and /healthz stay open so that Prometheus and load balancers need
no secret. Bad input gets a 4xx naming the field and nothing of it is stored; an unexpected failure is a
500 with a short message, its traceback in the log only.

Rows older than the store's retention (`retention`, the same as the store's) are refused at the door,
before the spool, never taken and then dropped by a TTL: /api/v1/steps answers 422 naming the cutoff and
stores nothing of the request, unless `?keep_days=N` keeps its records N days from now; /v1/metrics
stores the rest and reports the old points as an OTLP partial success. Both count in
fleetlens_hub_refused_rows{reason="retention"}.

/api/v1/write (hub.remote_write) answers as remote write senders expect: 204 once the rows are stored or
spooled, 4xx (never retried by the sender) for a body that will never be taken, 503 (retried) when
neither the store nor the spool could keep it. Old samples are refused by the store's cutoff and
counted, as the scraper's; requests that arrive together are written together and a retried request is
stored once (hub.groupcommit).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict
from typing import Any, ClassVar, TypeVar

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from alerts.commands import check_silences
from alerts.errors import SilenceError
from analytics.errors import QueryError, QueryLimitExceeded, StoreError, StoreRejected, TopologyError
from analytics.store.readonly import ReadLimits
from analytics.store.records import REQUESTS, ActionRow, SilenceRow
from analytics.store.retention import KEEP_DAYS_MAX, Cutoff, import_refusal, keep_until
from analytics.store.schema import Retention
from analytics.topology.importers import imported
from analytics.topology.names import checked_name
from collectors import textformat
from collectors.logtext import printable
from hub.apirequests import keep_days_parameter, query_request, record_rows, topology_request
from hub.auth import Tokens
from hub.checks import LatestChecks, check_rows
from hub.detect import DetectionLoop
from hub.errors import HttpError, PayloadError, PromQLError, SlotsBusy
from hub.groupcommit import GroupCommit
from hub.httpread import RequestBody
from hub.otlp import OtlpStepReceiver, otlp_error_response
from hub.placements import PlacementPoller
from hub.promql import Limits, answer_query
from hub.promql.answer import error as promql_error
from hub.promql.catalog import answer_catalog, is_catalog_path
from hub.promql.sql import NUMBERS, Read, ReadNumbers
from hub.queryslots import QuerySlots
from hub.remote_read import CONTENT_TYPE as REMOTE_READ_TYPE
from hub.remote_read import answer_read
from hub.remote_write import RemoteWriteReceiver
from hub.rounds import JOURNAL_DIR, MAX_PENDING_ROUNDS, RoundJournal, RoundQueue
from hub.scraper import Scraper
from hub.steplines import parse_steps_jsonl
from hub.topology import InventoryFile
from hub.writer import Writer

log = logging.getLogger("fleetlens.hub")
T = TypeVar("T")

JSON = "application/json"
ROLL_UP_EVERY_S = 15.0  # how often the hub rolls finished minutes and hours into the rollups
OTHER_PATH = "other"  # what unknown paths count as in fleetlens_hub_refused_requests
NO_CONTENT = (b"", "")  # a handler's answer that is a 204: taken, nothing to say
OPEN_PATHS = ("/metrics", "/healthz")  # GET and HEAD, without a token: they hold no data of the fleet
PROMQL_PATHS = ("/api/v1/query", "/api/v1/query_range")  # GET and POST, with a read token (hub.promql)
ENCODINGS = {"/api/v1/read": "snappy"}  # the Content-Encoding of a path's successful answers


_REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


class _Answer:
    """A response body whose `close`, which the WSGI server calls once the body is sent, runs `then`."""

    def __init__(self, body: bytes, then: Callable[[], None]) -> None:
        self._body = body
        self._then = then

    def __iter__(self) -> Iterator[bytes]:
        return iter((self._body,))

    def close(self) -> None:
        self._then()


class Hub:
    """Wires scraper, receivers, writer and store, and answers the hub's HTTP API (`app`).

    `store` serves the API (queries on its read sessions, silences and requests on its writing session)
    and is closed last; the writer and the detection loop should have sessions of their own."""

    def __init__(
        self,
        store: Any,
        writer: Writer,
        otlp: OtlpStepReceiver,
        scraper: Scraper | None = None,
        *,
        detection: DetectionLoop | None = None,
        inventory: InventoryFile | None = None,
        placements: Sequence[PlacementPoller] = (),
        remote_write: RemoteWriteReceiver | None = None,
        closing: Sequence[Callable[[], None]] = (),
        tokens: Tokens | None = None,
        max_body_bytes: int = 16 << 20,
        query_max_rows: int = 100_000,
        promql_max_samples: int = 10_000_000,
        query_max_seconds: float = 30.0,
        query_limits: ReadLimits | None = None,
        query_slots: QuerySlots | None = None,
        retention: Retention | None = None,
        pending_rounds: int = MAX_PENDING_ROUNDS,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.writer = writer
        self.otlp = otlp
        self.scraper = scraper
        self.detection = detection
        self.inventory = inventory
        self.placements = placements
        self.remote_write = remote_write or RemoteWriteReceiver()
        self._remote_writes = GroupCommit(writer)
        self._closing = list(closing)  # run once the loops stopped, before the store closes
        self._tokens = tokens or Tokens()
        self._max_body_bytes = max_body_bytes
        self._query_max_rows = query_max_rows
        self._promql_max_samples = promql_max_samples
        self._query_max_seconds = query_max_seconds
        self._query_limits = query_limits or ReadLimits()
        self._query_slots = query_slots or QuerySlots()
        self.retention = retention or Retention()  # the store's: what its TTLs would drop is refused here
        self._wall_clock = wall_clock
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        journal = RoundJournal(writer.spool.directory / JOURNAL_DIR, writer.store.stored_scrapes)
        self.rounds = RoundQueue(writer, journal, max_rounds=pending_rounds)  # the scraper's sink
        self._counts_lock = threading.Lock()
        self.refused: dict[tuple[str, int], int] = {}
        self.errors = 0
        self.latest_checks = LatestChecks(store, wall_clock)  # /metrics' autopilot_health_checks
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # -- ingestion ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the scrape loop (if there are targets), the detection loop, the inventory and placements
        pollers (if configured) and the roll-ups, each in a thread.

        The scrape loop hands each round to `rounds` (hub.rounds.RoundQueue), whose insert thread writes
        them in order, so that the next round is scraped on time while the store takes the last one (chDB
        works outside the GIL); rounds that queued while the store was slow go in together. Past
        `pending_rounds` waiting rounds, a round goes to the spool and is replayed when the store catches
        up: the scrape loop never waits for the store, so no interval is lost to a slow one.
        """
        if self.scraper is not None:
            self._spawn(self.scraper.run, self._stop, self.rounds.put)
        if self.detection is not None:
            self._spawn(self.detection.run, self._stop)
        if self.inventory is not None:
            self._spawn(self.inventory.run, self._stop, name="fleetlens-inventory")
        for poller in self.placements:
            self._spawn(poller.run, self._stop, name=f"fleetlens-placements-{poller.source}")
        self._spawn(self._roll_up_until_stopped, name="fleetlens-rollup")

    def _spawn(self, target: Callable[..., None], *args: object, name: str | None = None) -> None:
        """Run `target(*args)` in a daemon thread that close() waits for."""
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _roll_up_until_stopped(self) -> None:
        """Roll finished minutes into the 1-minute rollup, then finished hours into the hourly one, at
        start and every ROLL_UP_EVERY_S: pages over hours and days read them, and what is not rolled yet
        (read from raw samples or minutes instead) costs them time, not numbers. Often enough that the
        raw samples read for the minutes not rolled stay a few minutes' worth."""
        while True:
            try:
                self.store.roll_up_minutes()
                self.store.roll_up_hours()
            except StoreError as error:
                log.warning("rolling up failed (retried in %.0f s): %s", ROLL_UP_EVERY_S, error)
            if self._stop.wait(ROLL_UP_EVERY_S):
                return

    def close(self) -> None:
        """Stop scraping, flush the writer (what cannot be stored stays in the spool), close the store."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self.rounds.close()
        for close in self._closing:
            close()
        self.writer.close()
        self.store.close()

    def health(self) -> str | None:
        """None when the hub is well; else what is wrong, for /healthz and operators."""
        return self.writer.health()

    # -- the hub's own metrics ------------------------------------------------------------------------------

    def collect(self) -> Iterable:
        counters = [
            ("scrapes", "Target scrapes attempted.", self.rounds.scrapes),
            (
                "scrapes_failed",
                "Target scrapes that failed (up 0): refused, timed out, an error status, a body not parsed.",
                self.rounds.failed_scrapes,
            ),
            ("samples", "Samples scraped and handed to the writer.", self.rounds.samples),
            (
                "deferred_rounds",
                "Scraped rounds spooled as the store still took earlier ones.",
                self.rounds.deferred,
            ),
            (
                "coalesced_rounds",
                "Scraped rounds written with an earlier one: the store took longer than an interval.",
                self.rounds.coalesced,
            ),
            ("request_errors", "API requests that failed unexpectedly (500; the log has why).", self.errors),
            (
                "otlp_forgotten_series",
                "Step series the OTLP receiver forgot to stay bounded.",
                self.otlp.forgotten_series,
            ),
        ]
        gauges = [
            ("otlp_series", "Step series whose last export the OTLP receiver keeps.", self.otlp.series),
            ("queries_running", "API queries holding a slot (hub.queryslots).", self._query_slots.running),
            ("queries_waiting", "API queries waiting for a slot.", self._query_slots.waiting),
        ]
        if self.scraper is not None:
            scraper = self.scraper
            gauges.append(("targets", "Targets this hub's shard scrapes.", len(scraper.targets)))
            counters += [
                (
                    "scrape_duplicate_samples",
                    "Samples whose series came earlier in the body.",
                    scraper.duplicates_dropped,
                ),
                (
                    "scrape_ticks_skipped",
                    "Ticks skipped as the round before held the loop.",
                    scraper.ticks_skipped,
                ),
            ]
        yield from (
            CounterMetricFamily(f"fleetlens_hub_{name}", text, value=value) for name, text, value in counters
        )
        yield from (
            GaugeMetricFamily(f"fleetlens_hub_{name}", text, value=value) for name, text, value in gauges
        )
        refused = CounterMetricFamily(
            "fleetlens_hub_refused_requests",
            f"API requests refused, by endpoint ({OTHER_PATH} for unknown paths) and status.",
            labels=["endpoint", "status"],
        )
        for (endpoint, status), count in sorted(self.refused.items()):
            refused.add_metric([endpoint, str(status)], count)
        yield refused
        yield from self.remote_write.collect()
        yield from self.writer.collect()
        yield from self.latest_checks.collect()
        if self.detection is not None:
            yield from self.detection.collect()

    # -- HTTP ----------------------------------------------------------------------------------------------

    def app(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        """The hub's WSGI app. HEAD is answered as GET is, without the body. Once the answer is sent, what
        the client still sends of a body the hub did not read (a refusal: 413, 401, ...) is discarded, up
        to a bound (hub.httpread.RequestBody.discard), so that a client that sends its whole body before
        reading gets the answer rather than a connection reset."""
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/")
        request_body = RequestBody(environ, self._max_body_bytes)
        extra: list[tuple[str, str]] = []
        try:
            answer = self._answer(method, path, environ, request_body)
            status, body, content_type = 204 if answer == NO_CONTENT else 200, *answer
        except HttpError as exc:
            status, body, content_type, extra = exc.status, exc.body, exc.content_type, exc.headers
            self._note_refused(method, path, status, str(exc))
        except Exception:
            self.errors += 1
            log.exception("%s %s failed", method, printable(path))
            status, body, content_type = 500, b'{"error": "internal error; the hub\'s log says more"}', JSON
        headers = [("Content-Type", content_type), *extra]
        if status == 200 and path in ENCODINGS:
            headers.append(("Content-Encoding", ENCODINGS[path]))
        if status != 204:
            headers.append(("Content-Length", str(len(body))))
        if status == 405:
            allowed = "POST" if path in self._posts else "GET, HEAD" if path in OPEN_PATHS else "GET, POST"
            headers.append(("Allow", allowed))
        start_response(f"{status} {_REASONS.get(status, '')}", headers)
        return _Answer(b"" if method == "HEAD" else body, request_body.discard)

    def _answer(self, method: str, path: str, environ: dict, body: RequestBody) -> tuple[bytes, str]:
        if path in OPEN_PATHS:
            if method not in ("GET", "HEAD"):
                raise HttpError(405, f"{path} takes GET or HEAD")
            if path == "/metrics":
                return textformat.render(self.registry.collect()), textformat.CONTENT_TYPE
            problem = self.health()
            if problem is not None:
                raise HttpError(503, problem, f"not ok: {problem}\n".encode(), "text/plain")
            return b"ok\n", "text/plain"
        if path in PROMQL_PATHS or is_catalog_path(path):
            if method not in ("GET", "POST"):
                raise HttpError(405, f"{path} takes GET or POST")
            self._authorize("read", environ)
            return self._promql(path, method, environ, self._read_body(body))
        if path not in self._posts:
            raise HttpError(404, f"no endpoint {method} {printable(path)}")
        scope, handler = self._posts[path]
        if method != "POST":
            raise HttpError(405, f"{path} takes POST")
        self._authorize(scope, environ)
        return handler(self, self._read_body(body), environ)

    def _authorize(self, scope: str, environ: dict) -> None:
        """Go on if the request's token (or, on a hub without tokens, its address) may use `scope`."""
        authorization, client = environ.get("HTTP_AUTHORIZATION", ""), environ.get("REMOTE_ADDR", "")
        if (denied := self._tokens.check(scope, authorization, client)) is not None:
            raise HttpError(denied.status, denied.reason)

    def _note_refused(self, method: str, path: str, status: int, reason: str) -> None:
        """Count a refusal under its endpoint (unknown paths under one label) and log it, escaped."""
        known = path in self._posts or path in OPEN_PATHS or path in PROMQL_PATHS or is_catalog_path(path)
        endpoint = path if known else OTHER_PATH
        with self._counts_lock:
            self.refused[(endpoint, status)] = self.refused.get((endpoint, status), 0) + 1
        log.info("refused %s %s: %d %s", printable(method), printable(path), status, printable(reason))

    @staticmethod
    def _read_body(body: RequestBody) -> bytes:
        try:
            return body.read()
        except PayloadError as exc:
            raise HttpError(exc.status, str(exc)) from None

    def _otlp(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        content_type = environ.get("CONTENT_TYPE", "")
        cutoff = self._cutoff("steps")
        try:
            result = self.otlp.receive(
                body, content_type, environ.get("HTTP_CONTENT_ENCODING"), cutoff=cutoff
            )
        except PayloadError as exc:
            response = otlp_error_response(exc, content_type)  # the OTLP spec wants a Status body
            raise HttpError(exc.status, str(exc), response.body, response.content_type) from None
        self.writer.refused("steps", result.expired_rows, f"OTLP data points {cutoff.describe()}")
        if result.rows:
            self.writer.write("steps", result.rows)
        return result.response.body, result.response.content_type

    def _remote_write(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        """Prometheus remote write 1.0: 204 once stored or spooled; 503 when the spool is full too."""
        try:
            received = self.remote_write.receive(
                body,
                environ.get("CONTENT_TYPE"),
                environ.get("HTTP_CONTENT_ENCODING"),
                environ.get("HTTP_X_PROMETHEUS_REMOTE_WRITE_VERSION"),
            )
        except PayloadError as exc:
            raise HttpError(exc.status, str(exc)) from None
        if not self._remote_writes.commit(received):
            raise HttpError(503, "the store is down and the hub's spool is full; retry later")
        return NO_CONTENT

    def _steps(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        """Step JSON lines, taken whole or refused whole: a request holding a record older than the steps
        cutoff is a 422 naming it, unless ?keep_days=N keeps them all N days from now."""
        keep_days = keep_days_parameter(environ.get("QUERY_STRING", ""))
        try:
            rows = parse_steps_jsonl(
                body, environ.get("CONTENT_TYPE"), environ.get("HTTP_CONTENT_ENCODING"), self.otlp.limits
            )
        except PayloadError as exc:
            raise HttpError(exc.status, str(exc)) from None
        now = self._wall_clock()
        if keep_days is not None:
            self.writer.write("steps", rows, keep_until=keep_until(keep_days, now))
            return json.dumps({"rows": len(rows)}).encode(), JSON
        cutoff = self._cutoff("steps", now)
        if old := len(cutoff.split(rows, lambda row: row.ts)[1]):
            self._refuse_old_steps(len(rows), old, cutoff)
        if rows:
            self.writer.write("steps", rows)
        return json.dumps({"rows": len(rows)}).encode(), JSON

    def _refuse_old_steps(self, records: int, old: int, cutoff: Cutoff) -> None:
        """The 422 of a step request with `old` of its `records` past the cutoff; nothing of it is stored.
        Its body says so in numbers too, for clients (`fleetlens steps import --hub`) to report."""
        reason = import_refusal(records, old, cutoff)
        self.writer.refused("steps", records, f"a step import: {reason}")
        message = (
            f"0 of {records} step records stored; {reason}; send ?keep_days=N (1 to {KEEP_DAYS_MAX}) to keep "
            "imported history N days"
        )
        answer = {
            "error": message,
            "reason": reason,
            "records": records,
            "stored": 0,
            "refused": records,
            "older": old,
            "cutoff": cutoff.iso,
        }
        raise HttpError(422, message, json.dumps(answer).encode())

    def _cutoff(self, table: str, now: float | None = None) -> Cutoff:
        return Cutoff.of(self.retention, table, self._wall_clock() if now is None else now)

    def _silences(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        """Silences made, changed, expired or imported: the check every writer runs (alerts.commands),
        against what the store holds, before anything is stored; 400 naming the row and field."""
        rows, token = record_rows(body, SilenceRow)
        try:
            check_silences(self.store, rows)
        except SilenceError as exc:
            raise HttpError(400, str(exc)) from None
        return self._insert(lambda: self.store.insert_silences(rows, token=token))

    def _actions(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        """People's requests to the drain controller; only requests, never decisions, come this way."""
        rows, token = record_rows(body, ActionRow)
        for index, row in enumerate(rows):
            if row.outcome != "requested" or row.action not in REQUESTS:
                raise HttpError(
                    400,
                    f"rows[{index}]: only requests ({', '.join(REQUESTS)} with outcome 'requested') are "
                    f"accepted, not action {row.action!r} with outcome {row.outcome!r}",
                )
        return self._insert(lambda: self.store.insert_actions(rows, token=token))

    def _topology(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        """A topology source's text, parsed here by its format's importer and stored whole as what its
        reporter says now (Store.replace_links); 400 naming the file, line and key of what is wrong."""
        request = topology_request(body)
        try:
            said = imported(request.format, request.text, request.file)
            if request.reporter:
                checked_name(request.reporter, source="request", where="reporter")
        except TopologyError as exc:
            raise HttpError(400, str(exc)[:1000]) from None  # outside text in it quoted by repr()
        now = self._wall_clock()
        changes = self._stored(
            lambda: self.store.replace_links(
                said.source, said.links, now, reporter=request.reporter, unsaid=said.unsaid
            )
        )
        return json.dumps({"links": len(said.links), **asdict(changes)}).encode(), JSON

    def _checks(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        """Active checks' verdicts (hub.checks), stored whole or refused whole with a 400 naming the
        result and field."""
        rows = check_rows(body)
        stored = self._stored(lambda: self.store.insert_checks(rows))
        return json.dumps({"stored": stored}).encode(), JSON

    def _insert(self, insert: Callable[[], int]) -> tuple[bytes, str]:
        return json.dumps({"rows": self._stored(insert)}).encode(), JSON

    @staticmethod
    def _stored(write: Callable[[], T]) -> T:
        """What `write` returns; what the store refused is a 400, a store that cannot be reached a 503."""
        try:
            return write()
        except StoreRejected as exc:
            raise HttpError(400, str(exc)) from None
        except StoreError as exc:
            raise HttpError(503, str(exc)) from None

    def _query(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        """A read token's SQL, run by the store under the hub's limits (analytics.store.readonly.ReadLimits)
        in one of its client's slots (hub.queryslots; 429 with Retry-After when none comes free in time).
        The request takes query_max_seconds at most, its wait included: the store gets what is left, to the
        nearest second (a few read sessions serve every request). The rows are the JSON the store wrote,
        spliced into the answer, never parsed."""
        deadline = time.monotonic() + self._query_max_seconds
        sql, max_rows, parameters = query_request(body, self._query_max_rows)
        try:
            with self._query_slots.slot(self._query_client(environ), deadline):
                result = self.store.query_json(
                    sql,
                    parameters=parameters,
                    max_rows=max_rows,
                    max_seconds=max(1, round(deadline - time.monotonic())),
                    limits=self._query_limits,
                )
        except SlotsBusy as busy:
            raise HttpError(429, str(busy), headers=[("Retry-After", str(busy.retry_after_s))]) from None
        except QueryLimitExceeded as exc:
            raise HttpError(400, f"{exc} (hub.query_{exc.limit})") from None
        except QueryError as exc:
            raise HttpError(400, str(exc)) from None
        except StoreError as exc:
            raise HttpError(503, str(exc)) from None
        head = {
            "columns": result.columns,
            "types": result.types,
            "truncated": result.truncated,
            "elapsed_s": result.elapsed_s,
        }
        return json.dumps(head).encode()[:-1] + b', "rows": ' + result.rows + b"}", JSON

    def _promql(self, path: str, method: str, environ: dict, body: bytes) -> tuple[bytes, str]:
        """A PromQL query (hub.promql) or catalog request (hub.promql.catalog), run as SQL queries are:
        in one of the client's slots for the whole query, within query_max_seconds; errors in
        Prometheus's envelope."""
        deadline = time.monotonic() + self._query_max_seconds
        request = (method, environ.get("QUERY_STRING", ""), environ.get("CONTENT_TYPE"), body)
        limits = Limits(deadline, self._promql_max_samples)
        try:
            with self._query_slots.slot(self._query_client(environ), deadline):
                reads = self._promql_reader(limits)
                if path in PROMQL_PATHS:
                    is_range = path == "/api/v1/query_range"
                    answer = answer_query(is_range, *request, *reads, self._wall_clock(), limits)
                else:
                    answer = answer_catalog(path, *request, reads[0], self._wall_clock())
        except PromQLError as exc:
            raise HttpError(exc.status, str(exc), promql_error(exc.error_type, str(exc))) from None
        except SlotsBusy as busy:
            retry = [("Retry-After", str(busy.retry_after_s))]
            raise HttpError(429, str(busy), promql_error("unavailable", str(busy)), headers=retry) from None
        return answer, JSON

    def _remote_read(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        """Prometheus remote read (hub.remote_read), run as PromQL queries are: 400 for a request that is
        refused or whose queries read more than promql_max_samples samples together, 503 past
        query_max_seconds, 429 when no query slot comes free."""
        deadline = time.monotonic() + self._query_max_seconds
        limits = Limits(deadline, self._promql_max_samples)
        try:
            with self._query_slots.slot(self._query_client(environ), deadline):
                answer = answer_read(body, self._max_body_bytes, limits, *self._promql_reader(limits))
        except PayloadError as exc:
            raise HttpError(exc.status, str(exc)) from None
        except PromQLError as exc:
            raise HttpError(exc.status, str(exc)) from None  # its 422s are PayloadErrors already
        except SlotsBusy as busy:
            raise HttpError(429, str(busy), headers=[("Retry-After", str(busy.retry_after_s))]) from None
        return answer, REMOTE_READ_TYPE

    def _promql_reader(self, limits: Limits) -> tuple[Read, ReadNumbers]:
        """How a PromQL query reads its series (rows) and samples (numpy columns), in the slot its caller
        holds: store.query and store.query_numbers, each within what is left of the query's time;
        PromQLError when the store refuses or is down, a read matches more than query_max_rows series,
        or the query's reads together more than promql_max_samples samples."""
        read_so_far = [0]

        def run(query: Callable[[int], Any], limit: int, what: str, name: str) -> Any:
            limits.check_time()
            try:
                result = query(max(1, math.ceil(limits.deadline - time.monotonic())))
            except QueryError as exc:
                raise PromQLError(str(exc), "execution", 422) from None
            except StoreError as exc:
                raise PromQLError(str(exc), "unavailable", 503) from None
            if result.truncated:
                raise PromQLError(f"the query reads more than {limit} {what} ({name})", "execution", 422)
            return result

        def read(sql: str, parameters: Mapping[str, Any]) -> Sequence[tuple]:
            limit = self._query_max_rows

            def rows(seconds: int) -> Any:
                return self.store.query(sql, parameters=parameters, max_rows=limit, max_seconds=seconds)

            return run(rows, limit, "series", "hub.query_max_rows").rows

        def read_numbers(sql: str, parameters: Mapping[str, Any]) -> Mapping[str, np.ndarray]:
            limit = self._promql_max_samples - read_so_far[0]

            def numbers(seconds: int) -> Any:
                return self.store.query_numbers(
                    sql, NUMBERS, parameters=parameters, max_rows=limit, max_seconds=seconds
                )

            result = run(numbers, self._promql_max_samples, "samples", "hub.promql_max_samples")
            read_so_far[0] += len(result.columns["t"])
            return result.columns

        return read, read_numbers

    def _query_client(self, environ: dict) -> str:
        """Whom a query's slots count against: its token (a digest of it), or on a hub without tokens,
        its address."""
        if self._tokens.configured:
            offered = environ.get("HTTP_AUTHORIZATION", "").partition(" ")[2].strip()
            return "token " + hashlib.sha256(offered.encode()).hexdigest()[:16]
        return "address " + environ.get("REMOTE_ADDR", "")

    # path -> (scope, handler)
    _posts: ClassVar[dict[str, tuple[str, Callable[[Hub, bytes, dict], tuple[bytes, str]]]]] = {
        "/v1/metrics": ("write", _otlp),
        "/api/v1/write": ("write", _remote_write),
        "/api/v1/steps": ("write", _steps),
        "/api/v1/topology": ("write", _topology),
        "/api/v1/checks": ("write", _checks),
        "/api/v1/sql": ("read", _query),
        "/api/v1/read": ("read", _remote_read),
        "/api/v1/silences": ("act", _silences),
        "/api/v1/actions": ("act", _actions),
    }

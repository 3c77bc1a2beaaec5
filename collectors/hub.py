"""The hub: scrapes the fleet's exporters, receives step times, and is the only writer of the store.

    scraper ──(ScrapeBatch, TargetStatus every interval)──▶ writer ──▶ store
    POST /v1/metrics (OTLP) ─┐                               │ (store down: spool on disk, replay in order)
    POST /api/v1/steps ──────┴──(StepRow)──▶ writer          ▼
    POST /api/v1/query ◀───────── read-only SQL ────────── store
    POST /api/v1/silences, /api/v1/actions ─(silences, drain requests)─▶ store
    GET /metrics (the hub's own), GET /healthz

If FLEETLENS_API_TOKEN is set, every POST needs it as a bearer token; /metrics and /healthz stay open
so that Prometheus and load balancers need no secret.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import fields
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from analytics.errors import QueryError, StoreError, StoreRejected
from analytics.records import REQUESTS, ActionRow, SilenceRow
from collectors import textformat
from collectors.hub_detect import DetectionLoop
from collectors.hub_writer import Writer
from collectors.receivers import OtlpStepReceiver, PayloadError, otlp_error_response, parse_steps_jsonl
from collectors.scraper import Scraper

log = logging.getLogger("fleetlens.hub")

JSON = "application/json"
PENDING_ROUNDS = 2  # scraped rounds that may wait for the insert thread before the scrape loop waits too


class HttpError(Exception):
    """An answer other than 200: by default a JSON {"error": message}, or the given body."""

    def __init__(
        self, status: int, message: str, body: bytes | None = None, content_type: str = JSON
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = json.dumps({"error": message}).encode() if body is None else body
        self.content_type = content_type


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    503: "Service Unavailable",
}


class SerializedStore:
    """A store whose calls run one at a time: the writer's thread and the API's request threads share one
    clickhouse-connect client (and, embedded, the process's one chDB engine), which is not thread-safe."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        def serialized(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return method(*args, **kwargs)

        return serialized


class Hub:
    """Wires scraper, receivers, writer and store, and answers the hub's HTTP API (`app`)."""

    def __init__(
        self,
        store: Any,
        writer: Writer,
        otlp: OtlpStepReceiver,
        scraper: Scraper | None = None,
        *,
        detection: DetectionLoop | None = None,
        closing: Sequence[Callable[[], None]] = (),
        token: str | None = None,
        max_body_bytes: int = 16 << 20,
        query_max_rows: int = 100_000,
        query_max_seconds: float = 30.0,
    ) -> None:
        self.store = store
        self.writer = writer
        self.otlp = otlp
        self.scraper = scraper
        self.detection = detection
        self._closing = list(closing)  # run once the loops stopped, before the store closes
        self._token = token
        self._max_body_bytes = max_body_bytes
        self._query_max_rows = query_max_rows
        self._query_max_seconds = query_max_seconds
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._inserter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetlens-insert")
        self._pending = threading.BoundedSemaphore(PENDING_ROUNDS)
        self.scrapes = 0
        self.samples = 0
        self.refused: dict[tuple[str, int], int] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # -- ingestion ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the scrape loop (if there are targets) and the detection loop, each in a thread.

        Rounds are written by one insert thread of their own, in order, so that the next round is
        scraped on time while the store takes the last one (chDB works outside the GIL). Past
        PENDING_ROUNDS waiting rounds the scrape loop waits too, and skips the ticks it misses.
        """
        if self.scraper is not None:
            thread = threading.Thread(
                target=self.scraper.run, args=(self._stop, self._queue_round), daemon=True
            )
            thread.start()
            self._threads.append(thread)
        if self.detection is not None:
            thread = threading.Thread(target=self.detection.run, args=(self._stop,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _queue_round(self, batches: list, statuses: list) -> None:
        self._pending.acquire()
        try:
            future = self._inserter.submit(self._on_scrape, batches, statuses)
        except BaseException:
            self._pending.release()
            raise
        future.add_done_callback(self._round_written)

    def _round_written(self, future: Future) -> None:
        self._pending.release()
        if (error := future.exception()) is not None:
            log.error("writing a scraped round failed; its batches are lost", exc_info=error)

    def _on_scrape(self, batches: list, statuses: list) -> None:
        self.scrapes += len(statuses)
        self.samples += sum(len(batch) for batch in batches)
        if batches:
            self.writer.write("samples", batches)
        if statuses:
            self.writer.write("targets", statuses)

    def close(self) -> None:
        """Stop scraping, flush the writer (what cannot be stored stays in the spool), close the store."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self._inserter.shutdown(wait=True)
        for close in self._closing:
            close()
        self.writer.close()
        self.store.close()

    # -- the hub's own metrics ------------------------------------------------------------------------------

    def collect(self) -> Iterable:
        yield CounterMetricFamily("fleetlens_hub_scrapes", "Target scrapes attempted.", value=self.scrapes)
        yield CounterMetricFamily(
            "fleetlens_hub_samples", "Samples scraped and handed to the writer.", value=self.samples
        )
        refused = CounterMetricFamily(
            "fleetlens_hub_refused_requests",
            "API requests refused, by endpoint and status.",
            labels=["endpoint", "status"],
        )
        for (endpoint, status), count in sorted(self.refused.items()):
            refused.add_metric([endpoint, str(status)], count)
        yield refused
        yield from self.writer.collect()
        if self.detection is not None:
            yield from self.detection.collect()
        if self.scraper is not None:
            yield GaugeMetricFamily(
                "fleetlens_hub_targets", "Targets this hub's shard scrapes.", value=len(self.scraper.targets)
            )

    # -- HTTP ----------------------------------------------------------------------------------------------

    def app(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/")
        try:
            if path == "/metrics" and method == "GET":
                body, content_type = textformat.render(self.registry.collect()), textformat.CONTENT_TYPE
            elif path == "/healthz" and method == "GET":
                body, content_type = b"ok\n", "text/plain"
            elif path in self._posts:
                if method != "POST":
                    raise HttpError(405, f"{path} takes POST")
                self._authorize(environ)
                body, content_type = self._posts[path](self, self._read_body(environ), environ)
            else:
                raise HttpError(404, f"no endpoint {method} {path}")
            status = 200
        except HttpError as exc:
            status, body, content_type = exc.status, exc.body, exc.content_type
            self.refused[(path, status)] = self.refused.get((path, status), 0) + 1
            log.info("refused %s %s: %d %s", method, path, status, exc)
        start_response(f"{status} {_REASONS.get(status, '')}", [("Content-Type", content_type)])
        return [body]

    def _authorize(self, environ: dict) -> None:
        if not self._token:
            return
        offered = environ.get("HTTP_AUTHORIZATION", "")
        if not hmac.compare_digest(offered.encode(), f"Bearer {self._token}".encode()):
            raise HttpError(401, "this hub needs its API token: Authorization: Bearer <FLEETLENS_API_TOKEN>")

    def _read_body(self, environ: dict) -> bytes:
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise HttpError(400, "Content-Length is not a number") from None
        if length > self._max_body_bytes:
            raise HttpError(413, f"body of {length} bytes is over the limit of {self._max_body_bytes}")
        return environ["wsgi.input"].read(length)

    def _otlp(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        content_type = environ.get("CONTENT_TYPE", "")
        try:
            result = self.otlp.receive(body, content_type, environ.get("HTTP_CONTENT_ENCODING"))
        except PayloadError as exc:
            response = otlp_error_response(exc, content_type)  # the OTLP spec wants a Status body
            raise HttpError(exc.status, str(exc), response.body, response.content_type) from None
        self._store_rows(result.rows)
        return result.response.body, result.response.content_type

    def _steps(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        try:
            rows = parse_steps_jsonl(
                body, environ.get("CONTENT_TYPE"), environ.get("HTTP_CONTENT_ENCODING"), self.otlp.limits
            )
        except PayloadError as exc:
            raise HttpError(exc.status, str(exc)) from None
        self._store_rows(rows)
        return json.dumps({"rows": len(rows)}).encode(), JSON

    def _store_rows(self, rows: list) -> None:
        if rows:
            self.writer.write("steps", rows)

    def _silences(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        rows, token = self._rows(body, SilenceRow)
        return self._insert(lambda: self.store.insert_silences(rows, token=token))

    def _actions(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        """People's requests to the drain controller; only requests, never decisions, come this way."""
        rows, token = self._rows(body, ActionRow)
        for row in rows:
            if row.outcome != "requested" or row.action not in REQUESTS:
                raise HttpError(
                    400,
                    f"only requests ({', '.join(REQUESTS)} with outcome 'requested') are accepted, not {row}",
                )
        return self._insert(lambda: self.store.insert_actions(rows, token=token))

    @staticmethod
    def _rows(body: bytes, record: type) -> tuple[list, str]:
        """{"token": str, "rows": [{column: value}]} as records; 400 naming the row that does not fit."""
        try:
            request = json.loads(body)
            token, entries = str(request["token"]), request["rows"]
            if not isinstance(entries, list):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise HttpError(400, 'expected a JSON object {"token": "...", "rows": [{...}]}') from None
        names = {f.name: f.type for f in fields(record)}
        rows = []
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or set(entry) != set(names):
                raise HttpError(400, f"rows[{index}]: expected exactly the columns {', '.join(names)}")
            rows.append(record(**entry))
        return rows, token

    def _insert(self, insert: Callable[[], int]) -> tuple[bytes, str]:
        try:
            count = insert()
        except StoreRejected as exc:
            raise HttpError(400, str(exc)) from None
        except StoreError as exc:
            raise HttpError(503, str(exc)) from None
        return json.dumps({"rows": count}).encode(), JSON

    def _query(self, body: bytes, environ: dict) -> tuple[bytes, str]:
        try:
            request = json.loads(body)
            sql = request["sql"]
            max_rows = min(int(request.get("max_rows", self._query_max_rows)), self._query_max_rows)
            parameters = request.get("parameters") or {}
            if not isinstance(parameters, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise HttpError(
                400, 'expected a JSON object {"sql": "...", "max_rows"?: int, "parameters"?: {name: value}}'
            ) from None
        start = time.monotonic()
        try:
            result = self.store.query(
                sql, parameters=parameters, max_rows=max_rows, max_seconds=self._query_max_seconds
            )
        except QueryError as exc:
            raise HttpError(400, str(exc)) from None
        except StoreError as exc:
            raise HttpError(503, str(exc)) from None
        answer = {
            "columns": result.columns,
            "types": result.types,
            "rows": result.rows,
            "truncated": result.truncated,
            "elapsed_s": time.monotonic() - start,
        }
        return json.dumps(answer, default=str).encode(), JSON

    _posts: ClassVar[dict[str, Callable[[Hub, bytes, dict], tuple[bytes, str]]]] = {
        "/v1/metrics": _otlp,
        "/api/v1/steps": _steps,
        "/api/v1/query": _query,
        "/api/v1/silences": _silences,
        "/api/v1/actions": _actions,
    }

"""The exporter: runs the enabled collectors on each scrape and serves them over HTTP.

Each collector runs inside its own guard, so one that raises loses only its own families; the scrape
still answers, and `fleetlens_exporter_collector_success{collector}` says which one failed, as
node_exporter's `node_scrape_collector_success` does.

Scrapes that arrive together share one collection (SharedCollection): a scrape that comes while a
collection runs waits for it and is answered from it, so twenty scrapers cost one collection, not twenty
one after the other. Past `max_requests` scrapes in flight (node_exporter's --web.max-requests, 40 by
default) a scrape is answered 503 at once.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics

from collectors import textformat
from collectors.httpserver import serve_app
from collectors.registry import BuiltCollector
from collectors.webconfig import WebConfigSource

log = logging.getLogger("fleetlens.exporter")

LANDING_PAGE = b"""<html><head><title>fleetlens exporter</title></head>
<body><h1>fleetlens exporter</h1><p><a href="/metrics">Metrics</a></p></body></html>
"""
DEFAULT_MAX_REQUESTS = 40  # node_exporter's --web.max-requests


class Exporter:
    """A prometheus_client collector that wraps the built fleetlens collectors.

    Collections are serialised: collectors keep per-file offsets and NVML handles that two concurrent
    scrapers (Prometheus and the hub, say) must not interleave on. The HTTP app shares one collection
    between the scrapes that arrive while it runs (SharedCollection), so they do not queue here.
    """

    def __init__(self, built: list[BuiltCollector], clock: Callable[[], float] = time.perf_counter) -> None:
        self.built = built
        self._clock = clock
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            duration = GaugeMetricFamily(
                "fleetlens_exporter_collector_duration_seconds",
                "How long each collector took in this scrape.",
                labels=["collector"],
            )
            success = GaugeMetricFamily(
                "fleetlens_exporter_collector_success",
                "1 if the collector finished this scrape without an error, else 0.",
                labels=["collector"],
            )
            read_errors = CounterMetricFamily(
                "fleetlens_exporter_read_errors",
                "Samples skipped because of bad input (unreadable file, unparsable value, device error).",
                labels=["collector"],
            )
            for item in self.built:
                start = self._clock()
                try:
                    families = list(item.collector.collect())
                    ok = 1.0
                except Exception:
                    log.exception("collector %s failed; its metrics are missing from this scrape", item.name)
                    families, ok = [], 0.0
                duration.add_metric([item.name], self._clock() - start)
                success.add_metric([item.name], ok)
                read_errors.add_metric([item.name], item.errors.count)
                yield from families
            yield duration
            yield success
            yield read_errors

    def close(self) -> None:
        """Stop collectors that hold threads or handles (NVML event listener, followed log files)."""
        for item in self.built:
            close = getattr(item.collector, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:
                    log.exception("collector %s failed to close", item.name)


def make_registry(exporter: Exporter, process_metrics: bool = True) -> CollectorRegistry:
    """A registry holding the exporter (and the standard process_* metrics of this process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    if process_metrics:
        ProcessCollector(registry=registry)
    return registry


class _Families:
    """Families already collected, as the registry-like object prometheus_client's renderers read."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def render(families: Sequence[Metric], accept: str = "") -> tuple[bytes, str]:
    """Collected families as (body, content type): OpenMetrics if `accept` asks for it, else Prometheus
    text."""
    if "application/openmetrics-text" in accept:
        return openmetrics.generate_latest(_Families(families)), openmetrics.CONTENT_TYPE_LATEST
    return textformat.render(families), textformat.CONTENT_TYPE


def scrape_body(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """One scrape, as (body, content type): OpenMetrics if `accept` asks for it, else Prometheus text."""
    return render(list(registry.collect()), accept)


class _Collection:
    """One collection of the registry, which every scrape that waited for it is answered from: each
    body (format and compression) is rendered once, by the first scrape that asks for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.families: list[Metric] = []
        self.error: BaseException | None = None
        self._bodies: dict[tuple[bool, str], tuple[bytes, str]] = {}
        self._rendering = threading.Lock()

    def body(self, accept: str, gzipped: bool) -> tuple[bytes, str]:
        """(body, content type) for a scrape that accepts `accept`, gzipped if asked."""
        if self.error is not None:
            raise self.error
        key = ("application/openmetrics-text" in accept, "gzip" if gzipped else "")
        with self._rendering:
            if key not in self._bodies:
                body, content_type = render(self.families, accept)
                self._bodies[key] = (gzip.compress(body, compresslevel=1) if gzipped else body, content_type)
            return self._bodies[key]


class SharedCollection:
    """Collections of `registry` shared by the scrapes that arrive together ("single flight").

    A scrape that arrives while a collection runs waits for it and is answered from it; one that arrives
    when none runs starts one. So no scrape is answered from a collection that had ended before it came
    (nothing is cached between collections), and collectors run once however many scrapers come at once.
    At most `max_requests` scrapes are in flight (collecting, waiting or rendering; 0: no bound): past it
    `scrape` answers None at once, and the app 503, as node_exporter's --web.max-requests does. A
    collection that raises fails every scrape that waited for it (the next scrape starts afresh).
    """

    def __init__(self, registry: CollectorRegistry, max_requests: int = DEFAULT_MAX_REQUESTS) -> None:
        if max_requests < 0:
            raise ValueError(f"max_requests must be 0 (no bound) or more, got {max_requests}")
        self.max_requests = max_requests
        self._registry = registry
        self._lock = threading.Lock()
        self._running: _Collection | None = None
        self._in_flight = 0

    def scrape(self, accept: str = "", gzipped: bool = False) -> tuple[bytes, str] | None:
        """(body, content type) of a scrape, from the collection running now or a new one; None when
        `max_requests` scrapes are in flight already."""
        with self._lock:
            if self.max_requests and self._in_flight >= self.max_requests:
                return None
            self._in_flight += 1
            collection, leads = self._running, self._running is None
            if leads:
                collection = self._running = _Collection()
        try:
            if leads:
                self._collect(collection)
            else:
                collection.done.wait()
            return collection.body(accept, gzipped)
        finally:
            with self._lock:
                self._in_flight -= 1

    @property
    def in_flight(self) -> int:
        """Scrapes collecting, waiting for a collection or rendering, now."""
        with self._lock:
            return self._in_flight

    def _collect(self, collection: _Collection) -> None:
        try:
            collection.families = list(self._registry.collect())
        except BaseException as exc:
            collection.error = exc
        finally:
            with self._lock:
                self._running = None
            collection.done.set()


class MetricsApp:
    """WSGI app: /metrics (format by Accept header, gzip on request), a landing page at /. Scrapes that
    arrive together share one collection (`shared`); past its `max_requests` in flight a scrape gets 503
    with a body that names the limit. HEAD is answered as GET is, without the body (as node_exporter's
    server does: the headers, Content-Length included, are the GET's)."""

    def __init__(self, registry: CollectorRegistry, max_requests: int = DEFAULT_MAX_REQUESTS) -> None:
        self.shared = SharedCollection(registry, max_requests)

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        status, headers, body = self._answer(environ)
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    def _answer(self, environ: dict) -> tuple[str, list[tuple[str, str]], bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._metrics(environ)
        if path == "/":
            return "200 OK", [("Content-Type", "text/html; charset=utf-8")], LANDING_PAGE
        return "404 Not Found", [("Content-Type", "text/plain")], b"not found; metrics are at /metrics\n"

    def _metrics(self, environ: dict) -> tuple[str, list[tuple[str, str]], bytes]:
        gzipped = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        answer = self.shared.scrape(environ.get("HTTP_ACCEPT", ""), gzipped)
        if answer is None:
            busy = (
                f"{self.shared.max_requests} scrapes are in flight, the most --web.max-requests allows; "
                "try again later\n"
            )
            return (
                "503 Service Unavailable",
                [("Content-Type", "text/plain"), ("Retry-After", "1")],
                busy.encode(),
            )
        body, content_type = answer
        headers = [("Content-Type", content_type)]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        return "200 OK", headers, body


def make_app(registry: CollectorRegistry, max_requests: int = DEFAULT_MAX_REQUESTS) -> MetricsApp:
    """The exporter's WSGI app over `registry` (see MetricsApp)."""
    return MetricsApp(registry, max_requests)


def serve(
    registry: CollectorRegistry,
    host: str,
    port: int,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    web: WebConfigSource | None = None,
) -> WSGIServer:
    """Bind the metrics server (port 0 picks a free one: see `server.server_port`); call serve_forever().
    Past `max_requests` scrapes in flight (0: no bound), a scrape is answered 503; `web`: TLS and auth."""
    return serve_app(make_app(registry, max_requests), host, port, web=web)

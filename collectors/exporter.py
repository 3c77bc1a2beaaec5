"""The exporter: runs the enabled collectors on each scrape and serves them over HTTP.

Each collector runs inside its own guard, so one that raises loses only its own families; the scrape
still answers, and `fleetlens_exporter_collector_success{collector}` says which one failed, as
node_exporter's `node_scrape_collector_success` does.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics

from collectors import textformat
from collectors.httpserver import serve_app
from collectors.registry import BuiltCollector

log = logging.getLogger("fleetlens.exporter")

LANDING_PAGE = b"""<html><head><title>fleetlens exporter</title></head>
<body><h1>fleetlens exporter</h1><p><a href="/metrics">Metrics</a></p></body></html>
"""


class Exporter:
    """A prometheus_client collector that wraps the built fleetlens collectors.

    Scrapes are serialised: collectors keep per-file offsets and NVML handles that two concurrent
    scrapers (Prometheus and the hub, say) must not interleave on.
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


def scrape_body(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """One scrape, as (body, content type): OpenMetrics if `accept` asks for it, else Prometheus text."""
    if "application/openmetrics-text" in accept:
        return openmetrics.generate_latest(registry), openmetrics.CONTENT_TYPE_LATEST
    return textformat.render(registry.collect()), textformat.CONTENT_TYPE


def make_app(registry: CollectorRegistry) -> Callable:
    """WSGI app: /metrics (format by Accept header, gzip on request), a landing page at /."""

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            body, content_type = scrape_body(registry, environ.get("HTTP_ACCEPT", ""))
            headers = [("Content-Type", content_type)]
            if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
                body = gzip.compress(body, compresslevel=1)
                headers.append(("Content-Encoding", "gzip"))
            start_response("200 OK", headers)
            return [body]
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [LANDING_PAGE]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found; metrics are at /metrics\n"]

    return app


def serve(registry: CollectorRegistry, host: str, port: int) -> WSGIServer:
    """Bind the metrics server (port 0 picks a free one: see `server.server_port`); call serve_forever()."""
    return serve_app(make_app(registry), host, port)

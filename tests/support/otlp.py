"""A loopback OTLP/HTTP metrics endpoint for tests: it decodes every request as a real receiver would."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest


@dataclass(frozen=True)
class HistogramPoint:
    unit: str
    attributes: dict[str, str | int]
    count: int
    sum: float
    bucket_counts: list[int]
    explicit_bounds: list[float]
    time_unix_nano: int


class OtlpReceiver:
    """A loopback OTLP/HTTP metrics endpoint that decodes every request, as the hub will."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                requests.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                """Keep the test output free of access logs."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def histograms(self, name: str) -> Iterator[HistogramPoint]:
        for request in self.requests:
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        if metric.name != name:
                            continue
                        for point in metric.histogram.data_points:
                            attributes = {
                                kv.key: getattr(kv.value, kv.value.WhichOneof("value"))
                                for kv in point.attributes
                            }
                            yield HistogramPoint(
                                metric.unit,
                                attributes,
                                point.count,
                                point.sum,
                                list(point.bucket_counts),
                                list(point.explicit_bounds),
                                point.time_unix_nano,
                            )

    def latest(self, name: str) -> list[HistogramPoint]:
        """The newest point of each series: with cumulative temporality, everything recorded so far."""
        newest: dict[frozenset[tuple[str, str | int]], HistogramPoint] = {}
        for point in self.histograms(name):
            key = frozenset(point.attributes.items())
            if key not in newest or point.time_unix_nano > newest[key].time_unix_nano:
                newest[key] = point
        return list(newest.values())

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()

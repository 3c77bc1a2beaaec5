"""A loopback OTLP/HTTP metrics endpoint for tests: it decodes every request as a real receiver would."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests.support.loopback import LoopbackPostServer


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
        self._server = LoopbackPostServer(self._record)

    def _record(self, body: bytes, headers: object) -> tuple[int, str, bytes]:
        self.requests.append(ExportMetricsServiceRequest.FromString(body))
        return 200, "application/x-protobuf", b""

    @property
    def url(self) -> str:
        return self._server.url

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
        self._server.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.__exit__(*exc_info)

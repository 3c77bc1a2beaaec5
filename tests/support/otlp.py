"""A loopback OTLP/HTTP metrics endpoint for tests: it decodes every request as a real receiver would."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
)

from collectors.steprecord import STEP_DURATION
from tests.support.loopback import LoopbackPostServer

CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
IDENTITY = {"job": "job-a", "rank": 3, "node": "node-7"}  # the rank whose points the builders below make
START_NS = 1_700_000_000 * 10**9


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


# -- building exports as the step SDK sends them ------------------------------------------------------


def step_point(
    count: int, seconds: float, *, start_ns: int = START_NS, **attributes: str | int
) -> HistogramDataPoint:
    return HistogramDataPoint(
        attributes=[
            KeyValue(
                key=key,
                value=AnyValue(string_value=value) if isinstance(value, str) else AnyValue(int_value=value),
            )
            for key, value in {**IDENTITY, **attributes}.items()
        ],
        start_time_unix_nano=start_ns,
        time_unix_nano=start_ns + 10**9 * (count + 1),
        count=count,
        sum=seconds,
    )


def histogram(
    *points: HistogramDataPoint, name: str = STEP_DURATION, temporality: int = CUMULATIVE
) -> Metric:
    return Metric(
        name=name, unit="s", histogram=Histogram(data_points=points, aggregation_temporality=temporality)
    )


def export(*metrics: Metric) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    request.resource_metrics.add().scope_metrics.add().metrics.extend(metrics)
    return request

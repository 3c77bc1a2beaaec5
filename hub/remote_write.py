"""Prometheus remote write 1.0 into the hub: what a fleet's own Prometheus (or agent) already scrapes.

    receiver = RemoteWriteReceiver(RemoteWriteLimits(), NodeIdentity(("node", "Hostname", "instance")))
    received = receiver.receive(body, content_type, content_encoding, version_header)
    writer.write("samples", received.batches, token=received.token)
    writer.write("targets", received.statuses, token=received.token)

A request is a snappy-compressed (block format) protobuf WriteRequest (prometheus/prompb). It is taken
whole or refused whole with a 4xx naming the problem, as the protocol wants: senders retry 5xx and
drop 4xx, so nothing that could succeed later is ever answered 4xx, and nothing that never will is
answered 5xx. The decoded size is read from the snappy header and checked before anything is inflated.

Each series' node is the first of `NodeIdentity.labels` it carries (`instance` with its port stripped),
so that one node's dcgm-exporter series (Hostname) and node_exporter series (a file_sd `node` label)
meet under one node. A series that only its `instance` names (an exporter's process metrics, `up`)
joins the node its target's other series named, once one has. `node` itself is a column, never a
stored label; every other label is kept.
Samples become ScrapeBatches per (instance, node, timestamp): Prometheus stamps every sample of one
scrape with the scrape's time, so a batch is what the hub's own scraper would have made of that scrape.

`up` is not stored as a sample: each of its samples is a target status (the `targets` table, as for a
scrape of the hub's own), its node the one that target's other series named (a dcgm-exporter target's
`up` has no Hostname), its duration and sample count from scrape_duration_seconds and
scrape_samples_scraped when the same request holds them.

Samples dropped without refusing the request are counted by reason (DROP_REASONS): staleness markers
(Prometheus's "this series ended", not a value), timestamps outside what the store can hold, series
with none of the node labels, native histograms (not stored by this hub).

Replays are idempotent: `token` is a digest of the body, by which hub.groupcommit answers a request the
sender retries (a timeout after the hub had stored it) without storing it twice.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import urlsplit

import cramjam
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from analytics.store.records import ScrapeBatch, TargetStatus
from hub.bodies import media_type
from hub.errors import PayloadError

CONTENT_TYPE = "application/x-protobuf"
VERSION = "0.1.0"  # X-Prometheus-Remote-Write-Version of remote write 1.0
STALE_NAN_BITS = 0x7FF0000000000002  # Prometheus's staleness marker: a NaN with this exact bit pattern
FUTURE_SLACK_S = 3600.0  # samples stamped further ahead than this are a broken clock, not data
TARGET_LABELS = ("job", "instance")  # what names one scrape target in Prometheus
SCRAPE_DURATION, SCRAPE_SAMPLES = "scrape_duration_seconds", "scrape_samples_scraped"
MAX_REMEMBERED_TARGETS = 100_000  # targets whose node the receiver remembers for their `up`
MAX_CACHED_SERIES = 500_000  # series whose decoded labels the receiver keeps (a Vela-sized fleet: 126k)
DROP_REASONS = ("stale_marker", "timestamp_out_of_range", "no_node_label", "native_histogram")


@dataclass(frozen=True)
class RemoteWriteLimits:
    """What one request may hold; over a limit the request is refused whole (413 for size, 400 else)."""

    max_body_bytes: int = 16 << 20  # compressed, and again once decompressed
    max_series: int = 50_000
    max_samples: int = 100_000
    max_label_length: int = 4096  # characters of one label name or value


@dataclass(frozen=True)
class NodeIdentity:
    """Which label names a series' node: the first of `labels` the series carries with a value."""

    labels: tuple[str, ...] = ("node", "Hostname", "instance")

    def node_of(self, labels: Mapping[str, str]) -> tuple[str, bool]:
        """The node `labels` name ("" when none of the configured labels is there), and whether only the
        target's address (`instance`) named it: a weaker claim than a node label or Hostname."""
        for name in self.labels:
            if value := labels.get(name):
                return (strip_port(value), True) if name == "instance" else (value, False)
        return "", True


def strip_port(address: str) -> str:
    """The host of "host:port" ("[v6]:port" too); an address without a port as it is."""
    try:
        parts = urlsplit(f"//{address}")
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError:
        return address
    if host is None or not parts.netloc.endswith(f":{parts.port}"):
        return address
    return host


def _message_classes() -> tuple[type, type]:
    """WriteRequest and Label of prometheus/prompb (types.proto, remote.proto), built from their
    descriptors here, so the real protobuf parser decodes them without generated code.

    A series' labels are kept as their encoded Label messages (bytes, the same wire format): the tuple of
    them is the key of the receiver's series cache, and only a series not seen before has its labels
    decoded (and their UTF-8 checked) as Labels. Histograms are kept as raw bytes: this hub counts and
    drops them; exemplars and metadata are skipped as unknown fields."""
    proto = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="fleetlens/prompb_remote.proto", package="fleetlens.prompb", syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, str, bool]) -> None:
        added = file.message_type.add(name=name)
        for field_name, number, kind, type_name, repeated in fields:
            label = proto.LABEL_REPEATED if repeated else proto.LABEL_OPTIONAL
            added.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                added.field[-1].type_name = type_name

    message("Label", ("name", 1, proto.TYPE_STRING, "", False), ("value", 2, proto.TYPE_STRING, "", False))
    message(
        "Sample", ("value", 1, proto.TYPE_DOUBLE, "", False), ("timestamp", 2, proto.TYPE_INT64, "", False)
    )
    message(
        "TimeSeries",
        ("labels", 1, proto.TYPE_BYTES, "", True),
        ("samples", 2, proto.TYPE_MESSAGE, ".fleetlens.prompb.Sample", True),
        ("histograms", 4, proto.TYPE_BYTES, "", True),
    )
    message("WriteRequest", ("timeseries", 1, proto.TYPE_MESSAGE, ".fleetlens.prompb.TimeSeries", True))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    classes = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"fleetlens.prompb.{name}"))
        for name in ("WriteRequest", "Label")
    )
    return tuple(classes)


WriteRequest, Label = _message_classes()


@dataclass(frozen=True, slots=True)
class _Series:
    """What one series' labels say, decoded once: its name, its stored labels (shared by all its samples,
    never changed), its node, whether only `instance` named it, and its scrape target."""

    name: str
    labels: dict[str, str]
    node: str
    weak: bool
    target: tuple[str, str]

    @property
    def claims_node(self) -> bool:
        """Whether the series says which node its target belongs to (a node label or Hostname)."""
        return bool(self.node) and not self.weak and not _target_level(self.name) and bool(self.target[1])


@dataclass
class Received:
    """One request's rows for the writer, what was dropped from it, and its idempotency token."""

    token: str
    batches: list[ScrapeBatch] = field(default_factory=list)
    statuses: list[TargetStatus] = field(default_factory=list)
    samples: int = 0  # in batches
    dropped: Counter[str] = field(default_factory=Counter)


class RemoteWriteReceiver:
    """Decodes remote write requests into the hub's rows and keeps the counts for its /metrics.

    Thread-safe: the hub's HTTP server may call `receive` from several threads at once."""

    def __init__(
        self,
        limits: RemoteWriteLimits = RemoteWriteLimits(),
        identity: NodeIdentity = NodeIdentity(),
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits
        self.identity = identity
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._target_nodes: dict[tuple[str, str], str] = {}
        self._series: dict[tuple[bytes, ...], _Series] = {}  # by the series' encoded labels
        self.requests = 0
        self.samples = 0
        self.dropped: Counter[str] = Counter()

    def receive(
        self,
        body: bytes,
        content_type: str | None,
        content_encoding: str | None,
        version: str | None,
    ) -> Received:
        """The rows of one request; PayloadError with the status to answer when it is refused whole."""
        _check_headers(content_type, content_encoding, version)
        request = self._decode(body)
        received = Received(token=f"remote-write-{hashlib.sha256(body).hexdigest()[:32]}")
        self._convert(request, received)
        with self._lock:
            self.requests += 1
            self.samples += received.samples
            self.dropped.update(received.dropped)
        return received

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            requests, samples, dropped = self.requests, self.samples, dict(self.dropped)
        yield CounterMetricFamily(
            "fleetlens_hub_remote_write_requests", "Remote write requests taken.", value=requests
        )
        yield CounterMetricFamily(
            "fleetlens_hub_remote_write_samples",
            "Samples taken from remote write requests and handed to the writer (up as target statuses).",
            value=samples,
        )
        family = CounterMetricFamily(
            "fleetlens_hub_remote_write_dropped_samples",
            "Samples of taken remote write requests that were not stored, by reason.",
            labels=["reason"],
        )
        for reason in DROP_REASONS:
            family.add_metric([reason], dropped.get(reason, 0))
        yield family

    # -- decoding ----------------------------------------------------------------------------------------

    def _decode(self, body: bytes) -> WriteRequest:
        limit = self.limits.max_body_bytes
        if len(body) > limit:
            raise PayloadError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {len(body)} bytes exceeds the limit of {limit}"
            )
        data = _unsnappy(body, limit)
        request = WriteRequest()
        try:
            request.ParseFromString(data)
        except DecodeError as error:
            raise PayloadError(
                HTTPStatus.BAD_REQUEST, f"body is not a remote write WriteRequest (protobuf): {error}"
            ) from None
        series = len(request.timeseries)
        if series > self.limits.max_series:
            raise PayloadError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{series} series in one request; the limit is {self.limits.max_series}",
            )
        samples = sum(len(one.samples) for one in request.timeseries)
        if samples > self.limits.max_samples:
            raise PayloadError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{samples} samples in one request; the limit is {self.limits.max_samples}",
            )
        return request

    def _describe(self, encoded: tuple[bytes, ...], index: int) -> _Series:
        """The series whose labels are `encoded`; PayloadError naming timeseries[index] when a label is
        not a valid Label, is empty, too long or repeated, or there is no __name__."""
        if (known := self._series.get(encoded)) is not None:
            return known
        try:
            pairs = [(label.name, label.value) for label in map(Label.FromString, encoded)]
        except DecodeError as error:
            raise PayloadError(
                HTTPStatus.BAD_REQUEST, f"timeseries[{index}]: a label is not a valid Label: {error}"
            ) from None
        labels = dict(pairs)
        limit = self.limits.max_label_length
        if (
            len(labels) != len(pairs)
            or "" in labels
            or max(map(len, labels), default=0) > limit
            or max(map(len, labels.values()), default=0) > limit
            or not labels.get("__name__")
        ):
            raise _label_problem(pairs, index, limit)
        name = labels.pop("__name__")
        node, weak = self.identity.node_of(labels)
        labels.pop("node", None)  # a column of its own
        series = _Series(name, labels, node, weak, _target_of(labels))
        with self._lock:
            if len(self._series) >= MAX_CACHED_SERIES:  # the oldest tenth goes: a fleet that changed
                for stale in list(itertools.islice(self._series, MAX_CACHED_SERIES // 10)):
                    del self._series[stale]
            self._series[encoded] = series
        return series

    # -- conversion --------------------------------------------------------------------------------------

    def _convert(self, request: WriteRequest, received: Received) -> None:
        """Fill `received`: samples grouped by (instance, node, ts), and `up` as target statuses. The whole
        request is validated before anything of it is kept."""
        described = [self._describe(tuple(series.labels), i) for i, series in enumerate(request.timeseries)]
        self._remember({info.target: info.node for info in described if info.claims_node})
        newest_ms = (self._wall_clock() + FUTURE_SLACK_S) * 1000
        groups: dict[tuple[str, str, int], ScrapeBatch] = {}
        ups: list[tuple[_Series, str, int, float]] = []
        scrape_info: dict[tuple[str, str, str, int], float] = {}
        for series, info in zip(request.timeseries, described, strict=True):
            if series.histograms:
                received.dropped["native_histogram"] += len(series.histograms)
            name, labels, node = info.name, info.labels, info.node
            if info.weak:  # an exporter's own series (process, build info) join the node its others named
                node = self._known_node(info.target) or node
            kept = []
            for sample in series.samples:
                value, ts_ms = sample.value, sample.timestamp
                if math.isnan(value) and _bits(value) == STALE_NAN_BITS:
                    received.dropped["stale_marker"] += 1
                elif not 0 < ts_ms <= newest_ms:
                    received.dropped["timestamp_out_of_range"] += 1
                else:
                    kept.append((ts_ms, value))
            if name == "up":
                ups.extend((info, node, ts_ms, value) for ts_ms, value in kept)
                continue
            if name in (SCRAPE_DURATION, SCRAPE_SAMPLES):
                for ts_ms, value in kept:
                    scrape_info[(name, *info.target, ts_ms)] = value
            if not node:
                received.dropped["no_node_label"] += len(kept)
                continue
            instance = labels.get("instance", "")
            for ts_ms, value in kept:
                batch = groups.get((instance, node, ts_ms))
                if batch is None:
                    batch = groups[(instance, node, ts_ms)] = ScrapeBatch(
                        instance, node, ts_ms / 1000, [], [], []
                    )
                batch.names.append(name)
                batch.labels.append(labels)
                batch.values.append(value)
                received.samples += 1
        received.batches = list(groups.values())
        received.statuses = [self._status(*up, scrape_info) for up in ups]
        received.samples += len(received.statuses)

    def _status(
        self, info: _Series, own_node: str, ts_ms: int, value: float, scrape_info: Mapping[tuple, float]
    ) -> TargetStatus:
        """A target status from one `up` sample; its node is the one the target's series named, else the
        one `up`'s own labels name."""
        job, instance = info.target
        node = self._known_node(info.target) or own_node
        up = value == 1
        duration = scrape_info.get((SCRAPE_DURATION, job, instance, ts_ms), 0.0)
        samples = scrape_info.get((SCRAPE_SAMPLES, job, instance, ts_ms), 0.0)
        error = "" if up else f"Prometheus reported up {value:g} for job {job!r}"
        return TargetStatus(
            ts_ms / 1000, instance, node, up, _finite(duration), int(_finite(samples)) if up else 0, error
        )

    def _known_node(self, target: tuple[str, str]) -> str | None:
        """The node this target's series last named with a node label or Hostname, if any did."""
        if not target[1]:
            return None  # not from a scrape target
        with self._lock:
            return self._target_nodes.get(target)

    def _remember(self, claims: Mapping[tuple[str, str], str]) -> None:
        """The node each target's series named, for its `up` and its series that name none (a
        dcgm-exporter target's `up` has no Hostname); the oldest targets are forgotten past a bound."""
        if not claims:
            return
        with self._lock:
            for target, node in claims.items():
                if self._target_nodes.get(target) != node:
                    if len(self._target_nodes) >= MAX_REMEMBERED_TARGETS:
                        self._target_nodes.pop(next(iter(self._target_nodes)))
                    self._target_nodes[target] = node


def _label_problem(pairs: list[tuple[str, str]], index: int, limit: int) -> PayloadError:
    """What is wrong with the labels of timeseries[index], found wrong by the quick checks."""
    seen: set[str] = set()
    for name, value in pairs:
        if not name:
            problem = "a label has an empty name"
        elif len(name) > limit or len(value) > limit:
            problem = f"label {name[:64]!r} is over the limit of {limit} characters"
        elif name in seen:
            problem = f"label {name[:64]!r} given twice"
        else:
            seen.add(name)
            continue
        return PayloadError(HTTPStatus.BAD_REQUEST, f"timeseries[{index}]: {problem}")
    return PayloadError(HTTPStatus.BAD_REQUEST, f"timeseries[{index}]: no __name__ label")


def _target_level(name: str) -> bool:
    """Whether Prometheus made the series about the scrape itself (up, scrape_*): it carries the target's
    labels only, never the exporter's, so it does not say which node the target belongs to."""
    return name == "up" or name.startswith("scrape_")


def _target_of(labels: Mapping[str, str]) -> tuple[str, str]:
    return labels.get("job", ""), labels.get("instance", "")


def _bits(value: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def _finite(value: float) -> float:
    return value if math.isfinite(value) and value >= 0 else 0.0


def _check_headers(content_type: str | None, content_encoding: str | None, version: str | None) -> None:
    """Remote write 1.0 only: protobuf, snappy, version 0.1.x; 415 naming the header otherwise."""
    if media_type(content_type) != CONTENT_TYPE or "proto=" in (content_type or ""):
        raise PayloadError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type {content_type!r}: this receiver takes remote write 1.0, {CONTENT_TYPE}",
        )
    if (content_encoding or "").strip().lower() != "snappy":
        raise PayloadError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Encoding {content_encoding!r}: remote write bodies are snappy-compressed",
        )
    if version is not None and not version.strip().startswith("0.1."):
        raise PayloadError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"X-Prometheus-Remote-Write-Version {version!r}: this receiver speaks {VERSION}",
        )


def _unsnappy(body: bytes, limit: int) -> bytes:
    """The snappy block `body` decompressed; its declared size is checked against `limit` first."""
    try:
        size = cramjam.snappy.decompress_raw_len(body)
    except cramjam.DecompressionError as error:
        raise PayloadError(HTTPStatus.BAD_REQUEST, f"body is not snappy (block format): {error}") from None
    if size > limit:
        raise PayloadError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"body of {len(body)} bytes decompresses to {size}, over the limit of {limit}",
        )
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as error:
        raise PayloadError(HTTPStatus.BAD_REQUEST, f"body is not snappy (block format): {error}") from None

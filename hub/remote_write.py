"""Prometheus remote write 1.0 into the hub: what a fleet's own Prometheus (or agent) already scrapes.

    receiver = RemoteWriteReceiver(RemoteWriteLimits(), NodeIdentity(("node", "Hostname", "instance")))
    received = receiver.receive(body, content_type, content_encoding, version_header)
    GroupCommit(writer).commit(received)  # hub.groupcommit: with the requests that came together

A request is a snappy-compressed (block format) protobuf WriteRequest (prometheus/prompb), taken whole or
refused whole with PayloadError (a 4xx naming the problem), as the protocol wants: senders retry 5xx and
drop 4xx, so nothing that could succeed later is answered 4xx, and nothing that never will 5xx. The
decoded size is read from the snappy header and checked before anything is inflated. A series seen
before whose one sample has Prometheus's fixed layout is read from its bytes without the parser
(_convert): decoding is a large share of ingest.

Each series' node is the first of `NodeIdentity.labels` it carries (`instance` without its port), so
that one node's dcgm-exporter and node_exporter series meet under one node; a series only its
`instance` names (process metrics, `up`) joins the node its target's other series named. `node` is a
column, never a stored label. Samples become ScrapeBatches per (instance, node, timestamp), what the
hub's own scraper would have made of that scrape. `up` is not stored as a sample: each of its samples is
a target status (the `targets` table), with duration and sample count from scrape_duration_seconds and
scrape_samples_scraped when the same request holds them.

Samples dropped without refusing the request are counted by reason (DROP_REASONS): staleness markers,
timestamps outside what the store can hold, series with none of the node labels, native histograms.
Replays are idempotent: `token` is a digest of the body, by which hub.groupcommit answers a retried
request without storing it twice.
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
from google.protobuf.message import DecodeError
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from analytics.store.records import ScrapeBatch, TargetStatus
from collectors.steprecord import check_value
from hub.bodies import media_type
from hub.errors import PayloadError
from hub.prompb import Label, RawWriteRequest, Sample, TimeSeries

CONTENT_TYPE = "application/x-protobuf"
VERSION = "0.1.0"  # X-Prometheus-Remote-Write-Version of remote write 1.0
STALE_NAN_BITS = 0x7FF0000000000002  # Prometheus's staleness marker: a NaN with this exact bit pattern
FUTURE_SLACK_S = 3600.0  # samples stamped further ahead than this are a broken clock, not data
TARGET_LABELS = ("job", "instance")  # what names one scrape target in Prometheus
SCRAPE_DURATION, SCRAPE_SAMPLES = "scrape_duration_seconds", "scrape_samples_scraped"
MAX_REMEMBERED_TARGETS = 100_000  # targets whose node the receiver remembers for their `up`
MAX_CACHED_SERIES = 500_000  # series whose decoded labels the receiver keeps (a Vela-sized fleet: 126k)
DROP_REASONS = ("stale_marker", "timestamp_out_of_range", "no_node_label", "native_histogram")
MAX_STAMPS = 100_000  # encoded timestamps the fast path knows (one per target and scrape)

# How Prometheus encodes a series' one sample after its labels, timestamp 1971..2109 (a 6-byte varint):
# field 2 (Sample) of 16 bytes: field 1 (double value), field 2 (varint timestamp); or of 7 bytes when the
# value is 0 (proto3 leaves it out).
_VALUE_SAMPLE, _TIMESTAMP, _ZERO_SAMPLE = b"\x12\x10\x09", b"\x10", b"\x12\x07\x10"
_STALE = struct.pack("<Q", STALE_NAN_BITS)
_DOUBLE = struct.Struct("<d")


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


@dataclass(frozen=True, slots=True)
class _Series:
    """What one series' labels say, decoded once: its name, its stored labels (shared by all its samples,
    never changed), its node, whether only `instance` named it, its scrape target, and what follows from
    them for every sample (worked out here so that a sample costs a few lookups)."""

    name: str
    labels: dict[str, str]
    node: str
    weak: bool
    target: tuple[str, str]
    instance: str
    claims_node: bool  # says which node its target belongs to (a node label or Hostname)
    role: int  # SAMPLE, UP (a target status) or SCRAPE_INFO (a sample its target's status reads too)
    place: tuple[str, str]  # (instance, node): its samples' batch, with their time
    direct: bool  # its in-time samples go straight into their batch: a SAMPLE that names its node

    @classmethod
    def of(cls, name: str, labels: dict[str, str], node: str, weak: bool) -> _Series:
        target = _target_of(labels)
        claims = bool(node) and not weak and not _target_level(name) and bool(target[1])
        role = UP if name == "up" else SCRAPE_INFO if name in (SCRAPE_DURATION, SCRAPE_SAMPLES) else SAMPLE
        instance = labels.get("instance", "")
        return cls(
            name, labels, node, weak, target, instance, claims, role, (instance, node), not role and not weak
        )


SAMPLE, UP, SCRAPE_INFO = range(3)


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

    Thread-safe: the hub's HTTP server may call `receive` from several threads at once; they decode
    one at a time."""

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
        # One request decoded at a time: decoding is Python under the GIL, so a second decoder adds no
        # speed, and each thread more that waits for the GIL takes a share of it from the group writer
        # (a Prometheus with 60 queue shards starved it: the hub took half of what it was sent).
        self._decoding = threading.Lock()
        self._target_nodes: dict[tuple[str, str], str] = {}
        self._series: dict[bytes, _Series] = {}  # by the series' encoded labels (validated)
        self._stamps: dict[bytes, int] = {}  # timestamps by their 6-byte varint, for the fast path
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
        received = Received(token=f"remote-write-{hashlib.sha256(body).hexdigest()[:32]}")
        with self._decoding:
            self._convert(self._decode(body), received)
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

    def _decode(self, body: bytes) -> list[bytes]:
        """The request's series, each still encoded; PayloadError when the body is too large or no
        WriteRequest."""
        limit = self.limits.max_body_bytes
        if len(body) > limit:
            raise PayloadError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {len(body)} bytes exceeds the limit of {limit}"
            )
        data = unsnappy(body, limit)
        try:
            timeseries = RawWriteRequest.FromString(data).timeseries
        except DecodeError as error:
            raise _not_a_request(error) from None
        if len(timeseries) > self.limits.max_series:
            raise PayloadError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{len(timeseries)} series in one request; the limit is {self.limits.max_series}",
            )
        return list(timeseries)

    def _parsed(
        self, raw: bytes, index: int, samples: list[tuple[_Series, int, float]], dropped: Counter[str]
    ) -> int:
        """Add the samples of timeseries[index], any shape, read by the protobuf parser; its count."""
        try:
            series = TimeSeries.FromString(raw)
        except DecodeError as error:
            raise _not_a_request(f"timeseries[{index}]: {error}") from None
        labels = tuple(series.labels)
        info = self._describe(TimeSeries(labels=labels).SerializeToString(), labels, index)
        if series.histograms:
            dropped["native_histogram"] += len(series.histograms)
        for sample in series.samples:
            value, ts_ms = sample.value, sample.timestamp
            if math.isnan(value) and _bits(value) == STALE_NAN_BITS:
                dropped["stale_marker"] += 1
            else:
                samples.append((info, ts_ms, value))
            self._learn_stamp(ts_ms)
        return len(series.samples)

    def _learn_stamp(self, ts_ms: int) -> None:
        """Remember the 6-byte varint of `ts_ms` (1971 to 2109), which the fast path then reads."""
        encoded = Sample(timestamp=ts_ms).SerializeToString()[1:] if ts_ms > 0 else b""  # after its tag
        if len(encoded) == 6 and encoded not in self._stamps:
            with self._lock:
                if len(self._stamps) >= MAX_STAMPS:
                    self._stamps.clear()
                self._stamps[encoded] = ts_ms

    def _describe(self, key: bytes, encoded: tuple[bytes, ...], index: int) -> _Series:
        """The series whose labels are `encoded` (`key`: them as a TimeSeries encodes them); PayloadError
        naming timeseries[index] when a label is not a valid Label, is empty, too long or repeated, there
        is no __name__, or a label that names nodes (NodeIdentity) holds no name (a control character:
        collectors.steprecord.check_value), checked as sent: `instance` loses its port after."""
        if (known := self._series.get(key)) is not None:
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
        for label in self.identity.labels:
            try:
                check_value("node", labels.get(label, ""))
            except ValueError as error:
                raise PayloadError(
                    HTTPStatus.BAD_REQUEST, f"timeseries[{index}]: label {label}, a node's name: {error}"
                ) from None
        node, weak = self.identity.node_of(labels)
        labels.pop("node", None)  # a column of its own
        series = _Series.of(name, labels, node, weak)
        with self._lock:
            if len(self._series) >= MAX_CACHED_SERIES:  # the oldest tenth goes: a fleet that changed
                for stale in list(itertools.islice(self._series, MAX_CACHED_SERIES // 10)):
                    del self._series[stale]
            self._series[key] = series
        return series

    # -- conversion --------------------------------------------------------------------------------------

    def _convert(self, timeseries: list[bytes], received: Received) -> None:
        """Fill `received`: samples grouped by (instance, node, ts), and `up` as target statuses; stale
        markers and histograms counted as dropped. PayloadError when a series is not a valid TimeSeries,
        its labels are bad, or the request holds more samples than the limit; the whole request is
        validated before anything of it is kept.

        The fast path: Prometheus encodes a series as its labels, then one sample (value, timestamp). When
        the bytes before such a sample are exactly the encoded labels of a series seen before (the cache's
        key: validated then), the series is that one and the sample is read from its fixed-size fields;
        any other shape goes through the protobuf parser (_parsed). A sample of a series that names its
        node, in time, goes straight into its batch; the others (`up`, scrape_*, series only `instance`
        names, any time) wait for the request's end, when the nodes its series named are known."""
        newest_ms = (self._wall_clock() + FUTURE_SLACK_S) * 1000
        cache, stamps, groups = self._series, self._stamps, {}
        claims: dict[tuple[str, str], str] = {}
        later: list[tuple[_Series, int, float]] = []
        count = stale = 0
        place, batch_ts, add_name, add_labels, add_value = None, None, None, None, None
        for index, raw in enumerate(timeseries):
            if raw[-18:-15] == _VALUE_SAMPLE and raw[-7:-6] == _TIMESTAMP:
                info, value_at = cache.get(raw[:-18]), len(raw) - 15
            elif raw[-9:-6] == _ZERO_SAMPLE:
                info, value_at = cache.get(raw[:-9]), -1
            else:
                info = None
            ts_ms = stamps.get(raw[-6:]) if info is not None else None
            if ts_ms is None:
                parsed: list[tuple[_Series, int, float]] = []
                count += self._parsed(raw, index, parsed, received.dropped)
                for info, ts_ms, value in parsed:  # in the request's order, as the store keeps the first
                    if info.direct and 0 < ts_ms <= newest_ms:
                        _place(groups, claims, info, ts_ms, value)
                    else:
                        later.append((info, ts_ms, value))
                continue
            count += 1
            value = _DOUBLE.unpack_from(raw, value_at)[0] if value_at >= 0 else 0.0
            if value != value and raw[-15:-7] == _STALE:  # only a NaN can be the marker
                stale += 1
            elif not info.direct or ts_ms > newest_ms:  # a 6-byte stamp is after 1971
                later.append((info, ts_ms, value))
            else:
                if info.claims_node:
                    claims[info.target] = info.node
                if ts_ms != batch_ts or info.place != place:  # Prometheus queues a scrape's samples together
                    place, batch_ts = info.place, ts_ms
                    batch = groups.get((*place, ts_ms))
                    if batch is None:
                        batch = _open_batch(groups, *place, ts_ms)
                    add_name, add_labels, add_value = (
                        batch.names.append,
                        batch.labels.append,
                        batch.values.append,
                    )
                add_name(info.name)
                add_labels(info.labels)
                add_value(value)
        if count > self.limits.max_samples:
            raise PayloadError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"{count} samples in one request; the limit is {self.limits.max_samples}",
            )
        claims.update((info.target, info.node) for info, _, _ in later if info.claims_node)
        self._remember(claims)
        received.dropped.update(stale_marker=stale)
        received.statuses = self._rest(later, newest_ms, groups, received.dropped)
        received.batches = list(groups.values())
        received.samples = sum(map(len, received.batches)) + len(received.statuses)

    def _rest(
        self,
        samples: list[tuple[_Series, int, float]],
        newest_ms: float,
        groups: dict[tuple[str, str, int], ScrapeBatch],
        dropped: Counter[str],
    ) -> list[TargetStatus]:
        """Put `samples` into `groups` too, but `up` (the target statuses returned) and those out of time
        or without a node (counted in `dropped`)."""
        ups: list[tuple[_Series, int, float]] = []
        scrape_info: dict[tuple[str, str, str, int], float] = {}
        out_of_range = no_node = 0
        for info, ts_ms, value in samples:
            if not 0 < ts_ms <= newest_ms:
                out_of_range += 1
                continue
            if info.role == UP:
                ups.append((info, ts_ms, value))
                continue
            if info.role == SCRAPE_INFO:
                scrape_info[(info.name, *info.target, ts_ms)] = value
            node = info.node
            if info.weak:  # an exporter's own series (process, build info) join the node its others named
                node = self._known_node(info.target) or node
                if not node:
                    no_node += 1
                    continue
            batch = groups.get((info.instance, node, ts_ms))
            if batch is None:  # not `or`: that would count the batch's samples (len) every time
                batch = _open_batch(groups, info.instance, node, ts_ms)
            batch.names.append(info.name)
            batch.labels.append(info.labels)
            batch.values.append(value)
        dropped.update(timestamp_out_of_range=out_of_range, no_node_label=no_node)
        return [self._status(*up, scrape_info) for up in ups]

    def _status(
        self, info: _Series, ts_ms: int, value: float, scrape_info: Mapping[tuple, float]
    ) -> TargetStatus:
        """A target status from one `up` sample; its node is the one the target's series named, else the
        one `up`'s own labels name."""
        job, instance = info.target
        node = self._known_node(info.target) or info.node
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


def _place(
    groups: dict[tuple[str, str, int], ScrapeBatch],
    claims: dict[tuple[str, str], str],
    info: _Series,
    ts_ms: int,
    value: float,
) -> None:
    """Add a sample of a series that names its node, in time, to its batch, as the fast path does."""
    if info.claims_node:
        claims[info.target] = info.node
    batch = groups.get((*info.place, ts_ms))
    if batch is None:
        batch = _open_batch(groups, *info.place, ts_ms)
    batch.names.append(info.name)
    batch.labels.append(info.labels)
    batch.values.append(value)


def _open_batch(
    groups: dict[tuple[str, str, int], ScrapeBatch], instance: str, node: str, ts_ms: int
) -> ScrapeBatch:
    """A new batch for (instance, node, ts_ms) in `groups` (a batch there is never empty)."""
    batch = groups[(instance, node, ts_ms)] = ScrapeBatch(instance, node, ts_ms / 1000, [], [], [])
    return batch


def _not_a_request(error: object) -> PayloadError:
    return PayloadError(
        HTTPStatus.BAD_REQUEST, f"body is not a remote write WriteRequest (protobuf): {error}"
    )


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


def unsnappy(body: bytes, limit: int) -> memoryview:
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
        return memoryview(cramjam.snappy.decompress_raw(body))  # bytes() of it would copy byte by byte
    except cramjam.DecompressionError as error:
        raise PayloadError(HTTPStatus.BAD_REQUEST, f"body is not snappy (block format): {error}") from None

"""The hub's Prometheus remote write receiver over loopback HTTP into a real chDB store: node identity from
labels, `up` as target statuses, retries stored once, the spool, limits, and refusals that store nothing."""

from __future__ import annotations

import struct
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.store import Store
from analytics.store.hubclient import HubClient
from hub.app import Hub
from hub.auth import Tokens
from hub.errors import PayloadError
from hub.otlp import OtlpStepReceiver
from hub.prompb import Label, WriteRequest
from hub.remote_write import NodeIdentity, RemoteWriteLimits, RemoteWriteReceiver, strip_port
from hub.spool import Spool
from hub.writer import Writer
from tests.hub.test_app import Outage
from tests.support.exposition import key, parse_samples
from tests.support.hubserver import on_loopback
from tests.support.remote_write import HEADERS, encode, post, snappy

STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]


@pytest.fixture
def served(store: Store, tmp_path: Path) -> Iterator[tuple[Hub, str, Outage]]:
    switch = Outage(store)
    receiver = RemoteWriteReceiver(RemoteWriteLimits(max_series=100, max_samples=1000, max_label_length=256))
    hub = Hub(
        store, Writer(switch, Spool(tmp_path / "spool", 64 << 20)), OtlpStepReceiver(), remote_write=receiver
    )
    with on_loopback(hub) as url:
        yield hub, url, switch


def now_ms() -> int:
    return int(time.time()) * 1000


def dcgm(gpu: int, ts: int, value: float, host: str = "vela-001", instance: str = "10.0.0.1:9400") -> tuple:
    labels = {
        "__name__": "DCGM_FI_DEV_GPU_TEMP",
        "gpu": str(gpu),
        "Hostname": host,
        "job": "dcgm",
        "instance": instance,
    }
    return labels, [(ts, value)]


def up(instance: str, job: str, ts: int, value: float, **labels: str) -> tuple:
    return {"__name__": "up", "job": job, "instance": instance, **labels}, [(ts, value)]


def rows(url: str, sql: str) -> list[tuple]:
    return HubClient(url).query(sql).rows


def test_series_of_two_exporters_meet_under_one_node_and_up_becomes_target_statuses(served):
    _, url, _ = served
    ts = now_ms()
    node_exporter = {"job": "node", "instance": "10.0.0.1:9100", "node": "vela-001"}
    body = encode(
        [
            dcgm(0, ts, 41.0),
            dcgm(1, ts, 43.0),
            (
                {"__name__": "node_infiniband_state_id", "device": "mlx5_0", "port": "1", **node_exporter},
                [(ts, 4)],
            ),
            (
                {"__name__": "scrape_duration_seconds", "job": "node", "instance": "10.0.0.1:9100"},
                [(ts, 0.012)],
            ),
            (
                {
                    "__name__": "node_network_up",
                    "device": "eth0",
                    "job": "other",
                    "instance": "10.0.0.9:9100",
                },
                [(ts, 1)],
            ),
            up("10.0.0.1:9400", "dcgm", ts, 1),  # no Hostname: the node its series named
            up("10.0.0.1:9100", "node", ts, 0, node="vela-001"),
        ]
    )
    status, answer = post(url, snappy(body))
    assert (status, answer) == (204, b"")
    stored = rows(
        url,
        "SELECT node, metric, labels['gpu'], value FROM metrics "
        "WHERE metric != 'scrape_duration_seconds' ORDER BY 1, 2, 3",
    )
    assert stored == [
        ("10.0.0.9", "node_network_up", "", 1.0),  # instance, its port stripped
        ("vela-001", "DCGM_FI_DEV_GPU_TEMP", "0", 41.0),
        ("vela-001", "DCGM_FI_DEV_GPU_TEMP", "1", 43.0),
        ("vela-001", "node_infiniband_state_id", "", 4.0),
    ]
    labels = rows(url, "SELECT labels FROM metrics WHERE metric = 'node_infiniband_state_id'")[0][0]
    assert labels == {
        "device": "mlx5_0",
        "port": "1",
        "job": "node",
        "instance": "10.0.0.1:9100",
    }  # node: a column
    targets = rows(url, "SELECT target, node, up, duration_s, error != '' FROM targets ORDER BY target")
    assert targets == [("10.0.0.1:9100", "vela-001", 0, 0.012, 1), ("10.0.0.1:9400", "vela-001", 1, 0.0, 0)]
    assert rows(url, "SELECT count() FROM metrics WHERE metric = 'up'") == [(0,)]


def test_a_retried_request_is_stored_once(served):
    _, url, _ = served
    ts = now_ms()
    body = snappy(
        encode([dcgm(gpu, ts, 40.0 + gpu) for gpu in range(8)] + [up("10.0.0.1:9400", "dcgm", ts, 1)])
    )
    assert post(url, body)[0] == 204
    assert post(url, body)[0] == 204  # the sender timed out and sent it again
    assert rows(url, "SELECT count() FROM metrics") == [(8,)]
    assert rows(url, "SELECT count() FROM targets") == [(1,)]


def test_store_outage_spools_then_replays_in_order_and_answers_204(served):
    hub, url, switch = served
    ts = now_ms()
    switch.down = True
    for i in range(3):
        assert post(url, snappy(encode([dcgm(0, ts + i * 1000, 50.0 + i)])))[0] == 204
    assert hub.writer.spool.pending_entries >= 3
    switch.down = False
    deadline = time.monotonic() + 20
    while hub.writer.spool.pending_entries and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rows(url, "SELECT value FROM metrics ORDER BY ts") == [(50.0,), (51.0,), (52.0,)]


def test_stale_markers_future_samples_and_nodeless_series_are_dropped_and_counted(store, tmp_path):
    receiver = RemoteWriteReceiver(identity=NodeIdentity(("Hostname",)))
    hub = Hub(
        store, Writer(store, Spool(tmp_path / "spool", 1 << 20)), OtlpStepReceiver(), remote_write=receiver
    )
    with on_loopback(hub) as url:
        ts = now_ms()
        series = dcgm(0, ts, 40.0)[0]
        body = encode(
            [
                (series, [(ts - 1000, 39.0), (ts, STALE_NAN), (ts + 7200_000, 41.0)]),
                ({"__name__": "node_load1", "instance": "10.0.0.1:9100", "job": "node"}, [(ts, 0.5)]),
            ]
        )
        assert post(url, snappy(body))[0] == 204
        assert rows(url, "SELECT value FROM metrics") == [(39.0,)]
        exposed = parse_samples(_get(f"{url}/metrics"))
        dropped = "fleetlens_hub_remote_write_dropped_samples_total"
        for reason in ("stale_marker", "timestamp_out_of_range", "no_node_label"):
            assert exposed[key(dropped, reason=reason)] == 1
        assert exposed[key("fleetlens_hub_remote_write_samples_total")] == 1


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


@pytest.mark.parametrize(
    ("body", "headers", "status", "says"),
    [
        (b"not snappy at all", {}, 400, "not snappy"),
        (snappy(b"\xff\xff\xff\xff"), {}, 400, "not a remote write WriteRequest"),
        (snappy(encode([({"job": "x", "instance": "h:1"}, [(1, 1.0)])])), {}, 400, "no __name__"),
        (
            snappy(encode([({"__name__": "m", "node": "n", "big": "x" * 300}, [(1, 1.0)])])),
            {},
            400,
            "limit of 256",
        ),
        (
            snappy(encode([({"__name__": f"m{i}", "node": "n"}, [(1, 1.0)]) for i in range(101)])),
            {},
            413,
            "101 series",
        ),
        (
            snappy(encode([({"__name__": "m", "node": "n"}, [(i, 1.0) for i in range(1, 1002)])])),
            {},
            413,
            "1001 samples",
        ),
        (snappy(encode([dcgm(0, 1, 1.0)])), {"Content-Encoding": "gzip"}, 415, "snappy"),
        (snappy(encode([dcgm(0, 1, 1.0)])), {"Content-Type": "application/json"}, 415, "remote write 1.0"),
        (
            snappy(encode([dcgm(0, 1, 1.0)])),
            {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
            415,
            "remote write 1.0",
        ),
        (snappy(encode([dcgm(0, 1, 1.0)])), {"X-Prometheus-Remote-Write-Version": "2.0.0"}, 415, "0.1.0"),
    ],
    ids=[
        "not-snappy",
        "not-protobuf",
        "no-name",
        "long-label",
        "series",
        "samples",
        "gzip",
        "json",
        "v2",
        "version",
    ],
)
def test_bodies_that_can_never_be_taken_get_a_4xx_naming_why_and_store_nothing(
    served, body, headers, status, says
):
    hub, url, _ = served
    got, answer = post(url, body, {**HEADERS, **headers})
    assert got == status
    assert says in answer.decode()
    assert rows(url, "SELECT count() FROM metrics") == [(0,)]
    assert hub.refused[("/api/v1/write", status)] == 1


def test_invalid_utf8_and_a_repeated_label_are_refused():
    receiver = RemoteWriteReceiver()
    raw = encode([({"__name__": "m", "node": "n"}, [(1, 1.0)])]).replace(b"\x01m", b"\x01\xff", 1)
    with pytest.raises(PayloadError, match=r"timeseries\[0\]: a label is not a valid Label"):
        receiver.receive(snappy(raw), *HEADERS.values())
    request = WriteRequest()
    series = request.timeseries.add()
    series.labels.extend(
        Label(name=name, value=value).SerializeToString()
        for name, value in (("__name__", "m"), ("gpu", "0"), ("gpu", "1"))
    )
    with pytest.raises(PayloadError, match="'gpu' given twice"):
        receiver.receive(snappy(request.SerializeToString()), *HEADERS.values())


def test_a_body_whose_snappy_header_declares_more_than_the_limit_is_refused_before_inflating():
    receiver = RemoteWriteReceiver(RemoteWriteLimits(max_body_bytes=1 << 20))
    bomb = snappy(b"\x00" * (2 << 20))  # 2 MiB of zeros: about 100 KB compressed
    assert len(bomb) < 1 << 20
    with pytest.raises(Exception, match="decompresses to 2097152"):
        receiver.receive(bomb, *HEADERS.values())


def test_write_needs_the_write_scope_when_tokens_are_set(store, tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("read reader-token\nwrite writer-token\n")
    token_file.chmod(0o600)
    hub = Hub(
        store,
        Writer(store, Spool(tmp_path / "spool", 1 << 20)),
        OtlpStepReceiver(),
        tokens=Tokens.load(None, token_file),
    )
    with on_loopback(hub) as url:
        body = snappy(encode([dcgm(0, now_ms(), 40.0)]))
        assert post(url, body)[0] == 401
        assert post(url, body, {**HEADERS, "Authorization": "Bearer reader-token"})[0] == 403
        assert post(url, body, {**HEADERS, "Authorization": "Bearer writer-token"})[0] == 204


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("10.0.0.1:9100", "10.0.0.1"),
        ("[fd00::1]:9100", "fd00::1"),
        ("gpu-17", "gpu-17"),
        ("gpu-17:x", "gpu-17:x"),
    ],
)
def test_instance_loses_its_port(address, host):
    assert strip_port(address) == host


label_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_any_bytes_are_taken_or_refused_with_a_4xx_never_an_exception_of_another_kind(data):
    receiver = RemoteWriteReceiver()
    for body in (data, snappy(data)):
        try:
            receiver.receive(body, *HEADERS.values())
        except PayloadError as error:
            assert 400 <= error.status < 500


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(
                st.sampled_from(["gpu", "device", "job", "instance", "Hostname", "x"]), label_text, max_size=5
            ),
            st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.floats()), max_size=4),
        ),
        max_size=6,
    )
)
def test_every_sample_kept_is_one_sent_under_its_series_node_and_nothing_is_invented(series):
    sent = [({"__name__": "metric_a", **labels}, samples) for labels, samples in series]
    receiver = RemoteWriteReceiver()
    try:
        received = receiver.receive(snappy(encode(sent)), *HEADERS.values())
    except PayloadError as error:
        assert error.status == 400  # only an empty label name is refused here
        return
    kept = sorted(
        (batch.node, name, tuple(sorted(labels.items())), round(batch.ts * 1000), value)
        for batch in received.batches
        for name, labels, value in zip(batch.names, batch.labels, batch.values, strict=True)
        if value == value  # NaN compares unequal to itself
    )
    for node, _, labels, ts_ms, value in kept:
        sources = [
            s for s in sent if sorted((k, v) for k, v in s[0].items() if k != "__name__") == list(labels)
        ]
        own, weak = receiver.identity.node_of(sources[0][0])
        target = {(s[0].get("job"), s[0].get("instance")) for s in sources}
        named = {  # a series named only by its instance joins the node its target's other series named
            receiver.identity.node_of(s[0])[0]
            for s in sent
            if (s[0].get("job"), s[0].get("instance")) in target and not receiver.identity.node_of(s[0])[1]
        }
        assert node == own != "" if not weak else node in {own, *named} and node != ""
        assert any((ts_ms, value) in samples for _, samples in sources)
    assert received.samples + sum(received.dropped.values()) == sum(len(samples) for _, samples in sent)


class ParserOnly(RemoteWriteReceiver):
    """A receiver that never learns a timestamp, so that every series goes through the protobuf parser."""

    def _learn_stamp(self, ts_ms: int) -> None:
        pass


def outcome(receiver: RemoteWriteReceiver, body: bytes) -> object:
    """What `receiver` makes of `body`: its rows and drops, or the refusal."""
    try:
        received = receiver.receive(snappy(body), *HEADERS.values())
    except PayloadError as error:
        return error.status, str(error)
    samples = sorted(
        (batch.target, batch.node, batch.ts, name, sorted(labels.items()), struct.pack("<d", value))
        for batch in received.batches
        for name, labels, value in zip(batch.names, batch.labels, batch.values, strict=True)
    )
    return samples, sorted(map(repr, received.statuses)), +received.dropped


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["up", "metric_a", "scrape_samples_scraped"]),
            st.dictionaries(
                st.sampled_from(["gpu", "job", "instance", "Hostname", "node"]), label_text, max_size=4
            ),
            st.lists(
                st.tuples(
                    st.sampled_from([now_ms() - 5000, now_ms() - 4000]) | st.integers(-(2**63), 2**63 - 1),
                    st.sampled_from([0.0, -0.0, 1.0, 41.5, STALE_NAN, float("nan")]) | st.floats(),
                ),
                max_size=2,
            ),
        ),
        max_size=6,
    ),
    st.none() | st.tuples(st.integers(0, 10**4), st.integers(0, 255)),
)
def test_series_seen_before_are_read_as_the_protobuf_parser_reads_them(series, mutation):
    """The fast path (a series' encoded labels known, its one sample read from fixed offsets) keeps and
    refuses exactly what the parser does, for bodies as Prometheus sends them and for damaged ones."""
    sent = [({"__name__": name, **labels}, samples) for name, labels, samples in series]
    body = encode(sent)
    if mutation and body:
        at = mutation[0] % len(body)
        body = body[:at] + bytes([mutation[1]]) + body[at + 1 :]
    warmup = encode([(labels, [(now_ms() - 5000, 1.0)]) for labels, _ in sent])
    fast, parser = RemoteWriteReceiver(), ParserOnly()
    for receiver in (fast, parser):
        outcome(receiver, warmup)
    assert outcome(fast, body) == outcome(parser, body)

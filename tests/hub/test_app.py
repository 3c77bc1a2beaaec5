"""The hub end to end on loopback: real exporters scraped into a real chDB store, step times over OTLP
and JSON lines, the query API, the token, and a store outage survived through the spool."""

from __future__ import annotations

import itertools
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from alerts import commands
from alerts.silences import new_silence
from analytics.errors import QueryError, StoreRejected, StoreUnavailable
from analytics.store.hubclient import HubClient
from analytics.store.records import ActionRow, ScrapeBatch, SilenceRow
from collectors.exporter import make_registry, serve
from collectors.steps import StepTracker
from fleetlens.config import ExporterConfig
from fleetlens.exporter_cli import build_exporter
from hub.app import Hub
from hub.auth import Tokens
from hub.otlp import OtlpStepReceiver
from hub.rounds import TARGETS_HOLD_S
from hub.scraper import Scraper
from hub.spool import Spool
from hub.targets import Shard, TargetsFile
from hub.writer import Writer
from tests.support.clock import FakeClock
from tests.support.hubserver import hub_process, on_loopback
from tests.support.queryattacks import LONG_QUERY

TOKEN = "s3cret"
JSON = "application/json"


@pytest.fixture
def fleet(procfs_sys: Path) -> Iterator[list[dict]]:
    """Two real exporters (simulated GPUs, procfs fixture NICs) on loopback, as file_sd target groups."""
    servers, groups = [], []
    for node in ("vela-001", "vela-002"):
        exporter = build_exporter(ExporterConfig(gpu_backend="sim", sysfs_root=procfs_sys, node=node))
        server = serve(make_registry(exporter, process_metrics=False), "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append((server, exporter))
        groups.append({"targets": [f"127.0.0.1:{server.server_port}"], "labels": {"node": node}})
    groups.append({"targets": ["127.0.0.1:1"], "labels": {"node": "vela-down"}})  # nothing listens there
    yield groups
    for server, exporter in servers:
        server.shutdown()
        server.server_close()
        exporter.close()


class Outage:
    """The real store behind a switch: while `down`, every call fails as an unreachable store does.

    chDB runs inside this process and cannot be taken away for real, so the outage is simulated at the
    store's boundary; everything behind it (the real store) and in front of it (writer, spool) is real.
    """

    def __init__(self, store: object) -> None:
        self.store = store
        self.down = False

    def __getattr__(self, name: str) -> object:
        if self.down and name.startswith("insert_"):
            raise StoreUnavailable("store down for the test")
        return getattr(self.store, name)


def make_hub(
    store: object, tmp_path: Path, groups: list[dict] | None = None, token: str | None = None
) -> Hub:
    scraper = None
    if groups is not None:
        targets = tmp_path / "targets.json"
        targets.write_text(json.dumps(groups))
        scraper = Scraper(TargetsFile(targets).current, interval_s=1, timeout_s=0.5, shard=Shard(0, 1))
    writer = Writer(store, Spool(tmp_path / "spool", 64 << 20))
    return Hub(store, writer, OtlpStepReceiver(), scraper, tokens=Tokens.load(token))


@pytest.fixture
def served(store, tmp_path, fleet) -> Iterator[tuple[Hub, str]]:
    hub = make_hub(store, tmp_path, fleet)
    with on_loopback(hub) as url:
        yield hub, url


def scrape(hub: Hub) -> None:
    hub.writer.write_round(*hub.scraper.scrape_once())


def test_scraped_fleet_lands_in_the_metrics_view_and_targets(served):
    hub, url = served
    scrape(hub)
    client = HubClient(url)
    nodes = client.query(
        "SELECT node, count() FROM metrics WHERE metric = 'DCGM_FI_DEV_GPU_TEMP' GROUP BY node ORDER BY node"
    )
    assert nodes.rows == [("vela-001", 8), ("vela-002", 8)]
    port = client.query(
        "SELECT labels['device'], value FROM metrics WHERE node = 'vela-001' "
        "AND metric = 'node_infiniband_port_data_received_bytes_total' ORDER BY 1"
    )
    assert [device for device, _ in port.rows] == ["hfi1_0", "mlx4_0", "mlx4_0", "mlx5_0"]
    targets = client.query("SELECT node, up, samples > 0, error != '' FROM targets ORDER BY node").rows
    assert targets == [("vela-001", 1, 1, 0), ("vela-002", 1, 1, 0), ("vela-down", 0, 0, 1)]


def test_step_times_over_otlp_and_json_lines(served):
    _, url = served
    clock = FakeClock()
    tracker = StepTracker(job="llm", rank=3, node="vela-002", clock=clock, environ={}, otlp_endpoint=url)
    for _ in range(5):
        with tracker.step():
            clock.advance(2.0)
    tracker.close()
    record = {"ts": time.time(), "job": "llm", "rank": 0, "node": "vela-001", "step": 7, "duration_s": 1.5}
    assert HubClient(url).import_steps(json.dumps(record).encode() + b"\n") == 1
    rows = HubClient(url).query("SELECT source, rank, step, steps, duration_s FROM steps ORDER BY rank").rows
    assert rows == [("jsonl", 0, 7, 1, 1.5), ("otlp", 3, 4, 5, 2.0)]


def test_bad_step_lines_are_refused_naming_the_line_and_nothing_is_stored(served):
    _, url = served
    good = {"ts": 1.7e9, "job": "llm", "rank": 0, "node": "n", "step": 1, "duration_s": 1.0}
    body = (json.dumps(good) + "\n" + '{"ts": 1.7e9, "job": "llm"\n').encode()
    with pytest.raises(Exception, match="line 2") as info:
        HubClient(url).import_steps(body)
    assert "400" in str(info.value)
    assert HubClient(url).query("SELECT count() FROM steps").rows == [(0,)]


def test_query_api_fills_parameters_as_the_store_does(served):
    """Detectors read an embedded store through the hub with the same parameterized SQL."""
    _, url = served
    step = {"job": "llm", "rank": 0, "node": "vela-001", "step": 1, "duration_s": 1.0}
    now = int(time.time())
    lines = [json.dumps({**step, "ts": ts, "step": ts}) for ts in (now - 10, now)]
    HubClient(url).import_steps("\n".join(lines).encode() + b"\n")
    since = datetime.fromtimestamp(now - 5, UTC)
    result = HubClient(url).query(
        "SELECT step FROM steps WHERE ts >= {since:DateTime64(3)} AND job = {job:String}",
        parameters={"since": since, "job": "llm"},
    )
    assert result.rows == [(now,)]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("INSERT INTO steps (job) VALUES ('x')", "only SELECT statements"),
        ("SELECT count( FROM steps", "Syntax error"),
    ],
)
def test_query_api_refuses_writes_and_explains_syntax_errors(served, sql, message):
    _, url = served
    with pytest.raises(QueryError, match=message):
        HubClient(url).query(sql)


def test_silences_and_drain_requests_go_through_the_hub_and_only_requests_are_accepted(served):
    """The CLI and the UI reach an embedded store's silences and the drain controller this way."""
    _, url = served
    client = HubClient(url)
    silence = commands.add_silence(
        client, new_silence(["node=vela-007"], 3600, created_by="sre", comment="swap")
    )
    assert [s.id for s in commands.silences(client)] == [silence.id]
    commands.expire_silence(client, silence.id)
    assert commands.silences(client) == []

    commands.request(client, "approve", "decision-1", "alice")
    assert [(r.action, r.outcome, r.decision_id) for r in commands.actions(client)] == [
        ("approve", "requested", "decision-1")
    ]
    forged = ActionRow(time.time(), "drain", "vela-007", "", "by hand", "auto", "done", "d")
    with pytest.raises(StoreRejected, match="only requests"):
        client.insert_actions([forged], token="t")
    with pytest.raises(StoreRejected, match=r"rows\[0\]: expected exactly the columns"):
        client.insert_silences([forged], token="t")  # an action is no silence


def test_token_guards_the_api_but_not_metrics_or_health(store, tmp_path):
    hub = make_hub(store, tmp_path, token=TOKEN)
    with on_loopback(hub) as url:
        with pytest.raises(QueryError, match="401"):
            HubClient(url, token="").query("SELECT 1")
        assert HubClient(url, token=TOKEN).query("SELECT 1").rows == [(1,)]
        for path in ("/metrics", "/healthz"):
            with urllib.request.urlopen(url + path, timeout=5) as response:
                assert response.status == 200
        with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
            assert b"fleetlens_hub_refused_requests_total" in response.read()


def test_store_outage_during_scraping_loses_and_duplicates_nothing_across_a_restart(store, tmp_path, fleet):
    outage = Outage(store)
    hub = make_hub(outage, tmp_path, fleet)
    scrape(hub)  # store up
    outage.down = True
    for _ in range(3):  # store down: batches go to the spool
        scrape(hub)
    assert hub.writer.spool.pending_entries > 0
    hub.writer.close()  # the hub restarts while the store is still down; the spool stays on disk

    outage.down = False
    restarted = make_hub(outage, tmp_path, fleet)
    scrape(restarted)
    restarted.writer.close()  # flushes: replays the spool in order, then the new batch
    assert restarted.writer.spool.pending_entries == 0

    per_scrape = store.query(
        "SELECT ts, count() FROM metrics WHERE node = 'vela-001' AND metric = 'DCGM_FI_DEV_GPU_TEMP' "
        "GROUP BY ts"
    ).rows
    assert len(per_scrape) == 5  # every scrape stored
    assert {count for _, count in per_scrape} == {8}  # and exactly once
    statuses = store.query("SELECT count() FROM targets").rows
    assert statuses == [(15,)]


def post_raw(url: str, path: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(url + path, data=body, headers={"Content-Type": JSON}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth):
        value = [value]
    return value


def test_a_silence_that_cannot_work_is_refused_at_the_door(served):
    _, url = served
    now = time.time()
    bad = SilenceRow("s-1", json.dumps([["node", "=~", "("]]), now, now + 3600, "sre", "cable swap", now)
    with pytest.raises(StoreRejected, match=r'rows\[0\]: matchers\[0\]: matcher node=~"\(": not a regular'):
        HubClient(url).insert_silences([bad], token="t")
    assert commands.stored_silences(HubClient(url)) == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"sql": 5}, "sql: expected a string, got a number"),
        ({"sql": ["SELECT 1"]}, "sql: expected a string, got an array"),
        ({"sql": "SELECT 1", "max_rows": 1e400}, "max_rows: expected a positive integer, got a number"),
        ({"sql": "SELECT 1", "max_rows": True}, "max_rows: expected a positive integer, got a boolean"),
        ({"sql": "SELECT 1", "max_rows": 0}, "max_rows: expected a positive integer"),
        ({"sql": "SELECT 1", "parameters": [1]}, "parameters: expected an object"),
        ({"sql": "SELECT {x:String}", "parameters": {"x": {"y": 1}}}, "parameters.x: expected a string"),
        ({"sql": "SELECT 1", "limit": 1}, "unknown field(s) limit"),
        ({"sql": "SELECT 1", "parameters": {"x": nested(40)}}, "nested more than 32"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_query_requests_are_400s_naming_the_field(served, body, message):
    _, url = served
    status, answer = post_raw(url, "/api/v1/sql", json.dumps(body).encode())
    assert status == 400 and message in json.loads(answer)["error"], answer


def test_very_deep_json_and_a_negative_length_are_400s(served):
    _, url = served
    assert post_raw(url, "/api/v1/sql", b"[" * 100_000)[0] == 400
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /api/v1/sql HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.0 400")


def test_unknown_paths_count_under_one_label_and_cannot_forge_log_lines(served, caplog):
    _, url = served
    caplog.set_level(logging.INFO, logger="fleetlens.hub")
    for index in range(30):
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{url}/probe-{index}", timeout=5)
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{url}/x%0A2026-12-01%20INFO%20fleetlens.hub:%20all%20is%20well", timeout=5)
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        exposition = response.read().decode().splitlines()
    refused = [line for line in exposition if "refused_requests_total{" in line]
    assert refused == ['fleetlens_hub_refused_requests_total{endpoint="other",status="404"} 31']
    assert not any("\n" in record.getMessage() for record in caplog.records)
    assert any("/x\\x0a2026-12-01" in record.getMessage() for record in caplog.records)


def test_healthz_says_when_the_store_refuses_writes_and_logs_each_change_once(store, tmp_path, fleet, caplog):
    outage = Outage(store)
    hub = make_hub(outage, tmp_path, fleet)
    with on_loopback(hub) as url:
        scrape(hub)
        assert urllib.request.urlopen(url + "/healthz", timeout=5).read() == b"ok\n"
        outage.down = True
        for _ in range(3):
            scrape(hub)
        with pytest.raises(urllib.error.HTTPError) as unhealthy:
            urllib.request.urlopen(url + "/healthz", timeout=5)
        assert unhealthy.value.code == 503
        assert "the store refuses writes since" in (said := unhealthy.value.read().decode())
        assert "store down for the test" in said and "batches spooled" in said
        outage.down = False
        deadline = time.monotonic() + 20
        while hub.health() is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert urllib.request.urlopen(url + "/healthz", timeout=5).read() == b"ok\n"
    said = [r.getMessage() for r in caplog.records if r.name == "fleetlens.hub.writer"]
    assert sum("the store refuses writes" in message for message in said) == 1, said
    assert sum("takes writes again" in message for message in said) == 1, said


@pytest.mark.timing
def test_two_long_queries_cost_ingest_no_interval(fleet, tmp_path):
    """Queries run on read sessions of their own: a scrape round never waits for them."""
    (tmp_path / "targets.json").write_text(json.dumps(fleet[:2]))  # the two exporters that answer
    flags = ("--targets", str(tmp_path / "targets.json"), "--interval-s", "1")
    with hub_process(tmp_path, *flags, env={"FLEETLENS_HUB_QUERY_MAX_SECONDS": "8"}) as hub:
        url = hub.url
        time.sleep(3)
        start = time.time()
        queries = [
            threading.Thread(
                target=post_raw,
                args=(url, "/api/v1/sql", json.dumps({"sql": LONG_QUERY}).encode()),
            )
            for _ in range(2)
        ]
        for query in queries:
            query.start()
        for query in queries:
            query.join()
        took = time.time() - start
        time.sleep(3)
        end = time.time() - 2  # the last round may be on its way in
        time.sleep(TARGETS_HOLD_S)  # and the statuses of the rounds before `end` held that long
        rows = (
            HubClient(url)
            .query("SELECT node, toUnixTimestamp64Milli(ts) / 1000 FROM targets WHERE up ORDER BY node, ts")
            .rows
        )
    assert 7 < took < 14  # both ran, side by side, until the hub's limit stopped them
    for node in ("vela-001", "vela-002"):
        stamps = [start, *(ts for name, ts in rows if name == node and start <= ts < end), end]
        ticks = {int(ts) for ts in stamps[1:-1]}
        assert len(ticks) >= int(end - start) - 1, (node, sorted(ticks))
        assert max(b - a for a, b in itertools.pairwise(stamps)) < 2.5, (node, stamps)


class SlowStore:
    """The real store, taking `delay_s` longer over every batch of samples: a store falling behind."""

    def __init__(self, store: object, delay_s: float) -> None:
        self.store = store
        self.delay_s = delay_s

    def insert_samples(self, batches, *, token: str) -> int:
        time.sleep(self.delay_s)
        return self.store.insert_samples(batches, token=token)

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)


def run_hub_on_slow_store(store, tmp_path, fleet, delay_s: float, pending_rounds: int) -> Hub:
    """A hub scraping one target every second for 7 s into a store `delay_s` slower per insert, closed."""
    (tmp_path / "targets.json").write_text(json.dumps(fleet[:1]))
    scraper = Scraper(TargetsFile(tmp_path / "targets.json").current, interval_s=1, timeout_s=0.5)
    writer = Writer(SlowStore(store, delay_s=delay_s), Spool(tmp_path / "spool", 64 << 20))
    hub = Hub(store.session(), writer, OtlpStepReceiver(), scraper, pending_rounds=pending_rounds)
    hub.start()
    time.sleep(7)
    hub.close()  # what waits is written, the spooled rounds replayed, before it returns
    return hub


def assert_every_round_stored_whole(store) -> None:
    stamps = [
        ts for (ts,) in store.query("SELECT toUnixTimestamp64Milli(ts) / 1000 FROM targets ORDER BY ts").rows
    ]
    assert len(stamps) >= 6 and max(b - a for a, b in itertools.pairwise(stamps)) < 1.5, stamps
    per_scrape = store.query("SELECT ts, count() FROM samples GROUP BY ts").rows
    assert len(per_scrape) == len(stamps) and len({count for _, count in per_scrape}) == 1  # each whole


@pytest.mark.timing
def test_a_store_that_falls_behind_takes_the_rounds_that_waited_in_one_insert(store, tmp_path, fleet):
    hub = run_hub_on_slow_store(store, tmp_path, fleet, delay_s=1.5, pending_rounds=10)
    assert hub.rounds.coalesced > 0 and hub.rounds.deferred == 0  # caught up without the spool
    assert_every_round_stored_whole(store)


@pytest.mark.timing
def test_a_store_that_falls_far_behind_never_holds_up_the_scrape_loop(store, tmp_path, fleet):
    hub = run_hub_on_slow_store(store, tmp_path, fleet, delay_s=3, pending_rounds=1)
    assert hub.rounds.deferred > 0  # rounds past the one allowed to wait went to the spool
    assert_every_round_stored_whole(store)


def test_the_hub_rolls_finished_minutes_and_hours_into_the_rollups_when_it_starts(store, tmp_path):
    hour = (time.time() // 3600 - 3) * 3600  # an hour that ended long enough ago to be rolled up
    batches = [
        ScrapeBatch(
            "vela-001:9400", "vela-001", hour + minute * 60, ["DCGM_FI_DEV_GPU_TEMP"], [{"gpu": "0"}], [v]
        )
        for minute, v in enumerate((50.0, 70.0, 60.0))
    ]
    store.insert_samples(batches, token="an-old-hour")
    hub = Hub(store.session(), Writer(store, Spool(tmp_path / "spool", 1 << 20)), OtlpStepReceiver())
    hub.start()
    deadline = time.monotonic() + 30
    while not (rows := store.query("SELECT min, max, avg, last, count FROM metrics_1h").rows):
        assert time.monotonic() < deadline, "no hour rolled up"
        time.sleep(0.2)
    hub.close()
    assert rows == [(50.0, 70.0, 60.0, 60.0, 3)]
    assert store.query("SELECT count(), sum(count) FROM samples_1m").rows == [(3, 3)]


def test_a_hub_process_that_cannot_start_fails_its_test_with_the_hubs_own_words(tmp_path: Path):
    """The shared test hub (tests.support.hubserver): a hub that exits at once (a DSN it cannot use) is
    reported with its log, which names the problem, not as a bare timeout."""
    failed = pytest.raises(RuntimeError, match=r"(?s)fleetlens hub did not start.*postgres://db/fleet")
    with failed, hub_process(tmp_path, store="postgres://db/fleet"):
        pass

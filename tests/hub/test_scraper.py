"""The scraper against real HTTP servers on loopback: our exporter, fixed bodies, a hung one, a 500, a closed
port, and hostile ones (silent, slow-loris, a million series, slow to parse, a series sent three times) that
must cost only themselves; the file_sd targets file as it changes and breaks; shards that split a fleet
exactly."""

from __future__ import annotations

import contextlib
import functools
import gc
import gzip
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from analytics.store.records import ScrapeBatch, TargetStatus
from bench.hostile_targets import body_server, series_body, serving, silent, slow_body, slow_loris
from collectors import registry
from collectors.base import CollectorOptions
from collectors.exporter import Exporter, make_registry, serve
from hub.errors import ScrapeError, ScraperConfigError
from hub.expfmt import ExpositionParser
from hub.scraper import Scraper
from hub.targets import Shard, Target, TargetsFile, parse_targets
from hub.targetsession import ScrapeLimits, gunzip_scraped
from tests.support.peers import free_port, hung_listener

BODY = (
    b'# TYPE fleetlens_test_value gauge\nfleetlens_test_value{gpu="0"} 1\nfleetlens_test_value{gpu="1"} 2\n'
)


class _FixedBody(BaseHTTPRequestHandler):
    """Answers every GET with the server's (status, body, headers), keeping HTTP/1.1 connections alive."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_GET(self) -> None:
        status, body, headers = self.server.reply
        self.send_response(status)
        for header in {"Content-Type": "text/plain; version=0.0.4", **headers}.items():
            self.send_header(*header)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def fixed_target(
    body: bytes, status: int = 200, headers: dict[str, str] | None = None
) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FixedBody)
    server.daemon_threads = True
    server.handle_error = lambda request, client: None  # a scraper hanging up early is not news here
    server.reply, server.connections = (status, body, headers or {}), 0
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def address(server: ThreadingHTTPServer) -> str:
    return f"127.0.0.1:{server.server_port}"


def by_target(statuses: list[TargetStatus]) -> dict[str, TargetStatus]:
    return {status.target: status for status in statuses}


@pytest.mark.timing
def test_failed_targets_are_recorded_and_hold_up_no_one(fixtures: Path) -> None:
    e2e = (fixtures / "node_exporter" / "e2e-output.txt").read_bytes()
    expected_samples = sum(len(f.samples) for f in text_string_to_metric_families(e2e.decode()))
    closed = f"127.0.0.1:{free_port()}"
    with (
        fixed_target(e2e) as good,
        fixed_target(b"boom\n", status=500) as failing,
        hung_listener() as hung1,
        hung_listener() as hung2,
        hung_listener() as hung3,
    ):
        targets = [Target(a) for a in (address(good), address(failing), closed, hung1, hung2, hung3)]
        with Scraper(lambda: targets, interval_s=1, timeout_s=0.5) as scraper:
            for _ in range(2):  # failed targets are tried again the next round
                start = time.monotonic()
                batches, statuses = scraper.scrape_once()
                elapsed = time.monotonic() - start
                assert elapsed < 1.0, "three hung targets cost one timeout, not three"
                status = by_target(statuses)
                assert len(statuses) == 6
                assert status[address(good)].up and status[address(good)].samples == expected_samples
                assert [batch.target for batch in batches] == [address(good)]
                assert len(batches[0]) == expected_samples
                assert not status[address(failing)].up
                assert status[address(failing)].error == "HTTP 500 Internal Server Error"
                assert status[closed].error == "connection refused"
                for hung in (hung1, hung2, hung3):
                    assert status[hung].error == "deadline of 0.5 s exceeded while waiting for the response"
                    assert status[hung].samples == 0
                    assert 0.4 < status[hung].duration_s < 1.0


@pytest.fixture
def our_exporter(procfs_sys: Path) -> Iterator[str]:
    """Our exporter, in-process, with 8 simulated GPUs on procfs's /sys tree."""
    options = CollectorOptions(sysfs_root=procfs_sys, gpu_backend="sim", node="vm-7")
    exporter = Exporter(registry.build(registry.resolve(), options))
    server = serve(make_registry(exporter, process_metrics=False), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    exporter.close()


def test_scrapes_our_exporter_into_batches_for_its_node(our_exporter: str) -> None:
    with urllib.request.urlopen(f"http://{our_exporter}/metrics", timeout=10) as response:
        served = ExpositionParser().parse(response.read().decode())
    expected = {
        (name, frozenset(labels.items())) for name, labels in zip(served.names, served.labels, strict=True)
    }
    nic_values = {
        (name, frozenset(labels.items())): value
        for name, labels, value in zip(served.names, served.labels, served.values, strict=True)
        if name.startswith("node_infiniband")  # read from the fixture tree: the same every scrape
    }
    target = Target(our_exporter, {"node": "vela-001", "cluster": "vela"})
    with Scraper(lambda: [target], clock=lambda: 1_700_000_000.5) as scraper:
        for _ in range(2):  # the exporter closes each connection (HTTP/1.0): the next round reconnects
            (batch,), (status,) = scraper.scrape_once()
            assert status.up and status.node == batch.node == "vela-001"
            assert status.ts == batch.ts == 1_700_000_000.5
            assert len(batch) == status.samples == len(expected) > 400
            assert all(labels.pop("cluster") == "vela" for labels in map(dict, batch.labels))
            got = {
                (name, frozenset((k, v) for k, v in labels.items() if k != "cluster")): value
                for name, labels, value in zip(batch.names, batch.labels, batch.values, strict=True)
            }
            assert got.keys() == expected
            assert nic_values and all(got[key] == value for key, value in nic_values.items())
        assert scraper.types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"


def test_keeps_one_connection_per_target_across_rounds() -> None:
    with fixed_target(BODY) as server, Scraper(lambda: [Target(address(server))]) as scraper:
        for _ in range(3):
            _, (status,) = scraper.scrape_once()
            assert status.up and status.samples == 2
        assert server.connections == 1


def test_the_loop_freezes_the_collector_once_when_every_target_sends_steady_bodies() -> None:
    """The caches of a fleet's series are moved out of the garbage collector's walks after the first round
    whose bodies all took the values-only path, not before (the first parse fills the caches)."""
    seen: list[tuple[int, bool]] = []
    stop = threading.Event()

    def sink(batches: list[ScrapeBatch], statuses: list[TargetStatus]) -> None:
        assert [status.up for status in statuses] == [True]
        seen.append((gc.get_freeze_count(), scraper._settled))
        if len(seen) == 3:
            stop.set()

    gc.unfreeze()
    try:
        with fixed_target(BODY) as server, Scraper(lambda: [Target(address(server))]) as scraper:
            scraper.run(stop, sink)
    finally:
        gc.unfreeze()
    assert seen[:2] == [(0, False), (0, False)], "the first round parses in full; it settles after the second"
    assert seen[2][0] > 0 and seen[2][1]


def test_a_broken_or_oversized_body_fails_only_its_target() -> None:
    broken = BODY + b'fleetlens_test_value{gpu="2" 3\n'
    comment = b"# " + b"x" * 5000 + b"\n"
    limits = ScrapeLimits(max_body_bytes=4096, max_samples=2)
    with (
        fixed_target(gzip.compress(BODY), headers={"Content-Encoding": "gzip"}) as good,
        fixed_target(broken) as bad,
        fixed_target(BODY + b"x 1\n") as too_many,
        fixed_target(comment) as too_big,
        fixed_target(gzip.compress(comment), headers={"Content-Encoding": "gzip"}) as bomb,
    ):
        targets = [Target(address(s)) for s in (good, bad, too_many, too_big, bomb)]
        with Scraper(lambda: targets, limits=limits) as scraper:
            batches, statuses = scraper.scrape_once()
    status = by_target(statuses)
    assert [(batch.target, batch.values) for batch in batches] == [(address(good), [1.0, 2.0])]
    assert status[address(bomb)].error == "body over max_body_bytes=4096 once decompressed"
    assert status[address(bad)].error.startswith("line 4: ")
    assert 'fleetlens_test_value{gpu="2" 3' in status[address(bad)].error
    assert status[address(too_many)].error == "line 4: sample 3 is over max_samples=2; parsing stopped there"
    assert status[address(too_big)].error == "body over max_body_bytes=4096"


def write(path: Path, groups: object) -> None:
    """Replace the file as config management tools do: a new file renamed over the old one."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(groups) if isinstance(groups, list) else groups)
    temporary.replace(path)


def test_targets_file_is_reread_on_change_and_a_broken_one_keeps_the_last_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "targets.json"
    write(path, [{"targets": ["10.0.0.1:9400"], "labels": {"node": "vela-001"}}])
    targets = TargetsFile(path)
    assert targets.current() == [Target("10.0.0.1:9400", {"node": "vela-001"})]

    write(path, [{"targets": ["10.0.0.1:9400", "10.0.0.2:9400"], "labels": {"rack": "r1"}}])
    assert [(t.address, t.node) for t in targets.current()] == [
        ("10.0.0.1:9400", "10.0.0.1"),
        ("10.0.0.2:9400", "10.0.0.2"),
    ]

    for broken in ('[{"targets": ["10.0.0.3:9400"', '{"targets": []}', [{"targets": ["no-port"]}]):
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="fleetlens.scraper"):
            write(path, broken)
            assert len(targets.current()) == 2
            assert len(targets.current()) == 2
        assert len(caplog.records) == 1, "one message per change, not one per round"
        assert str(path) in caplog.text and "keeping the last good list of 2 targets" in caplog.text

    path.unlink()
    assert len(targets.current()) == 2


def test_targets_file_in_yaml_and_a_broken_first_read_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "targets.yml"
    path.write_text("- targets: ['[::1]:9400', 'gpu-node-7:9400']\n  labels: {cluster: vela}\n")
    assert [(t.address, t.node) for t in TargetsFile(path).current()] == [
        ("[::1]:9400", "::1"),
        ("gpu-node-7:9400", "gpu-node-7"),
    ]
    path.write_text("- targets: [gpu-node-7:9400]\n  labels: {rack: 7}\n")  # 7 is a number, not a string
    with pytest.raises(ScraperConfigError, match=rf"targets file {path}: group 0: labels must map strings"):
        TargetsFile(path)
    with pytest.raises(ScraperConfigError, match=r"missing\.json"):
        TargetsFile(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("groups", "problem"),
    [
        ({"targets": ["a:1"]}, "want a list of target groups"),
        ([{"labels": {}}], "group 0: want"),
        ([{"targets": ["a:1"]}, {"targets": ["a:99999"]}], "group 1: target 'a:99999' is not host:port"),
        ([{"targets": ["a:1/metrics"]}], "is not host:port"),
        ([{"targets": [9400]}], "target 9400 is not a string"),
        ([{"targets": ["a:1"], "label": {}}], "unknown key(s) 'label'"),
    ],
)
def test_bad_target_groups_are_named(groups: object, problem: str) -> None:
    with pytest.raises(ScraperConfigError) as caught:
        parse_targets(groups, "targets.json")
    assert problem in str(caught.value)


FLEET = [Target(f"10.{i // 250}.{i % 250}.1:9400") for i in range(400)]


def test_shards_partition_the_fleet_exactly() -> None:
    for count in (2, 3):
        shards = [{t.address for t in FLEET if Shard(i, count).owns(t)} for i in range(count)]
        assert sum(len(shard) for shard in shards) == len(FLEET)
        assert set().union(*shards) == {t.address for t in FLEET}
        assert all(len(shard) > len(FLEET) / count * 0.8 for shard in shards), "roughly even"


def test_shards_agree_across_processes() -> None:
    """Two hubs are two processes: Python's salted hash() would give each its own split."""
    program = (
        "from hub.targets import Shard, Target\n"
        f"print(sorted(a for a in {[t.address for t in FLEET]!r} if Shard(0, 2).owns(Target(a))))"
    )
    splits = {
        subprocess.run(
            [sys.executable, "-c", program],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert splits == {repr(sorted(t.address for t in FLEET if Shard(0, 2).owns(t))) + "\n"}


def test_a_sharded_scraper_scrapes_only_its_targets() -> None:
    fleet = [Target(f"127.0.0.1:{free_port()}") for _ in range(40)]  # closed ports: refused at once
    scraped = []
    for index in (0, 1):
        with Scraper(lambda: fleet, shard=Shard(index, 2), timeout_s=0.5) as scraper:
            scraped.append({status.target for status in scraper.scrape_once()[1]})
            assert {target.address for target in scraper.targets} == scraped[-1]
    assert scraped[0].isdisjoint(scraped[1]) and scraped[0] | scraped[1] == {t.address for t in fleet}


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"interval_s": 0.5}, "want 1 to 60 seconds"),
        ({"interval_s": 61}, "want 1 to 60 seconds"),
        ({"interval_s": 5, "timeout_s": 6}, "at most the interval"),
    ],
)
def test_interval_and_timeout_are_checked(settings: dict, problem: str) -> None:
    with pytest.raises(ScraperConfigError, match=problem):
        Scraper(list, **settings)


@pytest.mark.parametrize(("index", "count"), [(2, 2), (-1, 2), (0, 0)])
def test_impossible_shards_are_refused(index: int, count: int) -> None:
    with pytest.raises(ScraperConfigError, match=f"shard {index}/{count}"):
        Shard(index, count)


def test_run_scrapes_on_aligned_ticks_until_stopped() -> None:
    rounds: list[tuple[list[ScrapeBatch], list[TargetStatus]]] = []
    stop = threading.Event()

    def sink(batches: list[ScrapeBatch], statuses: list[TargetStatus]) -> None:
        rounds.append((batches, statuses))
        if len(rounds) == 1:
            raise RuntimeError("store hiccup")  # loses this round only
        if len(rounds) == 3:
            stop.set()

    with fixed_target(BODY) as server, Scraper(lambda: [Target(address(server))]) as scraper:
        runner = threading.Thread(target=scraper.run, args=(stop, sink))
        runner.start()
        runner.join(timeout=10)
    assert not runner.is_alive() and len(rounds) == 3
    times = [statuses[0].ts for _, statuses in rounds]
    assert all(ts % 1 < 0.3 for ts in times), f"scrapes start just after whole seconds: {times}"
    assert [round(b - a) for a, b in itertools.pairwise(times)] == [1, 1]
    assert all(len(batches) == 1 and len(batches[0]) == 2 for batches, _ in rounds)


def run_rounds(scraper: Scraper, rounds: int, sink_delay_s: float = 0.0) -> list[list[TargetStatus]]:
    """Scraper.run until the sink has had `rounds` rounds (the sink taking `sink_delay_s` on the first):
    the statuses of each call, of the scrapes that ended in its round, and of the one call after the
    stop, if scrapes were still parsing then."""
    seen: list[list[TargetStatus]] = []
    stop = threading.Event()

    def sink(batches: list[ScrapeBatch], statuses: list[TargetStatus]) -> None:
        seen.append(statuses)
        time.sleep(sink_delay_s if len(seen) == 1 else 0)
        if len(seen) == rounds:
            stop.set()

    runner = threading.Thread(target=scraper.run, args=(stop, sink))
    runner.start()
    runner.join(timeout=rounds * scraper.interval_s + 15)
    assert not runner.is_alive() and rounds <= len(seen) <= rounds + 1
    return seen


@pytest.mark.timing
def test_hostile_targets_cost_only_themselves_on_every_tick(our_exporter: str) -> None:
    """At a 1 s interval with a 1 s timeout, next to a silent target, a slow-loris, a million series and a
    body that takes seconds of CPU to parse, our exporter is scraped at every tick; each hostile target is
    down, every round, for its own reason (the slow body's parse is stopped by its CPU budget, or once it
    has waited its carry_rounds rounds more than its own)."""
    deadline, limit = "deadline of 1 s exceeded while ", "max_samples=10000"
    budget = re.escape("parsing used up its 1 s of CPU time")
    waited = re.escape("deadline of 5 more round(s) exceeded while parsing")  # CARRY_S at 1 s
    stopped = f"({budget}|{waited})"
    with (
        serving(silent) as quiet,
        serving(slow_loris()) as loris,
        serving(body_server(series_body(1_000_000))) as huge,
        serving(body_server(functools.partial(slow_body, 24))) as slow,
    ):
        targets = [Target(our_exporter), *(Target(server.address) for server in (quiet, loris, huge, slow))]
        limits = ScrapeLimits(max_samples=10_000)
        with Scraper(lambda: targets, interval_s=1, timeout_s=1, limits=limits) as scraper:
            rounds = run_rounds(scraper, 6)
    of = {
        target.address: [s for statuses in rounds for s in statuses if s.target == target.address]
        for target in targets
    }
    ours = of[our_exporter]
    assert len(ours) == 6 and all(status.up and status.samples > 400 for status in ours), ours
    gaps = [b.ts - a.ts for a, b in itertools.pairwise(ours)]
    assert all(0.5 < gap < 1.5 for gap in gaps), f"scraped at every tick, none missed: {gaps}"
    assert scraper.ticks_skipped == 0
    for server in (quiet, loris, huge, slow):
        assert len(of[server.address]) >= 5, "each round's scrape ends in it or the next"
        assert not any(status.up for status in of[server.address])
    assert {s.error for s in of[quiet.address] + of[loris.address]} == {deadline + "waiting for the response"}
    over = f"line 10002: sample 10001 is over {limit}; parsing stopped there"
    assert {s.error for s in of[huge.address]} == {over}
    for status in of[slow.address]:
        parsing = re.fullmatch(stopped + r" \(line (\d+)\)", status.error)
        assert parsing and 1 < int(parsing[2]) < 12_000, status.error
    assert min(status.duration_s for status in of[huge.address]) < 0.75, "stopped at the limit, early"


DUPLICATED = b'# TYPE t gauge\nt{gpu="0"} 1\nt{gpu="1"} 2\nt{gpu="0"} 3\nt{ gpu = "0" } 4\n'


def test_a_series_sent_three_times_is_stored_once_with_its_first_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with (
        fixed_target(DUPLICATED) as server,
        Scraper(lambda: [Target(address(server))]) as scraper,
        caplog.at_level(logging.WARNING, logger="fleetlens.scraper"),
    ):
        for round_ in (1, 2):
            (batch,), (status,) = scraper.scrape_once()
            assert status.up and status.samples == len(batch) == 2
            assert batch.labels == [{"gpu": "0"}, {"gpu": "1"}] and batch.values == [1, 2]
            assert scraper.duplicates_dropped == 2 * round_
    assert [record.getMessage() for record in caplog.records] == [
        f"target {address(server)} (127.0.0.1) sends series more than once per body: 2 samples dropped, "
        "the first of each series kept"
    ], "logged once, when the target starts"


def test_a_loop_held_past_a_tick_skips_it_and_fails_no_body_it_had_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parse held where its CPU budget cannot see it (here, before its first step, as another thread
    holding the GIL would hold it) holds the one loop: the ticks it held the loop past are skipped and
    counted, the target is asked once per round, never twice at once, and the body read is not failed
    for time its parse did not use."""
    with (
        serving(body_server(BODY)) as server,
        Scraper(lambda: [Target(server.address)], timeout_s=0.5) as scraper,
    ):
        scraper.scrape_once()
        parser = scraper._sessions[server.address].parser
        parse_steps = parser.parse_steps
        stuck = []

        def stuck_once(text: str, cpu_budget_s: float | None = None) -> object:
            if not stuck:
                stuck.append(text)
                time.sleep(1.7)  # past the next tick's deadline (0.5 s after it)
            return parse_steps(text, cpu_budget_s)

        monkeypatch.setattr(parser, "parse_steps", stuck_once)
        rounds = run_rounds(scraper, 2)
    first, second = (status for statuses in rounds for status in statuses)
    assert first.up and first.error == "", first.error
    assert second.up and round(second.ts - first.ts) == 2 and scraper.ticks_skipped == 1
    assert len(server.requests) == 3, "one request per round"


def test_bodies_read_in_time_are_not_failed_for_time_the_loop_spent_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hub starting gives its scrape loop less CPU than a round of first parses takes (every series new
    to every parser, the store's first inserts holding the GIL on other threads). Here the loop is held
    past its round's deadline as soon as it reads a first body, as the GIL held elsewhere would hold it:
    the bodies read by then, and those that arrived meanwhile, are parsed after it and every scrape of
    both rounds is up; none is failed for time its parse did not use, nor for time the loop was away."""
    held = []
    parse_steps = ExpositionParser.parse_steps

    def held_once(parser: ExpositionParser, text: str, cpu_budget_s: float | None = None) -> object:
        if not held:
            held.append(len(text))
            time.sleep(0.7)  # past the round's deadline (0.5 s), before the next tick's (1.5 s)
        return parse_steps(parser, text, cpu_budget_s)

    monkeypatch.setattr(ExpositionParser, "parse_steps", held_once)
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(fixed_target(series_body(500))) for _ in range(20)]
        targets = [Target(address(server)) for server in servers]
        scraper = stack.enter_context(Scraper(lambda: targets, timeout_s=0.5))
        rounds = run_rounds(scraper, 2)
    statuses = [status for statuses in rounds for status in statuses]
    assert held, "the loop was held"
    assert all(status.up and status.samples == 500 for status in statuses), {s.error for s in statuses}
    ticks = sorted({status.ts for status in statuses})
    assert len(ticks) == 2 and sorted(s.target for s in statuses) == sorted(2 * [t.address for t in targets])


def test_a_body_whose_parse_never_gets_done_ends_down_after_its_carry_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parse that never ends and never uses up its CPU time (here, one that waits between its steps, as
    a loop starved of the GIL would) is carried into carry_rounds more rounds, then reported down; the
    target's later bodies wait for it, one per round, and are parsed once it has ended: none is lost."""
    with (
        serving(body_server(BODY)) as server,
        Scraper(lambda: [Target(server.address)], interval_s=1, timeout_s=0.5) as scraper,
    ):
        parser = ExpositionParser  # the session's parser is made in the first round: patch its class
        parse_steps = parser.parse_steps
        stalled = []

        def stalled_once(self: ExpositionParser, text: str, cpu_budget_s: float | None = None) -> object:
            if stalled:
                return parse_steps(self, text, cpu_budget_s)
            stalled.append(text)
            return never_done()

        def never_done() -> Iterator[int]:
            while True:
                time.sleep(0.005)
                yield 1

        monkeypatch.setattr(parser, "parse_steps", stalled_once)
        rounds = run_rounds(scraper, scraper.carry_rounds + 3)
    statuses = sorted((status for statuses in rounds for status in statuses), key=lambda s: s.ts)
    stuck, *later = statuses
    assert not stuck.up
    assert stuck.error == f"deadline of {scraper.carry_rounds} more round(s) exceeded while parsing (line 1)"
    assert later and all(status.up for status in later), [s.error for s in later]
    assert len(statuses) == len(server.requests), "every body read was parsed or reported, none dropped"
    assert scraper.ticks_skipped == 0


def test_a_sink_that_holds_the_loop_past_a_tick_skips_it_and_counts_it() -> None:
    with fixed_target(BODY) as server, Scraper(lambda: [Target(address(server))], timeout_s=0.5) as scraper:
        rounds = run_rounds(scraper, 2, sink_delay_s=1.7)  # past the next tick's deadline (0.5 s after it)
    first, second = (status for statuses in rounds for status in statuses)
    assert round(second.ts - first.ts) == 2 and scraper.ticks_skipped == 1


def test_targets_going_down_together_make_one_log_line_per_round(caplog: pytest.LogCaptureFixture) -> None:
    closed = [Target(f"127.0.0.1:{free_port()}") for _ in range(5)]
    with (
        caplog.at_level(logging.WARNING, logger="fleetlens.scraper"),
        Scraper(lambda: closed, timeout_s=0.5) as scraper,
    ):
        for _ in range(2):
            scraper.scrape_once()
    (record,) = caplog.records  # the second round: still down, nothing new to say
    message = record.getMessage()
    assert message.startswith(f"5 target(s) went down: {closed[0].address} (127.0.0.1): connection refused, ")
    assert message.endswith("; and 2 more")


@settings(max_examples=60, deadline=None)
@given(body=st.binary(max_size=20_000), level=st.integers(0, 9), cut=st.integers(0, 64))
def test_gzip_bodies_inflate_as_zlib_inflates_them_and_broken_ones_fail_by_name(
    body: bytes, level: int, cut: int
) -> None:
    """The scraper's inflate gives zlib's bytes for any gzip body, within the limit or refused past it,
    and a body cut short or corrupted is a ScrapeError, never another exception."""
    compressed = gzip.compress(body, compresslevel=level)
    limit = max(1, len(body) // 2)
    if len(body) > limit:
        with pytest.raises(ScrapeError, match="once decompressed"):
            gunzip_scraped(compressed, limit)
    assert gunzip_scraped(compressed, len(body)) == zlib.decompressobj(wbits=31).decompress(compressed)
    try:  # cut short: what arrived of the body, or refused
        assert body.startswith(gunzip_scraped(compressed[: len(compressed) - cut], len(body) + 1))
    except ScrapeError as exc:
        assert str(exc).startswith("bad gzip body")
    with contextlib.suppress(ScrapeError):  # corrupted: some bytes or refused, nothing else
        gunzip_scraped(compressed[:10] + bytes([compressed[10] ^ 0xFF]) + compressed[11:], len(body) + 1)

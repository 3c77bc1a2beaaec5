"""The exporter process: guards around collectors, its own metrics, HTTP content negotiation, and
scrapes that arrive together sharing one collection, bounded by --web.max-requests."""

from __future__ import annotations

import contextlib
import gzip
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from collectors import textformat
from collectors.base import ReadErrors
from collectors.exporter import Exporter, SharedCollection, make_registry, scrape_body, serve
from collectors.registry import BuiltCollector
from fleetlens.cli import build_parser
from fleetlens.exporter_cli import _exporter_config
from tests.support.clock import FakeClock


class Healthy:
    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("fleetlens_test_value", "A value.", value=42)


class Broken:
    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("fleetlens_test_partial", "Emitted before the failure.", value=1)
        raise OSError("device vanished")


def built(name: str, collector) -> BuiltCollector:
    return BuiltCollector(name, collector, ReadErrors(name))


@pytest.fixture
def server():
    errors_seen = built("healthy", Healthy())
    errors_seen.errors.report("/sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error", "not a number")
    exporter = Exporter([errors_seen, built("broken", Broken())])
    srv = serve(make_registry(exporter), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[str, bytes, dict[str, str]]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as resp:
        return resp.headers.get_content_type(), resp.read(), dict(resp.headers)


def samples(body: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def test_failing_collector_loses_only_its_own_families(server):
    _, body, _ = get(server + "/metrics")
    got = samples(body.decode())
    assert got[("fleetlens_test_value", ())] == 42
    assert ("fleetlens_test_partial", ()) not in got  # a half-finished collector emits nothing
    assert got[("fleetlens_exporter_collector_success", (("collector", "healthy"),))] == 1
    assert got[("fleetlens_exporter_collector_success", (("collector", "broken"),))] == 0
    assert got[("fleetlens_exporter_collector_duration_seconds", (("collector", "broken"),))] >= 0
    assert got[("fleetlens_exporter_read_errors_total", (("collector", "healthy"),))] == 1
    assert ("process_cpu_seconds_total", ()) in got


def test_openmetrics_on_request_and_gzip(server):
    openmetrics = {"Accept": "application/openmetrics-text; version=1.0.0"}
    content_type, body, _ = get(server + "/metrics", openmetrics)
    assert content_type == "application/openmetrics-text"
    assert body.decode().rstrip().endswith("# EOF")
    _, body, headers = get(server + "/metrics", {"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip"
    assert b"fleetlens_test_value 42" in gzip.decompress(body)


def test_landing_page_and_unknown_paths(server):
    content_type, body, _ = get(server + "/")
    assert content_type == "text/html" and b'href="/metrics"' in body
    with pytest.raises(urllib.error.HTTPError) as info:
        get(server + "/nothing")
    assert info.value.code == 404


def test_head_answers_the_get_headers_without_a_body(server):
    """HEAD /metrics and / as node_exporter answers them: GET's status and headers, a Content-Length
    included, and no body on the wire (read from a raw socket: an HTTP client would skip it, and the next
    answer on a kept-alive connection would start inside it)."""
    host, port = server.removeprefix("http://").split(":")
    for path in ("/metrics", "/"):
        _, got, get_headers = get(server + path)
        with socket.create_connection((host, int(port)), timeout=5) as connection:
            connection.sendall(f"HEAD {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
            answer = b"".join(iter(lambda: connection.recv(65536), b""))
        head, _, body = answer.partition(b"\r\n\r\n")
        status, *lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines)
        assert status.split()[1] == "200" and body == b""
        assert headers["Content-Type"] == get_headers["Content-Type"]
        assert int(headers["Content-Length"]) > 0
        if path == "/":  # /metrics is collected again for the HEAD: its process figures differ a little
            assert int(headers["Content-Length"]) == len(got)


def test_close_reaches_collectors_that_hold_resources():
    closed = []

    class Holder(Healthy):
        def close(self) -> None:
            closed.append(True)

    Exporter([built("holder", Holder()), built("plain", Healthy())]).close()
    assert closed == [True]


def test_text_format_escapes_label_values_and_keeps_label_order():
    family = GaugeMetricFamily("fleetlens_test_info", "Help with \\ and\nnewline.", labels=["z", "a"])
    family.add_metric(['quote " back \\ slash', "line\nbreak"], 1)
    body = textformat.render([family]).decode()
    assert 'fleetlens_test_info{z="quote \\" back \\\\ slash",a="line\\nbreak"} 1' in body
    (parsed,) = text_string_to_metric_families(body)
    assert parsed.samples[0].labels == {"z": 'quote " back \\ slash', "a": "line\nbreak"}
    assert parsed.documentation == "Help with \\ and\nnewline."


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3.0, "3"),
        (-2, "-2"),
        (0.25, "0.25"),
        (1e20, "1e+20"),
        (float("inf"), "+Inf"),
        (-float("inf"), "-Inf"),
    ],
)
def test_values_render_as_prometheus_parses_them(value, text):
    assert textformat.format_value(value) == text
    assert float(text) == value
    assert textformat.format_value(float("nan")) == "NaN"


@pytest.mark.parametrize("command", ["collect", "exporter"])
@pytest.mark.parametrize("make_root", ["missing", "file"])
def test_sysfs_root_that_is_no_directory_is_a_config_error(tmp_path, command, make_root):
    root = tmp_path / "nonexistent"
    if make_root == "file":
        root.write_text("not a sysfs tree\n")
    argv = [
        sys.executable,
        "-m",
        "fleetlens.cli",
        command,
        "--sysfs-root",
        str(root),
        "--gpu-backend",
        "none",
    ]
    if command == "exporter":
        argv += ["--listen", "127.0.0.1:0"]
    # a subprocess with a timeout: an exporter that accepted the root would serve until killed
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "--sysfs-root" in line and str(root) in line
    assert ("does not exist" if make_root == "missing" else "is not a directory") in line
    assert "Traceback" not in done.stderr


class Gate:
    """A collector whose collect() blocks until the test opens the gate, counting its calls: a slow
    collection that the test holds and lets go, with no sleep. Each collection reports its number."""

    def __init__(self) -> None:
        self.calls = 0
        self.opened = threading.Event()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.calls += 1
        number = self.calls
        self.opened.wait(timeout=30)  # a test that never opens it fails rather than hangs
        yield GaugeMetricFamily("fleetlens_test_collection", "Which collection answered.", value=number)


@contextlib.contextmanager
def served(registry: CollectorRegistry, max_requests: int = 40) -> Iterator[tuple[str, SharedCollection]]:
    """The metrics server on a free port: its base URL and the collections its scrapes share."""
    srv = serve(registry, "127.0.0.1", 0, max_requests)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", srv.get_app().shared
    finally:
        srv.shutdown()
        srv.server_close()


def answer(url: str) -> tuple[int, bytes, dict[str, str]]:
    """Status, body and headers of a GET; a 503 is an answer too."""
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout_s:g} s"
        time.sleep(0.005)


def test_parallel_scrapes_share_one_collection_and_get_the_same_body() -> None:
    """Twenty scrapes that arrive while a collection runs wait for it: the collector runs once, all get
    its body; a scrape that comes after it ended starts a new collection (nothing is kept between)."""
    gate = Gate()
    with (
        served(make_registry(Exporter([built("gate", gate)]), process_metrics=False)) as (base, shared),
        ThreadPoolExecutor(20) as pool,
    ):
        scrapes = [pool.submit(answer, base + "/metrics") for _ in range(20)]
        wait_until(lambda: shared.in_flight == 20, "20 scrapes in flight")
        assert gate.calls == 1, "one collection for all of them"
        gate.opened.set()
        answers = [scrape.result() for scrape in scrapes]
        later = answer(base + "/metrics")
    assert {status for status, _, _ in answers} == {200}
    (body,) = {body for _, body, _ in answers}
    assert b"\nfleetlens_test_collection 1\n" in body
    assert later[0] == 200 and b"\nfleetlens_test_collection 2\n" in later[1] and gate.calls == 2


def test_past_max_requests_a_scrape_is_answered_503_naming_the_limit() -> None:
    gate = Gate()
    registry = make_registry(Exporter([built("gate", gate)]), process_metrics=False)
    with served(registry, max_requests=3) as (base, shared), ThreadPoolExecutor(3) as pool:
        scrapes = [pool.submit(answer, base + "/metrics") for _ in range(3)]
        wait_until(lambda: shared.in_flight == 3, "3 scrapes in flight")
        status, body, headers = answer(base + "/metrics")
        gate.opened.set()
        assert [scrape.result()[0] for scrape in scrapes] == [200, 200, 200]
        after = answer(base + "/metrics")[0]
    assert status == 503 and headers["Retry-After"] == "1"
    assert body == b"3 scrapes are in flight, the most --web.max-requests allows; try again later\n"
    assert after == 200 and gate.calls == 2, "the refused scrape ran no collector; a later one does"


def test_no_bound_with_max_requests_0() -> None:
    gate = Gate()
    registry = make_registry(Exporter([built("gate", gate)]), process_metrics=False)
    with served(registry, max_requests=0) as (base, shared), ThreadPoolExecutor(60) as pool:
        scrapes = [pool.submit(answer, base + "/metrics") for _ in range(60)]
        wait_until(lambda: shared.in_flight == 60, "60 scrapes in flight")
        gate.opened.set()
        assert {scrape.result()[0] for scrape in scrapes} == {200} and gate.calls == 1


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
@pytest.mark.parametrize("encoding", ["", "gzip"])
def test_a_shared_scrape_answers_the_exposition_a_direct_one_renders(accept: str, encoding: str) -> None:
    exporter = Exporter([built("healthy", Healthy()), built("broken", Broken())], clock=FakeClock())
    registry = make_registry(exporter, process_metrics=False)
    expected, content_type = scrape_body(registry, accept)
    with served(registry) as (base, _):
        request = urllib.request.Request(
            base + "/metrics", headers={"Accept": accept, "Accept-Encoding": encoding}
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            body, headers = resp.read(), resp.headers
    assert headers["Content-Type"] == content_type
    assert (gzip.decompress(body) if encoding else body) == expected


@pytest.mark.parametrize(
    ("given", "max_requests"), [([], 40), (["--web.max-requests", "7"], 7), (["--web.max-requests", "0"], 0)]
)
def test_web_max_requests_flag_reaches_the_config(given: list[str], max_requests: int) -> None:
    args = build_parser().parse_args(["exporter", *given])
    assert _exporter_config(args, listen=args.listen).web_max_requests == max_requests


def test_a_negative_web_max_requests_is_refused_in_one_line(tmp_path) -> None:
    argv = [sys.executable, "-m", "fleetlens.cli", "exporter", "--web.max-requests", "-1"]
    argv += ["--sysfs-root", str(tmp_path), "--gpu-backend", "none", "--listen", "127.0.0.1:0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert "exporter.web_max_requests" in line and "-1" in line

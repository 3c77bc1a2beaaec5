"""The exporter process: guards around collectors, its own metrics, HTTP content negotiation."""

from __future__ import annotations

import gzip
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from collectors import textformat
from collectors.base import ReadErrors
from collectors.exporter import Exporter, make_registry, serve
from collectors.registry import BuiltCollector


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

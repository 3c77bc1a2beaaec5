"""The gpu collector: dcgm-exporter's names, types and labels, both exposition formats, the shared backend."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from collectors import registry, textformat
from collectors.base import CollectorOptions, ReadErrors
from collectors.errors import GpuBackendError
from collectors.exporter import scrape_body
from collectors.gpu.backend import acquire_backend, release_backend
from collectors.gpu.collector import METRICS, GpuCollector
from collectors.gpu.model import LABELS, THROTTLE_REASONS, GpuReading
from collectors.gpu.nvml import NvmlBackend
from collectors.gpu.sim import ManualClock, SimBackend
from collectors.xid import XidCollector
from tests.support.exposition import samples_of
from tests.support.peers import free_port, peer, require_binary


def dcgm_fields(fixtures: Path) -> dict[str, tuple[str, str]]:
    """Every DCGM_FI_* field in dcgm-exporter's csv files, enabled or commented out, as (type, help);
    an enabled line wins over a commented-out one."""
    enabled: dict[str, tuple[str, str]] = {}
    disabled: dict[str, tuple[str, str]] = {}
    for csv in sorted((fixtures / "dcgm-exporter").glob("*.csv")):
        for line in csv.read_text().splitlines():
            target = disabled if line.startswith("#") else enabled
            parts = [part.strip() for part in line.lstrip("# ").split(",", 2)]
            if len(parts) == 3 and parts[0].startswith("DCGM_FI_"):
                target[parts[0]] = (parts[1], parts[2])
    return {**disabled, **enabled}


def busy_sim(count: int = 8) -> SimBackend:
    """A simulated node under load, every fault that fills an optional field switched on somewhere."""
    clock = ManualClock()
    sim = SimBackend(count=count, seed=3, clock=clock)
    sim.set_load(None, 0.9)
    sim.set_fault(1, "ecc", dbe=2)
    sim.set_fault(2, "pcie_downgrade")
    clock.advance(30)
    return sim


@pytest.fixture
def registry_of_busy_node() -> CollectorRegistry:
    collectors = CollectorRegistry(auto_describe=False)
    collectors.register(GpuCollector(busy_sim(), "vela-001", ReadErrors("gpu")))
    return collectors


def test_every_dcgm_name_is_a_dcgm_exporter_field_with_its_type_and_help(fixtures):
    fields = dcgm_fields(fixtures)
    dcgm = [spec for spec in METRICS if spec.name.startswith("DCGM_")]
    assert len(dcgm) > 20
    for spec in dcgm:
        assert spec.name in fields, spec.name
        assert (spec.kind, spec.help) == fields[spec.name], spec.name
    (last_xid,) = XidCollector("n", ReadErrors("xid"), busy_sim()).collect()
    assert (last_xid.type, last_xid.documentation) == fields[last_xid.name]


def test_names_without_a_dcgm_field_are_fleetlens_ones(fixtures):
    fields = dcgm_fields(fixtures)
    own = [spec.name for spec in METRICS if spec.name not in fields]
    assert own and all(name.startswith("fleetlens_gpu_") for name in own)


def test_labels_are_spelled_and_formatted_as_in_real_dcgm_exporter_output(fixtures):
    excerpt = (fixtures / "dcgm-exporter" / "issue512-h100-mig-metrics-excerpt.prom").read_text()
    real = next(text_string_to_metric_families(excerpt)).samples[0].labels
    assert set(LABELS) <= set(real)
    assert [name for name in real if name in LABELS] == list(LABELS)

    ours = samples_of(GpuCollector(busy_sim(), "vela-001", ReadErrors("gpu")))["DCGM_FI_DEV_GPU_TEMP"]
    assert len(ours) == 8
    for sample in ours:
        assert list(sample.labels) == list(LABELS)
        for name, pattern in {
            "pci_bus_id": r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]",
            "device": r"nvidia\d+",
            "UUID": r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}",
            "gpu": r"\d+",
        }.items():
            assert re.fullmatch(pattern, real[name]), (name, real[name])
            assert re.fullmatch(pattern, sample.labels[name]), (name, sample.labels[name])
        assert sample.labels["Hostname"] == "vela-001"


def test_prometheus_text_format_keeps_dcgm_counter_names_without_total(registry_of_busy_node):
    text = scrape_body(registry_of_busy_node)[0].decode()
    for spec in METRICS:
        assert re.search(rf"^{spec.name}\{{", text, re.MULTILINE), spec.name
        assert f"{spec.name}_total" not in text
        assert f"# TYPE {spec.name} {spec.kind}\n" in text
    assert re.search(r"^DCGM_FI_DEV_PCIE_REPLAY_COUNTER\{.*gpu=\"2\".*\} [1-9]", text, re.MULTILINE)


def test_openmetrics_types_dcgm_counters_as_counters_under_their_own_name(registry_of_busy_node):
    text = generate_openmetrics(registry_of_busy_node).decode()
    assert text.endswith("# EOF\n")
    for spec in METRICS:
        assert f"# TYPE {spec.name} {spec.kind}\n" in text
        assert re.search(rf"^{spec.name}\{{", text, re.MULTILINE), spec.name
        assert f"{spec.name}_total" not in text


class _TwoFormats(BaseHTTPRequestHandler):
    """/text answers in the exporter's text format, /om in OpenMetrics, whatever the Accept header."""

    registry: CollectorRegistry

    def do_GET(self) -> None:
        accept = "application/openmetrics-text" if self.path == "/om" else ""
        body, content_type = scrape_body(self.registry, accept)
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def prometheus_api(base: str, path: str, **params: str) -> list | dict:
    with urllib.request.urlopen(f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=5) as r:
        return json.load(r)["data"]


@pytest.mark.integration
def test_prometheus_ingests_dcgm_counters_under_dcgm_names_from_both_formats(registry_of_busy_node, tmp_path):
    prometheus = require_binary("prometheus")
    handler = type("Handler", (_TwoFormats,), {"registry": registry_of_busy_node})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{server.server_port}"
    jobs = "".join(
        f"  - job_name: {job}\n    metrics_path: /{job}\n    static_configs: [{{targets: ['{target}']}}]\n"
        for job in ("text", "om")
    )
    (tmp_path / "prometheus.yml").write_text(f"global: {{scrape_interval: 1s}}\nscrape_configs:\n{jobs}")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = [
        prometheus,
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    try:
        with peer(args, f"{base}/-/ready"):
            query = "count by (job) (DCGM_FI_DEV_PCIE_REPLAY_COUNTER)"
            deadline = time.monotonic() + 30
            while len(result := prometheus_api(base, "query", query=query)["result"]) < 2:
                assert time.monotonic() < deadline, result
                time.sleep(0.3)
            assert {r["metric"]["job"]: r["value"][1] for r in result} == {"text": "8", "om": "8"}
            renamed = prometheus_api(base, "query", query="DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total")
            assert renamed["result"] == []
            metadata = prometheus_api(base, "targets/metadata", metric="DCGM_FI_DEV_PCIE_REPLAY_COUNTER")
            assert {m["target"]["job"]: m["type"] for m in metadata} == {"text": "counter", "om": "counter"}
    finally:
        server.shutdown()
        server.server_close()


def test_throttle_reason_bits_are_nvmls():
    for reason, bit in THROTTLE_REASONS.items():
        name = "nvmlClocksEventReason" + "".join(word.capitalize() for word in reason.split("_"))
        assert getattr(pynvml, name) == bit, name


def test_backend_none_yields_nothing():
    options = CollectorOptions(gpu_backend="none")
    built = registry.build(["gpu", "xid"], options)
    assert [list(item.collector.collect()) for item in built] == [[], []]
    assert [item.errors.count for item in built] == [0, 0]


def test_nvml_without_a_driver_is_reported_once_and_yields_nothing():
    try:
        NvmlBackend().close()
    except GpuBackendError as error:
        assert "nvmlInit failed" in str(error)
    else:
        pytest.skip("this machine has an NVIDIA driver")
    (gpu,) = registry.build(["gpu"], CollectorOptions(gpu_backend="nvml"))
    assert [list(gpu.collector.collect()) for _ in range(3)] == [[], [], []]
    assert gpu.errors.count == 1
    gpu.collector.close()


def test_collectors_built_from_the_same_options_share_one_backend_with_the_fleet_simulator():
    options = CollectorOptions(gpu_backend="sim", gpu_sim_seed=11, gpu_sim_count=4, node="vela-002")
    built = {item.name: item.collector for item in registry.build(["gpu", "xid"], options)}
    fleet_simulator = acquire_backend(options)
    fleet_simulator.set_fault(2, "gpu_lost")
    up = {s.labels["gpu"]: s.value for s in samples_of(built["gpu"])["fleetlens_gpu_up"]}
    assert up == {"0": 1, "1": 1, "2": 0, "3": 1}
    (lost,) = samples_of(built["xid"])["fleetlens_gpu_xid_errors_total"]
    assert (lost.labels["gpu"], lost.labels["xid"], lost.value) == ("2", "79", 1)

    release_backend(options)
    for collector in built.values():
        collector.close()
    fresh = acquire_backend(options)
    assert fresh is not fleet_simulator
    release_backend(options)


class _BrokenBackend(SimBackend):
    def read(self) -> list:
        raise GpuBackendError("NVML: nvmlDeviceGetCount failed: Unknown Error")


def test_a_backend_that_fails_as_a_whole_is_reported_and_the_scrape_goes_on():
    errors = ReadErrors("gpu")
    assert list(GpuCollector(_BrokenBackend(), "n", errors).collect()) == []
    assert errors.count == 1


class StandingReadings:
    """A backend whose readings are whatever the test last set (the poller's, between two passes)."""

    def __init__(self, readings: list[GpuReading]) -> None:
        self.readings = readings

    def read(self) -> list[GpuReading]:
        return self.readings


def exposition(collector: GpuCollector) -> bytes:
    return textformat.render(list(collector.collect()))


def test_standing_readings_yield_the_same_families_and_text_and_new_ones_new():
    sim = busy_sim()
    backend = StandingReadings(sim.read())
    collector = GpuCollector(backend, "vela-001", ReadErrors("gpu"))
    first, second = list(collector.collect()), list(collector.collect())
    assert [family is again for family, again in zip(first, second, strict=True)] == [True] * len(first)
    assert exposition(collector) == exposition(collector)
    reading = backend.readings[0]
    backend.readings = [
        replace(reading, sample=replace(reading.sample, gpu_temp_c=91.0)),
        *backend.readings[1:],
    ]
    changed = list(collector.collect())
    assert not set(map(id, changed)) & set(map(id, first))
    temperatures = samples_of(collector)["DCGM_FI_DEV_GPU_TEMP"]
    assert [sample.value for sample in temperatures if sample.labels["gpu"] == "0"] == [91.0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.0, 1.0, 30.0]), min_size=1, max_size=8), st.integers(0, 7))
def test_a_long_lived_collector_renders_what_a_fresh_one_renders(steps, faulty):
    """Whatever reuse happens between scrapes, the exposition is the one a new collector would write."""
    clock = ManualClock()
    sim = SimBackend(count=8, seed=5, clock=clock)
    backend = StandingReadings([])
    lived = GpuCollector(backend, "vela-001", ReadErrors("gpu"))
    for number, step in enumerate(steps):
        clock.advance(step)
        if number == len(steps) // 2:
            sim.set_fault(faulty, "ecc", dbe=1)
        if step:
            backend.readings = sim.read()
        fresh = GpuCollector(StandingReadings(backend.readings), "vela-001", ReadErrors("gpu"))
        assert exposition(lived) == exposition(fresh)

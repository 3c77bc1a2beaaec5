"""Latency profiles (collectors.gpu.latency): the H200's measured costs, read from the fixture the real GPU
wrote and from the profile fleetlens ships, and a replay that pays them call by call.

Delays are recorded through the injected sleep, so these tests assert what each call pays, not how long
the machine took: the machine that runs them is shared and noisy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from collectors.errors import GpuBackendError
from collectors.gpu.latency import H200_PROFILE, Slowed, load_profile, pynvml_function
from collectors.gpu.nvml import CADENCES, POLLED, SAMPLED, NvmlBackend
from collectors.gpu.replay import load_capture
from fleetlens.config import ExporterConfig
from fleetlens.errors import ConfigError
from tests.collectors.gpu.test_replay import fleetlens

MEASURED = "h200-passthrough/nvml-call-latency.txt"
CAPTURE = "h200-passthrough/nvidia-smi-q.idle.txt"
REAL_SCRAPE = "h200-passthrough/fleetlens-collect.nvml.idle.prom"


class SleepRecorder:
    """Stands in for time.sleep: what each call would have waited, in order."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)


def slowed_backend(fixtures: Path, pick: str = "median") -> tuple[NvmlBackend, SleepRecorder]:
    recorder = SleepRecorder()
    delays = load_profile(H200_PROFILE).delays_s(pick)
    return NvmlBackend(nvml=Slowed(load_capture(fixtures / CAPTURE), delays, sleep=recorder)), recorder


def test_the_shipped_profile_is_the_one_measured_on_the_h200(fixtures):
    measured = load_profile(fixtures / MEASURED)
    shipped = load_profile(H200_PROFILE)
    assert shipped.costs == measured.costs
    assert "580.159.04" in shipped.source
    throughput = shipped.costs["nvmlDeviceGetPcieThroughput"]  # TX and RX: the slower of the two
    assert (throughput.median_ms, throughput.max_ms) == (21.049, 21.357)


def test_each_call_pays_its_cost_and_a_failing_one_pays_too(fixtures):
    backend, recorder = slowed_backend(fixtures)
    assert recorder.slept == [pytest.approx(0.00906)]  # nvmlInit
    recorder.slept.clear()
    read = backend.read_device(0, {SAMPLED})
    assert "pcie_tx_bytes_per_second" in read.values[SAMPLED]
    # TX, RX at 21.049 ms; the energy counter the capture cannot answer still costs 3.147 ms
    assert sorted(recorder.slept) == pytest.approx([0.003147, 0.021049, 0.021049])


def test_at_max_every_call_pays_the_slowest_it_was_seen(fixtures):
    backend, recorder = slowed_backend(fixtures, "max")
    recorder.slept.clear()
    backend.read_device(0, {POLLED})
    assert max(recorder.slept) == pytest.approx(0.003583)  # power usage at its worst
    assert len(recorder.slept) > 10


def test_a_replayed_scrape_that_reads_nvml_itself_pays_what_the_real_one_took(fixtures):
    """The synchronous read, the way the exporter read before its poller, costs the replay at least the
    two PCIe throughput calls and at most the gpu collector's whole duration on the real GPU."""
    backend, recorder = slowed_backend(fixtures)
    recorder.slept.clear()
    backend.read_device(0, set(CADENCES))
    real = {
        sample.labels.get("collector"): sample.value
        for family in text_string_to_metric_families((fixtures / REAL_SCRAPE).read_text())
        for sample in family.samples
        if sample.name == "fleetlens_exporter_collector_duration_seconds"
    }
    assert 2 * 0.021049 < sum(recorder.slept) <= real["gpu"]


def test_a_call_the_profile_does_not_name_or_below_a_sleeps_resolution_answers_at_once(fixtures):
    recorder = SleepRecorder()
    delays = {"nvmlDeviceGetPcieThroughput": 0.02, "nvmlDeviceGetCount": 1e-6}
    nvml = Slowed(load_capture(fixtures / CAPTURE), delays, sleep=recorder)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(nvml.nvmlDeviceGetCount() - 1)
    assert recorder.slept == []
    nvml.nvmlDeviceGetPcieThroughput(handle, nvml.NVML_PCIE_UTIL_TX_BYTES)
    assert recorder.slept == [0.02]


@pytest.mark.parametrize(
    ("name", "function"),
    [
        ("GetPcieThroughput_TX", "nvmlDeviceGetPcieThroughput"),
        ("GetClockInfo_SM", "nvmlDeviceGetClockInfo"),
        ("GetNvLinkState0", "nvmlDeviceGetNvLinkState"),
        ("GetSamples_GPU_UTIL", "nvmlDeviceGetSamples"),
        ("nvmlInit", "nvmlInit"),
        ("GetNoSuchThing", None),
        ("system", None),
        ("__import__", None),
    ],
)
def test_names_are_real_pynvml_functions_or_refused(name, function):
    assert pynvml_function(name) == function


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("GetPowerUsage median 1 max 0.5\n", ":1: max 0.5 ms is below the median 1 ms"),
        ("GetPowerUsage median nan max 1\n", ":1: 'nan' is not a delay in ms"),
        ("GetPowerUsage median -1 max 1\n", ":1: '-1' is not a delay in ms"),
        ("\nGetPowerUsage median 1e9 max 1e9\n", ":2: '1e9' is not a delay in ms"),
        ("GetPowerUsage\n", ":1: expected `NAME median MS max MS` or `NAME MS`"),
        ("GetFanciness median 1 max 2\n", "'GetFanciness' names no pynvml function"),
        ('{"calls": []}', 'expected an object with "calls"'),
        ('{"calls": {"GetPowerUsage": {"median_ms": 1}}}', 'calls.GetPowerUsage: expected {"median_ms"'),
        ('{"calls": {"GetPowerUsage": {"median_ms": true, "max_ms": 1}}}', "True is not a delay in ms"),
        ("{" * 100_000, "not JSON"),
    ],
)
def test_a_bad_profile_is_refused_naming_file_and_line(tmp_path, text, problem):
    path = tmp_path / "profile"
    path.write_text(text)
    with pytest.raises(GpuBackendError) as raised:
        load_profile(path)
    assert str(raised.value).startswith(str(path)) and problem in str(raised.value)


def test_a_missing_binary_or_fifo_profile_is_refused_naming_it_without_waiting(tmp_path):
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    os.mkfifo(tmp_path / "fifo")  # nobody writes it: reading would wait for ever
    problems = {"absent": "cannot read", "binary": "not UTF-8", "fifo": "not a regular file"}
    for name, problem in problems.items():
        with pytest.raises(GpuBackendError, match=f"^{re.escape(str(tmp_path / name))}: {problem}"):
            load_profile(tmp_path / name)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_load_or_fail_naming_the_file(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("profile") / "profile"
    path.write_bytes(data)
    try:
        profile = load_profile(path)
    except GpuBackendError as error:
        assert str(error).startswith(str(path))
    else:
        assert all(0 <= cost.median_ms <= cost.max_ms for cost in profile.costs.values())


def test_the_json_profile_round_trips_what_the_text_said(tmp_path, fixtures):
    measured = load_profile(fixtures / MEASURED)
    document = {
        "calls": {
            name.removeprefix("nvmlDevice"): {"median_ms": cost.median_ms, "max_ms": cost.max_ms}
            for name, cost in measured.costs.items()
        }
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    assert load_profile(path).costs == measured.costs


def test_a_latency_profile_belongs_to_a_replay_and_picks_median_or_max(tmp_path):
    with pytest.raises(ConfigError, match=r"exporter\.gpu_replay_latency: .*replay:FILE backends only"):
        ExporterConfig(gpu_backend="nvml", gpu_replay_latency=H200_PROFILE)
    with pytest.raises(ConfigError, match=r"exporter\.gpu_replay_latency_pick: expected median or max"):
        ExporterConfig(gpu_backend=f"replay:{tmp_path}/c", gpu_replay_latency_pick="p99")
    with pytest.raises(ConfigError, match=r"exporter\.gpu_poll_interval_s: must be between"):
        ExporterConfig(gpu_poll_interval_s=0)


def test_what_the_measuring_script_prints_is_a_profile_the_replay_reads(fixtures, tmp_path):
    """bench/nvml_latency.py, the script that measures a real GPU, run on the H200 capture's replay."""
    script = Path(__file__).resolve().parents[3] / "bench" / "nvml_latency.py"
    printed = subprocess.run(
        [sys.executable, str(script), "--replay", str(fixtures / CAPTURE), "--repeat", "2"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    path = tmp_path / "measured.txt"
    path.write_text(printed)
    measured = load_profile(path)
    assert {"nvmlInit", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetTotalEnergyConsumption"} <= set(
        measured.costs
    )
    assert "NVMLError_NotSupported" in printed  # the energy counter the capture cannot answer, timed too


def test_collect_with_a_bad_profile_stops_naming_file_and_line(fixtures, tmp_path):
    profile = tmp_path / "profile.txt"
    profile.write_text("GetPowerUsage median 2 max 1\n")
    result = fleetlens(
        "collect", "--gpu-backend", f"replay:{fixtures / CAPTURE}", "--gpu-replay-latency", str(profile)
    )
    assert result.returncode == 1
    assert f"{profile}:1: max 1 ms is below the median 2 ms" in result.stderr


def test_collect_at_the_h200_prices_prints_what_the_capture_holds(fixtures):
    at_once = fleetlens("collect", "--gpu-backend", f"replay:{fixtures / CAPTURE}", "--node", "vm")
    paid = fleetlens(
        "collect",
        "--gpu-backend",
        f"replay:{fixtures / CAPTURE}",
        "--node",
        "vm",
        "--gpu-replay-latency",
        str(H200_PROFILE),
        "--gpu-replay-latency-pick",
        "max",
    )
    assert paid.returncode == at_once.returncode == 0
    values = [gpu_values(result.stdout) for result in (at_once, paid)]
    assert values[0] == values[1] and len(values[0]) >= 38


def gpu_values(exposition: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The GPU series' values but their ages, by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if "gpu" in sample.labels and sample.name != "fleetlens_gpu_reading_age_seconds"
    }

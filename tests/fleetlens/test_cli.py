"""The `fleetlens` command as an operator runs it: one-shot collection and configuration errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.peers import free_port


def fleetlens(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_collect_once_prints_one_exposition(procfs_sys):
    result = fleetlens(
        "collect", "--once", "--gpu-backend", "sim", "--sysfs-root", str(procfs_sys), "--node", "vela-007"
    )
    assert result.returncode == 0, result.stderr
    families = {f.name: f for f in text_string_to_metric_families(result.stdout)}
    assert {s.labels["Hostname"] for s in families["DCGM_FI_DEV_SM_CLOCK"].samples} == {"vela-007"}
    assert {s.labels["device"] for s in families["node_infiniband_info"].samples} == {
        "hfi1_0",
        "mlx4_0",
        "mlx5_0",
    }
    success = {
        s.labels["collector"]: s.value for s in families["fleetlens_exporter_collector_success"].samples
    }
    assert set(success.values()) == {1.0}, success


def test_collect_openmetrics(procfs_sys):
    result = fleetlens(
        "collect", "--once", "--openmetrics", "--gpu-backend", "none", "--sysfs-root", str(procfs_sys)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("# EOF")


def test_collectors_can_be_disabled_by_name(procfs_sys):
    result = fleetlens(
        "collect",
        "--gpu-backend",
        "sim",
        "--sysfs-root",
        str(procfs_sys),
        "--disable-collector",
        "infiniband",
    )
    assert result.returncode == 0, result.stderr
    assert "node_infiniband_" not in result.stdout
    assert "DCGM_FI_DEV_SM_CLOCK" in result.stdout


def test_unknown_collector_is_refused_with_the_known_names():
    result = fleetlens("collect", "--enable-collector", "bogus")
    assert result.returncode == 2
    assert "unknown collector(s) bogus" in result.stderr and "infiniband" in result.stderr


def test_broken_config_file_is_refused_naming_file_and_key(tmp_path):
    config = tmp_path / "exporter.yaml"
    config.write_text("exporter:\n  gpu_backend: cuda\n")
    result = fleetlens("collect", "--config", str(config))
    assert result.returncode == 2
    assert (
        f"config file {config}: exporter.gpu_backend: 'cuda' is not one of nvml, sim, none" in result.stderr
    )


def test_environment_selects_backend(procfs_sys):
    env = {**os.environ, "FLEETLENS_EXPORTER_GPU_BACKEND": "sim", "FLEETLENS_EXPORTER_GPU_SIM_COUNT": "2"}
    result = subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", "collect", "--sysfs-root", str(procfs_sys)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    gpus = {
        s.labels["gpu"]
        for f in text_string_to_metric_families(result.stdout)
        if f.name == "DCGM_FI_DEV_SM_CLOCK"
        for s in f.samples
    }
    assert gpus == {"0", "1"}


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("hub", "--config", "{binary}", "--detectors", "none"), "not UTF-8 text"),
        (
            ("hub", "--store", "http://db:notaport/fleet", "--detectors", "none"),
            "DSN 'http://db:notaport/fleet'",
        ),
        (("hub", "--store", "postgres://db/fleet", "--detectors", "none"), "DSN 'postgres://db/fleet'"),
        (("query", "SELECT 1", "--hub", "notaurl"), "hub URL 'notaurl'"),
        (("query", "SELECT 1", "--hub", "http://[::1"), "hub URL 'http://[::1'"),
        (("hub", "--token-file", "{tokens}", "--detectors", "none"), "{tokens}:2: unknown scope(s) admin"),
    ],
)
def test_bad_config_and_flags_are_one_line_and_exit_2(tmp_path, args, named):
    binary, tokens = tmp_path / "fleetlens.yaml", tmp_path / "tokens"
    binary.write_bytes(b"hub:\n  store: \xff\xfe\x00\x00chdb")
    tokens.write_text("read r-token\nadmin a-token\n")
    tokens.chmod(0o600)
    filled = [arg.format(binary=binary, tokens=tokens) for arg in args]
    result = subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", *filled],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert named.format(tokens=tokens) in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "a-token" not in result.stderr  # a token file's error never shows a token


def test_a_store_password_is_never_printed(tmp_path):
    port = free_port()  # nothing listens there: the hub cannot reach its store and says so
    result = fleetlens("hub", "--store", f"http://fleet:hunter2@127.0.0.1:{port}/db", "--detectors", "none")
    assert result.returncode == 1
    assert "fleet:***@127.0.0.1" in result.stderr and "hunter2" not in result.stderr + result.stdout

"""The `fleetlens` command as an operator runs it: one-shot collection and configuration errors."""

from __future__ import annotations

import os
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families


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

"""Installs per role: the exporter and the step SDK load nothing of the hub, and run on the base install
alone; a hub command without its extra says which extra to install."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.peers import free_port, peer

REPO = Path(__file__).resolve().parents[2]
HEAVY = {"chdb", "clickhouse_connect", "streamlit", "sklearn", "pandas", "numpy", "kubernetes", "httpx"}
OTHER_PROGRAMS = {"hub", "sim", "analytics", "alerts", "ui"}

LOADED = """
import json, sys
from fleetlens import cli
code = cli.main(sys.argv[1:])
import collectors.steps  # the step SDK a training job imports
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_exporter_process_loads_collectors_and_nothing_of_the_hub(procfs_sys: Path) -> None:
    """A scrape through the real CLI path and the step SDK: no hub, store, UI or Kubernetes module."""
    done = subprocess.run(
        [sys.executable, "-c", LOADED, "collect", "--gpu-backend", "sim", "--sysfs-root", str(procfs_sys)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    *metrics, last = done.stdout.splitlines()
    loaded = json.loads(last)
    assert loaded["code"] == 0
    assert any(line.startswith("DCGM_FI_DEV_GPU_TEMP{") for line in metrics)  # it did scrape
    roots = {name.partition(".")[0] for name in loaded["modules"]}
    assert roots & HEAVY == set()
    assert roots & OTHER_PROGRAMS == set()
    own = {name for name in loaded["modules"] if name.startswith("fleetlens.")}
    assert own <= {
        "fleetlens.cli",
        "fleetlens.arguments",
        "fleetlens.config",
        "fleetlens.errors",
        "fleetlens.exporter_cli",
        "fleetlens.serving",
    }, own


def _source_tree(dest: Path) -> Path:
    """The package as a user would install it (pyproject, README, packages), without the checkout's
    virtual environment and caches, so the build writes nothing into the checkout."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    for package in ("fleetlens", "collectors", "hub", "sim", "analytics", "alerts", "ui"):
        shutil.copytree(REPO / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with `pip install fleetlens` (no extra)."""
    root = tmp_path_factory.mktemp("base-install")
    (root / "src").mkdir()
    source = _source_tree(root / "src")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    return venv


def _installed(venv: Path) -> set[str]:
    listing = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return {package["name"].lower() for package in json.loads(listing.stdout)}


def test_base_install_serves_exporter_metrics(base_venv: Path, procfs_sys: Path) -> None:
    installed = _installed(base_venv)
    assert {
        "chdb",
        "streamlit",
        "pandas",
        "scikit-learn",
        "kubernetes",
        "clickhouse-connect",
    } & installed == set()
    port = free_port()
    command = [
        str(base_venv / "bin" / "fleetlens"),
        "exporter",
        "--gpu-backend",
        "sim",
        "--sysfs-root",
        str(procfs_sys),
        "--listen",
        f"127.0.0.1:{port}",
    ]
    url = f"http://127.0.0.1:{port}/metrics"
    with peer(command, url), urllib.request.urlopen(url, timeout=10) as answer:
        body = answer.read().decode()
    assert "DCGM_FI_DEV_GPU_TEMP{" in body
    assert "node_infiniband_port_data_received_bytes_total{" in body


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        (["hub"], "hub"),
        (["query", "SELECT 1"], "hub"),
        (["detect"], "hub"),
        (["silence", "list"], "hub"),
        (["ui"], "ui"),
    ],
)
def test_base_install_names_the_extra_a_command_needs(
    base_venv: Path, command: list[str], extra: str
) -> None:
    done = subprocess.run(
        [str(base_venv / "bin" / "fleetlens"), *command], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr  # one line, no traceback
    assert f"pip install 'fleetlens[{extra}]'" in done.stderr

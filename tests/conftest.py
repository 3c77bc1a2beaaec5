"""Shared test fixtures: the real data in ../shared/fixtures and extracted /sys trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import ttar

REPO = Path(__file__).resolve().parent.parent


def fixtures_dir() -> Path:
    """Where the shared fixtures live: $FLEETLENS_FIXTURES, else ../shared/fixtures beside the repo."""
    return Path(os.environ.get("FLEETLENS_FIXTURES", REPO.parent / "shared" / "fixtures"))


@pytest.fixture(scope="session")
def fixtures() -> Path:
    root = fixtures_dir()
    if not root.is_dir():
        pytest.skip(f"shared fixtures not found at {root}; set FLEETLENS_FIXTURES to their directory")
    return root


@pytest.fixture(scope="session")
def node_exporter_sys(fixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """node_exporter's fixture tree; returns the directory to pass as the sysfs root."""
    dest = ttar.extract(fixtures / "node_exporter" / "sys.ttar", tmp_path_factory.mktemp("node_exporter"))
    return dest / "sys"


@pytest.fixture(scope="session")
def procfs_sys(fixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """prometheus/procfs's fixture tree (has mlx5 hw_counters and RoCE ecn dirs); sysfs root."""
    dest = ttar.extract(fixtures / "procfs" / "fixtures.ttar", tmp_path_factory.mktemp("procfs"))
    return dest / "fixtures" / "sys"

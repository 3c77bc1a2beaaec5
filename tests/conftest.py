"""Shared test fixtures: the real data in ../shared/fixtures, extracted /sys trees, the session's chDB
store, and one `fleetlens hub` process shared by a module's tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import clickhouse_connect
import pytest
from hypothesis import settings

from analytics.store import Store
from tests.support import ttar
from tests.support.hubserver import HubProcess, hub_process

# Property tests check what their examples do, not how fast: on a shared 2-core machine Hypothesis's default
# 200 ms deadline per example fails them at random (timed assertions belong in the `timing` tests).
settings.register_profile("fleetlens", deadline=None)
settings.load_profile("fleetlens")

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


@pytest.fixture(scope="session")
def chdb_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The one chDB directory of the test session (chDB opens one directory per process at a time).

    A handle held for the session keeps its engine running, so that a Store opens in milliseconds
    instead of restarting the engine, which reloads every database earlier tests left behind."""
    path = tmp_path_factory.mktemp("chdb")
    engine = clickhouse_connect.get_client(interface="chdb", path=str(path))
    yield path
    engine.close()


@pytest.fixture
def store(chdb_dir: Path) -> Iterator[Store]:
    """A Store on the session's chDB directory, in a database of its own, closed after the test."""
    with Store.open(f"chdb://{chdb_dir}", database=f"test_{uuid.uuid4().hex[:12]}") as opened:
        yield opened


@pytest.fixture(scope="module")
def shared_hub_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The work directory of the module's `shared_hub`: its store, spool and log, and what a module's
    `shared_hub_flags` writes for it (a token file, targets)."""
    return tmp_path_factory.mktemp("hub")


@pytest.fixture(scope="module")
def shared_hub_flags() -> tuple[str, ...]:
    """The flags of the module's `shared_hub`; a module overrides this fixture to give its own."""
    return ()


@pytest.fixture(scope="module")
def shared_hub_env() -> dict[str, str]:
    """The environment variables of the module's `shared_hub`; a module overrides this fixture to set some."""
    return {}


@pytest.fixture(scope="module")
def shared_hub(
    shared_hub_dir: Path, shared_hub_flags: tuple[str, ...], shared_hub_env: dict[str, str]
) -> Iterator[HubProcess]:
    """One running `fleetlens hub` (tests/support/hubserver.hub_process) for all the tests of a module."""
    with hub_process(shared_hub_dir, *shared_hub_flags, env=shared_hub_env) as hub:
        yield hub

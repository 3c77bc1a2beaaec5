"""A hub killed at any moment leaves no sample without its scrape row and no row twice.

The tests run the real `fleetlens hub` on a chDB directory, scraping a simulated fleet (sim.fleet.SimFleet,
real exporters on loopback), kill it with SIGKILL (five times at random moments, or once while it holds a
round's statuses), start it again on the same store and spool each time, and finally once more with no
targets, so that it only resolves what the last life left; then they read the store through the hub's
query API. tests/hub/test_rounds.py has the same in one process, with the death injected.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from analytics.store.hubclient import HubClient
from sim.fleet import SimFleet
from tests.support.hubserver import hub_process


@contextmanager
def hub(root: Path, targets: Path, life: int) -> Iterator[tuple[subprocess.Popen, str]]:
    """`fleetlens hub` on the store and spool in `root`, scraping `targets` every second; its output in
    hub-<life>.log. Ended by its own PID at the block's end if still running (SIGTERM: a clean stop)."""
    config = root / "fleetlens.yaml"
    config.write_text(json.dumps({"hub": {"spool_dir": str(root / "spool"), "detectors": "none"}}))
    flags = ("--config", str(config), "--targets", str(targets), "--interval-s", "1")
    with hub_process(root, *flags, log_level="WARNING", log_name=f"hub-{life}.log") as running:
        yield running.process, running.url


def scrape_rows(url: str, sql: str) -> list:
    return HubClient(url).query(sql).rows


def kill_at_random_moments(tmp_path: Path, kills: int, seed: int, holding: bool = False) -> None:
    """Scrape a four-node fleet through `kills` lives of the hub, each killed (SIGKILL) at a random
    moment of its 2nd to 9th second of scraping (with `holding`, the first moment after that when the
    store has samples newer than every scrape row: the hub holds their statuses); then check the store
    through one more, clean life."""
    chance = random.Random(seed)
    root = tmp_path / "hub"
    root.mkdir()
    targets, idle = tmp_path / "targets.json", tmp_path / "none.json"
    idle.write_text("[]")
    with SimFleet(4, tmp_path / "fleet") as fleet:
        fleet.write_file_sd(targets)
        for life in range(kills):
            stored_since = f"SELECT count() FROM samples WHERE toUnixTimestamp(ts) > {int(time.time())}"
            with hub(root, targets, life) as (process, url):
                started = time.monotonic()
                while not scrape_rows(url, stored_since)[0][0]:  # a round of this life
                    assert time.monotonic() - started < 60, f"life {life} stored no round in 60 s"
                    time.sleep(0.2)
                time.sleep(chance.uniform(1.0, 8.0))
                while holding and not scrape_rows(url, HOLDING)[0][0]:
                    time.sleep(0.05)
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=30)
    with hub(root, idle, kills) as (_, url):
        (rounds,) = scrape_rows(url, "SELECT uniqExact(toStartOfSecond(ts)) FROM samples")[0]
        orphans = scrape_rows(
            url,
            "SELECT node, toString(ts) FROM (SELECT DISTINCT node, ts FROM samples)"
            " WHERE (node, ts) NOT IN (SELECT node, ts FROM targets) ORDER BY ts LIMIT 20",
        )
        repeats = scrape_rows(
            url,
            "SELECT (SELECT count() - uniqExact(series_id, ts) FROM samples),"
            " (SELECT count() - uniqExact(target, node, ts) FROM targets)",
        )
    logs = "\n".join(f"{log.name}: {log.read_text()[-2000:]}" for log in sorted(root.glob("hub-*.log")))
    assert rounds > kills, f"every life stored rounds\n{logs}"
    assert orphans == [], f"samples without their scrape row\n{logs}"
    assert repeats == [(0, 0)], f"(series, ts) or (target, node, ts) stored twice\n{logs}"


HOLDING = "SELECT (SELECT max(ts) FROM samples) > (SELECT max(ts) FROM targets)"


def test_a_kill_while_the_hub_holds_statuses_leaves_every_sample_with_its_scrape_row(tmp_path):
    kill_at_random_moments(tmp_path, kills=1, seed=5, holding=True)


@pytest.mark.chaos
def test_five_kills_at_random_moments_leave_every_sample_with_its_scrape_row_and_none_twice(tmp_path):
    kill_at_random_moments(tmp_path, kills=5, seed=37)

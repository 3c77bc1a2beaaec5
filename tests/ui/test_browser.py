"""The app as people see it: `fleetlens ui` serving a store that a real `fleetlens hub` holds, read by a
headless Chromium (Debian's `chromium`, driven over its DevTools protocol on loopback). The README's
screenshot is taken of the demo's Fleet page (tests/fleetlens/test_demo.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser import chromium
from tests.support.hubserver import hub_process
from tests.support.peers import free_port, peer, require_binary

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
FLEETLENS = [sys.executable, "-m", "fleetlens.cli", "--log-level", "ERROR"]
SCENARIO = """
seed: 5
duration_s: 150
interval_s: 10
fleet: {nodes: 4, gpus_per_node: 2, nics_per_node: 2, prefix: vela-}
jobs:
  - {name: llm-tiny, nodes: 4, step_s: 2.0, dp: 4, pp: 1, tp: 2}
faults:
  - {kind: gpu_lost, node: vela-002, gpu: 1, start_s: 60}
  - {kind: link_flap, node: vela-003, nic: 1, start_s: 50, flaps: 1, period_s: 20}
"""
CONFIG = "drain: {mode: dry-run, limits: {max_nodes: 3, max_per_hour: 2}}\n"
DETECT = """
import sys, time
from analytics.detectors.runner import detect, store_anomalies
from analytics.store import Store
from analytics.store.records import Anomaly
from tests.support.evidence import example
cost = example("slow_node", ratio=1.4, job_slowdown=0.314, lost_gpu_hours=2.43)
straggler = Anomaly("slow-1", time.time() - 300, None, "slow_node", "vela-004", "", "llm-tiny", "warning",
                    0.4, cost, "slow_node", "2")
with Store.open(sys.argv[1]) as store:
    store_anomalies(store, [*detect(store, names=["gpu_fault", "link_flap"]), straggler])
"""
STRAGGLER = "vela-004 slows job llm-tiny by 31% (2.4 GPU-hours lost so far)"  # the seeded one's cost


@pytest.fixture
def chromium_binary() -> str:
    """Debian's chromium, asked for before the store is filled, so that a machine without it skips fast."""
    return require_binary("chromium")


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[str]:
    """A hub holding a store the simulator filled (a lost GPU, a flapping port) and the detectors read,
    with a straggler's anomaly that states what it costs its job."""
    (tmp_path / "tiny.yaml").write_text(SCENARIO)
    dsn = f"chdb://{tmp_path / 'store'}"
    subprocess.run(
        [*FLEETLENS, "sim", "run", str(tmp_path / "tiny.yaml"), "--offline", "--store", dsn], check=True
    )
    subprocess.run([sys.executable, "-c", DETECT, dsn], check=True)
    with hub_process(tmp_path, store=dsn, log_level="ERROR") as running:
        yield running.url


def test_the_pages_and_a_stragglers_cost_render_in_a_browser(chromium_binary: str, hub: str, tmp_path: Path):
    (tmp_path / "fleetlens.yaml").write_text(CONFIG)
    port = free_port()
    ui = [*FLEETLENS, "ui", "--hub", hub, "--port", str(port), "--config", str(tmp_path / "fleetlens.yaml")]
    base = f"http://127.0.0.1:{port}"
    with peer(ui, f"{base}/_stcore/health"), chromium(chromium_binary, tmp_path / "profile") as browser:
        fleet = ["vela-001", "vela-002", "vela-003", "vela-004", "anomalous", "gpu_fault", "link_flap"]
        fleet += ["GPU temperature (°C)", "anomalies (count)", "link flaps (count)"]  # charts and their units
        browser.visible_text(f"{base}/", fleet)

        report = [
            "anomalies by kind: gpu_fault 1",
            "nodes involved: vela-002",
            "Download Markdown",
            "time (UTC)",
        ]
        browser.visible_text(f"{base}/postmortem?node=vela-002", report)

        limits = ["drain mode dry-run", "max_nodes", "max_per_hour"]  # from the config `fleetlens ui` read
        browser.visible_text(f"{base}/actions", limits)

        costs = ["What the stragglers cost", "2.4 GPU-hours lost in all", STRAGGLER]
        browser.visible_text(f"{base}/anomalies", costs)
        browser.visible_text(f"{base}/node?node=vela-004", [*costs, "Anomalies (1)"])

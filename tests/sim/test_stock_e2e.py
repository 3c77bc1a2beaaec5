"""A fleet that runs only stock exporters, end to end: `fleetlens sim serve` plays tests/sim/stock-e2e.yaml
on the wall clock (dcgm-exporter's rendering and a real node_exporter per node), Debian's real Prometheus
2.42 scrapes both through the file_sd files it writes and remote-writes everything to a real `fleetlens
hub`, which also takes the jobs' step records; then `fleetlens detect --hub` runs over the scenario's
span and sim.evaluation scores it: every fault found, nothing reported on the node whose exporters stop
answering for a while. About three and a half minutes of wall time, most of it the scenario's three."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from analytics.evidence import from_json
from analytics.store.records import Anomaly
from fleetlens.demo.peers import logged_process, wait_http
from sim.evaluation import CONFOUNDER, FALSE, evaluate
from sim.scenario import Scenario, load_scenario
from sim.stock import DCGM_EXPORTER, NODE_EXPORTER
from tests.conftest import REPO
from tests.support.hubserver import hub_process
from tests.support.peers import free_port, require_binary

pytestmark = pytest.mark.integration

SCENARIO = Path(__file__).with_name("stock-e2e.yaml")
STARTUP_S = 12.0  # hub, fleet and Prometheus are up before the scenario's time 0
SETTLE_S = 8.0  # after the scenario: Prometheus's last scrapes reach the hub (it sends every second)
FLEETLENS = [sys.executable, "-m", "fleetlens.cli", "--log-level", "WARNING"]


def test_a_stock_fleet_remote_written_by_prometheus_is_diagnosed(tmp_path: Path):
    prometheus = require_binary("prometheus")
    require_binary("prometheus-node-exporter")
    scenario = load_scenario(SCENARIO)
    assert scenario.exporters == "stock"
    epoch = float(round(time.time() + STARTUP_S))
    with ExitStack() as stack:
        hub_url = stack.enter_context(hub(tmp_path / "hub", scenario.interval_s))
        files = stack.enter_context(fleet(tmp_path / "fleet", hub_url, epoch))
        stack.enter_context(prometheus_writing(prometheus, tmp_path / "prometheus", files, hub_url, scenario))
        end = epoch + scenario.duration_s
        time.sleep(max(0.0, end + SETTLE_S - time.time()))
        anomalies = detect(hub_url, epoch, end)
        jobs = query(hub_url, "SELECT DISTINCT node, labels['job'] FROM metrics WHERE metric != 'up'")
        ours = query(hub_url, "SELECT count() FROM metrics WHERE startsWith(metric, 'fleetlens_')")
        gaps = query(hub_url, "SELECT count() FROM targets WHERE NOT up AND node = 'vela-001'")
    nodes = scenario.fleet.names
    assert sorted(map(tuple, jobs)) == [(n, job) for n in nodes for job in ("dcgm-exporter", "node-exporter")]
    assert ours == [[0]], "a stock fleet has no fleetlens_* series"
    assert gaps[0][0] >= 4, "Prometheus saw vela-001's two exporters refuse during its scrape gap"
    result = evaluate(scenario, anomalies, epoch)
    assert len(result.faults) == len(scenario.faults) == 4 and not result.excluded
    missed = [outcome.fault for outcome in result.faults if not outcome.detected]
    assert not missed, f"missed {missed}; reports: {[outcome.report for outcome in result.reports]}"
    wrong = [o.report for o in result.reports if o.verdict in (CONFOUNDER, FALSE)]
    assert not wrong, f"reported what is no fault: {wrong}"


@contextmanager
def hub(root: Path, interval_s: float) -> Iterator[str]:
    """A `fleetlens hub` on a free port that scrapes nothing and runs no detector: it takes Prometheus's
    remote write and the step records, nodes named by the node, Hostname or instance label."""
    root.mkdir()
    config = {
        "hub": {
            "node_labels": ["node", "Hostname", "instance"],
            "interval_s": interval_s,
            "detectors": "none",
            "spool_dir": str(root / "spool"),
        }
    }
    (root / "fleetlens.yaml").write_text(json.dumps(config))  # JSON is YAML
    with hub_process(root, "--config", str(root / "fleetlens.yaml"), log_level="WARNING") as running:
        yield running.url


@contextmanager
def fleet(root: Path, hub_url: str, epoch: float) -> Iterator[dict[str, Path]]:
    """`fleetlens sim serve` of the scenario from `epoch` on, posting its steps to the hub; yields the two
    file_sd files it writes by the Prometheus job of their exporter."""
    root.mkdir()
    files = {job: root / f"targets.{job}.json" for job in (DCGM_EXPORTER.job, NODE_EXPORTER.job)}
    args = [
        *FLEETLENS,
        *("sim", "serve", str(SCENARIO), "--file-sd", str(root / "targets.json"), "--hub", hub_url),
        *("--epoch", str(epoch), "--workdir", str(root / "nodes")),
    ]
    with logged_process(args, root / "sim.log") as process:
        deadline = time.monotonic() + 30
        while not all(path.exists() for path in files.values()):
            assert process.poll() is None, (root / "sim.log").read_text()
            assert time.monotonic() < deadline, "sim serve wrote no targets within 30 s"
            time.sleep(0.2)
        yield files


@contextmanager
def prometheus_writing(
    binary: str, root: Path, files: dict[str, Path], hub_url: str, scenario: Scenario
) -> Iterator[None]:
    """Prometheus scraping each exporter as a job of its own every scenario interval, remote-writing to
    the hub as soon as it can."""
    root.mkdir()
    interval = f"{scenario.interval_s:g}s"
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            {"job_name": job, "file_sd_configs": [{"files": [str(path)]}]} for job, path in files.items()
        ],
        "remote_write": [
            {
                "url": f"{hub_url}/api/v1/write",
                "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms", "max_backoff": "1s"},
            }
        ],
    }
    (root / "prometheus.yml").write_text(json.dumps(config))
    port = free_port()
    args = [
        binary,
        f"--config.file={root / 'prometheus.yml'}",
        f"--storage.tsdb.path={root / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with logged_process(args, root / "prometheus.log") as process:
        wait_http(f"http://127.0.0.1:{port}/-/ready", process, timeout=30)
        yield


def detect(hub_url: str, start: float, end: float) -> list[Anomaly]:
    """`fleetlens detect --hub` over [start, end), its JSON back into anomalies."""
    result = subprocess.run(
        [*FLEETLENS, "detect", "--hub", hub_url, "--json", "--from", str(start), "--to", str(end)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    return [_anomaly(row) for row in json.loads(result.stdout)]


def _anomaly(row: dict[str, Any]) -> Anomaly:
    times = {
        key: None if row[key] is None else datetime.fromisoformat(row[key]).timestamp()
        for key in ("start", "end")
    }
    evidence = from_json(row["kind"], json.dumps(row["evidence"]))  # the CLI prints the fields, unversioned
    return Anomaly(**{**row, **times, "evidence": evidence})


def query(hub_url: str, sql: str) -> list[list]:
    result = subprocess.run(
        [*FLEETLENS, "query", "--hub", hub_url, "--json", sql], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [list(row.values()) for row in json.loads(result.stdout)]

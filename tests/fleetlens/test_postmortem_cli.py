"""`fleetlens postmortem` as an SRE runs it: its own process, on a store another process filled (chDB opens
one directory per process) with a throttled GPU, its alert, its drain and a scrape gap."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.hubserver import hub_process
from tests.support.incident import NODE

FLEETLENS = [sys.executable, "-m", "fleetlens.cli", "--log-level", "ERROR"]
SEED = """
import json, sys
from pathlib import Path
from analytics.store import Store
from analytics.store.records import Placement
from analytics.topology.model import Source
from tests.support.incident import NODE, seed_incident
root = Path(sys.argv[1])
with Store.open(f"chdb://{root / 'store'}") as store:
    incident = seed_incident(store, root / "fleet")
    placed = Placement(Source.SLURM, "slurm-9", "ana", NODE, (1,), incident.start + 1, incident.end - 1)
    store.replace_placements(Source.SLURM, [placed], now=incident.end)
print(json.dumps({"start": incident.start, "end": incident.end}))
"""


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A store holding the incident of tests.analytics.reports.test_postmortem, a Slurm job placed on its
    node that sent no step times, and its window."""
    root = tmp_path_factory.mktemp("postmortem")
    done = subprocess.run(
        [sys.executable, "-c", SEED, str(root)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return root / "store", json.loads(done.stdout)


def postmortem(seeded: tuple[Path, dict], *args: str, hub: str | None = None) -> subprocess.CompletedProcess:
    """The command on the seeded window, reading the store itself or, given its URL, through a hub."""
    store, window = seeded
    reader = ["--hub", hub] if hub else ["--store", f"chdb://{store}"]
    window_flags = ["--from", str(window["start"]), "--to", str(window["end"])]
    return subprocess.run(
        [*FLEETLENS, "postmortem", *args, *window_flags, *reader],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_markdown_report_of_a_node_names_the_incident(seeded):
    done = postmortem(seeded, "--node", NODE)

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"# Postmortem: node {NODE}\n")
    for line in (
        "- Anomalies: 1 (gpu_throttle 1)",
        "- Alerts fired: FleetlensGpuThrottle",
        f"- Drains: {NODE} pending (approve)",
        "- Target gaps: 1 (3 failed scrapes)",
    ):
        assert line in done.stdout


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["--node", "vela-999"], 1, "fleetlens: node 'vela-999' is unknown to the store"),
        (["--node", NODE, "--job", "job-a"], 2, "argument --job: not allowed with argument --node"),
    ],
)
def test_a_bad_scope_exits_non_zero_naming_it(seeded, args: list[str], status: int, message: str):
    done = postmortem(seeded, *args)

    assert done.returncode == status and message in done.stderr
    assert done.stdout == ""


def test_a_jobs_json_from_the_store_and_csv_through_a_hub_holding_it_carry_the_same_events(seeded, tmp_path):
    as_json = postmortem(seeded, "--job", "job-a", "--format", "json")
    with hub_process(tmp_path, store=f"chdb://{seeded[0]}", log_level="ERROR") as hub:
        as_csv = postmortem(seeded, "--job", "job-a", "--format", "csv", hub=hub.url)

    assert as_json.returncode == as_csv.returncode == 0, as_json.stderr + as_csv.stderr
    report = json.loads(as_json.stdout)
    assert report["nodes"] == ["vela-001", NODE] and report["scope"] == {"node": None, "job": "job-a"}
    rows = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [(row["ts"], row["what"], json.loads(row["evidence"])) for row in rows] == [
        (event["ts"], event["what"], event["evidence"]) for event in report["events"]
    ]
    assert "gpu_throttle gpu:1 opened" in [row["what"] for row in rows]


def test_a_job_that_sent_no_step_times_is_reported_through_a_hub_from_its_placements(seeded, tmp_path):
    with hub_process(tmp_path, store=f"chdb://{seeded[0]}", log_level="ERROR") as hub:
        done = postmortem(seeded, "--job", "slurm-9", hub=hub.url)

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# Postmortem: job slurm-9 on 1 node(s)\n")
    for line in (
        "The job sent no step times: its nodes and span come from its placements (slurm).",
        f"- Nodes in scope: {NODE} (from its placements)",
        "- Anomalies: 1 (gpu_throttle 1)",
        f"| slurm-9 | ana | {NODE} | 1 |",
    ):
        assert line in done.stdout

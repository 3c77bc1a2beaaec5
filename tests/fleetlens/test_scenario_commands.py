"""`fleetlens sim run`, `detect` and `eval` as an operator runs them, on the suite's CI scenarios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.scenario import load_scenario
from tests.conftest import REPO

SCENARIOS = REPO / "tests" / "scenarios"


def fleetlens(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", "--log-level", "ERROR", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def test_a_simulated_link_flap_is_found_by_detect_with_its_evidence(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'store'}"
    simulated = fleetlens("sim", "run", str(SCENARIOS / "ci-links.yaml"), "--offline", "--store", dsn)
    assert simulated.returncode == 0, simulated.stderr
    assert "simulated ci-links: 91 ticks" in simulated.stdout

    links = ("--detector", "link_flap", "--detector", "link_down")
    found = fleetlens("detect", "--store", dsn, *links, "--json")
    assert found.returncode == 0, found.stderr
    anomalies = json.loads(found.stdout)
    scenario = load_scenario(SCENARIOS / "ci-links.yaml")
    expected = {(f.kind, f.node, f.component) for f in scenario.faults if f.kind.startswith("link")}
    assert {(a["kind"], a["node"], a["component"]) for a in anomalies} == expected
    flap = next(a for a in anomalies if a["kind"] == "link_flap")
    assert flap["evidence"]["link_downed"] >= 1
    assert flap["start"].endswith("+00:00"), "times are UTC and say so"


def test_detect_refuses_an_unknown_detector_by_name(tmp_path: Path) -> None:
    result = fleetlens("detect", "--store", f"chdb://{tmp_path / 'store'}", "--detector", "psychic")
    assert result.returncode != 0
    assert "unknown detector(s) psychic" in result.stderr


def test_ci_scenarios_meet_the_detection_goals(tmp_path: Path) -> None:
    """The representative subset of the suite: every fault and confounder kind, scored as in the README."""
    report = tmp_path / "eval.json"
    files = sorted(str(path) for path in SCENARIOS.glob("ci-*.yaml"))
    result = fleetlens("eval", *files, "--json", str(report), timeout=1500)
    assert result.returncode == 0, result.stderr
    assert "| slow_node |" in result.stdout
    suite = json.loads(report.read_text())
    for kind, stats in suite["kinds"].items():
        if stats["catch_all"]:
            continue
        assert stats["recall"] >= 0.95, (kind, stats)
        assert stats["precision"] is None or stats["precision"] >= 0.95, (kind, stats)
        assert stats["confounder_reports"] == 0, (kind, stats)
    met = {goal["name"]: goal["met"] for goal in suite["goals"]}
    assert met.pop("no child of a shared fault drained") is None  # the CI scenarios have no layer fault
    assert met.pop("no node returned while faulty, every repaired drained node returned") is None  # no repair
    assert list(met.values()) == [True, True, True, True, True]


@pytest.mark.parametrize("flag", ["--from", "--to"])
def test_detect_names_a_time_it_cannot_read(tmp_path: Path, flag: str) -> None:
    result = fleetlens("detect", "--store", f"chdb://{tmp_path / 'store'}", flag, "yesterday")
    assert result.returncode != 0
    assert "'yesterday' is neither unix seconds nor an ISO 8601 time" in result.stderr


def test_exporters_flavour_is_checked_and_stock_is_not_played_online(tmp_path: Path) -> None:
    links = str(SCENARIOS / "ci-links.yaml")
    unknown = fleetlens("eval", links, "--exporters", "dcgm")
    assert unknown.returncode == 1
    assert "--exporters: 'dcgm' is not one of fleetlens, stock" in unknown.stderr
    online = fleetlens("sim", "run", links, "--exporters", "stock", "--store", f"chdb://{tmp_path / 'store'}")
    assert online.returncode == 1
    assert "ci-links: exporters: stock plays offline" in online.stderr

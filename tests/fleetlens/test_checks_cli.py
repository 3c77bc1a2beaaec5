"""`fleetlens checks run --hub`, `checks schedule --hub` and `checks list --hub` against a real hub process:
a real ping over loopback and a dcgmi stand-in reporting a failed test, stored and read back; the exit
status says which."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hubserver import hub_process
from tests.support.peers import require_binary

TOKEN = "checks-test-token"
DCGM3_FAILED = (
    Path(__file__).resolve().parents[1] / "fixtures" / "checks" / "dcgm3_per_gpu_sm_stress_fail.json"
)


def fleetlens(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLEETLENS_")}
    if path is not None:
        env["PATH"] = path  # the tools the checks find
    return subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "FLEETLENS_API_TOKEN": TOKEN},
    )


def listed(hub: str, node: str) -> list[dict]:
    done = fleetlens("checks", "list", "--node", node, "--json", "--hub", hub)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def fake_dcgmi(folder: Path, output: Path, exit_status: int) -> Path:
    """An executable named dcgmi that prints `output` and exits with `exit_status`."""
    folder.mkdir()
    dcgmi = folder / "dcgmi"
    dcgmi.write_text(f'#!/bin/sh\ncat "{output}"\nexit {exit_status}\n')
    dcgmi.chmod(dcgmi.stat().st_mode | stat.S_IXUSR)
    return folder


@pytest.mark.integration
def test_a_ping_that_passes_is_posted_and_listed_and_a_failed_dcgm_diag_exits_1(tmp_path: Path) -> None:
    require_binary("ping")
    with hub_process(tmp_path, env={"FLEETLENS_API_TOKEN": TOKEN}) as hub:
        ping = ["checks", "run", "--checks", "ping", "--peer", "lo=127.0.0.1", "--dev", "lo"]
        done = fleetlens(*ping, "--node", "vela-001", "--hub", hub.url)
        assert done.returncode == 0, done.stderr
        [printed] = [json.loads(line) for line in done.stdout.splitlines()]
        assert (printed["check"], printed["target"], printed["status"]) == ("ping", "peer:lo", "PASS")
        [row] = listed(hub.url, "vela-001")
        assert (row["check"], row["target"], row["status"], row["unit"]) == ("ping", "peer:lo", "PASS", "ms")

        dcgmi = fake_dcgmi(tmp_path / "bin", DCGM3_FAILED, 226)
        done = fleetlens(
            "checks",
            "run",
            "--checks",
            "dcgm_diag",
            "--node",
            "vela-002",
            "--hub",
            hub.url,
            path=f"{dcgmi}:/usr/bin:/bin",
        )
        assert done.returncode == 1, done.stderr
        failed = {row["target"] for row in listed(hub.url, "vela-002") if row["status"] == "FAIL"}
        assert "gpu:3" in failed
        assert listed(hub.url, "vela-001") == [row]


def test_a_check_whose_tool_is_absent_is_an_error_and_exits_2(tmp_path: Path) -> None:
    done = fleetlens("checks", "run", "--checks", "dcgm_diag", "--node", "vela-001", path=str(tmp_path))
    [result] = [json.loads(line) for line in done.stdout.splitlines()]
    assert result["status"] == "ERROR" and "dcgmi is not installed" in result["evidence"]["problem"]
    assert done.returncode == 2


@pytest.mark.integration
def test_preflight_prints_one_line_posts_every_result_and_a_failed_test_beats_errors(tmp_path: Path) -> None:
    dcgmi = fake_dcgmi(tmp_path / "bin", DCGM3_FAILED, 226)
    with hub_process(tmp_path, env={"FLEETLENS_API_TOKEN": TOKEN}) as hub:
        done = fleetlens(
            "checks", "preflight", "--node", "vela-003", "--hub", hub.url, path=f"{dcgmi}:/usr/bin:/bin"
        )
        assert done.returncode == 1, done.stderr
        [line] = done.stdout.splitlines()
        summary = json.loads(line)
        assert (summary["node"], summary["status"], summary["exit_status"]) == ("vela-003", "FAIL", 1)
        assert summary["duration_s"] > 0
        failing = {(brief["check"], brief["target"], brief["status"]) for brief in summary["failing"]}
        assert ("dcgm_diag", "gpu:3", "FAIL") in failing
        # this machine has no GPU: the performance checks say so instead of passing
        for check in ("pcie_bandwidth", "hbm_bandwidth", "gemm"):
            assert (check, "", "ERROR") in failing
        stored = {(row["check"], row["target"], row["status"]) for row in listed(hub.url, "vela-003")}
        assert failing <= stored


def test_preflight_with_nothing_to_judge_by_exits_2(tmp_path: Path) -> None:
    done = fleetlens("checks", "preflight", "--node", "vela-001", path=str(tmp_path))
    [summary] = [json.loads(line) for line in done.stdout.splitlines()]
    assert (summary["status"], done.returncode) == ("ERROR", 2)
    why = {brief["check"]: brief["why"] for brief in summary["failing"]}
    assert "dcgmi is not installed" in why["dcgm_diag"]


@pytest.mark.integration
def test_scheduled_light_checks_reach_the_hub_and_the_loop_stops_on_sigterm(tmp_path: Path) -> None:
    dcgmi = fake_dcgmi(tmp_path / "bin", DCGM3_FAILED, 226)
    command = [sys.executable, "-m", "fleetlens.cli", "checks", "schedule", "--node", "vela-003"]
    env = {**os.environ, "FLEETLENS_API_TOKEN": TOKEN, "PATH": f"{dcgmi}:/usr/bin:/bin"}
    with hub_process(tmp_path, env={"FLEETLENS_API_TOKEN": TOKEN}) as hub:
        schedule = [*command, "--hub", hub.url, "--without-slurm"]
        with subprocess.Popen(
            schedule, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        ) as process:
            first = json.loads(process.stdout.readline())  # type: ignore[union-attr]
            stored = []
            for _ in range(100):  # the post follows the printing; the hub stores it once it answers
                if stored := [row for row in listed(hub.url, "vela-003") if row["status"] == "FAIL"]:
                    break
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0, process.stderr.read()  # type: ignore[union-attr]
    assert (first["node"], first["check"]) == ("vela-003", "dcgm_diag")
    assert "gpu:3" in {row["target"] for row in stored}

"""The lifecycle's whole path with real parts: a drained node's test is started as an operator configures
it (`fleetlens checks run --hub`, a real process), its results reach a real hub process, and the
lifecycle reads them back through the hub's API. A dcgmi stand-in replays NVIDIA's own DCGM 3 document
with sm_stress failing on GPU 3, then the same run with every test passed (the node repaired)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from alerts.drain import DrainController
from alerts.lifecycle import CommandTrigger, Lifecycle, LifecyclePolicy
from alerts.policy import DrainPolicy
from analytics.store.checks import checks_between
from analytics.store.hubclient import HubClient
from tests.alerts.test_drain import anomaly, firing
from tests.alerts.test_lifecycle import Backend
from tests.fleetlens.test_checks_cli import DCGM3_FAILED, TOKEN, fake_dcgmi
from tests.support.hubserver import hub_process

pytestmark = pytest.mark.integration
NODE = "vela-003"


def passed_document(folder: Path) -> Path:
    """NVIDIA's document with every FAIL turned PASS: what the repaired node's DCGM says."""
    text = DCGM3_FAILED.read_text().replace('"FAIL"', '"PASS"').replace('"Fail"', '"Pass"')
    path = folder / "dcgm3_passed.json"
    path.write_text(text)
    return path


def settle(lifecycle: Lifecycle, action: str) -> list:
    """Step the lifecycle on the wall clock until it writes an `action` row (the checks run meanwhile)."""
    for _ in range(120):
        if rows := [row for row in lifecycle.step([], time.time()) if row.action == action]:
            return rows
        time.sleep(0.5)
    raise AssertionError(f"no {action} within a minute; states {lifecycle.states}")


def test_a_drained_node_fails_on_dcgm_and_returns_once_repaired(tmp_path: Path, monkeypatch) -> None:
    failing = fake_dcgmi(tmp_path / "failing", DCGM3_FAILED, 226)
    repaired = fake_dcgmi(tmp_path / "repaired", passed_document(tmp_path), 0)
    with hub_process(tmp_path, env={"FLEETLENS_API_TOKEN": TOKEN}) as hub:
        monkeypatch.setenv("FLEETLENS_API_TOKEN", TOKEN)
        monkeypatch.setenv("PATH", f"{failing}:/usr/bin:/bin")
        run = [sys.executable, "-m", "fleetlens.cli", "checks", "run", "--node", "{node}", "--level", "3"]
        trigger = CommandTrigger([*run, "--checks", "{checks}", "--hub", hub.url])
        client = HubClient(hub.url)
        backend = Backend()
        controller = DrainController(DrainPolicy(mode="auto"), [backend], fleet_size=100)
        controller.step(firing(anomaly(NODE)), now=time.time())
        lifecycle = Lifecycle(
            LifecyclePolicy(test_after_s=0, checks=("dcgm_diag",)),
            controller,
            trigger,
            lambda node, since, until: checks_between(client, since, until, node=node),
        )

        [failed] = settle(lifecycle, "fail")
        assert "dcgm_diag gpu:3 FAIL" in failed.reason and lifecycle.states[NODE].state == "failed"
        [ticket] = lifecycle.alerts
        assert {row["target"] for row in json.loads(ticket.annotations["evidence"])} >= {"gpu:3"}

        monkeypatch.setenv("PATH", f"{repaired}:/usr/bin:/bin")
        lifecycle.test(NODE, "carol", time.time())
        [returned] = settle(lifecycle, "return")
        assert returned.outcome == "done" and NODE not in lifecycle.states
        assert backend.calls[-1] == ("resume", NODE)  # Kubernetes sets gpuhealth=PASS in that same patch


def test_a_started_command_is_not_waited_for_and_is_killed_past_its_timeout(tmp_path: Path) -> None:
    started = tmp_path / "started"
    sleeper = f"import pathlib, time; pathlib.Path({str(started)!r}).write_text('x'); time.sleep(600)"
    trigger = CommandTrigger([sys.executable, "-c", sleeper], timeout_s=0.5)
    trigger.START_GRACE_S = 0.5
    trigger.start(NODE, ("dcgm_diag",), 0.0)  # returns after the grace, the command still running
    for _ in range(300):
        if started.exists():
            break
        time.sleep(0.1)
    [(process, _)] = trigger._running
    assert started.exists() and process.poll() is None
    time.sleep(0.6)
    trigger.start("vela-004", ("dcgm_diag",), 0.0)  # the next start reaps: the first is past its timeout
    assert process.returncode is not None
    for leftover, _ in trigger._running:  # the second sleeper, ours to end
        os.killpg(leftover.pid, signal.SIGKILL)
        leftover.wait()

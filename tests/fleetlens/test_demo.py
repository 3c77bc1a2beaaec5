"""`fleetlens demo` end to end, every part a real process: the live simulated fleet, the hub with its
embedded store, a PyTorch DDP job with a slowed rank, Alertmanager and a private Slurm when installed
(root), real veth links in network namespaces when root, and the UI, whose Fleet page (seen by a
headless Chromium) is the README's screenshot: `make screenshot` writes it to docs/fleet.png, `make test`
into the test's own folder, so a test run leaves the checkout as it was."""

from __future__ import annotations

import dataclasses
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from fleetlens.demo.report import passed, verdict_lines
from fleetlens.demo.run import SCENARIO, SETTLE_S, make_plan
from fleetlens.errors import DemoError
from sim.evaluation import evaluate
from sim.scenario import load_scenario
from tests.support.browser import chromium
from tests.support.peers import free_port

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0


def demo(workdir: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "fleetlens.cli", "demo", "--workdir", str(workdir), *flags]


def can_make_links() -> bool:
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in ("ip", "nsenter", "mount"))


def stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(pid: int) -> dict[int, str]:
    """pid -> start time of every process under `pid` (its children in other sessions included)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        fields = stat(entry.name) if entry.name.isdigit() else None
        if fields is not None:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
            starts[int(entry.name)] = fields[19]
    found, todo = {}, list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        found[child] = starts[child]
        todo += parents.get(child, [])
    return found


def still_running(processes: dict[int, str]) -> list[int]:
    """The processes of `processes` that still run (the same start time, not a zombie)."""
    return [
        pid
        for pid, start in processes.items()
        if (fields := stat(pid)) is not None and fields[19] == start and fields[0] != "Z"
    ]


def test_the_plan_puts_the_job_on_free_nodes_and_leaves_out_what_a_short_run_could_not_detect():
    scenario = load_scenario(SCENARIO)
    plan = make_plan(scenario, 200, NOW)

    busy = {node for job in scenario.jobs for node in job.nodes}
    assert len(plan.job_nodes) == 4 and not busy & set(plan.job_nodes)
    assert all(fault.start_s < 200 - SETTLE_S for fault in plan.scenario.faults)
    assert len(plan.scenario.faults) < len(scenario.faults)
    assert plan.slow_from_s + 60 < 200 and plan.flaps_at_s[-1] < 200 - SETTLE_S
    until_stopped = make_plan(scenario, None, NOW)  # Ctrl-C ends it: everything is injected
    assert until_stopped.duration_s is None and until_stopped.scenario.faults == scenario.faults
    with pytest.raises(DemoError, match="at least 180"):
        make_plan(scenario, 60, NOW)
    crowded = dataclasses.replace(scenario.jobs[0], nodes=tuple(scenario.fleet.names))
    with pytest.raises(DemoError, match="leaves 0 node"):
        make_plan(dataclasses.replace(scenario, jobs=(crowded,)), None, NOW)


def test_a_run_that_detected_nothing_fails_naming_every_fault_it_missed():
    plan = make_plan(load_scenario(SCENARIO), 300, NOW)
    result = evaluate(plan.expected("fla0-1"), [], plan.epoch)

    assert not passed(result)
    lines = verdict_lines(result)
    injected = len(plan.scenario.faults) + len(plan.scenario.layer_faults)
    assert sum("MISSED" in line for line in lines) == injected + 2  # + slowed rank, flap
    assert any("slow_node" in line and plan.slow_node in line for line in lines)
    assert lines[-1].endswith("FAIL")


@pytest.mark.integration
@pytest.mark.torch
def test_a_headless_timed_demo_detects_every_injected_fault_and_reports_no_confounder(tmp_path: Path):
    real_links = can_make_links()
    flags = ["--duration", "200", "--headless", *(["--real-links"] if real_links else [])]
    process = subprocess.Popen(demo(tmp_path, *flags), cwd=REPO, stdout=subprocess.PIPE, text=True)
    out, _ = process.communicate(timeout=600)

    assert process.returncode == 0, out
    assert re.search(r"^\d+ of \d+ faults detected, 0 confounder reports, .*: PASS$", out, re.M), out
    # one line per anomaly as it opens, and per drain decision
    assert re.search(r"anomaly +opened gpu_fault \(critical\) on demo-026 gpu:2", out), out
    assert re.search(r"anomaly +opened slow_node \(\w+\) on demo-031", out), out  # the DDP job's slow rank
    assert re.search(r"drain +drain demo-026: dry-run \(dry-run mode\)", out), out
    # leaf-00 reloads: one shared fault of the leaf explains its VMs' flaps, and none of them is drained
    # (demo-005 has an Xid 79 of its own)
    assert re.search(r"injected +leaf_degraded on leaf leaf-00", out), out
    assert re.search(r"anomaly +opened shared_fault \(\w+\) on leaf-00 leaf", out), out
    assert re.search(r"^ +leaf_degraded +leaf-00 leaf +after \d+", out, re.M), out
    child = r"anomaly +(opened|explained) link_flap \(\w+\) on demo-00[1-8] .*, explained by shared_fault"
    assert re.search(child + " on leaf-00 leaf", out), out
    assert not re.search(r"drain +drain demo-00[1-46-8]: dry-run", out), out
    if real_links:
        assert re.search(r"injected +ip link set fla0-\d+ down", out), out
        assert re.search(r"anomaly +opened link_flap \(warning\) on demo-links fla0-\d+", out), out
        # this demo's namespaces are gone (named by its PID: a killed run elsewhere may leave its own)
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"fleetlens-a-{process.pid}" not in {line.split()[0] for line in listed.splitlines()}, listed
    if shutil.which("prometheus-alertmanager"):
        assert re.search(r"Alertmanager holds \d+ alert name\(s\): .*FleetlensGpuFault", out), out
    if os.geteuid() == 0 and shutil.which("slurmctld"):
        assert "Slurm nodes: 32 idle" in out, out  # dry-run: decisions recorded, no node drained

    # the store stays readable: a postmortem of the slowed rank's node shows the slowdown
    [hint] = [line.strip() for line in out.splitlines() if line.strip().startswith("fleetlens postmortem")]
    report = subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", *hint.split()[1:], "--format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert '"slow_node"' in report.stdout


@pytest.mark.integration
@pytest.mark.torch
def test_ctrl_c_stops_every_process_the_demo_started_and_leaves_the_store_readable(tmp_path: Path):
    ui_port = free_port()
    process = subprocess.Popen(
        demo(tmp_path, "--ui-port", str(ui_port)),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    seen = []
    deadline = time.monotonic() + 300
    try:
        # up and detecting: the flapping port of the scenario is seen, after a lost GPU, an XID, a slow node
        while not re.search(r"anomaly +opened link_flap \(warning\) on demo-020", "".join(seen)):
            assert process.poll() is None, "".join(seen)
            seen.append(lines.get(timeout=max(1.0, deadline - time.monotonic())))
        hub = next(line.split()[1] for line in seen if line.strip().startswith("hub:"))
        assert f"http://127.0.0.1:{ui_port}" in "".join(seen)
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/_stcore/health", timeout=10) as answer:
            assert answer.status == 200
        with urllib.request.urlopen(f"{hub}/healthz", timeout=10) as answer:
            assert answer.status == 200
        if shutil.which("chromium"):  # the README's screenshot: the demo's Fleet page
            with chromium(shutil.which("chromium"), tmp_path / "profile") as browser:
                browser.visible_text(f"http://127.0.0.1:{ui_port}/", ["demo-026", "anomalous", "gpu_fault"])
                screenshot = Path(os.environ.get("FLEETLENS_SCREENSHOT") or tmp_path / "fleet.png")
                browser.screenshot(screenshot)
                assert screenshot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        children = descendants(process.pid)
        assert len(children) >= 8  # fleet, hub, torchrun and 4 ranks, the UI (and peers when installed)

        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
    while not lines.empty():
        seen.append(lines.get())
    assert still_running(children) == []
    assert any(line.startswith("store kept at") for line in seen), "".join(seen)

    sql = "SELECT (SELECT count() FROM anomalies) AS anomalies, (SELECT count() FROM steps) AS steps"
    count = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetlens.cli",
            "query",
            "--store",
            f"chdb://{tmp_path / 'store'}",
            "--json",
            sql,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert count.returncode == 0, count.stderr
    assert re.search(r'"anomalies": [1-9]', count.stdout) and re.search(r'"steps": [1-9]', count.stdout)

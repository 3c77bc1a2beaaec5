"""`fleetlens checks schedule` (collectors.checks.schedule): light checks hourly, heavy ones only on a free
node and at most once per heavy-every (or forced), the 1% GPU-time stretch, the bound on unsent results,
node state from a real squeue against a real slurmctld, and the CLI stopping on SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from collectors.checks.catalog import CheckOptions
from collectors.checks.result import CheckResult, Status
from collectors.checks.schedule import (
    DAY_S,
    HOUR_S,
    Post,
    PostFailed,
    Probe,
    Schedule,
    Scheduler,
    nvml_processes_probe,
    slurm_jobs_probe,
)
from collectors.errors import CollectorConfigError
from tests.support.slurm import SlurmCluster, slurm_cluster

FREE: Probe = lambda: None  # noqa: E731
BUSY: Probe = lambda: "Slurm jobs on vela-001: 17"  # noqa: E731


@dataclass
class FakeNode:
    """A fake clock the scheduler sleeps on, and checks that take `light_s` / `heavy_s` of it; records
    each run as (start, "light" or "heavy", dcgm level)."""

    horizon_s: float
    light_s: float = 10.0
    heavy_s: float = 1800.0
    now: float = 0.0
    runs: list[tuple[float, str, int]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.now += seconds
        return self.now >= self.horizon_s

    def run_checks(self, names: Sequence[str], options: CheckOptions) -> list[CheckResult]:
        which = "heavy" if options.dcgm_level == 3 else "light"
        self.runs.append((self.now, which, options.dcgm_level))
        started = self.now
        self.now += self.heavy_s if which == "heavy" else self.light_s
        return [
            CheckResult(options.node, name, "", Status.PASS, None, "", None, started, 1.0) for name in names
        ]

    def starts(self, which: str) -> list[float]:
        return [start for start, kind, _ in self.runs if kind == which]


def scheduled(node: FakeNode, probes: Sequence[Probe], **settings: object) -> Scheduler:
    return Scheduler(
        CheckOptions(node="vela-001"),
        Schedule(**settings),  # type: ignore[arg-type]
        probes,
        run_checks=node.run_checks,
        clock=node.clock,
        wait=node.wait,
    )


def test_light_checks_run_hourly_and_heavy_never_on_a_busy_node() -> None:
    node = FakeNode(horizon_s=5 * HOUR_S + 1)
    scheduled(node, [FREE, BUSY]).run()
    assert node.starts("light") == [hour * HOUR_S for hour in range(6)]
    assert node.starts("heavy") == []
    assert {level for _, kind, level in node.runs if kind == "light"} == {1}


def test_heavy_checks_run_on_a_free_node_at_level_3_and_never_twice_within_heavy_every() -> None:
    node = FakeNode(horizon_s=2 * DAY_S + HOUR_S)
    scheduled(node, [FREE, FREE]).run()
    # after the light run of the cycle; the cycle 24 h later is the first a day after the last heavy run
    assert node.starts("heavy") == [10.0, DAY_S + 10.0, 2 * DAY_S + 10.0]
    assert {level for _, kind, level in node.runs if kind == "heavy"} == {3}
    assert node.starts("light")[:3] == [0.0, HOUR_S, 2 * HOUR_S]  # a heavy run does not shift the hours


def test_heavy_every_is_a_setting() -> None:
    node = FakeNode(horizon_s=6 * HOUR_S + 1)
    scheduled(node, [FREE], heavy_every_s=3 * HOUR_S).run()
    assert node.starts("heavy") == [10.0, 3 * HOUR_S + 10.0, 6 * HOUR_S + 10.0]


def test_forced_heavy_checks_run_on_a_busy_node_still_once_per_heavy_every(caplog) -> None:
    node = FakeNode(horizon_s=DAY_S + HOUR_S)
    with caplog.at_level(logging.WARNING, "fleetlens.checks.schedule"):
        scheduled(node, [BUSY], force_heavy=True).run()
    assert node.starts("heavy") == [10.0, DAY_S + 10.0]
    assert "heavy checks forced on a busy node: Slurm jobs on vela-001: 17" in caplog.text


def test_a_light_run_over_one_percent_of_the_interval_stretches_the_next(caplog) -> None:
    node = FakeNode(horizon_s=4 * HOUR_S, light_s=72.0)  # 2% of an hour
    with caplog.at_level(logging.WARNING, "fleetlens.checks.schedule"):
        scheduled(node, [BUSY]).run()
    assert node.starts("light") == [0.0, 7200.0]  # 72 s is 1% of 2 h
    assert (
        "the light checks took 72.0 s, over 1% of the 3600 s interval: the next run is in 7200 s"
        in caplog.text
    )


def test_jitter_delays_each_run_by_at_most_the_jitter() -> None:
    node = FakeNode(horizon_s=3 * HOUR_S)
    Scheduler(
        CheckOptions(node="vela-001"),
        Schedule(jitter_s=600.0),
        [BUSY],
        run_checks=node.run_checks,
        clock=node.clock,
        wait=node.wait,
        jitter=lambda most: most / 2,
    ).run()
    assert node.starts("light") == [0.0, HOUR_S + 300.0, 2 * HOUR_S + 600.0]


@pytest.mark.parametrize("settings", [{"interval_s": 0.0}, {"jitter_s": -1.0}, {"max_unsent": -1}])
def test_a_schedule_that_cannot_run_is_refused(settings: dict[str, float]) -> None:
    with pytest.raises(CollectorConfigError, match="schedule needs interval"):
        Schedule(**settings)  # type: ignore[arg-type]


def post_answering(answers: list[PostFailed | None], posted: list[list[str]]) -> Post:
    """A hub that answers each post with the next of `answers`, recording what it stored."""
    replies = iter(answers)

    def post(results: list[CheckResult]) -> PostFailed | None:
        reply = next(replies)
        if reply is None:
            posted.append([f"{result.check}@{result.started:g}" for result in results])
        return reply

    return post


def scheduled_posting(node: FakeNode, post: Post, max_unsent: int) -> Scheduler:
    return Scheduler(
        CheckOptions(node="vela-001"),
        Schedule(max_unsent=max_unsent),
        [BUSY],
        post=post,
        run_checks=node.run_checks,
        clock=node.clock,
        wait=node.wait,
    )


def test_unsent_results_are_kept_up_to_the_bound_and_the_dropped_counted(caplog) -> None:
    node = FakeNode(horizon_s=3 * HOUR_S + 1)  # four light runs, two results each
    posted: list[list[str]] = []
    down = PostFailed("the hub at http://hub:9500 cannot be reached", retry=True)
    with caplog.at_level(logging.WARNING, "fleetlens.checks.schedule"):
        scheduled_posting(node, post_answering([down, down, down, None], posted), max_unsent=5).run()
    # the oldest of the six unsent after the third run was dropped; the rest went with the fourth run's
    assert posted == [
        [
            "gpu_state@0",
            "dcgm_diag@3600",
            "gpu_state@3600",
            "dcgm_diag@7200",
            "gpu_state@7200",
            "dcgm_diag@10800",
            "gpu_state@10800",
        ]
    ]
    assert "5 kept for the next post (at most 5), 1 dropped so far" in caplog.text
    assert caplog.records[-1].getMessage() == "sent 7 results; 1 earlier ones were dropped unsent"


def test_results_the_hub_refused_are_dropped_not_sent_again(caplog) -> None:
    node = FakeNode(horizon_s=HOUR_S + 1)
    posted: list[list[str]] = []
    refused = PostFailed("checks[0].status: expected one of PASS, WARN, FAIL, ERROR", retry=False)
    with caplog.at_level(logging.WARNING, "fleetlens.checks.schedule"):
        scheduled_posting(node, post_answering([refused, None], posted), max_unsent=100).run()
    assert posted == [["dcgm_diag@3600", "gpu_state@3600"]]
    assert "0 kept for the next post (at most 100), 2 dropped so far" in caplog.text


def fake_nvml(processes: dict[int, list[int]], failing: str = "") -> SimpleNamespace:
    """pynvml's interface over GPUs running `processes` (index -> pids); `failing` names a call that
    raises pynvml's NVMLError."""

    def call(name: str, answer: object) -> object:
        def function(*args: object) -> object:
            if name == failing:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
            return answer(*args) if callable(answer) else answer

        return function

    return SimpleNamespace(
        NVMLError=pynvml.NVMLError,
        nvmlInit=call("nvmlInit", None),
        nvmlShutdown=call("nvmlShutdown", None),
        nvmlDeviceGetCount=call("nvmlDeviceGetCount", len(processes)),
        nvmlDeviceGetHandleByIndex=call("nvmlDeviceGetHandleByIndex", lambda index: index),
        nvmlDeviceGetComputeRunningProcesses=call(
            "nvmlDeviceGetComputeRunningProcesses",
            lambda index: [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in processes[index]],
        ),
    )


@pytest.mark.parametrize(
    ("nvml", "says"),
    [
        (fake_nvml({0: [], 1: []}), None),
        (fake_nvml({0: [], 1: [4242]}), "GPU compute processes: pid 4242 on gpu:1"),
        (fake_nvml({0: []}, failing="nvmlInit"), "GPU processes unknown: nvmlInit failed: Unknown Error"),
        (
            fake_nvml({0: []}, failing="nvmlDeviceGetComputeRunningProcesses"),
            "GPU processes unknown: Unknown Error",
        ),
    ],
)
def test_nvml_says_free_only_when_no_gpu_runs_a_compute_process(
    nvml: SimpleNamespace, says: str | None
) -> None:
    assert nvml_processes_probe(nvml)() == says


def test_heavy_never_runs_while_a_gpu_process_is_there() -> None:
    node = FakeNode(horizon_s=2 * DAY_S)
    scheduled(node, [nvml_processes_probe(fake_nvml({0: [4242]}))]).run()
    assert node.starts("heavy") == []


def fake_squeue(tmp_path: Path, script: str) -> str:
    path = tmp_path / "squeue"
    path.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\n{script}\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ("true", None),
        ("echo", "Slurm state unknown: squeue line 1 is not a job id: ''"),
        (
            "echo 17; echo 18_3; echo '19_[1-3,5%2]'; echo 20+1",
            "Slurm jobs on vela-001: 17, 18_3, 19_[1-3,5%2], 20+1",
        ),
        (
            "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1",
            "Slurm state unknown: squeue exited 1: slurm_load_jobs error: Unable to contact slurm controller",
        ),
        ("echo '17; rm -rf /'", "Slurm state unknown: squeue line 1 is not a job id: '17; rm -rf /'"),
    ],
)
def test_squeue_says_free_only_when_it_lists_no_job(tmp_path: Path, script: str, says: str | None) -> None:
    assert slurm_jobs_probe("vela-001", [fake_squeue(tmp_path, script)])() == says
    assert (tmp_path / "args").read_text().split() == ["-h", "-w", "vela-001", "-o", "%i"]


def test_absent_slurm_is_unknown_so_heavy_checks_never_run() -> None:
    probe = slurm_jobs_probe("vela-001", ["fleetlens-no-such-squeue"])
    assert probe() == "Slurm state unknown: fleetlens-no-such-squeue is not installed (not found on PATH)"
    node = FakeNode(horizon_s=2 * DAY_S)
    scheduled(node, [FREE, probe]).run()
    assert node.starts("heavy") == []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_cluster(tmp_path_factory.mktemp("slurm"), names=["vela-001", "vela-002"]) as running:
        yield running


@pytest.mark.integration
def test_a_real_sbatch_job_on_the_node_makes_it_busy_for_the_real_squeue(cluster: SlurmCluster) -> None:
    env = {**os.environ, **cluster.env}
    probe = slurm_jobs_probe("vela-001", env=env)
    assert probe() is None
    job = subprocess.run(
        ["sbatch", "--parsable", "-w", "vela-001", "--output=/dev/null", "--wrap", "sleep 60"],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while (said := probe()) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert said == f"Slurm jobs on vela-001: {job}"
        assert slurm_jobs_probe("vela-002", env=env)() is None
        node = FakeNode(horizon_s=HOUR_S)
        scheduled(node, [FREE, probe]).run()
        assert node.starts("heavy") == []
    finally:
        subprocess.run(["scancel", job], env=env, timeout=10, check=True)
    assert slurm_jobs_probe("vela-001-no-such-node", env=env)().startswith(
        "Slurm state unknown: squeue exited"
    )


def test_the_cli_runs_light_checks_at_once_and_stops_on_sigterm(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "fleetlens.cli",
        "checks",
        "schedule",
        "--node",
        "vela-001",
        "--without-slurm",
    ]
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}  # no dcgmi: its check says so in an ERROR row
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as process:
        first = process.stdout.readline()  # type: ignore[union-attr]
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        stderr = process.stderr.read()  # type: ignore[union-attr]
    assert '"check": "dcgm_diag"' in first and '"status": "ERROR"' in first, stderr
    assert process.returncode == 0, stderr

"""A postmortem of a job a real Slurm 22.05 cluster ran (tests/support/slurm.py) that sent no step times:
the hub's poller places it from the real squeue --json, and the report finds its node and the anomaly
there from those placements alone."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from analytics.detectors.runner import store_anomalies
from analytics.reports.postmortem import build_report, to_markdown
from analytics.store import Store
from analytics.store.records import Anomaly
from hub.placements import SlurmPlacements
from tests.support.evidence import example
from tests.support.slurm import slurm_cluster

NODE = "vela-002"


def test_a_real_slurm_job_without_steps_is_reported_on_the_node_slurm_gave_it(
    store: Store, tmp_path_factory: pytest.TempPathFactory
):
    # a short root: slurmstepd's socket, <root>/spool/<node>/<node>_<job>.<step>, must fit a unix socket
    # path (108 bytes), which this test's own tmp_path under an xdist worker does not
    with slurm_cluster(tmp_path_factory.mktemp("slurm"), names=["vela-001", NODE]) as cluster:
        sbatch = ["sbatch", "--parsable", "-w", NODE, "--output=/dev/null", "--wrap", "sleep 60"]
        env = {**os.environ, **cluster.env}
        job = subprocess.run(sbatch, env=env, capture_output=True, text=True, timeout=10, check=True)
        job_id = job.stdout.strip()
        poller = SlurmPlacements(store, env=cluster.env)
        deadline = time.monotonic() + 120  # a loaded machine's slurmctld starts a job in seconds, not at once
        while not (placed := store.placements_between(0, time.time() + 60, job=job_id)):
            if time.monotonic() > deadline:
                queue = subprocess.run(
                    ["squeue", "-h", "-o", "%i %T %R"], env=env, capture_output=True, text=True
                )
                pytest.fail(f"job {job_id} was never placed; squeue says: {queue.stdout or queue.stderr}")
            assert poller.check() is not None, "squeue --json failed: see the log"
            time.sleep(0.2)
        # ended here, while its slurmd runs: a batch step left behind outlives the cluster
        subprocess.run(["scancel", "--full", job_id], env=env, timeout=10, check=True)
        cluster.wait_until(lambda now: now[NODE][0] == "idle", f"job {job_id} cancelled", timeout=60)
    [placement] = placed
    throttle = example("gpu_throttle", sm_clock_mhz=900.0, peers_sm_clock_mhz=1400.0)
    store_anomalies(
        store,
        [
            Anomaly(
                "a-1", placement.since + 1, None, "gpu_throttle", NODE, "gpu:0", "", "warning", 3.0,
                throttle, "gpu_throttle", "1",
            )
        ],
    )  # fmt: skip

    report = build_report(store, job=job_id, start=placement.since - 3600, end=placement.since + 3600)

    assert (report.nodes, report.nodes_from, report.start) == ((NODE,), "placements", placement.since)
    assert [event.what for event in report.events if event.source == "anomaly"] == [
        "gpu_throttle gpu:0 opened"
    ]
    assert f"| {job_id} | root | {NODE} |" in to_markdown(report)

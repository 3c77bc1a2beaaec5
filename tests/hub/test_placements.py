"""SlurmPlacements against a real Slurm 22.05 cluster (tests/support/slurm.py): a job sbatch starts is
placed on its node as the real squeue --json lists it, and ends when scancel ends it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from analytics.store import Store
from analytics.store.records import Placement
from hub.placements import SlurmPlacements
from tests.support.hubserver import hub_process, query_hub
from tests.support.slurm import SlurmCluster, slurm_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_cluster(
        tmp_path_factory.mktemp("slurm"), names=["vela-001", "vela-002", "vela-003"]
    ) as running:
        yield running


def slurm(cluster: SlurmCluster, *command: str) -> str:
    return subprocess.run(
        command, env={**os.environ, **cluster.env}, capture_output=True, text=True, timeout=10, check=True
    ).stdout


def poll_until(
    poller: SlurmPlacements, store: Store, done: Callable[[list[Placement]], bool], what: str
) -> list[Placement]:
    """check() until the placements stored satisfy `done`; fails naming `what` after 120 s of polls (a
    loaded machine's slurmctld starts and ends jobs in seconds, not at once)."""
    deadline = time.monotonic() + 120
    while True:
        assert poller.check() is not None
        placements = store.placements_between(0, time.time() + 60)
        if done(placements):
            return placements
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: the placements stored are {placements}")
        time.sleep(0.2)


def test_a_job_sbatch_starts_is_placed_on_its_node_and_ends_when_scancel_ends_it(
    cluster: SlurmCluster, store: Store
) -> None:
    poller = SlurmPlacements(store, env=cluster.env)
    job = slurm(
        cluster, "sbatch", "--parsable", "-N", "2", "--output=/dev/null", "--wrap", "sleep 30"
    ).strip()

    running = poll_until(poller, store, lambda ps: len(ps) == 2, f"job {job} never ran")
    assert {(p.job, p.user, p.until) for p in running} == {(job, "root", None)}
    assert {p.node for p in running} <= set(cluster.nodes)

    slurm(cluster, "scancel", job)
    ended = poll_until(poller, store, lambda ps: all(p.until for p in ps), f"job {job} never ended")
    assert [(p.node, p.since) for p in ended] == [(p.node, p.since) for p in running]
    assert all(p.since <= p.until <= time.time() for p in ended)


@pytest.mark.parametrize(
    "command",
    [
        ["/nonexistent/squeue", "--json"],
        [sys.executable, "-c", "import sys; sys.exit(1)"],
        [sys.executable, "-c", 'print(\'{"jobs": [{"job_state": 1}]}\')'],
    ],
)
def test_a_poll_that_fails_keeps_the_placements_stored(
    command: list[str], store: Store, tmp_path: Path
) -> None:
    good = tmp_path / "squeue.json"
    good.write_text(
        (
            Path(__file__).parents[1] / "fixtures/placements/squeue-22.05-one-running-one-cancelled.json"
        ).read_text()
    )
    SlurmPlacements(store, command=["cat", str(good)]).check()
    before = store.placements_between(0, time.time() + 60)

    assert SlurmPlacements(store, command=command).check() is None
    assert store.placements_between(0, time.time() + 60) == before
    assert [p.node for p in before if p.until is None] == ["vela-003"]


def test_a_hub_started_with_slurm_placements_keeps_the_running_job_in_its_store(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    job = slurm(cluster, "sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 60").strip()
    poll_until_running = time.monotonic() + 30
    while "RUNNING" not in slurm(cluster, "squeue", "-h", "-j", job, "-o", "%T"):
        assert time.monotonic() < poll_until_running, f"job {job} never ran"
        time.sleep(0.2)
    store = f"chdb://{tmp_path / 'hub-data'}"
    with hub_process(tmp_path, "--slurm-placements", store=store, env=cluster.env) as hub:
        deadline = time.monotonic() + 30  # its first poll runs as it starts
        while not (rows := placed_via_hub(hub.url, job)) and time.monotonic() < deadline:
            time.sleep(0.2)
    slurm(cluster, "scancel", job)
    assert [(row["job"], row["until_set"]) for row in rows] == [(job, 0)]  # placed, and still running
    assert rows[0]["node"] in cluster.nodes


def placed_via_hub(url: str, job: str) -> list[dict[str, object]]:
    """The placements of `job` in the hub's store (the cluster still lists the module's earlier jobs)."""
    assert job.isdigit()
    sql = f"SELECT job, node, isNotNull(valid_to) AS until_set FROM placements FINAL WHERE job = '{job}'"
    return query_hub(url, sql)

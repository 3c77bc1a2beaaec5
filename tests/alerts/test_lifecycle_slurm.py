"""The node lifecycle against a real Slurm 22.05 cluster (tests/support/slurm.py): a node fleetlens
drained is tested and resumed; a node a person drained, or took over with their own reason, is not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from alerts.backends.slurm import SlurmBackend, is_drained
from alerts.drain import DrainController
from alerts.lifecycle import Lifecycle
from alerts.policy import DrainPolicy
from tests.alerts.test_drain import anomaly, firing
from tests.alerts.test_lifecycle import POLICY, Results, Trigger
from tests.support.slurm import slurm_cluster

pytestmark = pytest.mark.integration
NODES = ["node01", "node02", "node03", "node04"]


def test_slurm_resumes_a_node_fleetlens_drained_once_tested_and_never_one_a_person_holds(
    tmp_path: Path,
) -> None:
    with slurm_cluster(tmp_path, names=NODES) as cluster:
        backend = SlurmBackend(env=cluster.env)

        def by_hand(node: str, reason: str) -> None:
            command = ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]
            subprocess.run(command, env={**os.environ, **cluster.env}, check=True)

        def states() -> dict[str, tuple[bool, str]]:
            return {node: (is_drained(state), why) for node, (state, why) in backend.node_states().items()}

        controller = DrainController(DrainPolicy(mode="auto"), [backend], fleet_size=100)
        controller.step(firing(anomaly("node01"), anomaly("node02")), now=10.0)
        by_hand("node03", "ops: DIMM swap, ticket=4711")  # never fleetlens's
        by_hand("node02", "ops: cable check, ticket=4712")  # a person takes over a node fleetlens drained
        trigger, results = Trigger(), Results()
        lifecycle = Lifecycle(POLICY, controller, trigger, results)
        assert lifecycle.step([], 700) and {node for node, _, _ in trigger.started} == {"node01", "node02"}
        for node in ("node01", "node02", "node03"):
            for check in POLICY.checks:
                results.add(node, check, "PASS", 710)

        rows = {row.node: row for row in lifecycle.step([], 720)}

        assert (rows["node01"].action, rows["node01"].outcome) == ("return", "done")
        assert (rows["node02"].action, rows["node02"].outcome) == ("return", "refused")
        assert "node03" not in rows and lifecycle.states == {} and controller.drained == {}
        cluster.wait_until(lambda now: now["node01"] == ("idle", ""), "node01 back in service")
        now = states()
        assert now["node02"] == (True, "ops: cable check, ticket=4712")
        assert now["node03"] == (True, "ops: DIMM swap, ticket=4711")
        assert not now["node01"][0]

"""SlurmBackend against a real Slurm 22.05 cluster: slurmctld and four slurmd on this machine
(tests/support/slurm.py), checked with the real sinfo."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from alerts.backends.slurm import SlurmBackend, is_drained, parse_node_lines
from alerts.errors import BackendError
from alerts.model import DrainRequest
from tests.support.peers import hung_listener, require_binary
from tests.support.slurm import SlurmCluster, slurm_cluster, slurm_conf

# One line of `scontrol show node --oneliner` from slurm-wlm 22.05.8, for a node a person drained.
DRAINED_BY_HAND = (
    "NodeName=node02 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=1.72 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Port=49643 Version=22.05.8 OS=Linux 6.18.44-fc-v782 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=100 "
    "AllocMem=0 FreeMem=17554 Sockets=1 Boards=1 State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 "
    "Owner=N/A MCS_label=N/A Partitions=all  BootTime=2026-11-30T03:10:34 "
    "SlurmdStartTime=2026-11-30T08:27:51 LastBusyTime=2026-11-30T08:27:56 CfgTRES=cpu=1,mem=100M,billing=1 "
    "AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
    "Reason=fleetlens: gpu_fault abc=1 | x [root@2026-11-30T08:28:00]"
)


def request(node: str, kind: str = "gpu_fault") -> DrainRequest:
    return DrainRequest(decision_id=uuid.uuid4().hex, node=node, kind=kind, alert_id=uuid.uuid4().hex[:16])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


@pytest.fixture
def backend(cluster: SlurmCluster) -> SlurmBackend:
    return SlurmBackend(env=cluster.env)


def test_a_line_of_scontrol_gives_state_and_the_whole_reason_without_who_and_when() -> None:
    states = parse_node_lines(DRAINED_BY_HAND)

    assert states == {"node02": ("IDLE+DRAIN", "fleetlens: gpu_fault abc=1 | x")}
    assert is_drained(states["node02"][0])


def test_a_line_it_cannot_read_is_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        states = parse_node_lines(f"Node node09 not found\n{DRAINED_BY_HAND}\n")

    assert list(states) == ["node02"]
    assert "Node node09 not found" in caplog.text


def test_a_missing_scontrol_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = str(tmp_path / "scontrol")

    with pytest.raises(BackendError, match=re.escape(f"drain node01: cannot run {missing}")):
        SlurmBackend(scontrol=missing).drain(request("node01"))


@pytest.mark.integration
def test_a_controller_that_never_answers_is_an_error_after_the_timeout(tmp_path: Path) -> None:
    require_binary("scontrol")
    with hung_listener() as address:
        conf = slurm_conf(tmp_path, int(address.rsplit(":", 1)[1]), {"node01": 1})
        backend = SlurmBackend(env={"SLURM_CONF": str(conf)}, timeout_s=1.0)
        started = time.monotonic()

        with pytest.raises(
            BackendError, match=r"drain node01: `scontrol update nodename=node01 .*within 1.0s"
        ):
            backend.drain(request("node01"))

    assert time.monotonic() - started < 5


@pytest.mark.integration
def test_drain_shows_in_sinfo_with_our_reason_and_resume_puts_the_node_back(
    cluster: SlurmCluster, backend: SlurmBackend
) -> None:
    drain = request("node02")

    backend.drain(drain)

    states = cluster.sinfo()
    assert states["node02"][0] in {"drained", "draining"}
    assert states["node02"][1] == f"fleetlens: gpu_fault {drain.alert_id}"
    assert {node: states[node] for node in ("node01", "node03", "node04")} == dict.fromkeys(
        ("node01", "node03", "node04"), ("idle", "")
    )

    backend.resume(drain)

    # slurmctld pings a resumed node before trusting it again: sinfo shows `idle*` for a moment.
    cluster.wait_until(lambda now: now["node02"] == ("idle", ""), "node02 idle without a reason")


@pytest.mark.integration
def test_resuming_a_node_that_is_in_service_leaves_it_so(
    cluster: SlurmCluster, backend: SlurmBackend
) -> None:
    backend.resume(request("node04"))

    assert cluster.sinfo()["node04"] == ("idle", "")


@pytest.mark.integration
def test_a_node_slurm_does_not_know_is_an_error_naming_it_and_scontrols_answer(backend: SlurmBackend) -> None:
    with pytest.raises(BackendError, match=r"drain node09: .* exited with status 1: .*Invalid node name"):
        backend.drain(request("node09"))


@pytest.mark.integration
@pytest.mark.parametrize("name", ["node[01-04]", "node01,node02", "node01 state=down", "", "-h", "node01;id"])
def test_a_name_that_is_not_one_node_is_refused_before_any_call(
    cluster: SlurmCluster, backend: SlurmBackend, name: str
) -> None:
    with pytest.raises(BackendError, match="not a single Slurm node name"):
        backend.drain(request(name))

    assert cluster.sinfo() == dict.fromkeys(cluster.nodes, ("idle", ""))


@pytest.mark.integration
def test_node_states_agree_with_sinfo_on_a_node_a_person_drained(
    cluster: SlurmCluster, backend: SlurmBackend
) -> None:
    reason = "ops: DIMM swap, ticket=4711"
    subprocess.run(
        ["scontrol", "update", "nodename=node03", "state=drain", f"reason={reason}"],
        env={**os.environ, **cluster.env},
        check=True,
    )
    try:
        seen, shown = backend.node_states(), cluster.sinfo()
    finally:
        backend.resume(request("node03"))

    assert set(seen) == set(shown) == set(cluster.nodes)
    assert {node: is_drained(state) for node, (state, _) in seen.items()} == {
        node: state in {"drained", "draining"} for node, (state, _) in shown.items()
    }
    assert {node: why for node, (_, why) in seen.items()} == {node: why for node, (_, why) in shown.items()}
    assert seen["node03"][1] == reason

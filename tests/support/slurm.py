"""A real Slurm cluster on this one machine: one slurmctld and N slurmd, for drain-backend tests.

Debian's slurm-wlm 22.05 runs several slurmd on one host without front-end mode: each daemon is
started with `-N nodeXX`, each node has its own `Port=` in slurm.conf (all with NodeAddr=127.0.0.1),
and its spool directory and pid file are told apart with `%n`. It needs no munge (auth/none,
cred/none), no cgroup.conf (proctrack/linuxproc, task/none) and no accounting. Slurm has no option to
bind to loopback only, so the daemons listen on free ports of every address for the length of a test.

Configuration, state and logs live under the caller's directory, so a system Slurm is never touched.
The daemons run in the foreground (-D) as our children, log to `<name>.log` there, and are ended by
their own PIDs. Slurm's daemons run as SlurmUser/SlurmdUser root, so this needs root.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.peers import free_port, require_binary, stop

NodeStates = dict[str, tuple[str, str]]


@dataclass(frozen=True)
class SlurmCluster:
    """A running cluster: its slurm.conf, the environment Slurm's commands need to find it, its nodes,
    and its daemons by name (each logs to `<name>.log` beside slurm.conf)."""

    conf: Path
    env: dict[str, str]
    nodes: list[str]
    daemons: Mapping[str, subprocess.Popen] = field(default_factory=dict)

    def sinfo(self) -> NodeStates:
        """node -> (state, reason) as the real `sinfo -N` shows them; reason "" where sinfo says none."""
        result = subprocess.run(
            ["sinfo", "-N", "-h", "-o", "%N|%T|%E"],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        states: NodeStates = {}
        for line in result.stdout.splitlines():
            node, state, reason = line.split("|", 2)
            states[node] = (state, "" if reason == "none" else reason)
        return states

    def wait_until(
        self, condition: Callable[[NodeStates], bool], what: str, timeout: float = 15.0
    ) -> NodeStates:
        """Poll sinfo until `condition` holds for it. RuntimeError as soon as a daemon has exited,
        TimeoutError naming `what` and sinfo's last answer; both with the daemons' logs."""
        deadline = time.monotonic() + timeout
        last: NodeStates | str = "no answer"
        while time.monotonic() < deadline:
            if any(process.poll() is not None for process in self.daemons.values()):
                raise RuntimeError(f"a Slurm daemon exited while waiting for {what}\n{self.logs()}")
            try:
                last = self.sinfo()
            except subprocess.CalledProcessError as error:
                last = error.stderr.strip()
            else:
                if condition(last):
                    return last
            time.sleep(0.2)
        raise TimeoutError(f"Slurm did not reach {what} within {timeout}s; sinfo said: {last}\n{self.logs()}")

    def logs(self, lines: int = 20) -> str:
        """Each daemon's status and the last lines of its log."""
        parts = []
        for name, process in self.daemons.items():
            status = "running" if process.poll() is None else f"exited with {process.returncode}"
            tail = (self.conf.parent / f"{name}.log").read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {name} ({status}):\n" + "\n".join(tail))
        return "\n".join(parts)


def slurm_conf(root: Path, controller_port: int, node_ports: Mapping[str, int]) -> Path:
    """Write a private slurm.conf under `root` (with its state and spool directories); its path."""
    (root / "state").mkdir(parents=True, exist_ok=True)
    for node in node_ports:
        (root / "spool" / node).mkdir(parents=True, exist_ok=True)
    nodes = "\n".join(
        f"NodeName={node} NodeAddr=127.0.0.1 Port={port} CPUs=1 RealMemory=100 State=UNKNOWN"
        for node, port in node_ports.items()
    )
    conf = root / "slurm.conf"
    conf.write_text(
        f"""\
ClusterName=fleetlens-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={controller_port}
SlurmdPort={free_port()}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
{nodes}
PartitionName=all Nodes=ALL Default=YES State=UP
"""
    )
    return conf


@contextlib.contextmanager
def slurm_cluster(
    tmp_path: Path, nodes: int = 4, names: Sequence[str] | None = None
) -> Iterator[SlurmCluster]:
    """Start slurmctld and one slurmd per node (`names`, default node01 .. node<nodes>) and yield once
    sinfo shows all idle."""
    slurmctld, slurmd = require_binary("slurmctld"), require_binary("slurmd")
    require_binary("sinfo")
    if os.geteuid() != 0:
        pytest.skip("a private Slurm cluster needs root: its daemons run as SlurmUser/SlurmdUser root")
    names = list(names or [f"node{index:02d}" for index in range(1, nodes + 1)])
    conf = slurm_conf(tmp_path, free_port(), {node: free_port() for node in names})
    env = {"SLURM_CONF": str(conf)}
    commands = {"slurmctld": [slurmctld, "-D", "-f", str(conf)]}
    commands |= {f"slurmd-{node}": [slurmd, "-D", "-N", node, "-f", str(conf)] for node in names}
    with contextlib.ExitStack() as stack:
        daemons = {
            name: stack.enter_context(_daemon(args, tmp_path / f"{name}.log", env))
            for name, args in commands.items()
        }
        cluster = SlurmCluster(conf=conf, env=env, nodes=names, daemons=daemons)
        cluster.wait_until(lambda states: _all_idle(states, names), "every node idle", timeout=30)
        yield cluster


def _all_idle(states: NodeStates, nodes: Sequence[str]) -> bool:
    return all(states.get(node, ("", ""))[0] == "idle" for node in nodes)


@contextlib.contextmanager
def _daemon(args: Sequence[str], log: Path, env: Mapping[str, str]) -> Iterator[subprocess.Popen]:
    """Run one daemon until the block ends, its output in `log`; ended by its own PID."""
    with log.open("w") as output:
        process = subprocess.Popen(
            list(args), env={**os.environ, **env}, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        yield process
    finally:
        stop(process)

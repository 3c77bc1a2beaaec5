"""Local peers the demo (and the integration tests) start: Alertmanager and a private Slurm cluster.

Each runs as our child in the foreground, on free loopback ports where it can be told to, with its
configuration, state and logs under a directory of the caller's, and is ended by the PID we started.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fleetlens.errors import ChildExited, DemoError

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
PRIVATE_PORTS_FROM = 20000  # below the ephemeral range, above what system services usually hold

# One receiver that notifies nobody: what Alertmanager holds is read through its API and UI.
ALERTMANAGER_CONFIG = """\
route:
  receiver: "null"
  group_wait: 1s
  group_interval: 1s
receivers:
  - name: "null"
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    [port] = free_ports(1)
    return port


def free_ports(count: int, port_range: Path = EPHEMERAL_RANGE) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that nothing listens on right now.

    They are held together while chosen, so none is handed out twice, and drawn from below the kernel's
    ephemeral range: a port from `bind(0)` is free only until someone binds it, and between our choice and
    the peer's bind every exporter bound to port 0 and every outgoing connection takes ports from that
    range (CI once lost the demo's hub port to one)."""
    low, _ = _ephemeral_range(port_range)
    candidates = random.sample(range(PRIVATE_PORTS_FROM, low), k=low - PRIVATE_PORTS_FROM)
    chosen: list[int] = []
    with contextlib.ExitStack() as stack:
        for port in candidates:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise DemoError(f"fewer than {count} free TCP ports on 127.0.0.1 below {low}")


def _ephemeral_range(path: Path) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where the file cannot be read)."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return max(low, PRIVATE_PORTS_FROM + 1024), high


def wait_http(url: str, process: subprocess.Popen, timeout: float = 20.0) -> None:
    """Wait until `url` answers 200, failing early with the peer's output if it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            out = process.stdout.read() if process.stdout else ""
            raise ChildExited(f"{process.args[0]} exited with {process.returncode}:\n{out}")
        if answers(url):
            return
        time.sleep(0.1)
    raise DemoError(f"{url} did not answer within {timeout}s")


def answers(url: str, timeout_s: float = 1.0) -> bool:
    """Whether `url` answers a GET with a success status now."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return True
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def stop(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """End a process we started, by its own PID: SIGTERM, then SIGKILL if it lingers past `timeout_s`."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def logged_process(
    args: Sequence[str], log: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """Run `args` until the block ends, its output in `log`, its input nothing (never ours: under pytest-xdist
    stdin is the worker's channel to its controller); ended by its own PID."""
    with log.open("w") as output:
        process = subprocess.Popen(
            list(args),
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        stop(process)


@contextlib.contextmanager
def alertmanager(binary: str, root: Path) -> Iterator[str]:
    """The base URL of a running Alertmanager with its state under `root` and no cluster gossip."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "alertmanager.yml"
    config.write_text(ALERTMANAGER_CONFIG)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = [
        binary,
        f"--config.file={config}",
        f"--storage.path={root / 'alertmanager-data'}",
        "--cluster.listen-address=",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with logged_process(args, root / "alertmanager.log") as process:
        wait_http(f"{base}/-/ready", process)
        yield base


# -- Slurm ---------------------------------------------------------------------------------------------------

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
        """Poll sinfo until `condition` holds for it. ChildExited as soon as a daemon has exited,
        DemoError naming `what` and sinfo's last answer; both with the daemons' logs."""
        deadline = time.monotonic() + timeout
        last: NodeStates | str = "no answer"
        while time.monotonic() < deadline:
            if any(process.poll() is not None for process in self.daemons.values()):
                raise ChildExited(f"a Slurm daemon exited while waiting for {what}\n{self.logs()}")
            try:
                last = self.sinfo()
            except subprocess.CalledProcessError as error:
                last = error.stderr.strip()
            else:
                if condition(last):
                    return last
            time.sleep(0.2)
        raise DemoError(f"Slurm did not reach {what} within {timeout}s; sinfo said: {last}\n{self.logs()}")

    def logs(self, lines: int = 20) -> str:
        """The controller's and every exited daemon's status and the last lines of their logs."""
        parts = []
        for name, process in self.daemons.items():
            if name != "slurmctld" and process.poll() is None:
                continue
            status = "running" if process.poll() is None else f"exited with {process.returncode}"
            tail = (self.conf.parent / f"{name}.log").read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {name} ({status}):\n" + "\n".join(tail))
        return "\n".join(parts)


def slurm_conf(
    root: Path, controller_port: int, node_ports: Mapping[str, int], slurmd_port: int | None = None
) -> Path:
    """Write a private slurm.conf under `root` (with its state and spool directories); its path.

    Debian's slurm-wlm 22.05 runs several slurmd on one host without front-end mode: each daemon is
    started with `-N node`, each node has its own `Port=` (all with NodeAddr=127.0.0.1), and spool
    directories and pid files are told apart with `%n`. No munge (auth/none, cred/none), no cgroups
    (proctrack/linuxproc, task/none), no accounting."""
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
ClusterName=fleetlens
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={controller_port}
SlurmdPort={slurmd_port or free_port()}
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
def slurm_cluster(root: Path, names: Sequence[str], slurmctld: str, slurmd: str) -> Iterator[SlurmCluster]:
    """Start slurmctld and one slurmd per node name (as root: Slurm's daemons run as root here) and
    yield once sinfo shows every node idle. Slurm cannot bind to loopback only: the daemons listen on
    free ports of every address while the block runs."""
    root.mkdir(parents=True, exist_ok=True)
    names = list(names)
    controller, slurmd_port, *node_ports = free_ports(len(names) + 2)
    conf = slurm_conf(root, controller, dict(zip(names, node_ports, strict=True)), slurmd_port)
    env = {"SLURM_CONF": str(conf)}
    commands = {"slurmctld": [slurmctld, "-D", "-f", str(conf)]}
    commands |= {f"slurmd-{node}": [slurmd, "-D", "-N", node, "-f", str(conf)] for node in names}
    with contextlib.ExitStack() as stack:
        daemons = {
            name: stack.enter_context(logged_process(args, root / f"{name}.log", env))
            for name, args in commands.items()
        }
        cluster = SlurmCluster(conf=conf, env=env, nodes=names, daemons=daemons)
        cluster.wait_until(lambda states: _all_idle(states, names), "every node idle", timeout=60)
        yield cluster


def _all_idle(states: NodeStates, nodes: Sequence[str]) -> bool:
    return all(states.get(node, ("", ""))[0] == "idle" for node in nodes)

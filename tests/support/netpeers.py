"""A small fabric of network namespaces for the network checks: the node under check and its peers, each
with one netdev (FABRIC_DEV) on a bridge in a `switch` namespace, and a `tc` qdisc on the switch port
towards an impaired peer, as a bad cable or a congested port would be.

The kernels these tests run on may lack netem (a Firecracker guest has tbf and htb only), so impairments
are token buckets: a rate far under the probe's own traffic drops most of it (loss), a rate of 10 Mbit/s
caps a bandwidth test. Everything made here is ended by the PID or name it was made with, and only that.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

import pytest

from collectors.checks.network import Runner, run_local
from collectors.commands import Completed
from tests.support.peers import require_binary, stop

FABRIC_DEV = "fl0"
# 1 kbit/s with room for one echo: ten pings a second apart at 0.2 s offer four times what it passes
STARVED = ("tbf", "rate", "1kbit", "burst", "100", "limit", "100")
TEN_MBIT = ("tbf", "rate", "10mbit", "burst", "32kbit", "latency", "50ms")


@dataclass(frozen=True)
class Fabric:
    """Each member's namespace and address (the node is member "node")."""

    namespaces: Mapping[str, str]
    addresses: Mapping[str, str]

    def runner(self, member: str) -> Runner:
        """Runs a check's commands inside `member`'s namespace."""
        prefix = ["ip", "netns", "exec", self.namespaces[member]]

        def run(argv: Sequence[str], timeout_s: float) -> Completed:
            return run_local([*prefix, *argv], timeout_s)

        return run

    @contextlib.contextmanager
    def iperf3_server(self, member: str, port: int = 5201) -> Iterator[subprocess.Popen]:
        """`iperf3 -s -1 -J` in `member`'s namespace, yielded once it listens on `port`."""
        iperf3 = require_binary("iperf3")
        namespace = self.namespaces[member]
        with tempfile.TemporaryFile("w+") as log:
            server = subprocess.Popen(
                ["ip", "netns", "exec", namespace, iperf3, "-s", "-1", "-J", "-p", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                _wait_listening(namespace, port, server, log)
                yield server
            finally:
                stop(server)


def _wait_listening(namespace: str, port: int, server: subprocess.Popen, log: IO[str]) -> None:
    listing = ["ip", "netns", "exec", namespace, "ss", "-Hltn", f"sport = :{port}"]
    for _ in range(100):
        if server.poll() is None and subprocess.run(listing, capture_output=True, text=True).stdout.strip():
            return
        time.sleep(0.1)
    log.seek(0)
    pytest.fail(f"iperf3 server never listened on port {port}: {log.read()}")


@contextlib.contextmanager
def fabric(peers: Mapping[str, Sequence[str]]) -> Iterator[Fabric]:
    """The node and `peers` (name -> tc qdisc arguments on its switch port, () for a clean link) on one
    bridge, addresses 10.40.0.1 (node), .2, ...; skips where namespaces cannot be made (not root, no
    `ip`/`tc`). Deletes every namespace it made, which removes their links and qdiscs with them."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (make test runs as root)")
    require_binary("ip")
    require_binary("tc")
    tag = f"fleetlens-net-{os.getpid()}"
    switch = f"{tag}-switch"
    members = ["node", *peers]
    namespaces = {member: f"{tag}-{member}" for member in members}
    addresses = {member: f"10.40.0.{index}" for index, member in enumerate(members, start=1)}
    made: list[str] = []
    try:
        for namespace in (switch, *namespaces.values()):
            _ip("netns", "add", namespace)
            made.append(namespace)
        _ip("-n", switch, "link", "add", "name", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for index, member in enumerate(members):
            port, namespace = f"port{index}", namespaces[member]
            _ip(
                "link",
                "add",
                port,
                "netns",
                switch,
                "type",
                "veth",
                "peer",
                "name",
                FABRIC_DEV,
                "netns",
                namespace,
            )
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", namespace, "addr", "add", f"{addresses[member]}/24", "dev", FABRIC_DEV)
            for device in ("lo", FABRIC_DEV):
                _ip("-n", namespace, "link", "set", device, "up")
            if qdisc := peers.get(member, ()):
                subprocess.run(["tc", "-n", switch, "qdisc", "add", "dev", port, "root", *qdisc], check=True)
        yield Fabric(namespaces, addresses)
    finally:
        for namespace in made:
            subprocess.run(["ip", "netns", "del", namespace], check=False)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True)

"""Real links for `fleetlens demo --real-links`: two network namespaces joined by veth pairs.

    namespace fleetlens-a-<pid>            namespace fleetlens-b-<pid>
      fla0-<pid> <────── veth ──────> flb0-<pid>     the port the demo flaps
      fla1-<pid> <────── veth ──────> flb1-<pid>     a port that stays up

A real exporter reads the first namespace's links through a sysfs mounted from inside it (sysfs
shows the network devices of the namespace that mounts it), so `--sysfs-root` is all it takes; the
demo flaps a port with `ip link set ... down` and `up`, and the kernel moves its carrier and counters
as it would for a cable. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; everything is
removed on exit, the namespaces taking their veths with them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import TracebackType

from fleetlens.errors import LinkSetupError

PORTS = 2


class RealLinks:
    """The namespaces, veths and sysfs mount; `sysfs_root` for the exporter, `flap_port` to flap."""

    def __init__(self, root: Path) -> None:
        suffix = os.getpid()
        self.namespaces = (f"fleetlens-a-{suffix}", f"fleetlens-b-{suffix}")
        self.ports = [(f"fla{i}-{suffix}"[:15], f"flb{i}-{suffix}"[:15]) for i in range(PORTS)]
        self.sysfs_root = root / "sys"
        self._mounted = False

    @property
    def flap_port(self) -> str:
        """The interface the demo flaps, as node_exporter's device label names it."""
        return self.ports[0][0]

    def __enter__(self) -> RealLinks:
        try:
            for namespace in self.namespaces:
                _run("ip", "netns", "add", namespace)
            ours, theirs = self.namespaces
            for a, b in self.ports:
                _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
                _run("ip", "link", "set", a, "netns", ours)
                _run("ip", "link", "set", b, "netns", theirs)
                _run("ip", "-n", ours, "link", "set", a, "up")
                _run("ip", "-n", theirs, "link", "set", b, "up")
            self.sysfs_root.mkdir(parents=True, exist_ok=True)
            _run("nsenter", f"--net=/run/netns/{ours}", "mount", "-t", "sysfs", "sysfs", str(self.sysfs_root))
            self._mounted = True
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def set_link(self, up: bool) -> None:
        """Take the flapped port down or bring it back, as `ip link set` does."""
        _run("ip", "-n", self.namespaces[0], "link", "set", self.flap_port, "up" if up else "down")

    def close(self) -> None:
        """Unmount and delete what exists; a namespace's veths go with it."""
        if self._mounted:
            subprocess.run(["umount", str(self.sysfs_root)], check=False, capture_output=True)
            self._mounted = False
        for namespace in self.namespaces:
            subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)


def _run(*args: str) -> None:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise LinkSetupError(f"{' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}")

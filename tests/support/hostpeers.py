"""What a hypervisor's host agent reads, made real for tests: a /sys tree with SR-IOV PFs laid out as the
kernel lays them out, libvirt's test driver (virsh without a daemon) holding domains with hostdevs, and
two lldpd daemons in two network namespaces joined by a veth pair (the host's PF and a leaf's port).

Everything started here is ended by the PID and name it was made with, and only that.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from tests.support.peers import require_binary, stop

PF = "ens1f0"
PF_PCI = "0000:3b:00.0"
VFS = tuple(f"0000:3b:{slot:02x}.{function}" for slot in (2, 3) for function in range(8))[:11]
GPU_PCI = "0000:18:00.0"
LEAF, LEAF_PORT = "leaf-07", "swp12"


def sriov_tree(root: Path, pf: str = PF, pf_pci: str = PF_PCI, vfs: Sequence[str] = VFS) -> Path:
    """A /sys tree under `root` with `pf` and its VFs as the kernel lays them out
    (Documentation/PCI/pci-iov-howto): class/net/<pf> -> ../../devices/pci0000:3a/0000:3a:00.0/<pci>/net/<pf>,
    its `device` -> ../../../<pci>, the PF's virtfnN -> ../<vf pci>; plus `eno1`, a NIC without VFs, and
    a VF bound to its netdev driver (physfn, no virtfn)."""
    bridge = root / "devices" / "pci0000:3a" / "0000:3a:00.0"
    net = root / "class" / "net"
    net.mkdir(parents=True)
    for name, pci in ((pf, pf_pci), ("eno1", "0000:3a:00.1"), ("ens1f0v0", vfs[0])):
        (bridge / pci / "net" / name).mkdir(parents=True)
        (bridge / pci / "net" / name / "device").symlink_to(f"../../../{pci}")
        (net / name).symlink_to(f"../../devices/pci0000:3a/0000:3a:00.0/{pci}/net/{name}")
    for index, vf in enumerate(vfs):
        (bridge / vf).mkdir(exist_ok=True)
        (bridge / pf_pci / f"virtfn{index}").symlink_to(f"../{vf}")
    (bridge / vfs[0] / "physfn").symlink_to(f"../{pf_pci}")
    return root


def libvirt_node(path: Path, domains: dict[str, Sequence[str]]) -> str:
    """A node XML for libvirt's test driver at `path`, one running domain per name holding PCI hostdevs
    at the given addresses, each with a UUID of its name (the test driver makes up a new one at each
    connection for a domain without, where a real libvirt keeps the one a domain was defined with); its
    connect URI (`virsh -c URI`)."""
    blocks = []
    for name, addresses in domains.items():
        hostdevs = "".join(
            "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
            f"<address domain='0x{a[0:4]}' bus='0x{a[5:7]}' slot='0x{a[8:10]}' function='0x{a[11]}'/>"
            "</source></hostdev>"
            for a in addresses
        )
        blocks.append(
            f"<domain type='test'><name>{name}</name><uuid>{uuid.uuid5(uuid.NAMESPACE_DNS, name)}</uuid>"
            "<memory>1048576</memory>"
            f"<os><type arch='x86_64'>hvm</type></os><devices>{hostdevs}</devices></domain>"
        )
    path.write_text(f"<node>{''.join(blocks)}</node>\n")
    return f"test://{path}"


@dataclass(frozen=True)
class LldpPair:
    """The host side's lldpd control socket (`lldpcli -u`), once it has heard the leaf."""

    socket: str


def _require_root_tools() -> tuple[str, str]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (make test runs as root)")
    require_binary("ip")
    return require_binary("lldpd"), require_binary("lldpcli")


@contextlib.contextmanager
def lldp_pair() -> Iterator[LldpPair]:
    """Namespaces `<tag>-host` (interface PF) and `<tag>-leaf` (LEAF_PORT, system name LEAF) joined by a
    veth, an lldpd in each with its own control socket sending every second; yields once the host's
    lldpd lists the leaf as its neighbor. Ends both daemons and deletes both namespaces.

    The sockets lie in a directory of their own that lldpd's unprivileged user (`_lldpd`) can reach:
    pytest's tmp_path is root's alone, where a client is refused."""
    lldpd, lldpcli = _require_root_tools()
    tag = f"fleetlens-ha-{os.getpid()}"
    sides = {"host": PF, "leaf": LEAF_PORT}
    made: list[str] = []
    daemons: list[subprocess.Popen] = []
    with tempfile.TemporaryFile("w+") as log, tempfile.TemporaryDirectory(prefix="fleetlens-lldpd-") as work:
        Path(work).chmod(0o755)
        try:
            for side in sides:
                subprocess.run(["ip", "netns", "add", f"{tag}-{side}"], check=True)
                made.append(f"{tag}-{side}")
            veth = ["ip", "link", "add", PF, "netns", f"{tag}-host", "type", "veth"]
            subprocess.run([*veth, "peer", "name", LEAF_PORT, "netns", f"{tag}-leaf"], check=True)
            for side, interface in sides.items():
                for name in ("lo", interface):
                    subprocess.run(["ip", "-n", f"{tag}-{side}", "link", "set", name, "up"], check=True)
                control = f"{work}/{side}.socket"
                daemons.append(
                    subprocess.Popen(
                        ["ip", "netns", "exec", f"{tag}-{side}", lldpd, "-d", "-u", control, "-I", interface],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
                configure = [lldpcli, "-u", control, "configure"]
                _retry([*configure, "lldp", "tx-interval", "1"], log)
                if side == "leaf":
                    _retry([*configure, "system", "hostname", LEAF], log)
                    _retry([*configure, "lldp", "portidsubtype", "ifname"], log)
            host_socket = f"{work}/host.socket"
            _retry([lldpcli, "-u", host_socket, "-f", "json0", "show", "neighbors"], log, until=_names_leaf)
            yield LldpPair(host_socket)
        finally:
            for daemon in daemons:
                stop(daemon)
            for namespace in made:
                subprocess.run(["ip", "netns", "del", namespace], check=False)


def _names_leaf(output: str) -> bool:
    return LEAF in output and LEAF_PORT in output


def _retry(argv: list[str], log: IO[str], until: Callable[[str], bool] = lambda output: True) -> None:
    """Run `argv` until it succeeds and `until` its output (lldpd starting, LLDP frames crossing), up to
    30 tries a second apart; fails the test with the daemons' log otherwise."""
    for _ in range(30):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode == 0 and until(done.stdout):
            return
        time.sleep(1)
    log.seek(0)
    pytest.fail(f"{' '.join(argv)} never succeeded: {done.stderr}{done.stdout[:2000]}\n{log.read()}")

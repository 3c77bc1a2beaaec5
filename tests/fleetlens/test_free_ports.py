"""Ports handed to peers come from below the kernel's ephemeral range: a port from there cannot be taken
by an exporter bound to port 0 or by an outgoing connection before the peer binds it."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

import pytest

from fleetlens.demo.peers import free_ports
from fleetlens.errors import DemoError

POOL = range(20000, 21030)  # the ports below an ephemeral range starting at 21030


def bound(port: int) -> socket.socket | None:
    """A socket bound to 127.0.0.1:`port`, None where that port is taken."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    return sock


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range(tmp_path: Path):
    port_range = tmp_path / "ip_local_port_range"
    port_range.write_text("40000\t60999\n")
    ports = free_ports(50, port_range)

    assert len(set(ports)) == 50 and all(20000 <= port < 40000 for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_only_the_free_ports_of_the_pool_are_handed_out_and_too_few_is_an_error(tmp_path: Path):
    port_range = tmp_path / "ip_local_port_range"
    port_range.write_text(f"{POOL.stop} 60999")
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(sock) for port in POOL if (sock := bound(port)) is not None]
        assert len(held) > 2, "the pool is taken by others"
        freed = [held.pop(), held.pop()]
        left = {sock.getsockname()[1] for sock in freed}
        for sock in freed:
            sock.close()

        assert set(free_ports(2, port_range)) == left  # every other port of the pool is taken
        too_few = rf"fewer than 3 free TCP ports on 127\.0\.0\.1 below {POOL.stop}"
        with pytest.raises(DemoError, match=too_few):
            free_ports(3, port_range)


def test_an_unreadable_range_falls_back_to_linux_defaults(tmp_path: Path):
    assert all(port < 32768 for port in free_ports(5, tmp_path / "absent"))

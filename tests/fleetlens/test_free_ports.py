"""Ports handed to peers come from below the kernel's ephemeral range: a port from there cannot be taken
by an exporter bound to port 0 or by an outgoing connection before the peer binds it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fleetlens.demo.peers import free_ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range(tmp_path: Path):
    port_range = tmp_path / "ip_local_port_range"
    port_range.write_text("40000\t60999\n")
    ports = free_ports(50, port_range)

    assert len(set(ports)) == 50 and all(20000 <= port < 40000 for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_handed_out(tmp_path: Path):
    port_range = tmp_path / "ip_local_port_range"
    port_range.write_text("21030 60999")  # 20000..21029: a small pool, so the taken port is drawn for sure
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 20000))
        taken.listen()
        ports = free_ports(1029, port_range)
        with pytest.raises(OSError, match=r"fewer than 1030 free TCP ports on 127\.0\.0\.1 below 21030"):
            free_ports(1030, port_range)
    assert 20000 not in ports and len(set(ports)) == 1029


def test_an_unreadable_range_falls_back_to_linux_defaults(tmp_path: Path):
    assert all(port < 32768 for port in free_ports(5, tmp_path / "absent"))

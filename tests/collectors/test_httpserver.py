"""The HTTP server of the exporter and the hub against clients that open connections and stall."""

from __future__ import annotations

import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator

import pytest

from collectors.httpserver import serve_app

TIMEOUT_S = 1.0
MAX_CONNECTIONS = 8


def hello(environ: dict, start_response: Callable) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello\n"]


@pytest.fixture
def server() -> Iterator[tuple[int, int]]:
    """(port, thread count with the server running) of a server with a small timeout and cap."""
    srv = serve_app(hello, "127.0.0.1", 0, timeout_s=TIMEOUT_S, max_connections=MAX_CONNECTIONS)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_port, threading.active_count()
    srv.shutdown()
    srv.server_close()


def get(port: int, path: str = "/metrics") -> int:
    """The status of a GET; a 503 is an answer too."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def stalled(port: int) -> socket.socket:
    """A client that sends half a request line and then nothing."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"GET /metr")
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server ends the connection (after a 503, perhaps) within twice the timeout."""
    sock.settimeout(2 * TIMEOUT_S)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_stalled_clients_neither_starve_others_nor_keep_their_threads(server, capsys):
    port, threads = server
    start = time.monotonic()
    clients = [stalled(port) for _ in range(50)]
    time.sleep(0.2)  # let the server accept them all
    assert threading.active_count() <= threads + MAX_CONNECTIONS  # no thread for those past the cap

    status = get(port)  # every slot is held: answered at once, not queued
    assert status == 503
    assert time.monotonic() - start < TIMEOUT_S
    while status != 200 and time.monotonic() - start < 4 * TIMEOUT_S:  # slots free as the timeout hits
        time.sleep(0.1)
        status = get(port)
    assert status == 200

    assert all(closed_by_server(sock) for sock in clients)
    for sock in clients:
        sock.close()
    deadline = time.monotonic() + 2 * TIMEOUT_S
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads
    assert time.monotonic() - start < 10
    assert "Traceback" not in capsys.readouterr().err  # a timeout is no server error


def test_a_connection_past_the_cap_gets_a_503_at_once(server):
    port, _ = server
    clients = [stalled(port) for _ in range(MAX_CONNECTIONS)]
    time.sleep(0.2)
    extra = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S / 2)
    assert extra.recv(4096).startswith(b"HTTP/1.0 503 ")
    for sock in [extra, *clients]:
        sock.close()


def test_access_log_escapes_control_characters(server, caplog):
    port, _ = server
    caplog.set_level(logging.DEBUG, logger="fleetlens.http")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /a\x1b[2J\x08forged%0Aline\\x0a HTTP/1.0\r\n\r\n")
        while sock.recv(4096):
            pass

    def ours() -> list[logging.LogRecord]:  # a slow client of an earlier test may be logged meanwhile
        return [record for record in caplog.records if "GET /a" in record.getMessage()]

    deadline = time.monotonic() + 2
    while not ours() and time.monotonic() < deadline:  # the handler logs after it answered
        time.sleep(0.02)
    [record] = ours()
    message = record.getMessage()
    assert '"GET /a\\x1b[2J\\x08forged%0Aline\\\\x0a HTTP/1.0" 200' in message
    assert message.isprintable()

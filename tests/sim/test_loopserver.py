"""The simulated fleet's HTTP front end: many apps on one loop, keep-alive as scrapers use it."""

from __future__ import annotations

import http.client
import socket

import pytest

from sim.loopserver import LoopServer


def hello(environ: dict, start_response) -> list[bytes]:
    if environ["PATH_INFO"] == "/boom":
        raise RuntimeError("the app broke")
    body = f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']} {environ['wsgi.input'].read().decode()}"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "999")])
    return [body.encode()]


def other(environ: dict, start_response) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"other app"]


@pytest.fixture
def server():
    server = LoopServer().start()
    yield server
    server.stop()


def raw_exchange(port: int, request: bytes) -> bytes:
    """Send `request` as is and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_each_port_serves_its_own_app_over_one_kept_alive_connection(server):
    port, other_port = server.serve(hello, "127.0.0.1"), server.serve(other, "127.0.0.1")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    first = conn.getresponse()
    assert (first.status, first.read()) == (200, b"GET /metrics ")
    assert first.getheader("Content-Length") == str(len(b"GET /metrics ")), "the app's own length is replaced"
    local_port = conn.sock.getsockname()[1]
    conn.request("POST", "/x", body=b"payload")
    second = conn.getresponse()
    assert second.read() == b"POST /x payload"
    assert conn.sock.getsockname()[1] == local_port, "the second request reused the connection"
    conn.close()
    other_conn = http.client.HTTPConnection("127.0.0.1", other_port, timeout=5)
    other_conn.request("GET", "/")
    assert other_conn.getresponse().read() == b"other app"
    other_conn.close()


def test_head_gets_headers_only_and_http_1_0_is_closed_after_one_answer(server):
    port = server.serve(hello, "127.0.0.1")
    head = raw_exchange(port, b"HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert head.endswith(b"\r\n\r\n"), "no body after a HEAD"
    assert b"Content-Length: 14\r\n" in head
    old = raw_exchange(port, b"GET /old HTTP/1.0\r\n\r\n")
    assert old.startswith(b"HTTP/1.1 200 OK") and old.endswith(b"GET /old ")


def test_bad_requests_and_failing_apps_get_an_error_status_naming_the_problem(server):
    port = server.serve(hello, "127.0.0.1")
    assert raw_exchange(port, b"NONSENSE\r\n\r\n").startswith(b"HTTP/1.1 400 Bad Request")
    bad_length = raw_exchange(port, b"POST / HTTP/1.1\r\nContent-Length: ten\r\n\r\n")
    assert bad_length.startswith(b"HTTP/1.1 400") and bad_length.endswith(b"Content-Length is not a number\n")
    assert raw_exchange(port, b"GET / HTTP/2.0\r\n\r\n").startswith(b"HTTP/1.1 505")
    assert raw_exchange(port, b"GET /boom HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 500")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/after")
    assert conn.getresponse().read() == b"GET /after ", "the server still answers"
    conn.close()


def test_stop_closes_listeners_and_open_connections(server):
    port = server.serve(hello, "127.0.0.1")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/")
    conn.getresponse().read()
    server.stop()
    assert conn.sock.recv(1) == b"", "the kept-alive connection was closed"
    conn.close()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass

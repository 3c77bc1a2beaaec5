"""The small threaded WSGI server that the exporter and the hub serve their HTTP endpoints with.

A thread per connection, so a slow client never blocks another; and since anyone who can reach the port
can open connections and then say nothing, each connection has a socket timeout (a stalled request line,
header or body read, or a client that stops reading the response, ends it) and their number is capped:
past the cap a new connection gets a 503 at once, from the accepting thread, and no thread of its own.
With a web config (collectors.webconfig), each connection's TLS handshake runs in its own thread, under the
same timeout, with the config as it is at that moment; the connection's request passes that config's basic
auth first, so the files are looked at once per connection.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from collectors.logtext import printable
from collectors.webconfig import ENVIRON_KEY, WebConfigSource

log = logging.getLogger("fleetlens.http")

DEFAULT_TIMEOUT_S = 15.0
DEFAULT_MAX_CONNECTIONS = 256
_BUSY_BODY = b"too many connections; try again later\n"
BUSY_RESPONSE = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)
_BUSY_WARNING_INTERVAL_S = 60.0


class _QuietHandler(WSGIRequestHandler):
    """Access lines at DEBUG: a scrape every second would otherwise fill the log."""

    def setup(self) -> None:
        self.timeout = self.server.connection_timeout_s
        self.handshake_failed = False
        web = self.server.web
        self.web_config = web.current() if web is not None else None
        tls = self.web_config.tls if self.web_config is not None else None
        if tls is not None:
            self.request.settimeout(self.timeout)
            try:
                self.request = self.connection = tls.wrap_socket(self.request, server_side=True)
            except (ssl.SSLError, OSError) as exc:  # a plain-HTTP client, a refused or missing client cert
                self.handshake_failed = True  # and wrap_socket has closed the connection
                log.debug("TLS handshake with %s failed: %s", self.client_address[0], printable(str(exc)))
                return
        super().setup()

    def handle(self) -> None:
        """Serve the request; a client that stalls past the timeout loses its connection, quietly."""
        if self.handshake_failed:
            return
        try:
            super().handle()
        except TimeoutError:
            self.log_message("connection closed: nothing received for %gs", self.timeout)

    def finish(self) -> None:
        if self.handshake_failed:
            return
        super().finish()
        if isinstance(self.connection, ssl.SSLSocket):  # the server shuts down the plain socket, now detached
            self.connection.close()

    def get_environ(self) -> dict:
        environ = super().get_environ()
        if isinstance(self.connection, ssl.SSLSocket):
            environ["HTTPS"] = "on"  # wsgi.url_scheme https
        if self.web_config is not None:
            environ[ENVIRON_KEY] = self.web_config
        return environ

    def log_message(self, format: str, *args: object) -> None:
        """Control characters escaped: a client's path or header must not forge log lines."""
        log.debug("%s - %s", self.address_string(), printable(format % args))


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per connection, at most `max_connections` at a time, each with a socket timeout."""

    daemon_threads = True
    request_queue_size = 128  # listen backlog; socketserver's 5 leaves a burst of clients in SYN retries

    def __init__(
        self,
        address: tuple[str, int],
        *,
        connection_timeout_s: float,
        max_connections: int,
        web: WebConfigSource | None,
    ) -> None:
        super().__init__(address, _QuietHandler)
        self.connection_timeout_s = connection_timeout_s
        self.web = web
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max_connections = max_connections
        self._last_busy_warning = -_BUSY_WARNING_INTERVAL_S

    def process_request(self, request: socket.socket, client_address: tuple) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request, client_address)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: it will never give the slot back
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: tuple) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, request: socket.socket, client_address: tuple) -> None:
        """Answer 503 without blocking the accepting thread, and close."""
        now = time.monotonic()
        if now - self._last_busy_warning >= _BUSY_WARNING_INTERVAL_S:
            self._last_busy_warning = now
            log.warning(
                "%d connections open, the most allowed: answering 503 to %s (said once a minute)",
                self._max_connections,
                client_address[0],
            )
        request.setblocking(False)
        with contextlib.suppress(OSError):  # BlockingIOError: the client has sent nothing yet
            request.recv(65536)  # what the client sent already: closing on unread data would reset
        with contextlib.suppress(OSError):  # the client left already
            request.send(BUSY_RESPONSE)  # a fresh socket's send buffer takes it whole
        self.shutdown_request(request)


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


def serve_app(
    app: Callable,
    host: str,
    port: int,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    web: WebConfigSource | None = None,
) -> WSGIServer:
    """Bind `app` on host:port (port 0 picks a free one: see `server.server_port`); call serve_forever().

    `timeout_s` bounds each read of the request (line, headers, body) and each write of the response;
    past `max_connections` open connections, new ones are answered 503 and closed. `web` (the
    --web.config.file) adds TLS, basic auth and headers, as it says at each connection and request.
    """
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    server = server_class(
        (host, port), connection_timeout_s=timeout_s, max_connections=max_connections, web=web
    )
    server.set_app(app if web is None else web.guard(app))
    return server

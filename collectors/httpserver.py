"""The small threaded WSGI server that the exporter and the hub serve their HTTP endpoints with."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger("fleetlens.http")


class _QuietHandler(WSGIRequestHandler):
    """Access lines at DEBUG: a scrape every second would otherwise fill the log."""

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s - %s", self.address_string(), format % args)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per request, so a slow client never blocks another."""

    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


def serve_app(app: Callable, host: str, port: int) -> WSGIServer:
    """Bind `app` on host:port (port 0 picks a free one: see `server.server_port`); call serve_forever()."""
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    return make_server(host, port, app, server_class=server_class, handler_class=_QuietHandler)

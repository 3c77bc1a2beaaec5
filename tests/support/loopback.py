"""A loopback HTTP server for tests that answers every POST with a function of its body and headers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# (body, headers) -> (status, content type, response body)
PostHandler = Callable[[bytes, Message], tuple[int, str, bytes]]


class LoopbackPostServer:
    """Serves on 127.0.0.1 and a free port between `with` and its end; `url` is its base."""

    def __init__(self, handle: PostHandler) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status, content_type, answer = handle(body, self.headers)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                """Keep the test output free of access logs."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> LoopbackPostServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()

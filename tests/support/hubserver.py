"""A hub served on loopback for a test, the way `fleetlens hub` serves it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from collectors.httpserver import serve_app
from hub.app import Hub


@contextlib.contextmanager
def on_loopback(hub: Hub) -> Iterator[str]:
    """Serve `hub`'s API on a free loopback port until the block ends (its URL), then close its writer."""
    server = serve_app(hub.app, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        hub.writer.close()

"""Serving until told to stop: the exporter's and the hub's main loop."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("fleetlens")


def serve_until_signal(server: Any, on_stop: Callable[[], None]) -> None:
    """serve_forever until SIGTERM or SIGINT, then `on_stop()`."""

    def stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        on_stop()

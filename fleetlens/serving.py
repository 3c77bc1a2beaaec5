"""Serving until told to stop: the exporter's and the hub's main loop."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from collectors.errors import WebConfigError
from collectors.webconfig import WebConfigSource
from fleetlens.errors import ConfigError

log = logging.getLogger("fleetlens")


def web_config(path: Path | None, key: str) -> WebConfigSource | None:
    """The --web.config.file's source (None when none is given); an invalid file stops the start."""
    if path is None:
        return None
    try:
        return WebConfigSource(path)
    except WebConfigError as exc:
        raise ConfigError(f"{key} (--web.config.file): {exc}") from None


def scheme(web: WebConfigSource | None) -> str:
    """http or https, as the web config serves now."""
    return "https" if web is not None and web.current().tls is not None else "http"


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

"""Start the real Alertmanager (Debian's prometheus-alertmanager) on a free loopback port."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from fleetlens.demo import peers
from tests.support.peers import require_binary


@contextlib.contextmanager
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """The base URL of a running Alertmanager with its state under `tmp_path` and no cluster gossip."""
    with peers.alertmanager(require_binary("prometheus-alertmanager"), tmp_path) as base:
        yield base

"""Start the real Alertmanager (Debian's prometheus-alertmanager) on a free loopback port."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tests.support.peers import free_port, peer, require_binary

# One receiver that notifies nobody: the tests read what Alertmanager holds through its API.
_CONFIG = """\
route:
  receiver: "null"
  group_wait: 1s
  group_interval: 1s
receivers:
  - name: "null"
"""


@contextlib.contextmanager
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """The base URL of a running Alertmanager with its state under `tmp_path` and no cluster gossip."""
    binary = require_binary("prometheus-alertmanager")
    config = tmp_path / "alertmanager.yml"
    config.write_text(_CONFIG)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = [
        binary,
        f"--config.file={config}",
        f"--storage.path={tmp_path / 'alertmanager-data'}",
        "--cluster.listen-address=",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",  # its output goes to a pipe nobody reads while it runs
    ]
    with peer(args, f"{base}/-/ready"):
        yield base

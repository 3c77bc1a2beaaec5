"""Start real peer processes (our exporter, Prometheus, node_exporter) on free loopback ports.

Each peer is ended by the PID we started, and only that one.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from fleetlens.demo.peers import free_port, stop, wait_http
from fleetlens.errors import ChildExited

__all__ = ["free_port", "stop", "wait_http"]


def require_binary(path: str) -> str:
    """The binary's path, or skip the test naming the Debian package that `make test` installs."""
    found = shutil.which(path)
    if found is None:
        pytest.skip(f"{path} not installed (make test installs it from Debian as root)")
    return found


@contextlib.contextmanager
def hung_listener() -> Iterator[str]:
    """HOST:PORT of a socket that accepts connections (the kernel's backlog) and never answers:
    a peer that is up but stuck."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def peer(args: Sequence[str], ready_url: str, cwd: Path | None = None) -> Iterator[subprocess.Popen]:
    """Run `args` until the block ends; `ready_url` answering 200 means it has started.

    Its output goes to an unnamed temporary file, not a pipe: a pipe nobody reads fills at 64 KiB and
    then blocks every log write of the peer, which a benchmark would measure as the peer's own cost.
    """
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(list(args), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            try:
                wait_http(ready_url, process)
            except ChildExited as exited:
                log.seek(0)
                raise ChildExited(f"{exited}{log.read()}") from None
            yield process
        finally:
            stop(process)


def fleetlens_exporter(*flags: str) -> tuple[list[str], str]:
    """The command line of our exporter on a free port, and its metrics URL."""
    port = free_port()
    args = [sys.executable, "-m", "fleetlens.cli", "exporter", "--listen", f"127.0.0.1:{port}", *flags]
    return args, f"http://127.0.0.1:{port}/metrics"


def prometheus(folder: Path) -> tuple[list[str], str]:
    """Debian's Prometheus on a free port, with `folder`/prometheus.yml (one scraping nothing when the
    folder has none) and its TSDB in `folder`/tsdb; the command line and its base URL (`/-/ready` answers
    once it has started)."""
    binary = require_binary("prometheus")
    config = folder / "prometheus.yml"
    if not config.exists():
        config.write_text("scrape_configs: []\n")
    port = free_port()
    args = [
        binary,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return args, f"http://127.0.0.1:{port}"


def node_exporter(sysfs_root: Path, *flags: str) -> tuple[list[str], str]:
    """Debian's prometheus-node-exporter on `sysfs_root` with only the infiniband and netclass collectors."""
    binary = require_binary("prometheus-node-exporter")
    port = free_port()
    args = [
        binary,
        f"--web.listen-address=127.0.0.1:{port}",
        f"--path.sysfs={sysfs_root}",
        "--collector.disable-defaults",
        "--collector.infiniband",
        "--collector.netclass",
        *flags,
    ]
    return args, f"http://127.0.0.1:{port}/metrics"

"""A real node_exporter per simulated node: Debian's prometheus-node-exporter reading the node's /sys tree.

In the stock flavour (sim.stock) a node's RoCE ports and netdevs are read by the program a real fleet
runs, not by fleetlens's own infiniband and netclass collectors, so that whatever node_exporter 1.5 shows
or leaves out (it reads no mlx5 hw_counters) is what the detectors get. Each process is started by us on
a free loopback port with only the infiniband and netclass collectors, and ended by its own PID; on
Linux the kernel also ends it (SIGTERM) when the process that started it dies without stopping it (a
worker process terminated, a simulator killed), so that no node_exporter outlives its simulation.

    exporter = NodeExporter(Path("/dev/shm/sim/vela-001/sys"), log=Path("vela-001.node_exporter.log"))
    exporter.start()
    body = exporter.scrape()          # one GET of /metrics, Prometheus text
    exporter.stop()
"""

from __future__ import annotations

import ctypes
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from sim.errors import NodeExporterError

BINARY = "prometheus-node-exporter"  # Debian's package and binary name (upstream: node_exporter)
BINARY_ENV = "FLEETLENS_NODE_EXPORTER"  # another node_exporter binary to run instead
COLLECTOR_FLAGS = ("--collector.disable-defaults", "--collector.infiniband", "--collector.netclass")
START_TIMEOUT_S = 20.0
SCRAPE_TIMEOUT_S = 10.0
PORT_ATTEMPTS = 5  # a free port can be taken by someone else before node_exporter binds it: try another
TEXT_FORMAT = "text/plain;version=0.0.4"
# what wsgi() passes on: the request headers that choose the format and compression (WSGI environ keys),
# and the response headers that say which were chosen
FORWARDED_HEADERS = (("Accept", "HTTP_ACCEPT"), ("Accept-Encoding", "HTTP_ACCEPT_ENCODING"))
PASSED_BACK = ("content-type", "content-encoding")


PR_SET_PDEATHSIG = 1  # prctl(2): the signal the calling process gets when its parent thread dies
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None  # loaded before any fork


def _end_with_parent() -> None:
    """Runs in the child between fork and exec: SIGTERM it when its parent dies (one libc call, nothing
    that could take a lock another thread of the parent held at the fork)."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def find_binary() -> str:
    """The node_exporter to run: $FLEETLENS_NODE_EXPORTER, else prometheus-node-exporter on PATH."""
    wanted = os.environ.get(BINARY_ENV) or BINARY
    found = shutil.which(wanted)
    if found is None:
        raise NodeExporterError(
            f"exporters: stock runs a real node_exporter per node, and {wanted} is not installed "
            f"(Debian: apt-get install prometheus-node-exporter; or set {BINARY_ENV})"
        )
    return found


class NodeExporter:
    """One node_exporter process on `sysfs_root`, its output in `log`."""

    def __init__(self, sysfs_root: Path, log: Path, binary: str | None = None) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.log = Path(log)
        self._binary = binary or find_binary()
        self._process: subprocess.Popen | None = None
        self.address = ""  # 127.0.0.1:port once started

    def start(self) -> NodeExporter:
        """Start it and wait until /metrics answers; NodeExporterError with its log if it never does."""
        for _ in range(PORT_ATTEMPTS):
            self.address = f"127.0.0.1:{_free_port()}"
            with self.log.open("w") as output:
                self._process = subprocess.Popen(
                    [
                        self._binary,
                        f"--path.sysfs={self.sysfs_root}",
                        *COLLECTOR_FLAGS,
                        f"--web.listen-address={self.address}",
                    ],
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=_end_with_parent,  # one libc call: safe beside threads
                )
            if self._wait_ready():
                return self
        raise NodeExporterError(f"node_exporter on {self.sysfs_root} did not start: {self._log_tail()}")

    def scrape(self) -> bytes:
        """One scrape of /metrics in the Prometheus text format."""
        request = urllib.request.Request(f"http://{self.address}/metrics", headers={"Accept": TEXT_FORMAT})
        try:
            with urllib.request.urlopen(request, timeout=SCRAPE_TIMEOUT_S) as response:
                return response.read()
        except (OSError, urllib.error.URLError) as error:
            raise NodeExporterError(
                f"node_exporter at {self.address} on {self.sysfs_root} did not answer: {error}; "
                f"{self._log_tail()}"
            ) from None

    def wsgi(self, environ: dict, start_response: Callable) -> list[bytes]:
        """One request passed through to node_exporter, so that a scraper of another address gets its own
        answer: status, Content-Type, Content-Encoding and body as it sent them (502 if it did not)."""
        query = environ.get("QUERY_STRING")
        path = environ.get("PATH_INFO", "/") + (f"?{query}" if query else "")
        headers = {name: environ[key] for name, key in FORWARDED_HEADERS if key in environ}
        connection = http.client.HTTPConnection(self.address, timeout=SCRAPE_TIMEOUT_S)
        try:
            connection.request(environ.get("REQUEST_METHOD", "GET"), path, headers=headers)
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as error:
            start_response("502 Bad Gateway", [("Content-Type", "text/plain")])
            return [f"node_exporter at {self.address} did not answer: {error}\n".encode()]
        finally:
            connection.close()
        kept = [(name, value) for name, value in response.getheaders() if name.lower() in PASSED_BACK]
        start_response(f"{response.status} {response.reason}", kept)
        return [body]

    def stop(self) -> None:
        """End the process we started, by its PID: SIGTERM, then SIGKILL if it lingers. Safe to call twice."""
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _wait_ready(self) -> bool:
        """True once /metrics answers; False when the process exited (its port was taken, say)."""
        assert self._process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False
            try:
                self.scrape()
                return True
            except NodeExporterError:
                time.sleep(0.02)
        self.stop()
        raise NodeExporterError(
            f"node_exporter on {self.sysfs_root} did not answer within {START_TIMEOUT_S:g} s: "
            + self._log_tail()
        )

    def _log_tail(self, lines: int = 5) -> str:
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError as error:
            return f"(no log: {error})"
        return f"its log {self.log} ends: " + " | ".join(tail)


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

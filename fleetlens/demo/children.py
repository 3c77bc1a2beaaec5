"""The demo's child processes: each in a session of its own, logging to a file, stopped by its PID.

A child in its own session does not get the terminal's Ctrl-C: the demo stops its children itself,
in reverse start order and the hub last (what sends to it goes first), so that the hub closes its
store cleanly, before the peers it talks to. A child that leads its own process
group (torchrun and its ranks, streamlit) is stopped as a group; nothing outside it is signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from fleetlens.errors import ChildExited

STOP_TIMEOUT_S = 20.0  # a hub flushing its writer gets this long before SIGKILL


class Children:
    """Start named processes, notice when one ends early, stop them all in reverse order."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: dict[str, subprocess.Popen] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen:
        with self.log(name).open("w") as output:
            process = subprocess.Popen(
                list(args),
                env={**os.environ, **(env or {})},
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started[name] = process
        return process

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def check(self) -> None:
        """ChildExited for the first child that is no longer running."""
        for name, process in self.started.items():
            if process.poll() is not None:
                raise ChildExited(f"{name} exited with {process.returncode}:\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 30) -> str:
        return "\n".join(self.log(name).read_text(errors="replace").splitlines()[-lines:])

    def stop_all(self, last: tuple[str, ...] = ()) -> None:
        """Stop every child in reverse start order, but those named in `last` after the others."""
        names = list(reversed(self.started))
        for name in [*(n for n in names if n not in last), *(n for n in names if n in last)]:
            self.stop(name)

    def stop(self, name: str) -> None:
        """SIGTERM to the child's process group (its session, led by its PID), SIGKILL past the timeout."""
        process = self.started.pop(name)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        _reap_group(process.pid)


def _reap_group(pgid: int) -> None:
    """Wait until no process of the child's group is left (ranks outliving torchrun), then kill any."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)

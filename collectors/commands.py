"""One way to run an external tool: argv without a shell, a timeout, and a bound on what it may print.

`run` gives the tool's exit status and its output as text (bytes that are not UTF-8 replaced, and
`stdout_replaced` saying so, for callers that must refuse such output). It raises a CommandError of its
own kind, each message naming the tool, when the tool is not there or cannot start, runs past its
timeout, or writes more than the bound to stdout or stderr; a tool past a limit is killed with the
process group it runs in. A non-zero exit is no error here: what it means is the caller's to say.
stdin is /dev/null. Standard library only: the exporter, the host agent and the checks use it from a
base install.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collectors.errors import CommandError, CommandNotFound, CommandOutputTooLarge, CommandTimedOut

DEFAULT_MAX_OUTPUT_BYTES = 4 << 20
_READ_CHUNK = 65536


@dataclass(frozen=True)
class Completed:
    """What a tool did: its exit status and its output, decoded as UTF-8 with bad bytes replaced."""

    returncode: int
    stdout: str
    stderr: str
    stdout_replaced: bool = False  # stdout held bytes that are not UTF-8


def run(
    argv: Sequence[str],
    timeout_s: float,
    *,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    env: Mapping[str, str] | None = None,
) -> Completed:
    """Run `argv` for at most `timeout_s` seconds, keeping at most `max_output_bytes` of each stream;
    CommandNotFound, CommandTimedOut, CommandOutputTooLarge or CommandError (it could not start)."""
    name = argv[0]
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=None if env is None else dict(env),
            start_new_session=True,  # so that a kill reaches the tool's own children too
        )
    except FileNotFoundError:
        where = "does not exist" if "/" in name else "is not installed (not found on PATH)"
        raise CommandNotFound(f"{name} {where}") from None
    except OSError as exc:
        raise CommandError(f"{name} cannot be run: {exc.strerror or exc}") from None
    streams = {"stdout": bytearray(), "stderr": bytearray()}
    try:
        _read_bounded(process, streams, time.monotonic() + timeout_s, max_output_bytes)
    except CommandTimedOut:
        raise CommandTimedOut(f"{name} ran past its {timeout_s:g} s timeout") from None
    except CommandOutputTooLarge as exc:
        raise CommandOutputTooLarge(f"{name} wrote more than {max_output_bytes} bytes to {exc}") from None
    finally:
        if process.returncode is None:
            _kill(process)
        process.stdout.close()  # type: ignore[union-attr]
        process.stderr.close()  # type: ignore[union-attr]
    stderr = streams["stderr"].decode("utf-8", "replace")
    try:
        return Completed(process.returncode, streams["stdout"].decode("utf-8"), stderr)
    except UnicodeDecodeError:
        return Completed(process.returncode, streams["stdout"].decode("utf-8", "replace"), stderr, True)


def _read_bounded(
    process: subprocess.Popen, streams: dict[str, bytearray], deadline: float, max_bytes: int
) -> None:
    """Read both pipes into `streams` until they close and the process exits; CommandTimedOut past
    `deadline`, CommandOutputTooLarge (its message the stream's name) past `max_bytes` on one stream."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, "stdout")  # type: ignore[arg-type]
        selector.register(process.stderr, selectors.EVENT_READ, "stderr")  # type: ignore[arg-type]
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommandTimedOut
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                streams[key.data].extend(chunk)
                if len(streams[key.data]) > max_bytes:
                    raise CommandOutputTooLarge(key.data)
    try:
        process.wait(max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        raise CommandTimedOut from None


def _kill(process: subprocess.Popen) -> None:
    """Kill the tool and its process group, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()

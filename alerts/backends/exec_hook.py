"""Exec hook drain backend: runs a command of the operator's for each drain and resume, for schedulers
and ticket systems fleetlens has no backend for.

The command (an argument list, never a shell line) gets the decision twice: in environment variables

    FLEETLENS_ACTION (drain | resume)  FLEETLENS_NODE  FLEETLENS_KIND  FLEETLENS_ALERT_ID
    FLEETLENS_DECISION_ID  FLEETLENS_JOB  FLEETLENS_SEVERITY  FLEETLENS_REASON

and as one JSON object with the same fields (lower case, without the prefix) on stdin. Exit status 0
means done; anything else, or no exit within the timeout, is a BackendError with the command's stderr.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence

from alerts.errors import AlertConfigError, BackendError
from alerts.model import DrainRequest


class ExecBackend:
    """Runs `command` with the decision in its environment and on its stdin."""

    name = "exec"

    def __init__(self, command: Sequence[str], *, timeout_s: float = 30.0) -> None:
        if not command:
            raise AlertConfigError("drain exec backend: needs a command, e.g. ['/usr/local/bin/drain-node']")
        self.command = list(command)
        self.timeout_s = timeout_s

    def drain(self, request: DrainRequest) -> None:
        self._run("drain", request)

    def resume(self, request: DrainRequest) -> None:
        self._run("resume", request)

    def _run(self, action: str, request: DrainRequest) -> None:
        decision = {
            "action": action,
            "node": request.node,
            "kind": request.kind,
            "alert_id": request.alert_id,
            "decision_id": request.decision_id,
            "job": request.job,
            "severity": request.severity,
            "reason": request.reason,
        }
        env = {**os.environ, **{f"FLEETLENS_{key.upper()}": value for key, value in decision.items()}}
        run_command(
            self.command,
            f"{action} {request.node}",
            stdin=json.dumps(decision),
            env=env,
            timeout_s=self.timeout_s,
        )

    def holds(self, request: DrainRequest) -> bool:
        """Always: fleetlens cannot read back what an operator's command did, so the command itself must
        refuse a resume it should not carry out (exit status non-zero)."""
        return True

    def mark(self, request: DrainRequest, health: str) -> None:
        """Nothing: the command is told of drains and resumes only."""


def run_command(
    command: Sequence[str],
    what: str,
    *,
    stdin: str = "",
    env: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Run an argument list (never a shell line); BackendError saying `cannot <what>` with the command's
    stderr when it cannot start, exits non-zero, or does not finish within `timeout_s`."""
    shown = shlex.join(command)
    try:
        result = subprocess.run(
            list(command),
            input=stdin,
            env=dict(env) if env is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except OSError as error:
        raise BackendError(f"exec: cannot {what}: cannot run `{shown}`: {error}") from error
    except subprocess.TimeoutExpired as error:
        raise BackendError(f"exec: cannot {what}: `{shown}` did not finish within {timeout_s:g} s") from error
    if result.returncode != 0:
        answer = result.stderr.strip() or result.stdout.strip() or "no output"
        raise BackendError(f"exec: cannot {what}: `{shown}` exited with status {result.returncode}: {answer}")

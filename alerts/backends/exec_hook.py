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
from collections.abc import Sequence

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
        shown = shlex.join(self.command)
        try:
            result = subprocess.run(
                self.command,
                input=json.dumps(decision),
                env=env,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except OSError as error:
            raise BackendError(
                f"exec: cannot {action} {request.node}: cannot run `{shown}`: {error}"
            ) from error
        except subprocess.TimeoutExpired as error:
            raise BackendError(
                f"exec: cannot {action} {request.node}: `{shown}` did not finish within {self.timeout_s:g} s"
            ) from error
        if result.returncode != 0:
            answer = result.stderr.strip() or result.stdout.strip() or "no output"
            status = f"exited with status {result.returncode}"
            raise BackendError(f"exec: cannot {action} {request.node}: `{shown}` {status}: {answer}")

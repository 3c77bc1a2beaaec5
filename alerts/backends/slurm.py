"""Slurm drain backend: drains and resumes nodes with `scontrol`, and reads back what Slurm says of them.

scontrol runs as an argument list, never through a shell, and only after the node name has been
checked: a name such as `node[01-04]` or `a,b` is a Slurm hostlist and would drain several nodes at
once, so only one plain host name per call gets through.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
from collections.abc import Mapping

from alerts.errors import BackendError
from alerts.model import DrainRequest

log = logging.getLogger(__name__)

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

# What slurmctld 22.05 answers (exit status 1) to `state=resume` on a node that is not drained or down.
_NOT_RESUMABLE = "Invalid node state specified"

_NODE_FIELD = re.compile(r"^NodeName=(\S+)")
_STATE_FIELD = re.compile(r"\sState=(\S+)")
# The reason runs up to the `[user@time]` that slurmctld appends, or to the end of the line.
_REASON_FIELD = re.compile(r"\sReason=(.*?)(?: \[[^\[\]@]*@[^\[\]]*\](?=\s|$)|$)")


def is_drained(state: str) -> bool:
    """Whether a state as scontrol prints it (`IDLE+DRAIN`, `MIXED+DRAIN`) keeps new work off the node."""
    return any(flag.startswith("DRAIN") for flag in state.upper().split("+"))


def parse_node_lines(text: str) -> dict[str, tuple[str, str]]:
    """node -> (state, reason) from `scontrol show node --oneliner`; the reason is "" when there is none.

    A line without NodeName or State is skipped with a warning: one odd line must not hide the rest.
    """
    states: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        node, state = _NODE_FIELD.search(line), _STATE_FIELD.search(line)
        if node is None or state is None:
            log.warning("slurm: skipping a line of `scontrol show node` without NodeName or State: %r", line)
            continue
        reason = _REASON_FIELD.search(line)
        states[node.group(1)] = (state.group(1), reason.group(1) if reason else "")
    return states


def _checked(node: str) -> str:
    if not _NODE_NAME.fullmatch(node):
        raise BackendError(
            f"slurm: {node!r} is not a single Slurm node name (letters, digits, '.', '_', '-'); "
            "nothing was sent to scontrol"
        )
    return node


class SlurmBackend:
    """Drains and resumes Slurm nodes through the scontrol of this host (or the one given)."""

    name = "slurm"

    def __init__(
        self, *, scontrol: str = "scontrol", env: Mapping[str, str] | None = None, timeout_s: float = 10.0
    ) -> None:
        self._scontrol = scontrol
        self._env = {**os.environ, **(env or {})}
        self._timeout_s = timeout_s

    def drain(self, request: DrainRequest) -> None:
        """`scontrol update nodename=<node> state=drain reason="fleetlens: <kind> <alert id>"`."""
        node = _checked(request.node)
        self._succeed(
            f"drain {node}", "update", f"nodename={node}", "state=drain", f"reason={request.reason}"
        )

    def resume(self, request: DrainRequest) -> None:
        """`scontrol update nodename=<node> state=resume`.

        Slurm refuses to resume a node that is not drained ("Invalid node state specified"); when the
        node indeed is not drained, it already takes work, which is what resume wants, so that passes.
        """
        node = _checked(request.node)
        what = f"resume {node}"
        result = self._run(what, "update", f"nodename={node}", "state=resume")
        if result.returncode == 0:
            return
        if _NOT_RESUMABLE in result.stderr and not self._is_drained_now(node):
            log.info("slurm: %s is not drained; nothing to resume", node)
            return
        raise _failure(what, result)

    def holds(self, request: DrainRequest) -> bool:
        """Whether the node is still drained with a reason fleetlens wrote (`fleetlens: ...`): a person who
        drained it again with their own reason, or resumed it, took it over."""
        node = _checked(request.node)
        state, reason = self._states(f"read the state of {node}", "show", "node", node)[node]
        return is_drained(state) and reason.startswith("fleetlens:")

    def mark(self, request: DrainRequest, health: str) -> None:
        """Nothing: Slurm shows the drain's reason, and the lifecycle's states are in fleetlens's audit."""

    def node_states(self) -> dict[str, tuple[str, str]]:
        """node -> (state as scontrol prints it, e.g. `IDLE+DRAIN`; reason or "") for every node in Slurm."""
        return self._states("read the node states", "show", "node")

    def _is_drained_now(self, node: str) -> bool:
        state, _ = self._states(f"read the state of {node}", "show", "node", node)[node]
        return is_drained(state)

    def _states(self, what: str, *args: str) -> dict[str, tuple[str, str]]:
        return parse_node_lines(self._succeed(what, *args, "--oneliner").stdout)

    def _succeed(self, what: str, *args: str) -> subprocess.CompletedProcess[str]:
        result = self._run(what, *args)
        if result.returncode != 0:
            raise _failure(what, result)
        return result

    def _run(self, what: str, *args: str) -> subprocess.CompletedProcess[str]:
        command = [self._scontrol, *args]
        try:
            return subprocess.run(
                command, env=self._env, capture_output=True, text=True, timeout=self._timeout_s, check=False
            )
        except OSError as error:
            raise BackendError(f"slurm: cannot {what}: cannot run {self._scontrol}: {error}") from error
        except subprocess.TimeoutExpired as error:
            raise BackendError(
                f"slurm: cannot {what}: `{shlex.join(command)}` gave no answer within {self._timeout_s}s"
            ) from error


def _failure(what: str, result: subprocess.CompletedProcess[str]) -> BackendError:
    answer = (result.stderr or result.stdout).strip() or "no output"
    return BackendError(
        f"slurm: cannot {what}: `{shlex.join(result.args)}` exited with status {result.returncode}: {answer}"
    )

"""Drain backends: what takes a node out of scheduling and puts it back (Slurm, Kubernetes, a command).

Each backend implements DrainBackend; `drain` and `resume` either succeed or raise BackendError with
what the scheduler answered; `holds` and `mark` serve the node lifecycle (alerts.lifecycle). They are
only ever called by the drain controller, after its safety limits.
"""

from __future__ import annotations

from typing import Protocol

from alerts.model import DrainRequest


class DrainBackend(Protocol):
    """Takes nodes out of scheduling and puts them back."""

    name: str

    def drain(self, request: DrainRequest) -> str | None:
        """Stop new work landing on request.node; raises BackendError when the scheduler refused. None
        once drained; where another tool holds the node already, nothing is changed and the answer names
        that tool and its mark (the controller records the drain as `drained-by-other`)."""

    def resume(self, request: DrainRequest) -> None:
        """Put request.node back into scheduling; raises BackendError when the scheduler refused."""

    def holds(self, request: DrainRequest) -> bool:
        """Whether request.node is still out of scheduling by fleetlens's drain, not by a person or another
        tool since (the lifecycle resumes only such a node); BackendError when the scheduler cannot say."""

    def mark(self, request: DrainRequest, health: str) -> None:
        """Show the node's health (TESTING, PASS, EVICT: Autopilot's gpuhealth values) where the scheduler
        can, else nothing; raises BackendError when the scheduler refused."""

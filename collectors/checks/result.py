"""One check's verdict on one target: what `fleetlens checks` reports and the hub stores.

Status is an allowlist (PASS, WARN, FAIL, ERROR): ERROR means the check could not judge (a tool missing,
output it could not parse), never that the target is healthy, so a check that cannot read a failed
test's result reports ERROR, not PASS. Standard library only: checks run in the base install.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    """A check's verdict, worst last (`worst` orders by it)."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    ERROR = "ERROR"


SEVERITY = {Status.PASS: 0, Status.WARN: 1, Status.ERROR: 2, Status.FAIL: 3}


@dataclass(frozen=True)
class CheckResult:
    """`check` on `target` ("gpu:3", "nic:mlx5_2", "peer:vela-007", "" for the whole node) of `node`:
    its status, the measured value with its unit and the threshold it was judged by (None where the
    check has no number), the evidence (a small JSON-able dict), when it started and how long it ran."""

    node: str
    check: str
    target: str
    status: Status
    value: float | None
    unit: str
    threshold: float | None
    started: float
    duration_s: float
    evidence: dict[str, Any] = field(default_factory=dict)


def worst(results: list[CheckResult]) -> Status:
    """The worst status of `results` (FAIL over ERROR over WARN over PASS); PASS for none."""
    return max((result.status for result in results), key=SEVERITY.__getitem__, default=Status.PASS)

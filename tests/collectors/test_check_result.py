"""A node's verdict over its checks: a check that could not judge never reads as healthy."""

from __future__ import annotations

from collectors.checks.result import CheckResult, Status, worst


def result(status: Status) -> CheckResult:
    return CheckResult("vela-001", "dcgm_diag", "gpu:0", status, None, "", None, 0.0, 1.0)


def test_error_outranks_pass_and_warn_and_fail_outranks_everything() -> None:
    assert worst([result(Status.PASS), result(Status.ERROR), result(Status.WARN)]) is Status.ERROR
    assert worst([result(Status.ERROR), result(Status.FAIL), result(Status.PASS)]) is Status.FAIL
    assert worst([result(Status.PASS)]) is Status.PASS

"""Waiting on a real peer (Prometheus, Alertmanager) to reach a state: a ceiling on the wait, never a
timing assertion."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], what: str, timeout_s: float = 15.0, every_s: float = 0.2) -> T:
    """`condition()`'s first truthy result, polled every `every_s` until `timeout_s` has passed; the test
    fails naming `what` when it never comes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")

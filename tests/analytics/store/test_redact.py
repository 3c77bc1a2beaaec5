"""Secrets in URLs and DSNs never reach what fleetlens prints or stores."""

from __future__ import annotations

import pytest

from analytics.store.redact import redacted


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://fleet:hunter2@ch:8123/db", "http://fleet:***@ch:8123/db"),
        (
            "https://hooks.example/services/T1?token=abc&channel=x",
            "https://hooks.example/services/T1?token=***&channel=***",
        ),
        ("chdb://./data", "chdb://./data"),
        ("http://alertmanager:9093", "http://alertmanager:9093"),
        ("http://user@host/db", "http://user@host/db"),  # a user name without a password is who, not a secret
        ("http://[::1:8123?secret", "***"),  # cannot be taken apart and may hold one
    ],
)
def test_passwords_and_query_values_are_masked(url, shown):
    assert redacted(url) == shown
    assert "hunter2" not in redacted(url) and "abc" not in redacted(url)

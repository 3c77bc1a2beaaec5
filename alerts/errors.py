"""The errors of the alerts package, as one tree.

    AlertsError
    ├── AlertConfigError   rules, policy, receivers or backends misconfigured: the message names the key
    ├── SilenceError       a silence with a bad matcher or expiry, or an unknown silence id
    ├── DecisionError      a drain decision that cannot be approved or undone (unknown id, already decided)
    └── BackendError       a drain backend call failed (scontrol's exit status, the API's answer)

Notifiers do not raise: a receiver that fails comes back as a Delivery with ok False and the reason,
so that one failing receiver never stops detection or the other receivers.
"""

from __future__ import annotations


class AlertsError(Exception):
    """Base of every error raised by alerts."""


class AlertConfigError(AlertsError):
    """Alert rules, drain policy, receivers or backends are misconfigured; the message names the key."""


class SilenceError(AlertsError):
    """A silence cannot be created or expired: a bad matcher or expiry, or an unknown id."""


class DecisionError(AlertsError):
    """A drain decision cannot be approved, denied or undone: unknown id, or already decided."""


class BackendError(AlertsError):
    """A drain backend could not carry out a call; the message says which node and what answered."""

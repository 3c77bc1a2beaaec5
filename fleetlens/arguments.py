"""Argument types of the command line: times and durations, with usage errors that name the text."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime

DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str) -> float:
    """Unix seconds from `1767225600`, `2026-01-01T00:00:00Z` or `2026-01-01 00:00` (UTC when no zone)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is neither unix seconds nor an ISO 8601 time") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def time_argument(text: str) -> float:
    """parse_time for argparse: a bad time is a usage error naming the text."""
    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration(text: str) -> float:
    """`90`, `90s`, `15m`, `2h`, `1d` as seconds."""
    found = DURATION.match(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m, 2h or 1d")
    return float(found.group(1)) * UNIT_S[found.group(2)]

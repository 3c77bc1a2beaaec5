"""The time range every page shows, picked once in the sidebar: a length ending now (the default, which
moves on with each refresh), a length ending at a given UTC time, or a custom from-until range."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import streamlit as st

from ui.errors import WindowError

LENGTHS_S = {"15 min": 900, "1 h": 3600, "6 h": 6 * 3600, "24 h": 86400, "7 d": 7 * 86400}
CUSTOM = "custom"
LENGTH_KEY, FROM_KEY, UNTIL_KEY = "window.length", "window.from", "window.until"
SHOWN = "%Y-%m-%d %H:%M:%S"


@dataclass(frozen=True)
class TimeRange:
    """[start, end) in unix seconds."""

    start: float
    end: float

    @property
    def label(self) -> str:
        """The range as people read it, in UTC with the zone shown."""
        return f"{shown(self.start)} to {shown(self.end)} UTC"

    def datetimes(self) -> dict[str, datetime]:
        """The bounds as {start:DateTime64(3)}, {end:DateTime64(3)} query parameters."""
        return {
            "start": datetime.fromtimestamp(self.start, UTC),
            "end": datetime.fromtimestamp(self.end, UTC),
        }


def shown(unix_s: float) -> str:
    """A unix time as "YYYY-MM-DD HH:MM:SS" in UTC."""
    return datetime.fromtimestamp(unix_s, UTC).strftime(SHOWN)


def utc_columns(*names: str) -> dict[str, Any]:
    """Column settings that show the `names` columns (UTC timestamps) with the zone in their titles."""
    return {
        name: st.column_config.DatetimeColumn(f"{name} (UTC)", format="YYYY-MM-DD HH:mm:ss") for name in names
    }


def pick() -> None:
    """The sidebar's range widgets; their values stay in session state for every page."""
    st.sidebar.selectbox("Time range", [*LENGTHS_S, CUSTOM], index=1, key=LENGTH_KEY)
    if st.session_state[LENGTH_KEY] == CUSTOM:
        st.sidebar.text_input("From (UTC)", key=FROM_KEY, placeholder="2026-11-30 09:00")
    st.sidebar.text_input("Until (UTC; empty: now)", key=UNTIL_KEY, placeholder="2026-11-30 10:00")
    try:
        st.sidebar.caption(chosen().label)
    except WindowError as error:
        st.sidebar.error(str(error))


def chosen(now: float | None = None) -> TimeRange:
    """The range the sidebar describes, ending `now` (default: the present) when no until is given."""
    until = _parse(st.session_state.get(UNTIL_KEY, ""), "Until")
    end = until if until is not None else (time.time() if now is None else now)
    if st.session_state.get(LENGTH_KEY, "1 h") == CUSTOM:
        start = _parse(st.session_state.get(FROM_KEY, ""), "From")
        if start is None:
            raise WindowError("a custom range needs a From time (UTC), e.g. 2026-11-30 09:00")
    else:
        start = end - LENGTHS_S[st.session_state.get(LENGTH_KEY, "1 h")]
    if start >= end:
        raise WindowError(f"From ({shown(start)} UTC) must be before Until ({shown(end)} UTC)")
    return TimeRange(start, end)


def current() -> TimeRange:
    """The chosen range; a page stops with the sidebar's complaint when it cannot be read."""
    try:
        return chosen()
    except WindowError as error:
        st.error(f"time range: {error}")
        st.stop()


def _parse(text: str, field: str) -> float | None:
    """A time typed in the sidebar (ISO 8601-ish, UTC unless it names a zone) as unix seconds."""
    if not text.strip():
        return None
    try:
        stamp = pd.Timestamp(text.strip())
    except ValueError:
        raise WindowError(f"{field}: {text!r} is not a time like 2026-11-30 09:00 (UTC)") from None
    stamp = stamp.tz_localize(UTC) if stamp.tzinfo is None else stamp.tz_convert(UTC)
    return stamp.timestamp()

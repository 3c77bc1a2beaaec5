"""Where the app reads and writes, and how it tells people when that fails.

`fleetlens ui` names the source in the environment (ui.environment): a hub's URL (HubClient, through its
query API: the way to an embedded store while its hub runs) or a store DSN (a ClickHouse server, or a
chDB directory no hub holds). Both answer `query` and `insert_actions`, so the pages read with
analytics.reports.dashboards and send approvals with alerts.commands alike on either.

Tests put a Store of their own in st.session_state[SESSION_KEY] before the first run (AppTest runs the
app in the test's process).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

import streamlit as st

from alerts.errors import AlertsError
from analytics.errors import AnalyticsError
from analytics.store import Store
from analytics.store.hubclient import HubClient
from analytics.store.protocols import ReadWriter
from ui import environment
from ui.errors import SourceError

SESSION_KEY = "fleetlens.source"


def current() -> ReadWriter:
    """This session's source: the one a test placed in session state, else the one the environment
    names (opened once per server process)."""
    placed = st.session_state.get(SESSION_KEY)
    if placed is not None:
        return placed
    return _opened(os.environ.get(environment.HUB, ""), os.environ.get(environment.STORE, ""))


@st.cache_resource(show_spinner=False)
def _opened(hub: str, store: str) -> ReadWriter:
    if hub:
        return HubClient(hub)
    if store:
        return Store.open(store)  # thread-safe: every session of the server shares it
    raise SourceError(
        f"no source: set {environment.HUB} (a hub's URL) or {environment.STORE} (a store DSN); "
        "`fleetlens ui --hub URL | --store DSN` sets them"
    )


def drain_policy() -> dict[str, Any] | None:
    """The drain policy the hub enforces (mode, limits, cooldown, rules), as `fleetlens ui` passed it;
    None when it passed none."""
    text = os.environ.get(environment.LIMITS, "")
    if not text:
        return None
    try:
        policy = json.loads(text)
    except ValueError as error:
        raise SourceError(f"{environment.LIMITS} is not JSON: {error}") from None
    if not isinstance(policy, dict):
        raise SourceError(f"{environment.LIMITS} must hold a JSON object, not {type(policy).__name__}")
    return policy


@contextlib.contextmanager
def reported(what: str) -> Iterator[None]:
    """Show a failure of the block (the store or the hub unreachable, a query refused, a bad setting)
    as an error on the page, naming `what` was being done, instead of a traceback."""
    try:
        yield
    except (AnalyticsError, AlertsError, SourceError) as error:
        st.error(f"{what}: {error}")

"""What people do to alerts and drains, as rows in the store: the CLI, the UI and the hub's API all go
through here, so a silence or an approval made anywhere reaches the hub's controller the same way.

Writes need a Store (the hub's, behind its API, or a ClickHouse server directly); reads need anything
with `query` (a Store, or analytics.store.hubclient.HubClient through the hub's query API).

Approvals, denials and undrain requests are `actions` rows with outcome `requested`; the hub's
controller picks them up on its next cycle and records what it did with them.

Every write of silences goes through `store_silences` (the hub's API runs its check, `check_silences`, on
what it is sent): at most MAX_SILENCES_PER_REQUEST rows, each a valid silence or the expiry of the row the
store holds (alerts.silences.validate_row). A `silences` row that holds no valid silence (stored by an
older version, or written to a ClickHouse server directly) never fails a reader: `silences` skips it,
logging it once per silence id, `stored_silences` shows it with the reason, and `expire_silence` can end
it.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from alerts.errors import DecisionError, SilenceError
from alerts.silences import Silence, expiry_row, silence_from_row, validate_row
from analytics.store.protocols import Reader, ReadWriter
from analytics.store.records import REQUESTS, ActionRow, QueryResult, SilenceRow

log = logging.getLogger(__name__)

NODE_REQUESTS = ("undrain", "test")  # requests about a node, not a decision


def rows(result: QueryResult) -> list[dict[str, Any]]:
    """A query result as one dict per row."""
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


# -- silences --------------------------------------------------------------------------------------------

MAX_SILENCES_PER_REQUEST = 100
SILENCE_COLUMNS_SQL = """
SELECT id, matchers, toUnixTimestamp64Milli(starts_at) / 1000 AS starts_at,
    toUnixTimestamp64Milli(ends_at) / 1000 AS ends_at, created_by, comment,
    toUnixTimestamp64Milli(updated_at) / 1000 AS updated_at
FROM silences FINAL
"""
SILENCES_SQL = (
    SILENCE_COLUMNS_SQL
    + """WHERE ends_at > fromUnixTimestamp64Milli(toInt64({since:Float64} * 1000)) AND ends_at > starts_at
ORDER BY starts_at
"""
)
SILENCE_SQL = SILENCE_COLUMNS_SQL + "WHERE id = {id:String}\n"
_reported_invalid: set[str] = set()  # ids of the invalid silences logged already, so each is logged once


@dataclass(frozen=True)
class StoredSilence:
    """A `silences` row as read back: the silence it holds, or None and the reason it holds none."""

    row: SilenceRow
    silence: Silence | None
    problem: str = ""

    @classmethod
    def of(cls, row: SilenceRow) -> StoredSilence:
        """`row` checked by alerts.silences.silence_from_row: a failure is kept as the reason, not raised."""
        try:
            return cls(row, silence_from_row(row))
        except SilenceError as error:
            return cls(row, None, str(error))


def stored_silences(source: Reader, since: float | None = None) -> list[StoredSilence]:
    """Every row of a silence that ends after `since` (default now), valid or not, by start time.

    A row whose ends_at is not after its starts_at mutes nothing and is left out: an expired silence
    that had not started yet is one."""
    since = time.time() if since is None else since
    result = source.query(SILENCES_SQL, parameters={"since": since})
    return [StoredSilence.of(SilenceRow(**row)) for row in rows(result)]


def silences(source: Reader, since: float | None = None) -> list[Silence]:
    """The valid silences that end after `since` (default now): the ones in force or to come. An invalid
    row is skipped, and logged the first time this process reads it."""
    found = []
    for stored in stored_silences(source, since):
        if stored.silence is not None:
            found.append(stored.silence)
        elif stored.row.id not in _reported_invalid:
            _reported_invalid.add(stored.row.id)
            log.warning(
                "silence %r is invalid and mutes nothing (%s); `fleetlens silence expire` ends it",
                stored.row.id,
                stored.problem,
            )
    return found


def stored_row(source: Reader, silence_id: str) -> SilenceRow | None:
    """The row the store holds for silence `silence_id` (its latest write), or None."""
    found = rows(source.query(SILENCE_SQL, parameters={"id": silence_id}, max_rows=1))
    return SilenceRow(**found[0]) if found else None


def check_silences(source: Reader, silence_rows: Sequence[SilenceRow], now: float | None = None) -> None:
    """The one check of every write to `silences` (the module doc); SilenceError naming the row, as
    rows[i], and the field, or the count."""
    if len(silence_rows) > MAX_SILENCES_PER_REQUEST:
        raise SilenceError(
            f"{len(silence_rows)} silences in one request, more than {MAX_SILENCES_PER_REQUEST}"
        )
    stored = functools.cache(lambda silence_id: stored_row(source, silence_id))
    for index, row in enumerate(silence_rows):
        try:
            validate_row(row, stored, now)
        except SilenceError as error:
            raise SilenceError(f"rows[{index}]: {error}") from None


def store_silences(store: ReadWriter, silence_rows: Sequence[SilenceRow], token: str) -> int:
    """Write `silence_rows` once check_silences passes them (a hub checks them again on its side)."""
    check_silences(store, silence_rows)
    return store.insert_silences(silence_rows, token=token)


def add_silence(store: ReadWriter, silence: Silence) -> Silence:
    """Store a new silence so every hub and reader sees it."""
    store_silences(store, [silence.row(silence.starts_at)], token=f"silence/{silence.id}/new")
    return silence


def expire_silence(store: ReadWriter, silence_id: str) -> StoredSilence:
    """End a silence now, valid or not; SilenceError when no silence in force or to come has that id."""
    now = time.time()
    found = next((s for s in stored_silences(store, now) if s.row.id == silence_id), None)
    if found is None:
        raise SilenceError(f"no silence {silence_id} is in force or to come")
    row = expiry_row(found.row, now)
    store_silences(store, [row], token=f"silence/{silence_id}/expire/{now}")
    silence = replace(found.silence, starts_at=row.starts_at, ends_at=now) if found.silence else None
    return StoredSilence(row, silence, found.problem)


# -- alerts ----------------------------------------------------------------------------------------------

ALERTS_SQL = """
SELECT fingerprint, argMax(alertname, ts) AS alertname, argMax(state, ts) AS state,
    argMax(labels, ts) AS labels, argMax(annotations, ts) AS annotations,
    toUnixTimestamp64Milli(argMax(starts_at, ts)) / 1000 AS starts_at,
    toUnixTimestamp64Milli(argMax(ends_at, ts)) / 1000 AS ends_at,
    toUnixTimestamp64Milli(max(ts)) / 1000 AS changed_at
FROM alerts
GROUP BY fingerprint
HAVING {state:String} = '' OR state = {state:String}
ORDER BY changed_at DESC
"""


def alert_states(source: Reader, state: str = "", limit: int = 1000) -> list[dict[str, Any]]:
    """The latest state of each alert (only those in `state` when given), most recently changed first."""
    return rows(source.query(ALERTS_SQL, parameters={"state": state}, max_rows=limit))


# -- drain decisions -------------------------------------------------------------------------------------

ACTIONS_SQL = """
SELECT toUnixTimestamp64Milli(ts) / 1000 AS ts, action, node, job, reason, mode, outcome, decision_id
FROM actions
WHERE ts >= fromUnixTimestamp64Milli(toInt64({since:Float64} * 1000))
ORDER BY ts, action
"""


def actions(source: Reader, since: float = 0.0, limit: int = 100_000) -> list[ActionRow]:
    """Every `actions` row since `since`, oldest first."""
    return [
        ActionRow(**row)
        for row in rows(source.query(ACTIONS_SQL, parameters={"since": since}, max_rows=limit))
    ]


def request(store: ReadWriter, action: str, target: str, by: str, now: float | None = None) -> ActionRow:
    """Ask the hub's controller to approve or deny decision `target`, or to undrain or test (the
    lifecycle) node `target`."""
    if action not in REQUESTS:
        raise DecisionError(f"unknown request {action!r}; one of {', '.join(REQUESTS)}")
    if not target or not by:
        raise DecisionError(f"{action}: needs a decision id (or, to undrain or test, a node) and who asks")
    now = time.time() if now is None else now
    is_node = action in NODE_REQUESTS
    row = ActionRow(
        now,
        action,
        target if is_node else "",
        "",
        f"requested by {by}",
        "",
        "requested",
        "" if is_node else target,
    )
    store.insert_actions([row], token=f"request/{uuid.uuid4()}")
    return row


def standing(history: Iterable[ActionRow]) -> tuple[dict[str, ActionRow], dict[str, ActionRow]]:
    """What an audit in time order leaves standing: the last drain of each node still out of service (by
    node) and the drains still waiting for approval (by decision id). The controller restores from it and
    people read it; one reading, so that both agree."""
    drained: dict[str, ActionRow] = {}
    pending: dict[str, ActionRow] = {}
    for row in history:
        if row.action == "drain" and row.outcome in ("done", "dry-run"):
            drained[row.node] = row
        elif row.action == "undrain" and row.outcome in ("done", "dry-run"):
            drained.pop(row.node, None)
        elif row.action == "return" and row.outcome in ("done", "dry-run", "refused"):
            drained.pop(row.node, None)  # the lifecycle returned it, or let go of a node someone took over
        elif row.action == "drain" and row.outcome == "pending":
            pending[row.decision_id] = row
        elif row.action in ("approve", "deny") and row.outcome in ("approved", "denied"):
            pending.pop(row.decision_id, None)
    return drained, pending


def drain_status(source: Reader, since: float = 0.0) -> dict[str, list[ActionRow]]:
    """What the controller has done, as its audit says: `drained` (the last drain of each node still
    out of service), `pending` (drains waiting for approval) and `recent` (every row since `since`)."""
    history = actions(source)
    drained, pending = standing(history)
    return {
        "drained": list(drained.values()),
        "pending": list(pending.values()),
        "recent": [row for row in history if row.ts >= since],
    }

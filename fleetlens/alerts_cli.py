"""`fleetlens alerts`, `fleetlens silence` and `fleetlens drain`: what people do about alerts and drains.

Each works through a hub (--hub URL: the only way to an embedded store while its hub runs) or on the
store directly (--store DSN). Approvals, denials, undrains and tests are requests that the hub's drain
controller (tests: its node lifecycle) carries out on its next cycle (alerts.commands).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from alerts import commands
from alerts.commands import StoredSilence
from alerts.silences import new_silence
from analytics.reports.lifecycle import node_states
from analytics.store.hubclient import HubClient
from analytics.store.records import ActionRow
from fleetlens.access import hub_config, open_store


@contextlib.contextmanager
def connected(args: argparse.Namespace) -> Iterator[Any]:
    """The hub's API (--hub) or the store (--store, else the config's), closed afterwards."""
    if args.hub:
        yield HubClient(args.hub)
        return
    store = open_store(hub_config(args))
    try:
        yield store
    finally:
        store.close()


def _when(unix_s: float | None) -> str:
    return "" if unix_s is None else datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _print(rows: Sequence[dict[str, Any]], columns: Sequence[str], as_json: bool) -> None:
    if as_json:
        print(json.dumps(list(rows), default=str))
        return
    print("\t".join(columns))
    for row in rows:
        print("\t".join(str(row.get(column, "")) for column in columns))


def cmd_alerts_list(args: argparse.Namespace) -> int:
    with connected(args) as source:
        alerts = commands.alert_states(source, args.state or "")
    rows = [
        {
            **alert,
            "node": alert["labels"].get("node", ""),
            "component": alert["labels"].get("component", ""),
            "summary": alert["annotations"].get("summary", ""),
            "since": _when(alert["starts_at"]),
            "ended": _when(alert["ends_at"]) if alert["state"] == "resolved" else "",
        }
        for alert in alerts
    ]
    _print(
        rows,
        ["state", "alertname", "node", "component", "since", "ended", "fingerprint", "summary"],
        args.json,
    )
    return 0


def _silence_row(stored: StoredSilence) -> dict[str, Any]:
    """One silence for people; a stored row that is no valid silence shows its matchers as stored and,
    under `invalid`, why it mutes nothing (`silence expire` ends it)."""
    row, silence = stored.row, stored.silence
    return {
        "id": row.id,
        "matchers": ",".join(map(str, silence.matchers)) if silence else row.matchers,
        "starts_at": _when(row.starts_at),
        "ends_at": _when(row.ends_at),
        "created_by": row.created_by,
        "comment": row.comment,
        "invalid": stored.problem,
    }


SILENCE_COLUMNS = ["id", "matchers", "starts_at", "ends_at", "created_by", "comment", "invalid"]


def cmd_silence_add(args: argparse.Namespace) -> int:
    with connected(args) as store:
        silence = new_silence(args.matcher, args.duration, created_by=args.by, comment=args.comment)
        commands.add_silence(store, silence)
    _print([_silence_row(StoredSilence(silence.row(silence.starts_at), silence))], SILENCE_COLUMNS, args.json)
    return 0


def cmd_silence_list(args: argparse.Namespace) -> int:
    with connected(args) as source:
        found = commands.stored_silences(source)
    _print([_silence_row(stored) for stored in found], SILENCE_COLUMNS, args.json)
    return 0


def cmd_silence_expire(args: argparse.Namespace) -> int:
    with connected(args) as store:
        expired = commands.expire_silence(store, args.id)
    _print([_silence_row(expired)], SILENCE_COLUMNS, args.json)
    return 0


ACTION_COLUMNS = ["ts", "action", "node", "job", "outcome", "mode", "decision_id", "reason"]


def _action_rows(rows: Sequence[ActionRow]) -> list[dict[str, Any]]:
    return [{**asdict(row), "ts": _when(row.ts)} for row in rows]


def cmd_drain_list(args: argparse.Namespace) -> int:
    with connected(args) as source:
        status = commands.drain_status(source)
    if args.json:
        print(json.dumps({part: _action_rows(rows) for part, rows in status.items()}, default=str))
        return 0
    for part, title in (("pending", "waiting for approval"), ("drained", "drained by fleetlens")):
        print(f"# {title}: {len(status[part])}")
        _print(_action_rows(status[part]), ACTION_COLUMNS, False)
    return 0


def cmd_alerts_lifecycle(args: argparse.Namespace) -> int:
    """The lifecycle state of each node fleetlens holds out of service, as the audit says."""
    with connected(args) as source:
        states = node_states(source)
    rows = [
        {"node": node, "state": state.state, "since": _when(state.since), "reason": state.reason}
        for node, state in sorted(states.items())
    ]
    _print(rows, ["node", "state", "since", "reason"], args.json)
    return 0


def cmd_drain_request(args: argparse.Namespace) -> int:
    """approve, deny, undrain or test (args.request): recorded for the hub's drain controller."""
    with connected(args) as store:
        row = commands.request(store, args.request, args.target, args.by)
    if args.json:
        print(json.dumps(_action_rows([row])[0]))
    else:
        print(
            f"{args.request} {args.target}: requested by {args.by}; "
            "the hub's drain controller acts next cycle"
        )
    return 0

"""`fleetlens alerts`, `fleetlens silence` and `fleetlens drain`: what people do about alerts and drains.

Each works through a hub (--hub URL: the only way to an embedded store while its hub runs) or on the
store directly (--store DSN). Approvals, denials and undrains are requests that the hub's drain
controller carries out on its next cycle (alerts.commands).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from alerts import commands
from alerts.commands import StoredSilence
from alerts.silences import new_silence
from analytics.store.hubclient import HubClient
from analytics.store.records import ActionRow
from fleetlens.access import hub_config, open_store

DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """`90`, `90s`, `15m`, `2h`, `1d` as seconds."""
    found = DURATION.match(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 15m, 2h or 1d")
    return float(found.group(1)) * UNIT_S[found.group(2)]


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


def _requester(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        with connected(args) as store:
            row = commands.request(store, action, args.target, args.by)
        if args.json:
            print(json.dumps(_action_rows([row])[0]))
        else:
            print(
                f"{action} {args.target}: requested by {args.by}; the hub's drain controller acts next cycle"
            )
        return 0

    return run


def add_commands(sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register `alerts`, `silence` and `drain`; `common` adds the --config/--store flags."""

    def leaf(
        parent: argparse._SubParsersAction, name: str, help: str, run: Callable
    ) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, help=help)
        common(parser)
        parser.add_argument("--hub", help="a hub's URL: go through its API (the way to an embedded store)")
        parser.add_argument("--json", action="store_true", help="JSON instead of a table")
        parser.set_defaults(func=run)
        return parser

    alerts = sub.add_parser("alerts", help="alerts raised from anomalies").add_subparsers(required=True)
    listing = leaf(alerts, "list", "the latest state of each alert", cmd_alerts_list)
    listing.add_argument(
        "--state", choices=["pending", "firing", "resolved"], help="only alerts in this state"
    )

    silence = sub.add_parser("silence", help="mute alerts by label matchers").add_subparsers(required=True)
    add = leaf(silence, "add", "create a silence starting now", cmd_silence_add)
    add.add_argument(
        "-m",
        "--matcher",
        action="append",
        required=True,
        help="NAME=VALUE, NAME!=VALUE, NAME=~RE or NAME!~RE",
    )
    add.add_argument("--duration", type=duration, required=True, help="how long: 90s, 15m, 2h, 1d")
    add.add_argument("--comment", required=True, help="why (kept in the audit)")
    add.add_argument("--by", default=getpass.getuser(), help="who (default: this user)")
    leaf(silence, "list", "silences in force or to come (an invalid one says why)", cmd_silence_list)
    expire = leaf(silence, "expire", "end a silence now", cmd_silence_expire)
    expire.add_argument("id", help="the silence's id (from silence list)")

    drain = sub.add_parser("drain", help="the drain controller's decisions").add_subparsers(required=True)
    leaf(drain, "list", "drains waiting for approval and nodes fleetlens drained", cmd_drain_list)
    for action, target, help in (
        ("approve", "decision id (from drain list)", "carry out a drain that waits for approval"),
        ("deny", "decision id (from drain list)", "drop a drain that waits for approval"),
        ("undrain", "node", "put a node fleetlens drained back into scheduling"),
    ):
        parser = leaf(drain, action, help, _requester(action))
        parser.add_argument("target", help=target)
        parser.add_argument("--by", default=getpass.getuser(), help="who (default: this user)")

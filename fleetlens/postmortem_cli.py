"""`fleetlens postmortem`: the UI's postmortem report without a browser, for a terminal or a ticket.

    fleetlens postmortem --node vela-002 --from 2026-01-01T10:00Z --to 2026-01-01T12:00Z
    fleetlens postmortem --job run-42 --from 1767261600 --to 1767268800 --format json --hub http://hub:9500

It reads through a hub (--hub URL: the only way to an embedded store while its hub runs) or the store
directly (--store DSN, else the config's).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from analytics.reports.postmortem import Report, build_report, to_csv, to_json, to_markdown
from fleetlens.alerts_cli import connected
from sim import pipeline

RENDERERS: dict[str, Callable[[Report], str]] = {
    "md": to_markdown,
    "json": lambda report: json.dumps(to_json(report), indent=1) + "\n",
    "csv": to_csv,
}


def cmd_postmortem(args: argparse.Namespace) -> int:
    with connected(args) as source:
        report = build_report(source, node=args.node, job=args.job, start=args.start, end=args.end)
    print(RENDERERS[args.format](report), end="")
    return 0


def add_commands(sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register `postmortem`; `common` adds the --config/--store flags."""
    parser = sub.add_parser(
        "postmortem", help="the incident report of a node or a job over a time window (Markdown, JSON, CSV)"
    )
    common(parser)
    parser.add_argument("--hub", help="a hub's URL: go through its API (the way to an embedded store)")
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("--node", help="the node the report is about")
    scope.add_argument("--job", help="the job the report is about (its nodes: those that ran its steps)")
    for flag, dest in (("--from", "start"), ("--to", "end")):
        parser.add_argument(
            flag, dest=dest, type=pipeline.time_argument, required=True, help="unix seconds or ISO 8601 (UTC)"
        )
    parser.add_argument("--format", choices=sorted(RENDERERS), default="md", help="md (default), json or csv")
    parser.set_defaults(func=cmd_postmortem)

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

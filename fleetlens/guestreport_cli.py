"""`fleetlens guest-report`: in a VM, what it sees of its own NICs, GPUs and DMI UUID, printed as JSON or
posted to a hub as format `guest` (collectors.guestreport). Imports collectors/ only, so a base install
runs it."""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path

from collectors.guestreport import FORMAT, guest_report
from collectors.hostagent import post_topology


def cmd_guest_report(args: argparse.Namespace) -> int:
    """Print this guest's report (the tree under --root) as JSON, or with --hub post it there, reporter =
    the node, with FLEETLENS_API_TOKEN as the token, and print what the hub stored. A part refused is in
    the report's `errors` (exit 0); a hub that refuses or cannot be reached is an error (exit 1)."""
    node = args.node or socket.gethostname()
    report = guest_report(Path(args.root), node)
    if not args.hub:
        print(json.dumps(report, indent=2))
        return 0
    answer = post_topology(args.hub, FORMAT, node, report, os.environ.get("FLEETLENS_API_TOKEN"))
    print(json.dumps(answer))
    return 0

"""`fleetlens demo`: the whole platform on this machine with a simulated fleet and a real training job."""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetlens.demo.run import SCENARIO, DemoOptions, run_demo


def cmd_demo(args: argparse.Namespace) -> int:
    options = DemoOptions(
        workdir=Path(args.workdir),
        scenario=Path(args.scenario),
        duration_s=args.duration,
        headless=args.headless,
        real_links=args.real_links,
        ui_port=args.ui_port,
    )
    try:
        return run_demo(options, say=lambda line: print(line, flush=True))
    except (RuntimeError, TimeoutError) as error:  # DemoError, LinkSetupError, a peer that did not start
        print(f"fleetlens demo: {error}", flush=True)
        return 1


def add_commands(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="run the whole platform here: simulated fleet, real DDP job, UI")
    parser.add_argument("--scenario", default=str(SCENARIO), help="scenario YAML (default: the demo's fleet)")
    parser.add_argument("--duration", type=float, help="stop after this many seconds and score the run")
    parser.add_argument("--headless", action="store_true", help="no UI")
    parser.add_argument(
        "--real-links", action="store_true", help="as root: flap a real veth between two network namespaces"
    )
    parser.add_argument(
        "--workdir", default="fleetlens-demo", help="where the store and logs go (default ./fleetlens-demo)"
    )
    parser.add_argument("--ui-port", type=int, default=8501, help="the UI's port (default 8501)")
    parser.set_defaults(func=cmd_demo)

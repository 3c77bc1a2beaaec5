"""`fleetlens demo`: the whole platform on this machine with a simulated fleet and a real training job."""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetlens.demo.run import SCENARIO, DemoOptions, run_demo
from fleetlens.errors import DemoError


def cmd_demo(args: argparse.Namespace) -> int:
    options = DemoOptions(
        workdir=Path(args.workdir),
        scenario=Path(args.scenario) if args.scenario else SCENARIO,
        duration_s=args.duration,
        headless=args.headless,
        real_links=args.real_links,
        ui_port=args.ui_port,
    )
    try:
        return run_demo(options, say=lambda line: print(line, flush=True))
    except DemoError as error:
        print(f"fleetlens demo: {error}", flush=True)
        return 1

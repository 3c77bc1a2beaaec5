"""`fleetlens sim run`, `sim serve` and `eval`: the simulator and the detection evaluation (the hub extra)."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from analytics.store.hubclient import HubAccess
from fleetlens.access import hub_config, open_store
from sim import pipeline
from sim.evaluation import combine, to_json, to_markdown
from sim.fleet import write_file_sd
from sim.live import LiveFleet
from sim.scenario import load_scenario, with_exporters


def cmd_sim_run(args: argparse.Namespace) -> int:
    scenario = with_exporters(load_scenario(args.scenario), args.exporters)
    store = open_store(hub_config(args))
    try:
        with tempfile.TemporaryDirectory(prefix="fleetlens-sim-", dir=pipeline.scratch_dir()) as tmp:
            summary = pipeline.simulate(scenario, store, Path(tmp), offline=args.offline, speed=args.speed)
    finally:
        store.close()
    print(
        f"simulated {scenario.name}: {summary.ticks} ticks, {summary.samples} samples, {summary.steps} step "
        f"rows, {summary.targets_down} failed scrapes, in {summary.wall_s:.1f} s"
    )
    return 0


def cmd_sim_serve(args: argparse.Namespace) -> int:
    """Serve the scenario's nodes on loopback in real time until SIGTERM or SIGINT; with --hub, post the
    jobs' step records there with the token and client certificate of the environment (HubAccess), as
    every other client of a hub does."""
    scenario = with_exporters(load_scenario(args.scenario), args.exporters)
    if args.until is not None:
        scenario = scenario.until(args.until)
    epoch = time.time() if args.epoch is None else args.epoch
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with contextlib.ExitStack() as stack:
        workdir = args.workdir
        if workdir is None:  # the /sys trees are rewritten at every scrape: tmpfs where there is one
            scratch = tempfile.TemporaryDirectory(prefix="fleetlens-live-", dir=pipeline.scratch_dir())
            workdir = stack.enter_context(scratch)
        fleet = LiveFleet(scenario, Path(workdir), epoch).start()
        stack.callback(fleet.close)
        files = fleet.file_sd(Path(args.file_sd))
        for path, groups in files.items():
            write_file_sd(path, groups)
        print(
            f"fleetlens sim: {len(fleet.addresses)} nodes of {scenario.name} on loopback "
            f"({scenario.exporters} exporters), targets in {', '.join(map(str, files))}, scenario time 0 at "
            f"{datetime.fromtimestamp(epoch, UTC):%H:%M:%S} UTC",
            flush=True,
        )
        if args.hub:
            access = HubAccess.resolve()
            fleet.post_steps_until(stop, urlsplit(args.hub).netloc, access.token, access.tls_for(args.hub))
        else:
            stop.wait()
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.scenarios]
    suite = combine(pipeline.evaluate_files(paths, workers=args.workers, exporters=args.exporters))
    print(to_markdown(suite))
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(suite), indent=1) + "\n")
    return 0

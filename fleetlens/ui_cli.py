"""`fleetlens ui`: serve the Streamlit app (ui/app.py) on a hub's API or on a store.

    fleetlens ui --hub http://127.0.0.1:9500            # an embedded store: read through its hub
    fleetlens ui --store http://ch1:8123/fleet          # a ClickHouse server (or a chDB dir no hub holds)

The app learns where to read, and the drain policy the hub enforces (this config's `drain:` section),
from the environment (ui.environment); `streamlit run` then takes this process's place, so that a
signal to it (Ctrl-C, a service manager's SIGTERM) reaches the server itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict
from typing import NoReturn

from fleetlens.access import load
from fleetlens.errors import ConfigError
from ui import environment


def app_environment(args: argparse.Namespace, base: Mapping[str, str]) -> dict[str, str]:
    """`base` with where the app reads (--hub, else --store or the config's store) and the drain policy."""
    if args.hub and args.store:
        raise ConfigError("fleetlens ui: give --hub or --store, not both")
    settings = load(args)
    where = {environment.HUB: args.hub} if args.hub else {environment.STORE: settings.hub.store}
    policy = json.dumps(asdict(settings.drain.policy()))
    cleared = {key: value for key, value in base.items() if key not in (environment.HUB, environment.STORE)}
    return {**cleared, **where, environment.LIMITS: policy}


def streamlit_command(address: str, port: int) -> list[str]:
    """`python -m streamlit run ui/app.py`, headless, on `address`:`port`: no usage statistics sent, no
    developer menu shown."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(environment.APP),
        "--server.headless=true",
        f"--server.address={address}",
        f"--server.port={port}",
        "--browser.gatherUsageStats=false",
        "--client.toolbarMode=viewer",
    ]


def cmd_ui(args: argparse.Namespace) -> NoReturn:
    env = app_environment(args, os.environ)
    command = streamlit_command(args.address, args.port)
    print(f"fleetlens ui: http://{args.address}:{args.port}", flush=True)
    os.execve(command[0], command, env)

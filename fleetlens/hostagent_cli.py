"""`fleetlens host-agent`: on a hypervisor, report what it sees of its VMs' place to a hub, every interval.
Imports collectors/ only, so a base install (no hub extra) runs it."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
from pathlib import Path

from collectors.hostagent import HostAgent, run_agent
from fleetlens.errors import ConfigError


def cmd_host_agent(args: argparse.Namespace) -> int:
    """Post this host's report to --hub each --interval-s (once with --once) with FLEETLENS_API_TOKEN as
    the token, until SIGTERM or SIGINT; exit status 1 when --once could not store its report."""
    if not args.interval_s > 0:
        raise ConfigError(f"--interval-s: {args.interval_s} is not a positive number of seconds")
    agent = HostAgent(
        args.host or socket.gethostname(),
        sysfs_root=Path(args.sysfs_root),
        virsh=("virsh", "-c", args.virsh_connect) if args.virsh_connect else ("virsh",),
        lldpcli=("lldpcli", "-u", args.lldpd_socket) if args.lldpd_socket else ("lldpcli",),
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    token = os.environ.get("FLEETLENS_API_TOKEN")
    stored = run_agent(agent, args.hub, token, interval_s=args.interval_s, once=args.once, stop=stop)
    return 0 if stored or not args.once else 1

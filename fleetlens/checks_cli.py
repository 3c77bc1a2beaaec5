"""`fleetlens checks run` and `list`: active health checks on this node (collectors.checks), one JSON line
per result and, with --hub, posted to the hub's `checks` table; and the stored results read back.

`run`'s exit status is what a job launcher acts on: 0 when every result is PASS or WARN, 1 when any is
FAIL, 2 when any is ERROR (a check that could not judge, its results not stored by the hub, or a bad
option) and none is FAIL.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

from analytics.errors import StoreError
from analytics.store import checks
from analytics.store.hubclient import HubClient
from collectors.checks.dcgm_diag import run_dcgm_diag
from collectors.checks.gpu_state import UnavailableBackend, run_gpu_state
from collectors.checks.network import iperf3_pair, ping_mesh
from collectors.checks.result import CheckResult, Status, worst
from collectors.errors import CollectorConfigError, GpuBackendError
from collectors.gpu.nvml import NvmlBackend
from fleetlens.access import reader
from fleetlens.errors import ConfigError

CHECK_NAMES = ("dcgm_diag", "gpu_state", "ping", "iperf3")
DEFAULT_CHECKS = "dcgm_diag,gpu_state"  # light: DCGM level 1 and the GPUs' own state, seconds of GPU time
EXIT_STATUS = {Status.PASS: 0, Status.WARN: 0, Status.FAIL: 1, Status.ERROR: 2}
LIST_COLUMNS = ("started", "node", "check", "target", "status", "value", "unit", "threshold")
DAY_S = 86_400.0


def cmd_checks_run(args: argparse.Namespace) -> int:
    """Run the chosen checks, print each result as a JSON line, post them with --hub; the exit status of
    the module doc."""
    node = args.node or socket.gethostname()
    try:
        results = [result for name in _chosen(args.checks) for result in _RUNNERS[name](node, args)]
    except CollectorConfigError as exc:
        raise ConfigError(str(exc)) from None
    for result in results:
        print(json.dumps(asdict(result)), flush=True)
    status = EXIT_STATUS[worst(results)]
    if args.hub and results:
        try:
            HubClient(args.hub).insert_checks([asdict(result) for result in results])
        except StoreError as exc:
            print(f"fleetlens checks run: the results were not stored: {exc}", file=sys.stderr)
            return status if status == EXIT_STATUS[Status.FAIL] else EXIT_STATUS[Status.ERROR]
    return status


def cmd_checks_list(args: argparse.Namespace) -> int:
    """The stored results since --since (default a day ago), of --node where given, as a table or JSON."""
    now = time.time()
    source = reader(args)
    try:
        rows = checks.checks_between(
            source, now - DAY_S if args.since is None else args.since, now, node=args.node
        )
    finally:
        if not args.hub:
            source.close()
    if args.json:
        print(json.dumps([asdict(row) for row in rows]))
        return 0
    print("\t".join(LIST_COLUMNS))
    for row in rows:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row.started))
        cells = (started, *(getattr(row, column) for column in LIST_COLUMNS[1:]))
        print("\t".join("-" if cell is None or cell == "" else str(cell) for cell in cells))
    return 0


def _chosen(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if unknown := sorted(set(names) - set(CHECK_NAMES)):
        raise ConfigError(f"--checks: unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECK_NAMES)}")
    return list(dict.fromkeys(names))


def _peers(pairs: list[str]) -> dict[str, str]:
    """--peer NAME=ADDR options as name -> address."""
    peers = {}
    for pair in pairs:
        name, equals, address = pair.partition("=")
        if not equals or not name or not address:
            raise ConfigError(f"--peer {pair!r}: expected NAME=ADDR")
        peers[name] = address
    return peers


def _needing_peers(args: argparse.Namespace, check: str) -> dict[str, str]:
    peers = _peers(args.peer)
    if not peers:
        raise ConfigError(f"{check} needs at least one --peer NAME=ADDR")
    return peers


def _ping(node: str, args: argparse.Namespace) -> list[CheckResult]:
    peers = _needing_peers(args, "ping")
    if not args.dev:
        raise ConfigError("ping needs --dev NETDEV (the interface, or source address, to ping from)")
    return ping_mesh(node, peers, args.dev)


def _iperf3(node: str, args: argparse.Namespace) -> list[CheckResult]:
    """iperf3 to each peer, one at a time (pairs at once would share the link they measure)."""
    expected = args.expected_gbps * 1e9
    return [
        iperf3_pair(node, name, address, expected) for name, address in _needing_peers(args, "iperf3").items()
    ]


def _gpu_state(node: str, args: argparse.Namespace) -> list[CheckResult]:
    try:
        backend = NvmlBackend()
    except (ImportError, GpuBackendError) as exc:
        return run_gpu_state(node, UnavailableBackend(f"NVML cannot be opened: {exc}"))  # type: ignore[arg-type]
    try:
        return run_gpu_state(node, backend)
    finally:
        backend.close()


_RUNNERS: dict[str, Callable[[str, argparse.Namespace], list[CheckResult]]] = {
    "dcgm_diag": lambda node, args: run_dcgm_diag(node, args.level),
    "gpu_state": _gpu_state,
    "ping": _ping,
    "iperf3": _iperf3,
}

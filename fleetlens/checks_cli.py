"""`fleetlens checks run`, `preflight`, `schedule` and `list`: active health checks on this node
(collectors.checks), one JSON line per result (`preflight`: one JSON line in all) and, with --hub, posted
to the hub's `checks` table; the same on a schedule (collectors.checks.schedule); and the stored results
read back.

`run`'s and `preflight`'s exit status is what a job launcher acts on: 0 when every result is PASS or WARN,
1 when any is FAIL, 2 when any is ERROR (a check that could not judge, its results not stored by the
hub, or a bad option) and none is FAIL.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict

from analytics.errors import StoreError, StoreUnavailable
from analytics.store import checks
from analytics.store.hubclient import HubClient
from collectors.checks.catalog import CATALOG, CheckOptions, chosen
from collectors.checks.result import CheckResult, Status, worst
from collectors.checks.schedule import (
    Post,
    PostFailed,
    Schedule,
    Scheduler,
    nvml_processes_probe,
    slurm_jobs_probe,
)
from collectors.errors import CollectorConfigError
from fleetlens.access import reader
from fleetlens.errors import ConfigError

EXIT_STATUS = {Status.PASS: 0, Status.WARN: 0, Status.FAIL: 1, Status.ERROR: 2}
LIST_COLUMNS = ("started", "node", "check", "target", "status", "value", "unit", "threshold")
DAY_S = 86_400.0


def cmd_checks_run(args: argparse.Namespace) -> int:
    """Run the chosen checks, print each result as a JSON line, post them with --hub; the exit status of
    the module doc."""
    options = CheckOptions(
        node=args.node or socket.gethostname(),
        dcgm_level=args.level,
        peers=_peers(args.peer),
        dev=args.dev or "",
        expected_gbps=args.expected_gbps,
    )
    results = _run(args.checks, options)
    _print_results(results)
    return _posted(results, args.hub, "run")


def cmd_checks_preflight(args: argparse.Namespace) -> int:
    """The `preflight` set at its short sizes; one JSON line: the worst status, how long it took, and the
    FAIL and ERROR results in brief. Posted with --hub; the exit status of the module doc."""
    began = time.monotonic()
    node = args.node or socket.gethostname()
    results = _run("preflight", CheckOptions(node=node, short=True))
    failing = [_brief(result) for result in results if result.status in (Status.FAIL, Status.ERROR)]
    status = _posted(results, args.hub, "preflight")
    summary = {"node": node, "status": worst(results).value, "exit_status": status, "failing": failing}
    print(json.dumps(summary | {"duration_s": round(time.monotonic() - began, 3)}), flush=True)
    return status


def _run(checks: str, options: CheckOptions) -> list[CheckResult]:
    """The results of `checks` (names and sets); a bad name or option is a ConfigError (exit 2)."""
    try:
        return [result for name in chosen(checks) for result in CATALOG[name].run(options)]
    except CollectorConfigError as exc:
        raise ConfigError(str(exc)) from None


def _posted(results: list[CheckResult], hub: str | None, command: str) -> int:
    """The exit status of `results`, after posting them to `hub` where given: 2 (unless 1) when the hub
    did not store them, the reason on stderr."""
    status = EXIT_STATUS[worst(results)]
    if hub and results:
        try:
            HubClient(hub).insert_checks([asdict(result) for result in results])
        except StoreError as exc:
            print(f"fleetlens checks {command}: the results were not stored: {exc}", file=sys.stderr)
            return status if status == EXIT_STATUS[Status.FAIL] else EXIT_STATUS[Status.ERROR]
    return status


def _brief(result: CheckResult) -> dict[str, object]:
    """A result as the pre-flight line names it: what, where, how bad, and why in the check's own words."""
    evidence = result.evidence
    why = evidence.get("reason") or evidence.get("problem") or evidence.get("error") or ""
    fields = ("check", "target", "status", "value", "unit", "threshold")
    return {field: getattr(result, field) for field in fields} | {"why": str(why)[:300]}


def cmd_checks_schedule(args: argparse.Namespace) -> int:
    """Run collectors.checks.schedule's loop on this node until SIGTERM; 0 when stopped so."""
    node = args.node or socket.gethostname()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    probes = [nvml_processes_probe()] + ([] if args.without_slurm else [slurm_jobs_probe(node)])
    try:
        scheduler = Scheduler(
            CheckOptions(node=node),
            Schedule(args.interval, args.jitter, args.heavy_every, args.force, args.max_unsent),
            probes,
            post=_hub_post(HubClient(args.hub)) if args.hub else None,
            emit=_print_results,
            wait=stop.wait,
        )
        scheduler.run()
    except CollectorConfigError as exc:
        raise ConfigError(str(exc)) from None
    return 0


def _hub_post(client: HubClient) -> Post:
    """Posts results with `client`; why not when the hub did not store them, to retry when it could not
    be reached."""

    def post(results: list[CheckResult]) -> PostFailed | None:
        try:
            client.insert_checks([asdict(result) for result in results])
        except StoreUnavailable as exc:
            return PostFailed(str(exc), retry=True)
        except StoreError as exc:
            return PostFailed(str(exc), retry=False)
        return None

    return post


def _print_results(results: list[CheckResult]) -> None:
    for result in results:
        print(json.dumps(asdict(result)), flush=True)


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


def _peers(pairs: list[str]) -> dict[str, str]:
    """--peer NAME=ADDR options as name -> address."""
    peers = {}
    for pair in pairs:
        name, equals, address = pair.partition("=")
        if not equals or not name or not address:
            raise ConfigError(f"--peer {pair!r}: expected NAME=ADDR")
        peers[name] = address
    return peers

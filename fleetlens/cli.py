"""The `fleetlens` command: one entry point, one subcommand per job.

Flags override the environment, which overrides the config file (see fleetlens.config).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from alerts.errors import AlertsError
from analytics.detectors import build as build_detectors
from analytics.detectors.runner import DetectionRunner, detect
from analytics.errors import AddressError, AnalyticsError
from analytics.store.hubclient import HubClient
from analytics.store.records import Anomaly
from analytics.store.redact import redacted
from collectors import registry
from collectors.base import CollectorOptions
from collectors.errors import CollectorError
from collectors.exporter import Exporter, make_registry, scrape_body, serve
from collectors.httpserver import serve_app
from collectors.steprecord import read_step_records
from fleetlens import nccl_cli
from fleetlens.access import hub_config, load, open_store, reader
from fleetlens.alerting import build_alert_service
from fleetlens.alerts_cli import add_commands as add_alert_commands
from fleetlens.config import Config, ConfigError, ExporterConfig, load_config
from fleetlens.demo_cli import add_commands as add_demo_commands
from fleetlens.postmortem_cli import add_commands as add_postmortem_commands
from fleetlens.ui_cli import add_commands as add_ui_commands
from hub.app import Hub
from hub.auth import Tokens
from hub.bodies import ReceiverLimits
from hub.detect import DetectionLoop
from hub.errors import HubError, TokenFileError
from hub.otlp import OtlpStepReceiver
from hub.scraper import ScrapeLimits, Scraper, Shard, TargetsFile
from hub.spool import Spool
from hub.writer import Writer
from sim import pipeline
from sim.evaluation import combine, to_json, to_markdown
from sim.fleet import write_file_sd
from sim.live import LiveFleet
from sim.scenario import load_scenario

log = logging.getLogger("fleetlens")

IMPORT_CHUNK = 100_000  # step rows per insert when importing a file into the store


def _exporter_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config file (flags and FLEETLENS_* variables override it)")
    parser.add_argument("--sysfs-root", help="the /sys tree to read (default /sys)")
    parser.add_argument("--gpu-backend", choices=["nvml", "sim", "none"], help="where GPU metrics come from")
    parser.add_argument("--node", help="node name for the Hostname label (default: this host's name)")
    parser.add_argument("--kernel-log", help="kernel log file to follow for NVRM Xid lines (e.g. /dev/kmsg)")
    parser.add_argument("--nccl-logs", help="glob of NCCL_DEBUG=INFO log files to watch for GPUDirect RDMA")
    parser.add_argument("--gpu-sim-seed", type=int, help="seed of the simulated GPU backend")
    parser.add_argument("--gpu-sim-count", type=int, help="number of simulated GPUs")
    parser.add_argument(
        "--netclass-ignored-devices", metavar="REGEX", help="interfaces the netclass collector skips"
    )
    parser.add_argument(
        "--netclass-ignore-invalid-speed",
        action="store_const",
        const=True,
        help="omit speed when it reads -1",
    )
    parser.add_argument(
        "--enable-collector", action="append", dest="enable_collectors", metavar="NAME", help="repeatable"
    )
    parser.add_argument(
        "--disable-collector", action="append", dest="disable_collectors", metavar="NAME", help="repeatable"
    )


def _exporter_config(args: argparse.Namespace, **extra: Any) -> ExporterConfig:
    """The exporter section, with every flag the user gave (argparse dests are the config keys)."""
    flags = {f.name: getattr(args, f.name) for f in fields(ExporterConfig) if hasattr(args, f.name)}
    return load_config(args.config, overrides={"exporter": {**flags, **extra}}).exporter


def build_exporter(config: ExporterConfig) -> Exporter:
    """Wire the enabled collectors with the roots the config names (CollectorOptions keys are config keys).

    A sysfs root that is no directory is refused: the collectors would read nothing and say nothing.
    """
    if not config.sysfs_root.is_dir():
        problem = "is not a directory" if config.sysfs_root.exists() else "does not exist"
        raise ConfigError(f"exporter.sysfs_root (--sysfs-root): {str(config.sysfs_root)!r} {problem}")
    options = CollectorOptions(**{f.name: getattr(config, f.name) for f in fields(CollectorOptions)})
    try:
        names = registry.resolve(config.enable_collectors, config.disable_collectors)
    except ValueError as exc:
        raise ConfigError(f"exporter collectors: {exc}") from None
    return Exporter(registry.build(names, options))


def _serve_until_signal(server: Any, on_stop: Any) -> None:
    """serve_forever until SIGTERM or SIGINT, then `on_stop()`."""

    def stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        on_stop()


def cmd_exporter(args: argparse.Namespace) -> int:
    config = _exporter_config(args, listen=args.listen)
    exporter = build_exporter(config)
    host, port = config.host_port
    server = serve(make_registry(exporter), host, port)
    shown_host = f"[{host}]" if ":" in host else host
    log.info(
        "serving metrics at http://%s:%d/metrics (collectors: %s)",
        shown_host,
        server.server_port,
        ", ".join(item.name for item in exporter.built),
    )
    print(f"fleetlens exporter: metrics at http://{shown_host}:{server.server_port}/metrics", flush=True)
    _serve_until_signal(server, exporter.close)
    return 0


def build_hub(settings: Config, tokens: Tokens) -> Hub:
    """Wire store, spool, writer, receivers, (with a targets file) the scraper of this hub's shard, and
    detection with alerting and draining after each window. The writer, the detection loop and the API
    each have a session of their own on the store, and queries run on read sessions apart from all
    three, so none waits for another's statements."""
    config = settings.hub
    store = open_store(config)
    writer = Writer(store.session(), Spool(config.spool_dir, config.spool_max_bytes))
    limits = ReceiverLimits(config.max_body_bytes, config.max_label_length, config.max_rows_per_request)
    scraper = None
    if config.targets is not None:
        scraper = Scraper(
            TargetsFile(config.targets).current,
            interval_s=config.interval_s,
            timeout_s=config.timeout_s,
            shard=Shard(*config.shard_index_count),
            limits=ScrapeLimits(config.max_body_bytes, config.max_series_per_target, config.max_label_length),
        )
    detection, closing = None, []
    if config.detector_names != []:
        detection_store = store.session()
        alerting = build_alert_service(detection_store, settings.alerts, settings.drain)
        closing.append(alerting.close)
        detection = DetectionLoop(
            DetectionRunner(build_detectors(config.detector_names), config.detect_window_s),
            detection_store,
            window_s=config.detect_window_s,
            lag_s=config.interval_s + config.timeout_s,
            then=alerting.cycle,
        )
    return Hub(
        store,
        writer,
        OtlpStepReceiver(limits),
        scraper,
        detection=detection,
        closing=closing,
        tokens=tokens,
        max_body_bytes=config.max_body_bytes,
        query_max_rows=config.query_max_rows,
        query_max_seconds=config.query_max_seconds,
    )


def cmd_hub(args: argparse.Namespace) -> int:
    settings = load(args)
    config = settings.hub
    try:
        tokens = Tokens.load(os.environ.get("FLEETLENS_API_TOKEN"), config.token_file)
    except TokenFileError as exc:
        raise ConfigError(f"hub.token_file: {exc}") from None
    hub = build_hub(settings, tokens)
    host, port = config.host_port
    server = serve_app(hub.app, host, port)
    hub.start()
    print(
        f"fleetlens hub: API at http://{host}:{server.server_port} (store {redacted(config.store)})",
        flush=True,
    )
    if not tokens.configured:
        log.warning(
            "no API token (FLEETLENS_API_TOKEN or hub.token_file): the API answers loopback clients only"
        )
    _serve_until_signal(server, hub.close)
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    source = reader(args)
    try:
        result = source.query(args.sql, max_rows=args.max_rows)
    finally:
        if not args.hub:
            source.close()
    if args.json:
        rows = [dict(zip(result.columns, row, strict=True)) for row in result.rows]
        print(json.dumps(rows, default=str))
    else:
        print("\t".join(result.columns))
        for row in result.rows:
            print("\t".join(str(value) for value in row))
    if result.truncated:
        print(f"fleetlens: result cut at {args.max_rows} rows", file=sys.stderr)
    return 0


def cmd_steps_import(args: argparse.Namespace) -> int:
    """Import a finished job's step JSON lines: all or nothing, named line on the first bad record."""
    body = Path(args.file).read_bytes()
    if args.hub:
        count = HubClient(args.hub).import_steps(body)
    else:
        rows = list(read_step_records(args.file))  # all checked before any insert
        digest = hashlib.sha256(body).hexdigest()  # importing the same file twice stores it once
        store = open_store(hub_config(args))
        try:
            count = sum(
                store.insert_steps(rows[start : start + IMPORT_CHUNK], token=f"{digest}:{start}")
                for start in range(0, len(rows), IMPORT_CHUNK)
            )
        finally:
            store.close()
    print(f"imported {count} step records from {args.file}")
    return 0


def cmd_sim_run(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
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
    """Serve the scenario's nodes on loopback in real time until SIGTERM or SIGINT."""
    scenario = load_scenario(args.scenario)
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
        write_file_sd(Path(args.file_sd), fleet.targets)
        print(
            f"fleetlens sim: {len(fleet.targets)} nodes of {scenario.name} on loopback, targets in "
            f"{args.file_sd}, scenario time 0 at {datetime.fromtimestamp(epoch, UTC):%H:%M:%S} UTC",
            flush=True,
        )
        if args.hub:
            fleet.post_steps_until(stop, urlsplit(args.hub).netloc)
        else:
            stop.wait()
    return 0


def _anomaly_json(anomaly: Anomaly) -> dict[str, Any]:
    """An anomaly with ISO 8601 UTC times and its evidence as an object."""
    row = asdict(anomaly)
    for key in ("start", "end"):
        if row[key] is not None:
            row[key] = datetime.fromtimestamp(row[key], UTC).isoformat(timespec="milliseconds")
    row["evidence"] = json.loads(anomaly.evidence)
    return row


def cmd_detect(args: argparse.Namespace) -> int:
    source = reader(args)
    try:
        anomalies = detect(source, args.start, args.end, names=args.detectors, window_s=args.window_s)
    finally:
        if not args.hub:
            source.close()
    if args.json:
        print(json.dumps([_anomaly_json(anomaly) for anomaly in anomalies]))
        return 0
    print("start\tend\tkind\tnode\tcomponent\tjob\tseverity\tscore\tdetector")
    for row in map(_anomaly_json, anomalies):
        print(
            "\t".join(
                str(row[key] or "")
                for key in (
                    "start",
                    "end",
                    "kind",
                    "node",
                    "component",
                    "job",
                    "severity",
                    "score",
                    "detector",
                )
            )
        )
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    suite = combine(pipeline.evaluate_files([Path(p) for p in args.scenarios], workers=args.workers))
    print(to_markdown(suite))
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(suite), indent=1) + "\n")
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    exporter = build_exporter(_exporter_config(args))
    try:
        accept = "application/openmetrics-text" if args.openmetrics else ""
        body, _ = scrape_body(make_registry(exporter, process_metrics=False), accept)
    finally:
        exporter.close()
    sys.stdout.write(body.decode())
    return 0


def cmd_collectors(args: argparse.Namespace) -> int:
    for name, reg in registry.registrations().items():
        print(f"{name:12} {'enabled' if reg.default_enabled else 'disabled'} by default")
    return 0


def cmd_nccl(args: argparse.Namespace) -> int:
    return nccl_cli.main(args.files)


def _hub_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config file (flags and FLEETLENS_* variables override it)")
    parser.add_argument(
        "--store", help="chdb://DIR (embedded, default chdb://./data) or http(s)://host:8123/db"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetlens", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True)

    exporter = sub.add_parser("exporter", help="serve this VM's GPU, RoCE and link metrics over HTTP")
    exporter.add_argument("--listen", help="HOST:PORT to serve /metrics on (default 0.0.0.0:9400)")
    _exporter_flags(exporter)
    exporter.set_defaults(func=cmd_exporter)

    collect = sub.add_parser("collect", help="print one scrape to stdout and exit")
    collect.add_argument("--once", action="store_true", help="one scrape (the only mode; kept for clarity)")
    collect.add_argument("--openmetrics", action="store_true", help="OpenMetrics instead of Prometheus text")
    _exporter_flags(collect)
    collect.set_defaults(func=cmd_collect)

    collectors = sub.add_parser("collectors", help="list the collectors and whether they run by default")
    collectors.set_defaults(func=cmd_collectors)

    hub = sub.add_parser("hub", help="scrape the fleet, receive step times, store everything in ClickHouse")
    _hub_flags(hub)
    hub.add_argument("--targets", help="Prometheus file_sd JSON of the exporters to scrape")
    hub.add_argument("--listen", help="HOST:PORT of the hub's API (default 127.0.0.1:9500)")
    hub.add_argument("--shard", help="i/n: scrape only the targets whose hash falls in shard i of n")
    hub.add_argument("--cluster", help="ClickHouse cluster name: Replicated and Distributed tables")
    hub.add_argument("--interval-s", type=float, dest="interval_s", help="scrape interval, 1 to 60 s")
    hub.add_argument("--detectors", help='detectors to run on each window: "all" (default), "none" or names')
    hub.add_argument("--detect-window-s", type=float, dest="detect_window_s", help="detection window (10 s)")
    hub.add_argument(
        "--token-file", dest="token_file", help='scoped API tokens, lines of "read,write,act <token>"'
    )
    hub.set_defaults(func=cmd_hub)

    query = sub.add_parser("query", help="read-only SQL on the store, through a hub or directly")
    _hub_flags(query)
    query.add_argument("sql")
    query.add_argument("--hub", help="hub URL (needed while a hub holds the embedded store)")
    query.add_argument("--max-rows", type=int, default=10_000)
    query.add_argument("--json", action="store_true", help="a JSON array of row objects")
    query.set_defaults(func=cmd_query)

    steps = sub.add_parser("steps", help="training step records")
    steps_sub = steps.add_subparsers(dest="steps_command", required=True)
    steps_import = steps_sub.add_parser("import", help="import a step JSON-lines file into the store")
    _hub_flags(steps_import)
    steps_import.add_argument("file")
    steps_import.add_argument("--hub", help="send to this hub instead of opening the store")
    steps_import.set_defaults(func=cmd_steps_import)

    sim = sub.add_parser("sim", help="the fleet simulator")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True)
    sim_run = sim_sub.add_parser(
        "run", help="play a scenario through the collectors and the hub into a store"
    )
    _hub_flags(sim_run)
    sim_run.add_argument("scenario", help="scenario YAML (format in the README)")
    sim_run.add_argument("--speed", type=float, default=1.0, help="simulated seconds per real second")
    sim_run.add_argument("--offline", action="store_true", help="write the rows straight into the store")
    sim_run.set_defaults(func=cmd_sim_run)
    sim_serve = sim_sub.add_parser(
        "serve", help="serve a scenario's nodes on loopback in real time for a hub to scrape"
    )
    sim_serve.add_argument("scenario", help="scenario YAML (format in the README)")
    sim_serve.add_argument("--file-sd", required=True, help="write the nodes' targets here (file_sd JSON)")
    sim_serve.add_argument("--hub", help="hub URL to send the simulated jobs' step records to")
    sim_serve.add_argument("--epoch", type=pipeline.time_argument, help="scenario time 0 (default: now)")
    sim_serve.add_argument("--until", type=float, help="leave out faults and confounders starting later (s)")
    sim_serve.add_argument("--workdir", help="where the /sys trees go (default: a new directory on tmpfs)")
    sim_serve.set_defaults(func=cmd_sim_serve)

    detect_cmd = sub.add_parser("detect", help="run the detectors once over a time range and print anomalies")
    _hub_flags(detect_cmd)
    detect_cmd.add_argument("--hub", help="hub URL (needed while a hub holds the embedded store)")
    for flag, dest, default in (("--from", "start", "oldest"), ("--to", "end", "newest")):
        detect_cmd.add_argument(
            flag,
            dest=dest,
            type=pipeline.time_argument,
            help=f"unix seconds or ISO 8601 (default: the {default} data)",
        )
    detect_cmd.add_argument(
        "--detector", dest="detectors", action="append", help="only this one (repeatable)"
    )
    detect_cmd.add_argument("--window-s", type=float, default=pipeline.DEFAULT_WINDOW_S)
    detect_cmd.add_argument("--json", action="store_true", help="a JSON array of anomaly objects")
    detect_cmd.set_defaults(func=cmd_detect)

    eval_cmd = sub.add_parser(
        "eval", help="simulate scenarios, run the detectors, score them against the faults"
    )
    eval_cmd.add_argument("scenarios", nargs="+", metavar="SCENARIO", help="scenario YAML files")
    eval_cmd.add_argument("--json", help="also write the full results (every miss and false report) here")
    eval_cmd.add_argument("--workers", type=int, default=2, help="scenarios evaluated at once (default 2)")
    eval_cmd.set_defaults(func=cmd_eval)

    nccl = sub.add_parser("nccl", help="per-rank GPUDirect RDMA verdict and proof from NCCL_DEBUG=INFO logs")
    nccl.add_argument("files", nargs="+", metavar="FILE", help="NCCL_DEBUG=INFO log files")
    nccl.set_defaults(func=cmd_nccl)
    add_alert_commands(sub, _hub_flags)
    add_postmortem_commands(sub, _hub_flags)
    add_ui_commands(sub, _hub_flags)
    add_demo_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=args.log_level.upper(), format=log_format, stream=sys.stderr)
    try:
        return args.func(args)
    except (ConfigError, AddressError) as exc:
        print(f"fleetlens: configuration error: {exc}", file=sys.stderr)
        return 2
    except (AnalyticsError, AlertsError, CollectorError, HubError, OSError) as exc:
        print(f"fleetlens: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

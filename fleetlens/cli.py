"""The `fleetlens` command: one entry point, one subcommand per job.

Flags override the environment, which overrides the config file (see fleetlens.config).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from collectors import nccl_log, registry
from collectors.base import CollectorOptions
from collectors.exporter import Exporter, make_registry, scrape_body, serve
from fleetlens.config import ConfigError, ExporterConfig, load_config

log = logging.getLogger("fleetlens")


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
    """Wire the enabled collectors with the roots the config names (CollectorOptions keys are config keys)."""
    options = CollectorOptions(**{f.name: getattr(config, f.name) for f in fields(CollectorOptions)})
    try:
        names = registry.resolve(config.enable_collectors, config.disable_collectors)
    except ValueError as exc:
        raise ConfigError(f"exporter collectors: {exc}") from None
    return Exporter(registry.build(names, options))


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

    def stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        exporter.close()
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
    return nccl_log.main(args.files)


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

    nccl = sub.add_parser("nccl", help="per-rank GPUDirect RDMA verdict and proof from NCCL_DEBUG=INFO logs")
    nccl.add_argument("files", nargs="+", metavar="FILE", help="NCCL_DEBUG=INFO log files")
    nccl.set_defaults(func=cmd_nccl)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=args.log_level.upper(), format=log_format, stream=sys.stderr)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"fleetlens: configuration error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""`fleetlens exporter`, `collect` and `collectors`: what runs on a VM. Imports collectors/ only, so a base
install (no hub extra) runs it."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields
from typing import Any

from collectors import registry
from collectors.base import CollectorOptions
from collectors.errors import CollectorConfigError
from collectors.exporter import Exporter, make_registry, scrape_body, serve
from fleetlens.config import ExporterConfig, load_exporter_config
from fleetlens.errors import ConfigError
from fleetlens.serving import scheme, serve_until_signal, web_config

log = logging.getLogger("fleetlens")


def _exporter_config(args: argparse.Namespace, **extra: Any) -> ExporterConfig:
    """The exporter section, with every flag the user gave (argparse dests are the config keys)."""
    flags = {f.name: getattr(args, f.name) for f in fields(ExporterConfig) if hasattr(args, f.name)}
    return load_exporter_config(args.config, overrides={**flags, **extra})


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
    except CollectorConfigError as exc:
        raise ConfigError(f"exporter collectors: {exc}") from None
    return Exporter(registry.build(names, options))


def cmd_exporter(args: argparse.Namespace) -> int:
    config = _exporter_config(args, listen=args.listen)
    web = web_config(config.web_config_file, "exporter.web_config_file")
    exporter = build_exporter(config)
    host, port = config.host_port
    server = serve(make_registry(exporter), host, port, config.web_max_requests, web=web)
    shown_host = f"[{host}]" if ":" in host else host
    served_as = scheme(web)
    log.info(
        "serving metrics at %s://%s:%d/metrics (collectors: %s)",
        served_as,
        shown_host,
        server.server_port,
        ", ".join(item.name for item in exporter.built),
    )
    print(
        f"fleetlens exporter: metrics at {served_as}://{shown_host}:{server.server_port}/metrics",
        flush=True,
    )
    serve_until_signal(server, exporter.close)
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

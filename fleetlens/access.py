"""How commands reach the store: directly (--store, or the config's) or through a hub's API (--hub),
which is the only way to an embedded store while its hub runs."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from analytics.store import Store
from analytics.store.hubclient import HubClient
from analytics.store.schema import Retention
from fleetlens.config import Config, HubConfig, load_config


def retention(config: HubConfig) -> Retention:
    """How long the store keeps each kind of row: what its TTLs say and what its doors refuse past."""
    return Retention(
        raw_days=config.raw_retention_days,
        rollup_days=config.rollup_retention_days,
        steps_days=config.steps_retention_days,
        targets_days=config.targets_retention_days,
    )


def open_store(config: HubConfig) -> Store:
    return Store.open(config.store, cluster=config.cluster, retention=retention(config))


def load(args: argparse.Namespace) -> Config:
    """The whole config, the hub section overridden by this command's flags."""
    flags = {f.name: getattr(args, f.name) for f in fields(HubConfig) if hasattr(args, f.name)}
    return load_config(args.config, overrides={"hub": flags})


def hub_config(args: argparse.Namespace) -> HubConfig:
    return load(args).hub


def reader(args: argparse.Namespace) -> Any:
    """Where to read from: a hub's API (--hub) or the store itself (--store, else the config's)."""
    if args.hub:
        return HubClient(args.hub)
    return open_store(hub_config(args))

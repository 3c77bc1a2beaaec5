"""Prometheus text exposition in tests: parse it into comparable samples, render ours, scrape node_exporter's.

Samples are keyed by (sample name, frozenset of label pairs), so two scrapes compare with `==` whatever
order their labels and lines come in.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from collectors.base import Collector
from collectors.exporter import scrape_body
from tests.support.peers import node_exporter, peer

SampleKey = tuple[str, frozenset[tuple[str, str]]]


@dataclass(frozen=True)
class Family:
    """One metric family as exposed: type, help and its samples."""

    type: str
    help: str
    samples: dict[SampleKey, float]


def key(name: str, **labels: str) -> SampleKey:
    """The key of one sample: key("node_network_up", device="eth0")."""
    return name, frozenset(labels.items())


def parse_families(text: str) -> dict[str, Family]:
    """Families by name as the text parser names them (a counter's without its _total suffix)."""
    return {
        family.name: Family(
            family.type,
            family.documentation,
            {(s.name, frozenset(s.labels.items())): s.value for s in family.samples},
        )
        for family in text_string_to_metric_families(text)
    }


def parse_samples(text: str) -> dict[SampleKey, float]:
    """Every sample in the text: {(name, frozenset(labels)): value}."""
    return merged(parse_families(text).values())


def merged(families: Iterable[Family]) -> dict[SampleKey, float]:
    """The samples of all `families` in one mapping."""
    return {k: v for family in families for k, v in family.samples.items()}


def render(*collectors: Collector) -> str:
    """The text exposition of our collectors, as the exporter serves it."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return scrape_body(registry)[0].decode()


def samples_of(collector: Collector) -> dict[str, list[Sample]]:
    """One scrape, as {sample name: samples}."""
    found: dict[str, list[Sample]] = {}
    for family in collector.collect():
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def scrape(url: str) -> str:
    """One GET of a /metrics URL."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def node_exporter_exposition(sysfs_root: Path, *flags: str) -> str:
    """One scrape of the real node_exporter (infiniband and netclass only) run on `sysfs_root`, then stopped.

    Skips the test when the binary is not installed.
    """
    args, url = node_exporter(sysfs_root, *flags)
    with peer(args, url):
        return scrape(url)

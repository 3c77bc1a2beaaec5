"""The targets a hub scrapes: file_sd groups of "host:port" exporters, and this hub's shard of them.

A targets file (Prometheus file_sd: JSON, or YAML by its suffix) is re-read whenever it changes. Its
first read must succeed, so that a hub with a broken file does not start; after that a broken or
missing file keeps the last good targets and logs, once per change, what is wrong (ScraperConfigError
names the file, group and key).

`Shard(i, n)` keeps the targets whose crc32("host:port") modulo n is i: stable across processes and
hosts, so n hubs split a fleet exactly.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from hub.errors import ScraperConfigError

log = logging.getLogger("fleetlens.scraper")


@dataclass(frozen=True)
class Target:
    """One exporter: its "host:port" and the labels its file_sd group gave it."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def node(self) -> str:
        """The fleet node the target belongs to: its `node` label, else its host."""
        return self.labels.get("node") or urlsplit(f"//{self.address}").hostname or self.address

    @property
    def sample_labels(self) -> dict[str, str]:
        """Labels added to every sample: all but `node` (a column of its own) and reserved `__*` ones."""
        return {k: v for k, v in self.labels.items() if k != "node" and not k.startswith("__")}


@dataclass(frozen=True)
class Shard:
    """Which part of the fleet this hub scrapes: targets whose crc32(address) % count == index."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ScraperConfigError(f"shard {self.index}/{self.count}: want 0 <= i < n")

    def owns(self, target: Target) -> bool:
        return zlib.crc32(target.address.encode()) % self.count == self.index


def parse_targets(groups: object, source: str) -> list[Target]:
    """Targets from file_sd content: `[{"targets": ["host:port", ...], "labels": {...}}, ...]`.

    A target listed twice is scraped once, with its first group's labels.
    """
    if not isinstance(groups, list):
        raise ScraperConfigError(f"{source}: want a list of target groups, got {type(groups).__name__}")
    found: dict[str, Target] = {}
    for i, group in enumerate(groups):
        where = f"{source}: group {i}"
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise ScraperConfigError(f'{where}: want {{"targets": [...], "labels": {{...}}}}')
        unknown = sorted(set(group) - {"targets", "labels"})
        if unknown:
            raise ScraperConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise ScraperConfigError(f"{where}: labels must map strings to strings")
        for address in group["targets"]:
            _check_address(address, where)
            found.setdefault(address, Target(address, labels))
    return list(found.values())


def _check_address(address: object, where: str) -> None:
    if not isinstance(address, str):
        raise ScraperConfigError(f"{where}: target {address!r} is not a string")
    try:
        parts = urlsplit(f"//{address}")
        valid = parts.hostname and parts.port and parts.netloc == address
    except ValueError:
        valid = False
    if not valid:
        raise ScraperConfigError(f"{where}: target {address!r} is not host:port")


def file_signature(path: Path) -> tuple[int, int, int] | None:
    """The inode, size and mtime of `path` (None when it cannot be read): what tells a file changed."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class TargetsFile:
    """A file_sd file (JSON, or YAML by its .yml/.yaml suffix), re-read whenever it changes.

    The first read must succeed (a hub with a broken targets file should not start). After that a
    broken or missing file keeps the last good targets and logs, once per change, what is wrong.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._signature = file_signature(self.path)
        self._targets = self._load()

    def current(self) -> list[Target]:
        """The targets, re-read if the file's inode, size or mtime changed since the last call."""
        signature = file_signature(self.path)
        if signature != self._signature:
            self._signature = signature
            try:
                self._targets = self._load()
                log.info("targets file %s: %d targets", self.path, len(self._targets))
            except ScraperConfigError as exc:
                log.error("%s; keeping the last good list of %d targets", exc, len(self._targets))
        return self._targets

    def _load(self) -> list[Target]:
        try:
            text = self.path.read_text()
            groups = yaml.safe_load(text) if self.path.suffix in (".yml", ".yaml") else json.loads(text)
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
            raise ScraperConfigError(f"targets file {self.path}: {exc}") from None
        return parse_targets(groups, f"targets file {self.path}")

"""The operator's inventory file (`hub.topology_file`), re-read whenever it changes, like a targets file.

Its first read must succeed (a hub with a broken inventory does not start). After that the hub checks the
file every POLL_S seconds; a changed file that parses replaces the inventory's links in the store
(Store.replace_links: what it no longer says ends now, what is new starts now); a broken or missing one
keeps the last good links and logs, once per change, what is wrong (TopologyError names the file, line
and key). Links the store could not take are written again on the next check.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analytics.errors import StoreError, TopologyError
from analytics.topology import inventory
from analytics.topology.model import Link, Source
from hub.targets import file_signature

log = logging.getLogger("fleetlens.topology")

POLL_S = 5.0


class InventoryFile:
    """The inventory at `path`, its links kept in `store` as the inventory source's."""

    def __init__(self, path: Path | str, store: Any, wall_clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self._store = store
        self._wall_clock = wall_clock
        self._signature = file_signature(self.path)
        self._unstored: list[Link] | None = inventory.read(self.path)  # TopologyError: the hub won't start

    def check(self) -> None:
        """Re-read the file if it changed since the last check, and store what it says if not stored yet."""
        signature = file_signature(self.path)
        if signature != self._signature:
            self._signature = signature
            try:
                self._unstored = inventory.read(self.path)
            except TopologyError as exc:
                log.error("%s; keeping the inventory's last good links", exc)
        if self._unstored is None:
            return
        try:
            changes = self._store.replace_links(Source.INVENTORY, self._unstored, self._wall_clock())
        except StoreError as exc:
            log.warning("storing the links of %s failed (retried in %.0f s): %s", self.path, POLL_S, exc)
            return
        log.info("inventory file %s: %d links (%s)", self.path, len(self._unstored), changes)
        self._unstored = None

    def run(self, stop: threading.Event) -> None:
        """check() now and every POLL_S seconds until `stop` is set."""
        while True:
            self.check()
            if stop.wait(POLL_S):
                return

"""Scraped rounds on their way to the store: one insert thread, rounds coalesced when it falls behind.

The scrape loop never waits for the store: it hands each round to `put` and goes on. One thread writes
the rounds in order. When the store took longer than an interval, every round that queued meanwhile
goes in with the next insert: an insert into chDB has a fixed cost of tens of milliseconds, so a store
that fell behind catches up with bigger inserts instead of falling further behind. Past `max_rounds`
waiting rounds (a store that is down, not just slow) a round goes to `defer` (the spool) instead, so the
memory held stays bounded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from analytics.store.records import ScrapeBatch, TargetStatus

log = logging.getLogger("fleetlens.hub")

MAX_PENDING_ROUNDS = 10  # rounds that may wait for the insert thread; later ones are deferred

RoundSink = Callable[[list[ScrapeBatch], list[TargetStatus]], None]


class RoundQueue:
    """Rounds waiting for `write`, written by a thread of their own; `deferred` counts those past
    `max_rounds` given to `defer`, `coalesced` those written together with an earlier one."""

    def __init__(self, write: RoundSink, defer: RoundSink, *, max_rounds: int = MAX_PENDING_ROUNDS) -> None:
        self.max_rounds = max_rounds
        self.deferred = 0
        self.coalesced = 0
        self._write = write
        self._defer = defer
        self._rounds: list[tuple[list[ScrapeBatch], list[TargetStatus]]] = []
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._write_until_closed, name="fleetlens-insert", daemon=True)
        self._thread.start()

    def put(self, batches: list[ScrapeBatch], statuses: list[TargetStatus]) -> None:
        """Queue a round for the insert thread, or defer it when `max_rounds` already wait."""
        with self._ready:
            if len(self._rounds) < self.max_rounds and not self._closed:
                self._rounds.append((batches, statuses))
                self._ready.notify()
                return
            self.deferred += 1
        self._defer(batches, statuses)

    def close(self) -> None:
        """Write what is queued, then stop the insert thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def _write_until_closed(self) -> None:
        while True:
            with self._ready:
                while not self._rounds and not self._closed:
                    self._ready.wait()
                if not self._rounds:
                    return
                rounds, self._rounds = self._rounds, []
                self.coalesced += len(rounds) - 1
            try:
                self._write(
                    [batch for batches, _ in rounds for batch in batches],
                    [status for _, statuses in rounds for status in statuses],
                )
            except Exception:
                log.exception("writing %d scraped round(s) failed; their batches are lost", len(rounds))

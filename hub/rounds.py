"""Scraped rounds on their way to the store: one insert thread, rounds coalesced when it falls behind.

The scrape loop never waits for the store: it hands each round to `put` and goes on. One thread writes
the rounds in order. When the store took longer than an interval, every round that queued meanwhile
goes in with the next insert: an insert into chDB has a fixed cost of tens of milliseconds, so a store
that fell behind catches up with bigger inserts instead of falling further behind. Past `max_rounds`
waiting rounds (a store that is down, not just slow) a round goes to `defer` (the spool) instead, so the
memory held stays bounded.

A round's target statuses (one row per scrape) are held and written with a later round's samples, those
of every round of up to `hold_s` seconds (TARGETS_HOLD_S) in one insert: their insert's fixed cost was
0.12-0.2 us of CPU per scraped sample at 192 nodes scraped every second, paid for a row per target.
Their readers can wait that long: the fleet page calls a node down after minutes without a scrape
(analytics.reports.dashboards.DOWN_AFTER_S), postmortems read past windows and no detector reads them.
Statuses held that long are written even when no round comes (a long interval), and all of them at close.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from analytics.store.records import ScrapeBatch, TargetStatus

log = logging.getLogger("fleetlens.hub")

MAX_PENDING_ROUNDS = 10  # rounds that may wait for the insert thread; later ones are deferred
TARGETS_HOLD_S = 5.0  # the longest a round's target statuses wait to go in with later rounds'

RoundSink = Callable[[list[ScrapeBatch], list[TargetStatus]], None]


class RoundQueue:
    """Rounds waiting for `write`, written by a thread of their own; `deferred` counts those past
    `max_rounds` given to `defer`, `coalesced` those written together with an earlier one. Target
    statuses are written at most `hold_s` seconds after their round was queued, often with later ones'."""

    def __init__(
        self,
        write: RoundSink,
        defer: RoundSink,
        *,
        max_rounds: int = MAX_PENDING_ROUNDS,
        hold_s: float = TARGETS_HOLD_S,
    ) -> None:
        self.max_rounds = max_rounds
        self.hold_s = hold_s
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
        """Write what is queued and the statuses held, then stop the insert thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def _write_until_closed(self) -> None:
        held: list[TargetStatus] = []
        due = 0.0  # when the oldest of the held statuses must be written (time.monotonic)
        while True:
            with self._ready:
                while not (self._rounds or self._closed or (held and time.monotonic() >= due)):
                    self._ready.wait(due - time.monotonic() if held else None)
                rounds, self._rounds = self._rounds, []
                closed = self._closed
                self.coalesced += max(0, len(rounds) - 1)
            if not held:
                due = time.monotonic() + self.hold_s
            held += [status for _, statuses in rounds for status in statuses]
            batches = [batch for batches, _ in rounds for batch in batches]
            statuses = held if closed or time.monotonic() >= due else []
            if statuses:
                held = []
            try:
                if batches or statuses:
                    self._write(batches, statuses)
            except Exception:
                log.exception(
                    "writing %d scraped batches and %d target statuses failed; they are lost",
                    len(batches),
                    len(statuses),
                )
            if closed and not rounds:
                return

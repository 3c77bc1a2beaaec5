"""Scraped rounds on their way to the store: one insert thread, rounds coalesced when it falls behind.

    rounds = RoundQueue(writer, RoundJournal(spool_dir / JOURNAL_DIR, store.stored_scrapes))
    scraper.run(stop, rounds.put)         # the scraper's sink: never waits for the store

One thread writes the rounds in order. When the store took longer than an interval, every round that
queued meanwhile goes in with the next insert, so a store that fell behind catches up with bigger
inserts (each has a fixed cost) instead of falling further behind. Past `max_rounds` waiting rounds (a
store that is down, not just slow) a round goes to the spool instead, its samples and statuses in one
file, so the memory held stays bounded.

A round's target statuses (one row per scrape) are held and written with later rounds', those of up to
`hold_s` seconds (TARGETS_HOLD_S) in one insert, which saves an insert per round; their readers wait
minutes before calling a node down. Held statuses are written even when no round comes, and at close.

Failure policy: a round's samples and its statuses are stored together or not at all, even if the hub
dies while it holds them. Before a write's samples go to the store, its statuses are written durably to
a journal file (RoundJournal: `rounds/` in the spool directory), deleted once they are written (stored
or spooled). A hub that starts and finds files left resolves them against the store: statuses whose
samples are stored are written (a repeat is dropped by the store), the others dropped with their
samples. A journal the disk refuses is logged and the round written all the same; a failed write is
logged and its statuses left to the journal.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import astuple
from pathlib import Path
from typing import Protocol

from analytics.errors import StoreError
from analytics.store.records import ScrapeBatch, TargetStatus
from hub.spool import write_durably
from hub.writer import Written

log = logging.getLogger("fleetlens.hub")

MAX_PENDING_ROUNDS = 10  # rounds that may wait for the insert thread; later ones are deferred
TARGETS_HOLD_S = 5.0  # the longest a round's target statuses wait to go in with later rounds'
JOURNAL_DIR = "rounds"  # the journal's directory, in the spool directory
_JOURNAL_NAME = re.compile(r"(\d{20})\.round")

# statuses -> the (node, ts in ms) of those whose scrape has samples stored (Store.stored_scrapes)
StoredScrapes = Callable[[Sequence[TargetStatus]], set[tuple[str, int]]]


class RoundWriter(Protocol):
    """What the insert thread writes through (hub.writer.Writer)."""

    def write_round(
        self,
        batches: Sequence[ScrapeBatch],
        statuses: Sequence[TargetStatus],
        *,
        token: str | None = None,
        hold: bool = False,
    ) -> Written: ...

    def defer_round(self, batches: Sequence[ScrapeBatch], statuses: Sequence[TargetStatus]) -> None: ...


class RoundJournal:
    """Target statuses whose samples may be in the store while they are not: one file per write in
    `directory`, `<sequence>.round` (JSON: each status's fields in dataclass order), written durably
    (hub.spool.write_durably) before the write's samples are inserted, deleted once the statuses are
    written. `stored_scrapes` asks the store which scrapes have samples (Store.stored_scrapes)."""

    def __init__(self, directory: str | Path, stored_scrapes: StoredScrapes) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._stored_scrapes = stored_scrapes
        self.left: list[Path] = []  # files an earlier run left (or a failed write), for resolve()
        last = 0
        for path in sorted(self.directory.iterdir()):
            if match := _JOURNAL_NAME.fullmatch(path.name):
                self.left.append(path)
                last = max(last, int(match[1]))
            elif path.name.endswith(".round.tmp"):  # torn by a crash before its samples were inserted
                path.unlink(missing_ok=True)
        self._next = last + 1

    def record(self, statuses: Sequence[TargetStatus]) -> Path:
        """Write `statuses` to a new file, durably; OSError when it cannot be."""
        path = self.directory / f"{self._next:020d}.round"
        self._next += 1
        write_durably(path, json.dumps([astuple(status) for status in statuses]).encode())
        return path

    def settle(self, paths: Sequence[Path]) -> None:
        """Delete the files of statuses now written (stored or spooled)."""
        for path in paths:
            path.unlink(missing_ok=True)

    def resolve(self, writer: RoundWriter) -> None:
        """Write the statuses of the files left whose samples are stored, drop the others, delete the
        files. A file's statuses of failed or empty scrapes go with the file's samples: written when
        some of them are stored or it had none. StoreError (from the store's lookup) leaves them all."""
        if not self.left:
            return
        files = [(path, _read_statuses(path)) for path in self.left]
        sampled = [status for _, statuses in files for status in statuses if status.samples > 0]
        stored = self._stored_scrapes(sampled) if sampled else set()
        kept: list[TargetStatus] = []
        for _, statuses in files:
            scraped = [_scrape(status) for status in statuses if status.samples > 0]
            if scraped and not stored.intersection(scraped):
                continue
            kept += [status for status in statuses if status.samples == 0 or _scrape(status) in stored]
        # named by what it holds, not by the files' names, which a later run numbers again from 1: the
        # same token for other rows would have the store drop them as a replay
        content = json.dumps([astuple(status) for status in kept]).encode()
        token = "round-journal-" + hashlib.sha256(content).hexdigest()[:32]
        writer.write_round([], kept, token=token)
        self.settle([path for path, _ in files])
        total = sum(len(statuses) for _, statuses in files)
        log.warning(
            "%d scrape rows were left in the journal (by a hub that stopped without writing them, or a "
            "failed write): %d written (their samples are stored), %d dropped (their samples are not)",
            total,
            len(kept),
            total - len(kept),
        )
        self.left = []


def _scrape(status: TargetStatus) -> tuple[str, int]:
    return status.node, round(status.ts * 1000)


def _read_statuses(path: Path) -> list[TargetStatus]:
    """The statuses of a journal file; none (and a warning) when it cannot be read."""
    try:
        return [TargetStatus(*fields) for fields in json.loads(path.read_bytes())]
    except (OSError, ValueError, TypeError) as error:
        log.warning("journal file %s cannot be read (%s); its scrape rows are lost", path, error)
        return []


class RoundQueue:
    """Rounds waiting for `writer`, written by a thread of their own: the scraper's sink (`put`).

    Counters for the hub's metrics: `scrapes` (target statuses put), `failed_scrapes` (those of a target
    that did not answer with a body) and `samples` (samples put),
    `deferred` (rounds past `max_rounds` given to the writer's spool), `coalesced` (rounds written
    together with an earlier one). Target statuses are written at most `hold_s` seconds after their round
    was queued, often with later ones', and journaled meanwhile in `journal` (none: a crash loses those
    held)."""

    def __init__(
        self,
        writer: RoundWriter,
        journal: RoundJournal | None = None,
        *,
        max_rounds: int = MAX_PENDING_ROUNDS,
        hold_s: float = TARGETS_HOLD_S,
    ) -> None:
        self.max_rounds = max_rounds
        self.hold_s = hold_s
        self.scrapes = 0
        self.failed_scrapes = 0
        self.samples = 0
        self.deferred = 0
        self.coalesced = 0
        self._writer = writer
        self._journal = journal
        self._rounds: list[tuple[list[ScrapeBatch], list[TargetStatus]]] = []
        self._ready = threading.Condition()
        self._closed = False
        self._waiting = False  # for the store, to resolve what the journal was left with
        self._resolve_left()
        self._thread = threading.Thread(target=self._write_until_closed, name="fleetlens-insert", daemon=True)
        self._thread.start()

    def put(self, batches: list[ScrapeBatch], statuses: list[TargetStatus]) -> None:
        """Queue a round for the insert thread, or defer it when `max_rounds` already wait."""
        with self._ready:
            self.scrapes += len(statuses)
            self.failed_scrapes += sum(not status.up for status in statuses)
            self.samples += sum(len(batch) for batch in batches)
            if len(self._rounds) < self.max_rounds and not self._closed:
                self._rounds.append((batches, statuses))
                self._ready.notify()
                return
            self.deferred += 1
        self._writer.defer_round(batches, statuses)

    def close(self) -> None:
        """Write what is queued and the statuses held, then stop the insert thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def _resolve_left(self) -> None:
        """Resolve the journal files an earlier run left; a store that cannot say now is asked again at
        the next write."""
        if self._journal is None or not self._journal.left:
            return
        try:
            self._journal.resolve(self._writer)
        except StoreError as error:
            level = logging.DEBUG if self._waiting else logging.WARNING
            log.log(level, "the scrape rows an earlier run left wait for the store: %s", error)
            self._waiting = True

    def _write_until_closed(self) -> None:
        held: list[TargetStatus] = []
        journaled: list[Path] = []
        due = 0.0  # when the oldest of the held statuses must be written (time.monotonic)
        while True:
            with self._ready:
                while not (self._rounds or self._closed or (held and time.monotonic() >= due)):
                    self._ready.wait(due - time.monotonic() if held else None)
                rounds, self._rounds = self._rounds, []
                closed = self._closed
                self.coalesced += max(0, len(rounds) - 1)
            self._resolve_left()
            if not held:
                due = time.monotonic() + self.hold_s
            new = [status for _, statuses in rounds for status in statuses]
            batches = [batch for batches, _ in rounds for batch in batches]
            try:
                if new and self._journal is not None:
                    journaled += _recorded(self._journal, new)
                if self._writer.write_round(batches, new, hold=True) is Written.STORED:
                    held += new
                elif held:  # the new statuses went with their samples; the held ones' samples are stored
                    due = 0.0
                if held and (closed or time.monotonic() >= due):
                    self._writer.write_round([], held)
                    held = []
                if not held and self._journal is not None:
                    self._journal.settle(journaled)
                    journaled = []
            except Exception:
                log.exception(
                    "writing %d scraped batches and %d target statuses failed; the journal keeps those",
                    len(batches),
                    len(held) + len(new),
                )
                held = []
                if self._journal is not None:
                    self._journal.left += journaled
                journaled = []
            if closed and not rounds:
                return


def _recorded(journal: RoundJournal, statuses: list[TargetStatus]) -> list[Path]:
    """`statuses` journaled (their file, in a list); none when the disk refuses: the round is written all
    the same, only a crash before its statuses are would lose them."""
    try:
        return [journal.record(statuses)]
    except OSError as error:
        log.warning(
            "cannot journal %d scrape rows (%s); a crash before they are written loses them",
            len(statuses),
            error,
        )
        return []

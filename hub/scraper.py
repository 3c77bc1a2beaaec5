"""The hub's scraper: this shard's targets scraped concurrently on aligned ticks, each round handed on.

    Scraper(TargetsFile(path).current, interval_s=1, shard=Shard(0, 2)).run(stop_event, rounds.put)

Every `interval_s` seconds a round scrapes each target of the shard (hub.targets) once, all at once, on
one thread (hub.scraperound drives the sockets and parses; hub.targetsession keeps each target's
connection and parser between rounds). A scrape yields a TargetStatus, failed ones included (up False,
the error text), and a ScrapeBatch if it succeeded, its samples stamped with the scrape's start
(timestamps in a body are not honoured, as with Prometheus's honor_timestamps: false). After each round
the sink gets the scrapes that ended in it, its own and carried ones; the hub's sink is hub.rounds.

Failure policy: a failed target costs only itself and is tried again next round; its limits are
enforced while reading and parsing, not after. A fetch has a deadline (its tick plus the timeout, at
most the interval), a body's parse a budget of the parser's own CPU time (the timeout again); a parse
not done by its round's deadline goes on in the following rounds, before the target's next body, and
ends down CARRY_S seconds after its round. So every scrape ends within a few rounds, and a target holds
at most one body per round. A sink that raises loses only the round it was given; one that holds the
loop past a tick's deadline makes the loop skip ticks (counted in `ticks_skipped`). A series sent twice
in one body keeps its first sample (the others counted in `duplicates_dropped`). Targets that went down
or came back are logged one line per round, not one per target.
"""

from __future__ import annotations

import gc
import logging
import math
import selectors
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor

from analytics.store.records import ScrapeBatch, TargetStatus
from hub.errors import ScraperConfigError
from hub.scraperound import Scrape, ScrapeRound
from hub.targets import Shard, Target
from hub.targetsession import ScrapeLimits, TargetSession, log_changes

log = logging.getLogger("fleetlens.scraper")

# Host names are looked up on this many threads (getaddrinfo blocks).
_LOOKUP_THREADS = 4
# How long after its round a scrape's body may still wait for its parse, or be parsed, in seconds (at
# least the next round): a hub starting parses every target's first body cold, and its other threads
# hold the GIL for much of its first seconds.
CARRY_S = 5.0

WHOLE_FLEET = Shard()  # one hub scrapes every target
DEFAULT_LIMITS = ScrapeLimits()

Sink = Callable[[list[ScrapeBatch], list[TargetStatus]], None]


class Scraper:
    """Scrapes this shard's targets, all at once, every `interval_s` seconds (1 to 60).

    One loop, on the caller's thread, drives every target's scrape over non-blocking sockets (stdlib
    `selectors`) and parses each body, a run of lines at a time between reads, as it completes: no
    thread per target, and so no threads fighting for the GIL. Host names are looked up on a small
    pool of threads (addresses need none). A round ends when all its scrapes have, or at its deadline,
    when every fetch still going is cut off and every body still to parse is carried into the next
    round (see the module's docstring); so no fetch outlives its round, no scrape the round after, and
    a target is asked once per round.

    `carry_rounds` is how many rounds after its own a body may still be parsed in (CARRY_S at least one).
    `target_source` is called before every round (a TargetsFile's `current`, or any list in tests);
    `targets` holds the last round's targets of this shard. `clock` gives the unix time that stamps
    samples and aligns ticks. `types` collects every family's type from the targets' TYPE lines (the
    last one seen wins), for the hub's rate computations. Counters for the hub's own metrics:
    `duplicates_dropped` (samples whose series came earlier in the same body) and `ticks_skipped`
    (ticks whose deadline had passed when the loop reached them). One caller at a time: `run` or
    `scrape_once`.
    """

    def __init__(
        self,
        target_source: Callable[[], Sequence[Target]],
        *,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
        shard: Shard = WHOLE_FLEET,
        limits: ScrapeLimits = DEFAULT_LIMITS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 1 <= interval_s <= 60:
            raise ScraperConfigError(f"scrape interval {interval_s:g}s: want 1 to 60 seconds")
        timeout_s = interval_s if timeout_s is None else timeout_s
        if not 0 < timeout_s <= interval_s:
            raise ScraperConfigError(
                f"scrape timeout {timeout_s:g}s: want more than 0 and at most the interval ({interval_s:g}s)"
            )
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.carry_rounds = max(1, math.ceil(CARRY_S / interval_s))
        self.shard = shard
        self.limits = limits
        self.types: dict[str, str] = {}
        self.targets: list[Target] = []
        self.duplicates_dropped = 0
        self.ticks_skipped = 0
        self._target_source = target_source
        self._clock = clock
        self._sessions: dict[str, TargetSession] = {}
        self._selector = selectors.DefaultSelector()
        self._resolver: ThreadPoolExecutor | None = None
        self._settled = False
        self._carried: list[Scrape] = []  # scrapes whose body is still to parse, into the next round
        self._ended: list[Scrape] = []  # scrapes ended and not yet handed over, in the order they ended

    def scrape_once(self) -> tuple[list[ScrapeBatch], list[TargetStatus]]:
        """One round now: every target of this shard, concurrently, each fetch until its deadline, and
        every body read parsed to its end (or its CPU budget's)."""
        self._round(time.monotonic() + self.timeout_s)
        self._parse_carried()
        return self._take_ended()

    def run(self, stop: threading.Event, sink: Sink) -> None:
        """Scrape at each multiple of the interval until `stop` is set; after each round, `sink` gets the
        scrapes that ended since its last call (the round's, and earlier rounds' that were still parsing).

        A round ends by its deadline, which is never past the next tick, so slow targets delay no tick;
        bodies still to parse are parsed until the next tick, and in the next round. A sink that raises
        loses only what it was given; one that blocks past a tick's deadline makes the loop skip that
        tick rather than bunch scrapes together. Once stopped, the bodies read are parsed and handed over.
        """
        tick = self._first_tick(self._clock())
        while not stop.is_set():
            self._parse_until(tick)
            if stop.wait(max(0.0, tick - self._clock())):
                break
            late = max(0.0, self._clock() - tick)
            self._round(time.monotonic() + self.timeout_s - late)
            self._hand_over(sink)
            if not self._settled:
                self._settle()
            tick = self._next_tick(tick)
        self._parse_carried()
        if self._ended:
            self._hand_over(sink)

    def _hand_over(self, sink: Sink) -> None:
        batches, statuses = self._take_ended()
        try:
            sink(batches, statuses)
        except Exception:
            log.exception("scrape sink failed; %d batches of this round are lost", len(batches))

    def _settle(self) -> None:
        """After the first round whose targets that answered all sent steady bodies (every series cached),
        collect garbage once and freeze what lives: the parsers' caches and the store's memo, a few objects
        per series, which every full collection would otherwise walk. Objects frozen are still freed when
        no longer referenced; series that come later are collected as usual. Only the hub's loop (`run`)
        does it, once."""
        up = [session for session in self._sessions.values() if session.was_up]
        if up and all(session.parser.steady for session in up):
            self._settled = True
            gc.collect()
            gc.freeze()

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()
        self._selector.close()
        if self._resolver is not None:
            self._resolver.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Scraper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _first_tick(self, now: float) -> float:
        return (now // self.interval_s + 1) * self.interval_s

    def _next_tick(self, tick: float) -> float:
        """The tick after `tick`, unless the sink (or one step of a parse) held the loop past its
        deadline (then the first tick whose deadline is still ahead, the skipped ones counted), or the
        clock was set back."""
        tick += self.interval_s
        now = self._clock()
        overdue = now - (tick + self.timeout_s)
        if overdue >= 0:
            skipped = int(overdue // self.interval_s) + 1
            self.ticks_skipped += skipped
            log.warning("the scrape loop was held past %d tick(s); skipped them", skipped)
            tick += skipped * self.interval_s
        if tick - now > self.interval_s:
            tick = self._first_tick(now)
        return tick

    def _round(self, deadline: float) -> None:
        """Scrape every target of this shard, each fetch by `deadline` (time.monotonic), and go on with
        the bodies carried from the round before; this round's last for them."""
        self.targets = [target for target in self._target_source() if self.shard.owns(target)]
        round_ = ScrapeRound(self._selector, self._lookups, deadline)
        ts = self._clock()
        scrapes = [Scrape(session, round_, ts) for session in self._sessions_for(self.targets)]
        self._carried = round_.drive(scrapes, self._carried)
        self._ended += round_.ended

    def _parse_until(self, tick: float) -> None:
        """Go on parsing the carried bodies until `tick` (unix time, on `clock`), the next round's start."""
        if self._carried:
            round_ = ScrapeRound(self._selector, self._lookups, time.monotonic() + tick - self._clock())
            self._carried = round_.drive((), self._carried, counts=False)
            self._ended += round_.ended

    def _parse_carried(self) -> None:
        """Parse the carried bodies to their ends (each within its CPU budget)."""
        round_ = ScrapeRound(self._selector, self._lookups, math.inf)
        round_.parse_all(self._carried)
        self._carried = []
        self._ended += round_.ended

    def _take_ended(self) -> tuple[list[ScrapeBatch], list[TargetStatus]]:
        """The scrapes ended since the last call, as batches and statuses, their types and duplicates
        counted, and their targets' changes logged."""
        ended, self._ended = self._ended, []
        log_changes(list(dict.fromkeys(scrape.session for scrape in ended)))
        outcomes = [scrape.outcome for scrape in ended]
        for outcome in outcomes:
            self.types.update(outcome.types)
            self.duplicates_dropped += outcome.duplicates
        batches = [outcome.batch for outcome in outcomes if outcome.batch is not None]
        return batches, [outcome.status for outcome in outcomes]

    def _lookups(self) -> Executor:
        if self._resolver is None:
            self._resolver = ThreadPoolExecutor(_LOOKUP_THREADS, thread_name_prefix="fleetlens-lookup")
        return self._resolver

    def _sessions_for(self, targets: Sequence[Target]) -> list[TargetSession]:
        """A session per target, kept across rounds; a target whose labels changed starts afresh."""
        wanted = {target.address: target for target in targets}
        for address, session in list(self._sessions.items()):
            if wanted.get(address) != session.target:
                session.close()
                del self._sessions[address]
        for address, target in wanted.items():
            if address not in self._sessions:
                self._sessions[address] = TargetSession(
                    target, self.timeout_s, self.limits, self.carry_rounds
                )
        return [self._sessions[address] for address in wanted]

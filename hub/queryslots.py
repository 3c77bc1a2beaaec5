"""Who may run a query on the hub now: slots per client and in all, given fairly, with a bounded wait.

Each query the API runs holds the store for up to hub.query_max_seconds. Without admission, a client
that sends a few long queries holds every slot and everyone else's `SELECT 1` waits behind them.
QuerySlots lets each client (its token; its address on a hub without tokens) run at most `per_client`
queries at once and all clients together at most `total`. When a slot frees, it goes to the waiting
request whose client runs the fewest queries (the earliest of those first), so a client that holds its
slots delays only itself. A request that gets no slot within `queue_s`, or by its own deadline if that is
sooner, is refused with SlotsBusy (the hub's 429), which says when a slot it waits for will be free at
the latest: the earliest deadline among the queries holding them (the store stops each by its
deadline). A client may have at most WAITING_PER_SLOT requests waiting per slot of its own; past that
it is refused at once, so that no client fills the hub's connections with waiting requests.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from hub.errors import SettingError, SlotsBusy

WAITING_PER_SLOT = 4


@dataclass(frozen=True, eq=False)
class _Waiter:
    client: str
    ticket: int  # arrival order


class QuerySlots:
    """At most `per_client` queries of one client at once, `total` in all; a wait of at most `queue_s`."""

    def __init__(self, total: int = 4, per_client: int = 2, queue_s: float = 5.0) -> None:
        if not 1 <= per_client <= total:
            raise SettingError(f"slots: need 1 <= per_client <= total, got {per_client} and {total}")
        if not 0 <= queue_s < math.inf:
            raise SettingError(f"slots: queue_s must be 0 or more seconds, got {queue_s}")
        self.total = total
        self.per_client = per_client
        self.queue_s = queue_s
        self._changed = threading.Condition()
        self._running: dict[str, list[float]] = {}  # client -> the deadlines of its running queries
        self._waiting: list[_Waiter] = []
        self._tickets = itertools.count()

    @property
    def running(self) -> int:
        """Queries holding a slot now."""
        with self._changed:
            return sum(map(len, self._running.values()))

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot now."""
        with self._changed:
            return len(self._waiting)

    @contextlib.contextmanager
    def slot(self, client: str, deadline: float) -> Iterator[None]:
        """Hold one of `client`'s slots for the block, for a query that ends by `deadline` (time.monotonic
        seconds); SlotsBusy when none comes free within queue_s or by the deadline."""
        self._take(client, deadline)
        try:
            yield
        finally:
            with self._changed:
                deadlines = self._running[client]
                deadlines.remove(deadline)
                if not deadlines:
                    del self._running[client]
                self._changed.notify_all()

    def _take(self, client: str, deadline: float) -> None:
        with self._changed:
            now = time.monotonic()
            queued = sum(waiter.client == client for waiter in self._waiting)
            if queued >= self.per_client * WAITING_PER_SLOT:
                raise self._busy(client, now, f"this client has {queued} queries waiting for a slot already")
            waiter = _Waiter(client, next(self._tickets))
            self._waiting.append(waiter)
            give_up = min(now + self.queue_s, deadline)
            try:
                while self._next() is not waiter:
                    left = give_up - time.monotonic()
                    if left <= 0:
                        raise self._busy(
                            client, time.monotonic(), f"no slot came free in {give_up - now:.1f} s"
                        )
                    self._changed.wait(left)
                self._running.setdefault(client, []).append(deadline)
            finally:
                self._waiting.remove(waiter)
                self._changed.notify_all()  # who is next may have changed, and a slot may still be free

    def _next(self) -> _Waiter | None:
        """The waiter the next free slot goes to: of those whose client has a slot of its own free, the
        one whose client runs the fewest queries, then the earliest; None while every slot is taken."""
        if sum(map(len, self._running.values())) >= self.total:
            return None
        eligible = [w for w in self._waiting if len(self._running.get(w.client, ())) < self.per_client]
        return min(eligible, key=lambda w: (len(self._running.get(w.client, ())), w.ticket), default=None)

    def _busy(self, client: str, now: float, why: str) -> SlotsBusy:
        """SlotsBusy for `client`: why, what holds the slots, and when one it waits for will be free."""
        mine = self._running.get(client, [])
        everyone = [deadline for deadlines in self._running.values() for deadline in deadlines]
        holding = mine if len(mine) >= self.per_client else everyone
        retry_after = max(1, math.ceil(min(holding, default=now) - now))
        return SlotsBusy(
            f"{why}: this client runs {len(mine)} queries of its {self.per_client} "
            f"(hub.query_slots_per_client), all clients {len(everyone)} of {self.total} (hub.query_slots); "
            f"retry in {retry_after} s",
            retry_after,
        )

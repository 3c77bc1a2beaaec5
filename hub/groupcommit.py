"""Remote write requests that arrive together are written together: one insert per table per group.

A Prometheus sends many small requests at once (one per queue shard, 500 to a few thousand samples
each), and a store insert costs about as much for 2,000 rows as for 50,000. So the first request of a
group waits `linger_s` for others, then writes them all, and every request of the group is answered with
the group's outcome; while one group is written the next one gathers.

Idempotency survives the grouping: a group's token is a digest of its requests' tokens (a spooled group
is replayed once), and a request whose token was written in an earlier group is answered at once
without writing it again (a sender's retry after a lost answer). Tokens are remembered in memory, the
last RECENT_TOKENS of them: a retry that crosses a hub restart may be stored twice.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from hub.remote_write import Received
from hub.writer import Writer

RECENT_TOKENS = 100_000
LINGER_S = 0.05


@dataclass
class _Group:
    requests: list[Received] = field(default_factory=list)
    written: threading.Event = field(default_factory=threading.Event)
    kept: bool = False


class GroupCommit:
    """Writes the rows of concurrent remote write requests through `writer`, a group at a time."""

    def __init__(
        self, writer: Writer, linger_s: float = LINGER_S, sleep: Callable[[float], object] = time.sleep
    ) -> None:
        self._writer = writer
        self._linger_s = linger_s
        self._sleep = sleep
        self._lock = threading.Lock()  # the open group and the recent tokens
        self._writing = threading.Lock()  # one group written at a time, in the order they closed
        self._open: _Group | None = None
        self._recent: OrderedDict[str, None] = OrderedDict()

    def commit(self, received: Received) -> bool:
        """Write `received` with the requests that arrive with it; True once stored or spooled, False
        when neither the store nor the spool could keep its group."""
        with self._lock:
            if received.token in self._recent:
                return True
            group, leader = self._open, self._open is None
            if leader:
                group = self._open = _Group()
            group.requests.append(received)
        if not leader:
            group.written.wait()
            return group.kept
        self._sleep(self._linger_s)
        with self._lock:
            self._open = None
        with self._writing:
            group.kept = self._write(group.requests)
        group.written.set()
        return group.kept

    def _write(self, requests: list[Received]) -> bool:
        fresh = {request.token: request for request in requests}  # a retry within the group counts once
        token = "remote-write-" + hashlib.sha256("".join(sorted(fresh)).encode()).hexdigest()[:32]
        batches = [batch for request in fresh.values() for batch in request.batches]
        statuses = [status for request in fresh.values() for status in request.statuses]
        kept = self._writer.write("samples", batches, token=token)
        kept = self._writer.write("targets", statuses, token=token) and kept
        if kept:
            with self._lock:
                for request_token in fresh:
                    self._recent[request_token] = None
                while len(self._recent) > RECENT_TOKENS:
                    self._recent.popitem(last=False)
        return kept

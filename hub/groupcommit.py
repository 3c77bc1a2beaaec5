"""Remote write requests that arrive together are written together: one insert per table per group.

A Prometheus sends many small requests at once (one per queue shard, 500 to a few thousand samples
each), and every store insert has a fixed cost (CPU per table, then the merging of the parts it
made), which small groups pay many times over per sample. So the first request of a group waits until
the group holds `full_samples` samples or `linger_s` has passed, and until the previous group is written
(requests that come meanwhile join it), then writes them all; every request of the group is answered
with the group's outcome. A sender sees the wait as latency (well inside its remote_timeout) and adds
queue shards to keep its throughput; a slower store makes larger groups, which cost less per sample.

Idempotency survives the grouping: a group's token is a digest of its requests' tokens (a spooled group
is replayed once), and a request whose token was written in an earlier group is answered at once
without writing it again (a sender's retry after a lost answer). Tokens are remembered in memory, the
last RECENT_TOKENS of them; a retry they miss (after a hub restart, or grouped otherwise) is written
again, and the store drops every sample and `up` status of it that it holds (analytics.store.ledger).
A group's samples and statuses go in together (Writer.write_round): spooled, they are one file.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import itemgetter

from analytics.store.records import ScrapeBatch
from hub.remote_write import Received
from hub.writer import Writer

RECENT_TOKENS = 100_000
LINGER_S = 0.25  # a sender with one shard waits this much more per request
FULL_SAMPLES = 30_000  # past this an insert costs the same per sample (bench/remote_write.py)


@dataclass
class _Group:
    requests: list[Received] = field(default_factory=list)
    samples: int = 0
    full: threading.Event = field(default_factory=threading.Event)
    written: threading.Event = field(default_factory=threading.Event)
    kept: bool = False


class GroupCommit:
    """Writes the rows of concurrent remote write requests through `writer`, a group at a time."""

    def __init__(self, writer: Writer, linger_s: float = LINGER_S, full_samples: int = FULL_SAMPLES) -> None:
        self._writer = writer
        self._linger_s = linger_s
        self._full_samples = full_samples
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
            group.samples += received.samples
            if group.samples >= self._full_samples:  # the next request opens the next group
                self._open = None
                group.full.set()
        if not leader:
            group.written.wait()
            return group.kept
        group.full.wait(self._linger_s)
        with self._writing:  # requests that come while the previous group is written join this one
            with self._lock:
                if self._open is group:
                    self._open = None
            group.kept = self._write(group.requests)
        group.written.set()
        return group.kept

    def _write(self, requests: list[Received]) -> bool:
        fresh = {request.token: request for request in requests}  # a retry within the group counts once
        token = "remote-write-" + hashlib.sha256("".join(sorted(fresh)).encode()).hexdigest()[:32]
        batches = merged(batch for request in fresh.values() for batch in request.batches)
        statuses = [status for request in fresh.values() for status in request.statuses]
        kept = bool(self._writer.write_round(batches, statuses, token=token))
        if kept:
            with self._lock:
                for request_token in fresh:
                    self._recent[request_token] = None
                while len(self._recent) > RECENT_TOKENS:
                    self._recent.popitem(last=False)
        return kept


def merged(batches: Iterable[ScrapeBatch]) -> list[ScrapeBatch]:
    """One batch per (target, node, time) of `batches`, its samples in an order fixed per series.

    Prometheus spreads one scrape over several requests (its queue shards), in no fixed order. Put back
    together and ordered alike, a scrape that arrived whole in one group has its target's series in the
    order of its previous scrape: what the store recognises without looking up each series (KnownSeries).
    The order is that of the series' labels dicts' identities: the receiver shares one dict per series."""
    pieces: dict[tuple[str, str, float], list[ScrapeBatch]] = {}
    for batch in batches:
        pieces.setdefault((batch.target, batch.node, batch.ts), []).append(batch)
    out = []
    for (target, node, ts), parts in pieces.items():
        rows = sorted(
            (
                row
                for part in parts
                for row in zip(map(id, part.labels), part.names, part.labels, part.values, strict=True)
            ),
            key=itemgetter(0),
        )
        out.append(
            ScrapeBatch(
                target, node, ts, [row[1] for row in rows], [row[2] for row in rows], [row[3] for row in rows]
            )
        )
    return out

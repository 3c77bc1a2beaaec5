"""The insert thread of scraped rounds (hub.rounds): every round's samples written in order, its target
statuses held up to hold_s and written with later rounds', on time without them, and all at close."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from analytics.store.records import ScrapeBatch, TargetStatus
from hub.rounds import RoundQueue
from hub.writer import Written


def scraped(n: int) -> tuple[list[ScrapeBatch], list[TargetStatus]]:
    """Round n: one batch and one status of each of two targets."""
    targets = ("a:1", "b:1")
    return (
        [ScrapeBatch(t, t[0], n, ["up"], [{}], [1.0]) for t in targets],
        [TargetStatus(n, t, t[0], True, 0.01, 1) for t in targets],
    )


class Sink:
    """A RoundWriter that records each write as (batches, statuses written), the statuses it was told to
    hold left out; `written` is set after each, and every round past max_rounds lands in `deferred`."""

    def __init__(self) -> None:
        self.writes: list[tuple[list[ScrapeBatch], list[TargetStatus]]] = []
        self.deferred: list[tuple[list[ScrapeBatch], list[TargetStatus]]] = []
        self.written = threading.Event()

    def write_round(
        self,
        batches: Sequence[ScrapeBatch],
        statuses: Sequence[TargetStatus],
        *,
        token: str | None = None,
        hold: bool = False,
    ) -> Written:
        written = [] if hold else list(statuses)
        if batches or written:
            self.writes.append((list(batches), written))
            self.written.set()
        return Written.STORED

    def defer_round(self, batches: Sequence[ScrapeBatch], statuses: Sequence[TargetStatus]) -> None:
        self.deferred.append((list(batches), list(statuses)))

    def put_and_wait(self, queue: RoundQueue, n: int) -> None:
        self.written.clear()
        queue.put(*scraped(n))
        assert self.written.wait(5)


def test_samples_go_in_round_by_round_and_held_statuses_all_at_close() -> None:
    sink = Sink()
    queue = RoundQueue(sink, hold_s=60)
    for n in range(3):
        sink.put_and_wait(queue, n)
    queue.close()
    rounds = [scraped(n) for n in range(3)]
    assert sink.writes == [
        *((batches, []) for batches, _ in rounds),
        ([], [status for _, statuses in rounds for status in statuses]),
    ]


def test_the_statuses_of_rounds_within_hold_s_go_in_together_once_the_first_is_due() -> None:
    sink = Sink()
    queue = RoundQueue(sink, hold_s=1.5)
    started = time.monotonic()
    for n in range(3):
        sink.put_and_wait(queue, n)
    assert time.monotonic() - started < 1.5, "too slow a machine for this test"
    deadline = time.monotonic() + 5
    while not any(statuses for _, statuses in sink.writes):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert time.monotonic() - started >= 1.5
    queue.close()
    rounds = [scraped(n) for n in range(3)]
    assert [statuses for _, statuses in sink.writes if statuses] == [[s for _, ss in rounds for s in ss]]
    assert [b for batches, _ in sink.writes for b in batches] == [b for batches, _ in rounds for b in batches]


def test_held_statuses_go_in_after_hold_s_when_no_round_comes() -> None:
    sink = Sink()
    queue = RoundQueue(sink, hold_s=0.3)
    sink.put_and_wait(queue, 0)
    sink.written.clear()
    started = time.monotonic()
    assert sink.written.wait(5)
    assert 0.2 < time.monotonic() - started < 2
    assert sink.writes[1] == ([], scraped(0)[1])
    queue.close()
    assert len(sink.writes) == 2  # nothing left to write at close


def test_without_holding_every_round_goes_in_with_its_statuses() -> None:
    sink = Sink()
    queue = RoundQueue(sink, hold_s=0)
    for n in range(3):
        sink.put_and_wait(queue, n)
    queue.close()
    assert sink.writes == [write for n in range(3) for write in ((scraped(n)[0], []), ([], scraped(n)[1]))]


def test_a_round_past_max_rounds_is_deferred_with_its_statuses_and_held_ones_stay_held() -> None:
    release = threading.Event()
    sink = Sink()

    class Slow(Sink):
        def write_round(self, *args: Any, **options: Any) -> Written:
            release.wait(5)
            return sink.write_round(*args, **options)

    slow = Slow()
    queue = RoundQueue(slow, max_rounds=1, hold_s=60)
    queue.put(*scraped(0))  # taken by the insert thread, which waits in slow()
    time.sleep(0.2)
    queue.put(*scraped(1))  # waits
    queue.put(*scraped(2))  # past max_rounds
    release.set()
    queue.close()
    assert slow.deferred == [scraped(2)]
    assert sink.writes == [(scraped(0)[0], []), (scraped(1)[0], []), ([], scraped(0)[1] + scraped(1)[1])]

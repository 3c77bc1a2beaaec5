"""The insert thread of scraped rounds (hub.rounds): every round's samples written in order, its target
statuses held up to hold_s and written with later rounds', on time without them, and all at close."""

from __future__ import annotations

import threading
import time

from analytics.store.records import ScrapeBatch, TargetStatus
from hub.rounds import RoundQueue


def scraped(n: int) -> tuple[list[ScrapeBatch], list[TargetStatus]]:
    """Round n: one batch and one status of each of two targets."""
    targets = ("a:1", "b:1")
    return (
        [ScrapeBatch(t, t[0], n, ["up"], [{}], [1.0]) for t in targets],
        [TargetStatus(n, t, t[0], True, 0.01, 1) for t in targets],
    )


class Sink:
    """Records each write; `written` is set after each."""

    def __init__(self) -> None:
        self.writes: list[tuple[list[ScrapeBatch], list[TargetStatus]]] = []
        self.written = threading.Event()

    def __call__(self, batches: list[ScrapeBatch], statuses: list[TargetStatus]) -> None:
        self.writes.append((batches, statuses))
        self.written.set()

    def put_and_wait(self, queue: RoundQueue, n: int) -> None:
        self.written.clear()
        queue.put(*scraped(n))
        assert self.written.wait(5)


def never(batches: list[ScrapeBatch], statuses: list[TargetStatus]) -> None:
    raise AssertionError("nothing should be deferred")


def test_samples_go_in_round_by_round_and_held_statuses_all_at_close() -> None:
    sink = Sink()
    queue = RoundQueue(sink, never, hold_s=60)
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
    queue = RoundQueue(sink, never, hold_s=1.5)
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
    queue = RoundQueue(sink, never, hold_s=0.3)
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
    queue = RoundQueue(sink, never, hold_s=0)
    for n in range(3):
        sink.put_and_wait(queue, n)
    queue.close()
    assert sink.writes == [scraped(n) for n in range(3)]


def test_a_round_past_max_rounds_is_deferred_with_its_statuses_and_held_ones_stay_held() -> None:
    release = threading.Event()
    sink = Sink()
    deferred: list[tuple[list[ScrapeBatch], list[TargetStatus]]] = []

    def slow(batches: list[ScrapeBatch], statuses: list[TargetStatus]) -> None:
        release.wait(5)
        sink(batches, statuses)

    queue = RoundQueue(slow, lambda b, s: deferred.append((b, s)), max_rounds=1, hold_s=60)
    queue.put(*scraped(0))  # taken by the insert thread, which waits in slow()
    time.sleep(0.2)
    queue.put(*scraped(1))  # waits
    queue.put(*scraped(2))  # past max_rounds
    release.set()
    queue.close()
    assert deferred == [scraped(2)]
    assert sink.writes == [(scraped(0)[0], []), (scraped(1)[0], scraped(0)[1] + scraped(1)[1])]

"""The insert thread of scraped rounds (hub.rounds): every round's samples written in order, its target
statuses held up to hold_s and written with later rounds', on time without them, and all at close; and
stored together with their samples on a real store when the thread dies between them (as a hub under
kill -9: tests/hub/test_crash.py kills the real one) or the store fails between them."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from analytics.errors import StoreUnavailable
from analytics.store import Store
from analytics.store.records import ScrapeBatch, TargetStatus
from hub.rounds import JOURNAL_DIR, RoundJournal, RoundQueue
from hub.spool import Spool
from hub.writer import Writer, Written


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


# -- a round's samples and statuses stored together, whatever dies or fails between them ----------------


def scraped_at(ts: float, down: bool = False) -> tuple[list[ScrapeBatch], list[TargetStatus]]:
    """A round at `ts`: two nodes answered with two samples each; a third target refused when `down`."""
    answered = ("vela-001", "vela-002")
    batches = [
        ScrapeBatch(
            f"{n}:9400", n, ts, ["DCGM_FI_DEV_GPU_TEMP"] * 2, [{"gpu": "0"}, {"gpu": "1"}], [40.0, 41.0]
        )
        for n in answered
    ]
    statuses = [TargetStatus(ts, f"{n}:9400", n, True, 0.01, 2) for n in answered]
    if down:
        statuses.append(TargetStatus(ts, "vela-003:9400", "vela-003", False, 0.5, 0, "connection refused"))
    return batches, statuses


class DiesBeforeStatuses:
    """The real writer, but its caller's thread dies (as a hub under SIGKILL does) when it comes to write
    held statuses whose samples the store already took."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer

    def write_round(
        self, batches: Sequence[ScrapeBatch], statuses: Sequence[TargetStatus], **options: object
    ) -> Written:
        if not batches and statuses and not options.get("hold"):
            raise SystemExit("killed")  # ends the insert thread, past every except Exception
        return self.writer.write_round(batches, statuses, **options)

    def defer_round(self, batches: Sequence[ScrapeBatch], statuses: Sequence[TargetStatus]) -> None:
        self.writer.defer_round(batches, statuses)


def orphans(store: Store) -> list[tuple]:
    return store.query(
        "SELECT DISTINCT node, ts FROM samples WHERE (node, ts) NOT IN (SELECT node, ts FROM targets)"
    ).rows


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the death
def test_a_hub_that_died_holding_statuses_writes_those_whose_samples_are_stored_when_it_starts_again(
    store: Store, tmp_path: Path
) -> None:
    now = float(int(time.time()))
    spool = tmp_path / "spool"
    writer = Writer(store, Spool(spool, 1 << 20))
    journal = RoundJournal(spool / JOURNAL_DIR, store.stored_scrapes)
    queue = RoundQueue(DiesBeforeStatuses(writer), journal, hold_s=1.0)
    for n in range(3):
        queue.put(*scraped_at(now + n, down=n == 1))
    queue._thread.join(timeout=30)  # died when the statuses fell due
    assert not queue._thread.is_alive()
    assert store.query("SELECT count() FROM targets").rows == [(0,)]
    assert len(orphans(store)) == 6
    never = scraped_at(now + 3, down=True)[1]
    journal.record(never)  # journaled, then killed before its samples went in
    writer.close()

    restarted = Writer(store.session(), Spool(spool, 1 << 20))
    RoundQueue(restarted, RoundJournal(spool / JOURNAL_DIR, store.stored_scrapes)).close()
    restarted.close()
    assert orphans(store) == []
    rows = store.query(
        "SELECT toUnixTimestamp(ts) - {now:UInt32}, node, up FROM targets ORDER BY 1, 2",
        parameters={"now": int(now)},
    ).rows
    assert rows == [
        (0, "vela-001", 1), (0, "vela-002", 1),
        (1, "vela-001", 1), (1, "vela-002", 1), (1, "vela-003", 0),
        (2, "vela-001", 1), (2, "vela-002", 1),
    ]  # fmt: skip
    assert list((spool / JOURNAL_DIR).iterdir()) == []


class FailsAfterSamples:
    """The real store, but its targets inserts fail as an unreachable store while `down`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.down = True

    def __getattr__(self, name: str) -> object:
        if self.down and name == "insert_targets":
            raise StoreUnavailable("store down for the test")
        return getattr(self.store, name)


def test_a_spooled_round_stores_its_statuses_with_its_samples_even_when_the_store_fails_between(
    store: Store, tmp_path: Path
) -> None:
    now = float(int(time.time()))
    flaky = FailsAfterSamples(store)
    spool = Spool(tmp_path / "spool", 1 << 20)
    writer = Writer(flaky, spool, sleep=lambda _: threading.Event().wait(0.05))
    writer.defer_round(*scraped_at(now, down=True))  # the scrape loop could not wait: spooled whole
    deadline = time.monotonic() + 10
    while store.query("SELECT count() FROM samples").rows == [(0,)]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert spool.pending_entries == 1  # samples in, statuses not: the file stays
    flaky.down = False
    writer.close()
    assert spool.pending_entries == 0
    assert orphans(store) == []
    assert store.query("SELECT count(), uniqExact(series_id, ts) FROM samples").rows == [(4, 4)]
    assert store.query("SELECT count() FROM targets").rows == [(3,)]


def test_a_journal_the_disk_refuses_still_writes_every_round_and_its_statuses(tmp_path, monkeypatch) -> None:
    def full_disk(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("hub.rounds.write_durably", full_disk)
    sink = Sink()
    queue = RoundQueue(sink, RoundJournal(tmp_path / "rounds", lambda statuses: set()), hold_s=60)
    for n in range(2):
        sink.put_and_wait(queue, n)
    queue.close()
    assert sink.writes == [(scraped(0)[0], []), (scraped(1)[0], []), ([], scraped(0)[1] + scraped(1)[1])]


def test_the_journals_of_two_deaths_named_alike_are_both_written(store: Store, tmp_path: Path) -> None:
    now = float(int(time.time()))
    spool = tmp_path / "spool"
    writer = Writer(store, Spool(spool, 1 << 20))
    for life in range(2):  # each life dies holding one round, its journal numbered from 1 again
        batches, statuses = scraped_at(now + life)
        RoundJournal(spool / JOURNAL_DIR, store.stored_scrapes).record(statuses)
        assert writer.write_round(batches, statuses, hold=True) is Written.STORED
        RoundQueue(writer, RoundJournal(spool / JOURNAL_DIR, store.stored_scrapes)).close()  # the next life
    writer.close()
    assert orphans(store) == []
    assert store.query("SELECT count() FROM targets").rows == [(4,)]

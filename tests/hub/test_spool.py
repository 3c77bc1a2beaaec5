"""The hub's spool and writer against a fake store: outages, restarts, a full disk, torn files, crashes."""

from __future__ import annotations

import errno
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from analytics.errors import StoreRejected, StoreUnavailable
from analytics.store.records import ScrapeBatch, SilenceRow, TargetStatus
from collectors.steprecord import StepRecord
from hub.errors import UnknownRecordType
from hub.spool import Kind, Row, Spool, row_count
from hub.writer import Backoff, Writer
from tests.support.exposition import samples_of


class FakeStore:
    """The Store's insert API in memory; like the real one it writes a repeated token once.

    `down` makes every insert raise StoreUnavailable, `refusing` StoreRejected.
    """

    def __init__(self) -> None:
        self.down = False
        self.refusing = False
        self.attempts: list[str] = []  # the token of every insert tried
        self.stored: list[tuple[Kind, list[Row], str]] = []
        self._lock = threading.Lock()

    def insert(self, kind: Kind, rows: Sequence[Row], token: str) -> int:
        with self._lock:
            self.attempts.append(token)
            if self.down:
                raise StoreUnavailable("fake store: connection refused")
            if self.refusing:
                raise StoreRejected("fake store: type mismatch in column value")
            if any(token == seen for _, _, seen in self.stored):
                return 0
            self.stored.append((kind, list(rows), token))
            return row_count(kind, rows)

    def insert_samples(self, batches: Sequence[ScrapeBatch], *, token: str) -> int:
        return self.insert("samples", batches, token)

    def insert_targets(self, statuses: Sequence[TargetStatus], *, token: str) -> int:
        return self.insert("targets", statuses, token)

    def insert_steps(self, rows: Sequence[StepRecord], *, token: str) -> int:
        return self.insert("steps", rows, token)

    def scrape_times(self) -> list[float]:
        """The ts of every stored scrape batch, in the order stored."""
        return [batch.ts for kind, rows, _ in self.stored if kind == "samples" for batch in rows]


def scrape(ts: float) -> ScrapeBatch:
    """A small scrape batch told apart from others by its time."""
    return ScrapeBatch("vela-001:9400", "vela-001", ts, ["DCGM_FI_DEV_GPU_TEMP"], [{"gpu": "0"}], [41.0])


def real_scrape(fixtures: Path, ts: float) -> ScrapeBatch:
    """The samples of the real dcgm-exporter /metrics excerpts (V100, and H100 MIG with pod labels)."""
    names, labels, values = [], [], []
    for excerpt in ("issue250-v100-metrics-excerpt.prom", "issue512-h100-mig-metrics-excerpt.prom"):
        text = (fixtures / "dcgm-exporter" / excerpt).read_text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                names.append(sample.name)
                labels.append(dict(sample.labels))
                values.append(sample.value)
    return ScrapeBatch("10.0.3.7:9400", "r6i3n0", ts, names, labels, values)


def spool_files(spool: Spool, where: str = "") -> list[str]:
    return sorted(path.name for path in (spool.directory / where).iterdir() if path.is_file())


def put_scrapes(spool: Spool, times: Sequence[float]) -> None:
    for ts in times:
        assert spool.put("samples", f"token-{ts}", [scrape(ts)])


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def one_entry_bytes(tmp_path: Path) -> int:
    """The size on disk of one `scrape` batch's file."""
    probe = Spool(tmp_path / "probe", max_bytes=1 << 20)
    put_scrapes(probe, [1.0])
    return probe.pending_bytes


# The spool


def test_restart_replays_every_kind_in_order_with_values_intact(fixtures, tmp_path):
    real = real_scrape(fixtures, 1_700_000_000.25)
    odd_values = ScrapeBatch(
        "vela-002:9400",
        "vela-002",
        1_700_000_001.0,
        ["a", "b", "c"],
        [{"v": "ü\u2603"}, {}, {}],
        [math.nan, math.inf, -0.0],
    )
    status = TargetStatus(1_700_000_001.5, "vela-003:9400", "vela-003", False, 10.0, 0, "timeout: 10 s")
    steps = [
        StepRecord(1_700_000_002.0, "llama-70b", 3, "vela-001", 41, 1.25, 0.9, 0.3, 0.05, 1, 0, 3),
        StepRecord(1_700_000_002.5, "llama-70b", 4, "vela-001", 40, 1.1, steps=20, source="otlp"),
    ]
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.put("samples", "t1", [real, odd_values])
    spool.put("targets", "t2", [status])
    spool.put("steps", "t3", steps)
    del spool

    reopened = Spool(tmp_path, max_bytes=1 << 20)
    assert reopened.pending_entries == 3
    reopened.put("steps", "t4", steps[:1])  # after a restart new batches still go behind the old
    store = FakeStore()
    assert reopened.replay(store.insert) == 4

    assert [(kind, token) for kind, _, token in store.stored] == [
        ("samples", "t1"),
        ("targets", "t2"),
        ("steps", "t3"),
        ("steps", "t4"),
    ]
    (stored_real, stored_odd), [stored_status], stored_steps, _ = (rows for _, rows, _ in store.stored)
    assert stored_real == real
    assert len(real) == 10
    assert stored_odd.labels == odd_values.labels
    nan, inf, zero = stored_odd.values
    assert math.isnan(nan) and inf == math.inf and math.copysign(1, zero) == -1
    assert stored_status == status
    assert stored_steps == steps
    assert reopened.pending_entries == 0 and reopened.pending_bytes == 0
    assert spool_files(reopened) == []


def test_replay_stops_at_first_unavailable_and_resumes_in_order(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    put_scrapes(spool, [1, 2, 3, 4, 5])
    store = FakeStore()

    def down_after_two(kind: Kind, rows: Sequence[Row], token: str) -> None:
        store.down = len(store.stored) == 2
        store.insert(kind, rows, token)

    assert spool.replay(down_after_two) == 2
    assert spool.pending_entries == 3
    assert spool.replay(store.insert) == 0  # still down: nothing lost, nothing skipped
    store.down = False
    assert spool.replay(store.insert) == 3
    assert store.scrape_times() == [1, 2, 3, 4, 5]
    assert spool.replayed_total == 5


def test_full_spool_drops_the_oldest_and_counts_them(tmp_path):
    size = one_entry_bytes(tmp_path)
    spool = Spool(tmp_path / "spool", max_bytes=3 * size + size // 2)
    put_scrapes(spool, [1, 2, 3, 4, 5])

    assert spool.pending_entries == 3
    assert spool.dropped_total == 2 and spool.dropped_rows_total == 2
    assert spool.pending_bytes <= spool.max_bytes
    assert len(spool_files(spool)) == 3
    store = FakeStore()
    spool.replay(store.insert)
    assert store.scrape_times() == [3, 4, 5]


def test_batch_being_replayed_is_not_dropped_to_make_room(tmp_path):
    size = one_entry_bytes(tmp_path)
    spool = Spool(tmp_path / "spool", max_bytes=2 * size)
    put_scrapes(spool, [1, 2])
    store = FakeStore()

    def insert_while_scrapes_arrive(kind: Kind, rows: Sequence[Row], token: str) -> None:
        if token == "token-1":
            put_scrapes(spool, [3, 4])  # the scrape loop fills the spool while batch 1 is in the store
        store.insert(kind, rows, token)

    spool.replay(insert_while_scrapes_arrive)
    assert store.scrape_times() == [1, 4]
    assert spool.dropped_total == 2  # batches 2 and 3, not the one the store was taking


def test_batch_larger_than_the_whole_spool_is_dropped_and_the_rest_kept(tmp_path):
    spool = Spool(tmp_path, max_bytes=4 * one_entry_bytes(tmp_path))
    put_scrapes(spool, [1, 2])
    huge = ScrapeBatch(
        "vela-001:9400", "vela-001", 3, ["m"] * 500, [{"i": str(i)} for i in range(500)], [0.0] * 500
    )

    assert not spool.put("samples", "huge", [huge])
    assert spool.dropped_total == 1 and spool.dropped_rows_total == 500
    assert spool.pending_entries == 2


def test_torn_files_found_on_start_are_set_aside_and_counted(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    put_scrapes(spool, [1, 2, 3])
    first, torn, last = spool_files(spool)
    data = (tmp_path / torn).read_bytes()
    (tmp_path / torn).write_bytes(data[: len(data) // 2])  # power cut mid-write, no journal
    (tmp_path / f"{99:020d}-samples-1.spool.tmp").write_bytes(data[:10])  # a crash before the rename
    del spool

    reopened = Spool(tmp_path, max_bytes=1 << 20)
    assert reopened.corrupt_total == 2
    assert spool_files(reopened) == [first, last]
    assert spool_files(reopened, "corrupt") == [torn, f"{99:020d}-samples-1.spool.tmp"]
    store = FakeStore()
    reopened.put("samples", "after", [scrape(4)])
    assert reopened.replay(store.insert) == 3
    assert store.scrape_times() == [1, 3, 4]
    assert spool_files(reopened, "corrupt") == [torn, f"{99:020d}-samples-1.spool.tmp"]  # not overwritten


def test_file_that_does_not_decode_is_set_aside_at_replay(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    put_scrapes(spool, [1, 2, 3])
    damaged = tmp_path / spool_files(spool)[1]
    data = damaged.read_bytes()
    damaged.write_bytes(data[:16] + bytes(len(data) - 16))  # header intact, payload zeroed: a bad sector

    store = FakeStore()
    assert spool.replay(store.insert) == 2
    assert store.scrape_times() == [1, 3]
    assert spool.corrupt_total == 1
    assert spool_files(spool, "corrupt") == [damaged.name]


def test_crash_between_insert_and_delete_resends_the_same_token_without_duplicates(tmp_path):
    class Crash(Exception):
        """The hub dying right after the store took the batch, before its spool file was deleted."""

    spool = Spool(tmp_path, max_bytes=1 << 20)
    put_scrapes(spool, [1, 2])
    store = FakeStore()

    def insert_then_crash(kind: Kind, rows: Sequence[Row], token: str) -> None:
        store.insert(kind, rows, token)
        raise Crash

    with pytest.raises(Crash):
        spool.replay(insert_then_crash)
    del spool

    reopened = Spool(tmp_path, max_bytes=1 << 20)
    assert reopened.pending_entries == 2
    assert reopened.replay(store.insert) == 2
    assert store.attempts == ["token-1", "token-1", "token-2"]
    assert store.scrape_times() == [1, 2]


def test_a_round_spooled_whole_replays_its_statuses_after_its_samples_and_stays_until_both_are_in(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    status = TargetStatus(1.0, "vela-001:9400", "vela-001", True, 0.02, 1, "")
    assert spool.put("samples", "round-1", [scrape(1)], statuses=[status])
    store = FakeStore()

    def targets_down(kind: Kind, rows: Sequence[Row], token: str) -> None:
        if kind == "targets":
            raise StoreUnavailable("fake store: down after the samples")
        store.insert(kind, rows, token)

    assert spool.replay(targets_down) == 0
    assert (spool.pending_entries, store.attempts) == (1, ["round-1"])
    reopened = Spool(tmp_path, max_bytes=1 << 20)  # a restart finds the round whole
    assert reopened.replay(store.insert) == 1
    assert store.attempts == ["round-1", "round-1", "round-1/targets"]  # the samples' repeat: one token
    stored = [(kind, rows) for kind, rows, _ in store.stored]
    assert stored == [("samples", [scrape(1)]), ("targets", [status])]
    with pytest.raises(ValueError, match="statuses go with a batch of samples"):
        spool.put("steps", "t", [StepRecord(1.0, "job", 0, "vela-001", 1, 1.0)], statuses=[status])


def test_refused_batch_is_kept_for_an_operator_and_the_replay_goes_on(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    put_scrapes(spool, [1, 2, 3])
    store = FakeStore()

    def refuse_second(kind: Kind, rows: Sequence[Row], token: str) -> None:
        store.refusing = token == "token-2"
        store.insert(kind, rows, token)

    assert spool.replay(refuse_second) == 2
    assert store.scrape_times() == [1, 3]
    assert spool.rejected_total == 1
    [kept] = spool_files(spool, "rejected")
    del spool

    reopened = Spool(tmp_path, max_bytes=1 << 20)
    assert reopened.pending_entries == 0  # never replayed again
    assert reopened.set_aside_bytes == (tmp_path / "rejected" / kept).stat().st_size


def test_set_aside_files_make_room_before_any_pending_batch_is_dropped(tmp_path):
    size = one_entry_bytes(tmp_path)
    spool = Spool(tmp_path / "spool", max_bytes=3 * size)
    spool.reject("samples", "refused", [scrape(0)], "type mismatch")
    put_scrapes(spool, [1, 2, 3])

    assert spool_files(spool, "rejected") == []
    assert spool.dropped_total == 0
    assert spool.pending_entries == 3


def test_disk_failure_drops_the_batch_and_leaves_no_partial_file(tmp_path, monkeypatch):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    put_scrapes(spool, [1])

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", failing_fsync)
        assert not spool.put("samples", "lost", [scrape(2)])
    assert spool.dropped_total == 1
    assert len(spool_files(spool)) == 1
    put_scrapes(spool, [3])
    store = FakeStore()
    spool.replay(store.insert)
    assert store.scrape_times() == [1, 3]


def test_puts_during_a_replay_are_all_stored_once_in_order(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    store = FakeStore()
    times = list(range(300))
    putter = threading.Thread(target=put_scrapes, args=(spool, times))
    putter.start()
    while putter.is_alive() or spool.pending_entries:
        spool.replay(store.insert)
    putter.join()

    assert store.scrape_times() == times
    assert spool.replayed_total == len(times)


# The writer


@pytest.fixture
def writers() -> Iterator[Callable[..., Writer]]:
    """Makes writers and closes every one at the end, so no replay thread outlives its test."""
    made: list[Writer] = []

    def make(store: FakeStore, spool: Spool, **options) -> Writer:
        options.setdefault("backoff", Backoff(0.001, 0.01))
        made.append(Writer(store, spool, **options))
        return made[-1]

    yield make
    for writer in made:
        writer.close()


def metric(writer: Writer, name: str, **labels: str) -> float:
    [value] = [s.value for s in samples_of(writer)[name] if all(s.labels[k] == v for k, v in labels.items())]
    return value


def test_outage_then_recovery_stores_every_batch_once_in_order(tmp_path, writers):
    store = FakeStore()
    writer = writers(store, Spool(tmp_path, max_bytes=1 << 20))
    for ts in range(10):
        writer.write("samples", [scrape(ts)])
    store.down = True
    for ts in range(10, 20):
        writer.write("samples", [scrape(ts)])
    assert metric(writer, "fleetlens_hub_spool_entries") >= 10
    store.down = False
    for ts in range(20, 30):  # behind the spooled ones, even while the store is up again
        writer.write("samples", [scrape(ts)])
    wait_until(lambda: writer.spool.pending_entries == 0)

    assert store.scrape_times() == list(range(30))
    assert metric(writer, "fleetlens_hub_store_inserted_rows_total", kind="samples") == 30
    assert (
        metric(writer, "fleetlens_hub_store_insert_failures_total", kind="samples", reason="unavailable") >= 1
    )
    assert metric(writer, "fleetlens_hub_spool_replayed_entries_total") >= 10
    assert metric(writer, "fleetlens_hub_spool_bytes", state="pending") == 0


def test_writer_replays_what_an_earlier_hub_left_without_new_writes(tmp_path, writers):
    put_scrapes(Spool(tmp_path, max_bytes=1 << 20), [1, 2, 3])
    store = FakeStore()
    writer = writers(store, Spool(tmp_path, max_bytes=1 << 20))
    wait_until(lambda: writer.spool.pending_entries == 0)
    assert store.scrape_times() == [1, 2, 3]


def test_refused_write_is_set_aside_not_retried_and_later_writes_go_on(tmp_path, writers):
    store = FakeStore()
    store.refusing = True
    writer = writers(store, Spool(tmp_path, max_bytes=1 << 20))
    writer.write("targets", [TargetStatus(1.0, "vela-001:9400", "vela-001", True, 0.02, 3, "")])
    store.refusing = False
    writer.write("samples", [scrape(2)])
    writer.close()

    assert len(store.attempts) == 2
    assert store.scrape_times() == [2]
    assert len(spool_files(writer.spool, "rejected")) == 1
    assert metric(writer, "fleetlens_hub_store_insert_failures_total", kind="targets", reason="rejected") == 1
    assert metric(writer, "fleetlens_hub_spool_set_aside_total", reason="rejected") == 1


def test_replays_wait_longer_after_each_failure_and_start_over_after_success(tmp_path, writers):
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(0.001)

    store = FakeStore()
    backoff = Backoff(initial_s=0.1, maximum_s=0.4)
    writer = writers(store, Spool(tmp_path, max_bytes=1 << 20), backoff=backoff, sleep=sleep)
    store.down = True
    writer.write("samples", [scrape(1)])
    wait_until(lambda: len(waits) >= 5)
    store.down = False
    wait_until(lambda: writer.spool.pending_entries == 0)
    assert waits[:5] == [0.1, 0.2, 0.4, 0.4, 0.4]

    store.down = True
    tried = len(waits)
    writer.write("samples", [scrape(2)])
    wait_until(lambda: len(waits) > tried)
    assert waits[tried] == 0.1


def test_insert_latency_is_a_histogram_per_kind(tmp_path, writers):
    now = [0.0]

    class SlowStore(FakeStore):
        def insert(self, kind: Kind, rows: Sequence[Row], token: str) -> int:
            now[0] += 0.3
            return super().insert(kind, rows, token)

    writer = writers(SlowStore(), Spool(tmp_path, max_bytes=1 << 20), clock=lambda: now[0])
    writer.write("steps", [StepRecord(1.0, "job", 0, "vela-001", 1, 1.0)])
    writer.write("steps", [StepRecord(2.0, "job", 0, "vela-001", 2, 1.0)])

    buckets = {
        s.labels["le"]: s.value
        for s in samples_of(writer)["fleetlens_hub_store_insert_duration_seconds_bucket"]
        if s.labels["kind"] == "steps"
    }
    assert buckets["0.25"] == 0 and buckets["0.5"] == 2 and buckets["+Inf"] == 2
    assert metric(writer, "fleetlens_hub_store_insert_duration_seconds_sum", kind="steps") == pytest.approx(
        0.6
    )


def test_rows_of_a_type_no_store_insert_takes_are_a_clear_error_not_stored_nor_spooled(tmp_path, writers):
    store = FakeStore()
    writer = writers(store, Spool(tmp_path, max_bytes=1 << 20))
    with pytest.raises(UnknownRecordType, match="no store insert takes SilenceRow rows"):
        writer.write("steps", [SilenceRow("s1", "[]", 0.0, 1.0, "ops", "maintenance", 0.0)])
    assert store.attempts == [] and writer.spool.pending_entries == 0

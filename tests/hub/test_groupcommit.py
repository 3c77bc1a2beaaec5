"""Concurrent remote write requests written as one group through the real writer and store."""

from __future__ import annotations

import threading
from pathlib import Path

from analytics.store import Store
from analytics.store.records import ScrapeBatch, TargetStatus
from hub.groupcommit import GroupCommit, merged
from hub.remote_write import Received
from hub.spool import Spool
from hub.writer import Writer, Written


class CountingWriter:
    """The real writer, counting its writes per kind; `full` makes it answer as a full spool would."""

    def __init__(self, writer: Writer) -> None:
        self.writer = writer
        self.writes: list[tuple[str, int]] = []
        self.full = False

    def write_round(self, batches: list, statuses: list, **options: object) -> Written:
        self.writes += [("samples", len(batches)), ("targets", len(statuses))]
        return Written.DROPPED if self.full else self.writer.write_round(batches, statuses, **options)


def request(i: int, ts: float = 1_796_000_000.0) -> Received:
    batch = ScrapeBatch(
        f"10.0.0.{i}:9400", f"vela-{i:03d}", ts, ["DCGM_FI_DEV_GPU_TEMP"], [{"gpu": "0"}], [40.0 + i]
    )
    status = TargetStatus(ts, f"10.0.0.{i}:9400", f"vela-{i:03d}", True, 0.01, 1)
    return Received(token=f"request-{i}", batches=[batch], statuses=[status], samples=2)


def commit_at_once(groups: GroupCommit, requests: list[Received]) -> list[bool]:
    outcomes: list[bool] = [False] * len(requests)

    def send(index: int) -> None:
        outcomes[index] = groups.commit(requests[index])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return outcomes


def test_requests_arriving_together_are_one_insert_per_table_and_a_retry_is_not_stored_again(
    store: Store, tmp_path: Path
):
    writer = CountingWriter(Writer(store, Spool(tmp_path / "spool", 1 << 20)))
    groups = GroupCommit(writer, linger_s=0.5)
    assert commit_at_once(groups, [request(i) for i in range(8)]) == [True] * 8
    assert writer.writes == [("samples", 8), ("targets", 8)]
    assert store.query("SELECT count() FROM metrics").rows == [(8,)]

    assert groups.commit(request(3))  # the sender lost our answer and sends it again
    assert writer.writes == [("samples", 8), ("targets", 8)]
    assert store.query("SELECT count() FROM metrics").rows == [(8,)]
    writer.writer.close()


def test_every_request_of_a_group_the_spool_could_not_keep_is_told_so(store: Store, tmp_path: Path):
    writer = CountingWriter(Writer(store, Spool(tmp_path / "spool", 1 << 20)))
    writer.full = True
    groups = GroupCommit(writer, linger_s=0.3)
    assert commit_at_once(groups, [request(i) for i in range(4)]) == [False] * 4
    writer.full = False
    assert groups.commit(request(1))  # not remembered as written: its retry is written
    assert store.query("SELECT count() FROM metrics").rows == [(1,)]
    writer.writer.close()


def test_a_group_is_written_once_it_holds_enough_samples_without_waiting_out_the_linger(
    store: Store, tmp_path: Path
):
    writer = CountingWriter(Writer(store, Spool(tmp_path / "spool", 1 << 20)))
    groups = GroupCommit(writer, linger_s=3600, full_samples=6 * 2)
    assert commit_at_once(groups, [request(i) for i in range(6)]) == [True] * 6
    assert writer.writes == [("samples", 6), ("targets", 6)]
    assert store.query("SELECT count() FROM metrics").rows == [(6,)]
    writer.writer.close()


def test_pieces_of_one_scrape_from_several_requests_become_one_batch_in_one_order_per_series():
    series = [{"gpu": str(i), "instance": "10.0.0.1:9400"} for i in range(6)]

    def piece(order: list[int], ts: float = 1_796_000_000.0) -> ScrapeBatch:
        names = [f"m{i % 2}" for i in order]
        return ScrapeBatch(
            "10.0.0.1:9400", "vela-001", ts, names, [series[i] for i in order], [*map(float, order)]
        )

    first = merged([piece([3, 0, 5]), piece([1, 4, 2])])
    second = merged([piece([2, 5, 1]), piece([0], 1_796_000_001.0), piece([0, 4, 3])])
    assert [len(batch) for batch in first] == [6] and [len(batch) for batch in second] == [6, 1]
    assert (first[0].names, first[0].labels) == (second[0].names, second[0].labels)  # as the store's memo
    for batch in (*first, *second):
        for name, labels, value in zip(batch.names, batch.labels, batch.values, strict=True):
            assert (name, labels) == (f"m{int(value) % 2}", series[int(value)])

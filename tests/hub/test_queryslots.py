"""QuerySlots: a client holding its slots delays only itself, a freed slot goes to the client running the
fewest, a wait ends in SlotsBusy with when to retry, and no client queues without bound."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.errors import SlotsBusy
from hub.queryslots import WAITING_PER_SLOT, QuerySlots

LONG = 600.0  # deadline of a query that holds its slot for the whole test


def later(seconds: float = LONG) -> float:
    return time.monotonic() + seconds


def take(slots: QuerySlots, client: str) -> None:
    """One query of `client`'s, gone as soon as it has its slot."""
    with slots.slot(client, later()):
        pass


@contextmanager
def held(slots: QuerySlots, *clients: str) -> Iterator[None]:
    """Each of `clients` holds one slot until the block ends."""
    with ExitStack() as stack:
        for client in clients:
            stack.enter_context(slots.slot(client, later()))
        yield


class Waiting(threading.Thread):
    """A request that waits for a slot in a thread of its own and notes when it got one (or SlotsBusy)."""

    def __init__(self, slots: QuerySlots, client: str, granted: list[str], release: threading.Event) -> None:
        super().__init__(daemon=True)
        self.slots, self.client, self.granted, self.release = slots, client, granted, release
        self.refused: SlotsBusy | None = None

    def run(self) -> None:
        try:
            with self.slots.slot(self.client, later()):
                self.granted.append(self.client)
                self.release.wait(30)
        except SlotsBusy as busy:
            self.refused = busy


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.005)


def test_a_client_holding_its_slots_does_not_delay_another():
    slots = QuerySlots(total=4, per_client=2, queue_s=0)
    with held(slots, "a", "a"):
        with pytest.raises(SlotsBusy):
            take(slots, "a")
        with slots.slot("b", later()):  # at once: queue_s=0 would refuse any wait
            assert slots.running == 3


def test_a_freed_slot_goes_to_the_client_running_the_fewest_then_the_earliest():
    slots = QuerySlots(total=2, per_client=2, queue_s=30)
    granted: list[str] = []
    release = threading.Event()
    first = ExitStack()
    first.enter_context(slots.slot("a", later()))
    with held(slots, "a"):
        a_again = Waiting(slots, "a", granted, release)  # arrives first, but its client runs two
        a_again.start()
        wait_until(lambda: slots.waiting == 1)
        b = Waiting(slots, "b", granted, release)
        b.start()
        wait_until(lambda: slots.waiting == 2)
        first.close()
        wait_until(lambda: granted == ["b"])
        assert slots.waiting == 1  # a's waits for a slot of its own
    wait_until(lambda: granted == ["b", "a"])
    release.set()
    for thread in (a_again, b):
        thread.join(10)
    assert slots.running == 0


def test_a_wait_past_queue_s_is_refused_with_when_a_slot_frees():
    slots = QuerySlots(total=4, per_client=1, queue_s=0.05)
    with slots.slot("a", time.monotonic() + 7.2), pytest.raises(SlotsBusy) as refused:
        take(slots, "a")
    assert "no slot came free in" in str(refused.value)
    assert "this client runs 1 queries of its 1 (hub.query_slots_per_client)" in str(refused.value)
    assert 1 <= refused.value.retry_after_s <= 8  # by the holding query's deadline, in whole seconds
    assert (slots.running, slots.waiting) == (0, 0)


def test_a_client_queues_a_few_requests_at_most():
    slots = QuerySlots(total=1, per_client=1, queue_s=30)
    granted: list[str] = []
    release = threading.Event()
    with held(slots, "a"):
        queued = [Waiting(slots, "a", granted, release) for _ in range(WAITING_PER_SLOT)]
        for thread in queued:
            thread.start()
        wait_until(lambda: slots.waiting == WAITING_PER_SLOT)
        with pytest.raises(SlotsBusy, match=f"has {WAITING_PER_SLOT} queries waiting"):
            take(slots, "a")
    wait_until(lambda: len(granted) == 1)
    release.set()
    for thread in queued:
        thread.join(10)
    assert len(granted) == WAITING_PER_SLOT


@settings(max_examples=25, deadline=None)
@given(
    total=st.integers(1, 4),
    per_client=st.integers(1, 4),
    clients=st.lists(st.sampled_from("abc"), min_size=1, max_size=12),
)
def test_no_more_run_at_once_than_the_slots_allow(total: int, per_client: int, clients: list[str]):
    slots = QuerySlots(total=total, per_client=min(per_client, total), queue_s=10)
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    lock = threading.Lock()

    def query(client: str) -> None:
        try:
            with slots.slot(client, later()):
                with lock:
                    running[client] = running.get(client, 0) + 1
                    most[client] = max(most.get(client, 0), running[client])
                    most["all"] = max(most.get("all", 0), sum(running.values()))
                time.sleep(0.002)
                with lock:
                    running[client] -= 1
        except SlotsBusy:  # more of its requests waiting than a client may have
            pass

    threads = [threading.Thread(target=query, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert most["all"] <= total
    assert all(count <= slots.per_client for client, count in most.items() if client != "all")
    assert (slots.running, slots.waiting) == (0, 0)


def test_nonsense_slots_are_refused():
    with pytest.raises(ValueError, match="per_client <= total"):
        QuerySlots(total=2, per_client=3)
    with pytest.raises(ValueError, match="queue_s"):
        QuerySlots(queue_s=-1)

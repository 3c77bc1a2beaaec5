"""The placements table: what each scheduler says runs where, dated as jobs come and go."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.errors import StoreRejected
from analytics.store import Store
from analytics.store.records import Placement
from analytics.store.topology import Changes
from analytics.topology.model import Source

T0 = 1_767_000_000.0
EXAMPLES = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
_examples = itertools.count()


def job(
    name: str, node: str, gpus: tuple[int, ...] = (0, 1), since: float = T0, until: float | None = None
) -> Placement:
    return Placement(Source.SLURM, name, "alice", node, gpus, since, until)


def rows(store: Store) -> int:
    return store.query("SELECT count() FROM placements").rows[0][0]


def test_a_running_job_opens_at_its_start_and_saying_it_again_writes_nothing(store: Store) -> None:
    said = [job("42", "vela-001"), job("42", "vela-002")]
    assert store.replace_placements(Source.SLURM, said, T0 + 5) == Changes(opened=2, closed=0, unchanged=0)
    written = rows(store)
    assert store.replace_placements(Source.SLURM, reversed(said), T0 + 65) == Changes(0, 0, 2)
    assert rows(store) == written
    assert store.placements_between(T0, T0 + 100) == said
    assert store.placements_between(T0, T0 + 100, node="vela-002") == [said[1]]


def test_a_job_said_to_have_ended_ends_at_its_own_end_and_stays_ended(store: Store) -> None:
    store.replace_placements(Source.SLURM, [job("42", "vela-001")], T0 + 5)
    ended = job("42", "vela-001", until=T0 + 30)
    assert store.replace_placements(Source.SLURM, [ended], T0 + 40) == Changes(0, 1, 0)
    assert store.replace_placements(Source.SLURM, [ended], T0 + 50) == Changes(0, 0, 1)
    assert store.placements_between(T0, T0 + 100, job="42") == [ended]
    assert store.placements_between(T0 + 31, T0 + 100) == []


def test_a_job_no_longer_listed_ends_now_and_one_seen_only_ended_is_stored_whole(store: Store) -> None:
    store.replace_placements(Source.SLURM, [job("42", "vela-001")], T0 + 5)
    short = job("43", "vela-002", since=T0 + 10, until=T0 + 20)
    assert store.replace_placements(Source.SLURM, [short], T0 + 60) == Changes(1, 2, 0)
    assert store.placements_between(T0, T0 + 100) == [job("42", "vela-001", until=T0 + 60), short]


def test_sources_are_replaced_apart(store: Store) -> None:
    pod = Placement(Source.KUBERNETES, "team/pod-a", "", "vela-001", (3,), T0)
    store.replace_placements(Source.KUBERNETES, [pod], T0)
    store.replace_placements(Source.SLURM, [], T0 + 10)
    assert store.placements_between(T0, T0 + 20) == [pod]


def test_a_clock_gone_back_or_a_placement_of_another_source_is_refused(store: Store) -> None:
    store.replace_placements(Source.SLURM, [job("42", "vela-001", since=T0 + 5)], T0 + 5)
    with pytest.raises(StoreRejected, match="clock"):
        store.replace_placements(Source.SLURM, [], T0)
    with pytest.raises(StoreRejected, match="k8s"):
        store.replace_placements(Source.KUBERNETES, [job("42", "vela-001")], T0 + 10)
    assert store.placements_between(T0, T0 + 20) == [job("42", "vela-001", since=T0 + 5)]


# polls of a running set: each the (job, node) pairs squeue lists as running then
polls = st.lists(
    st.frozensets(st.tuples(st.sampled_from("abc"), st.sampled_from(("vela-001", "vela-002")))), max_size=6
)


@EXAMPLES
@given(polls)
def test_any_sequence_of_polls_reads_back_as_the_intervals_each_pair_was_listed(
    store: Store, said: list[frozenset[tuple[str, str]]]
) -> None:
    start = T0 + 1000 * next(_examples)  # each example after the last, its jobs its own
    store.replace_placements(Source.SLURM, [], start)
    prefix = f"{start:.0f}-"
    expected: list[Placement] = []
    opened: dict[tuple[str, str], float] = {}
    for index, running in enumerate([*said, frozenset()]):
        now = start + 10 * (index + 1)
        placements = [job(prefix + name, node, since=opened.get((name, node), now)) for name, node in running]
        changes = store.replace_placements(Source.SLURM, placements, now)
        assert store.replace_placements(Source.SLURM, placements, now) == Changes(0, 0, len(running))
        ended = [pair for pair in opened if pair not in running]
        assert (changes.opened, changes.closed) == (len(running - opened.keys()), len(ended))
        expected += [
            job(prefix + name, node, since=opened.pop((name, node)), until=now) for name, node in ended
        ]
        opened.update({pair: now for pair in running if pair not in opened})
    stored = [p for p in store.placements_between(start, start + 1000) if p.job.startswith(prefix)]
    assert sorted(stored, key=repr) == sorted(expected, key=repr)

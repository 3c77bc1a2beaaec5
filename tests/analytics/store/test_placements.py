"""The placements table: what each scheduler says runs where, dated as jobs come and go."""

from __future__ import annotations

import pytest

from analytics.errors import StoreRejected
from analytics.store import Store
from analytics.store.records import Placement
from analytics.store.topology import Changes
from analytics.topology.model import Source

T0 = 1_767_000_000.0


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

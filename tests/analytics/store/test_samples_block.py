"""The samples insert's Native block on real chDB: metric and node go as LowCardinality(String), numbered in
dictionaries that the store keeps across inserts and starts over past MAX_KEYS names; what is read back is
what was sent, whatever the names (empty, unicode, NUL, one name for every row, many distinct)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.store import Store
from analytics.store.clickhouse import MAX_KEYS, KnownSeries, series_id
from analytics.store.records import ScrapeBatch

NOW = time.time() // 60 * 60 - 600  # recent enough that no TTL drops it

EXAMPLES = itertools.count(1)
ODD_NAMES = st.sampled_from(["", "m", "ü", "日本語", "a\x00b", " ", "DCGM_FI_DEV_GPU_TEMP"]) | st.text(
    max_size=6
)


def sent_rows(rounds: Sequence[Sequence[ScrapeBatch]]) -> list[tuple]:
    return sorted(
        (series_id(name, b.node, labels), name, b.node, round(b.ts * 1000), value)
        for batches in rounds
        for b in batches
        for name, labels, value in zip(b.names, b.labels, b.values, strict=True)
    )


def stored_rows(store: Store, since: float | None = None) -> list[tuple]:
    """The samples stored from `since` (unix seconds) for ten seconds, or all of them."""
    where = (
        ""
        if since is None
        else f" WHERE ts >= toDateTime64({since}, 3) AND ts < toDateTime64({since + 10}, 3)"
    )
    sql = f"SELECT series_id, metric, node, toUnixTimestamp64Milli(ts), value FROM samples{where}"
    return sorted(store.query(sql, max_rows=1_000_000).rows)


@st.composite
def scrape_rounds(draw: st.DrawFn) -> list[list[ScrapeBatch]]:
    """Rounds of scrapes of a few targets, each scrape's names drawn anew or its target's last again (so
    that the store's reuse of a target's encoded columns is exercised beside new dictionary entries)."""
    # each target its own node, as in a fleet: two targets sending one node's series at one time would be
    # one sample sent twice, which the store keeps once (analytics.store.ledger)
    targets = draw(
        st.lists(
            st.tuples(st.sampled_from("abc"), ODD_NAMES),
            min_size=1,
            max_size=3,
            unique_by=(lambda target: target[0], lambda target: target[1]),
        )
    )
    last: dict[tuple[str, str], list[str]] = {}
    rounds = []
    for r in range(draw(st.integers(1, 4))):
        batches = []
        for target, node in targets:
            names = last.get((target, node))
            if names is None or draw(st.booleans()):
                names = draw(st.lists(ODD_NAMES, max_size=8))
            last[target, node] = names
            labels = [{"i": str(i)} for i in range(len(names))]  # distinct series for equal names
            values = [r * 100.0 + i for i in range(len(names))]
            batches.append(ScrapeBatch(f"{target}:1", node, NOW + r, names, labels, values))
        rounds.append(batches)
    return rounds


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=scrape_rounds(), max_keys=st.sampled_from([0, 3, MAX_KEYS]))
def test_samples_read_back_as_sent_whatever_the_names(store: Store, rounds: list, max_keys: int) -> None:
    store._series = KnownSeries(max_keys=max_keys)  # dictionaries that start over often, or never
    since = (
        NOW - next(EXAMPLES) * 10
    )  # the store is the test's: each example's rows have seconds of their own
    rounds = [[replace(b, ts=since + b.ts - NOW) for b in batches] for batches in rounds]
    for i, batches in enumerate(rounds):
        store.insert_samples(batches, token=f"{since}-{i}")
    assert stored_rows(store, since) == sent_rows(rounds)


def test_more_names_than_the_dictionary_keeps_read_back_as_sent_and_it_starts_over(store: Store) -> None:
    many = [f"metric_{i}" for i in range(MAX_KEYS + 10)]  # past MAX_KEYS, and past UInt16 numbers
    rounds = [
        [ScrapeBatch("a:1", "vela-001", NOW, many, [{}] * len(many), [float(i) for i in range(len(many))])],
        [ScrapeBatch("b:1", "vela-002", NOW + 1, ["one"] * 3, [{"i": str(i)} for i in range(3)], [1.0] * 3)],
    ]
    for i, batches in enumerate(rounds):
        store.insert_samples(batches, token=f"round-{i}")
        if i == 0:
            assert len(store._series.metrics) == len(many)
    assert len(store._series.metrics) == 1  # started over before the second insert
    assert stored_rows(store) == sent_rows(rounds)

"""History is kept or refused, never lost: inserts past a table's retention on a real chDB store.

ClickHouse drops rows past their TTL at the insert or the next merge and still counts them as written;
these tests show the store never sends such rows (it refuses and reports them), that step rows kept on
purpose (keep_until) outlive steps_days through merges, and that a store from before keep_until migrates.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import clickhouse_connect
import pytest

from analytics.errors import StoreRejected
from analytics.store import Retention, Store, schema
from analytics.store.records import ScrapeBatch, TargetStatus
from analytics.store.retention import (
    DAY_S,
    KEEP_DAYS_MAX,
    Cutoff,
    check_keep_days,
    import_refusal,
    keep_until,
)
from analytics.store.schema import Expiry, Layout
from collectors.steprecord import StepRecord
from tests.analytics.store.test_schema import build

NOW = time.time() // 60 * 60
YEAR_AGO = NOW - 330 * DAY_S  # "11 months ago", as in the issue


def steps(start: float, count: int, job: str = "old-job") -> list[StepRecord]:
    """`count` steps of one rank, one a minute from `start`."""
    return [StepRecord(start + 60 * i, job, 0, "vela-001", i, 46.0, compute_s=40.0) for i in range(count)]


def stored_steps(store: Store) -> int:
    return store.query("SELECT count() FROM steps").rows[0][0]


def merge(chdb_dir: Path, store: Store, table: str) -> None:
    """OPTIMIZE FINAL: a merge, where ClickHouse applies TTLs to what an insert left."""
    client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
    try:
        client.command(f"OPTIMIZE TABLE {store.database}.{table} FINAL")
    finally:
        client.close()


# --- the cutoff -------------------------------------------------------------------------------------------


def test_the_cutoff_names_the_table_the_setting_and_an_iso_time() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
    cutoff = Cutoff.of(Retention(steps_days=30), "steps", now)
    assert cutoff.at == now - 30 * DAY_S
    assert cutoff.describe() == "older than the steps retention cutoff 2026-11-01T00:00:00Z (steps_days=30)"


def test_a_sample_is_refused_past_raw_days_though_the_rollups_outlive_it() -> None:
    """The rollups are rolled from raw samples, which a sample past raw_days would never be."""
    cutoff = Cutoff.of(Retention(raw_days=15, rollup_days=400), "samples", NOW)
    assert (cutoff.setting, cutoff.days) == ("raw_days", 15)


@pytest.mark.parametrize("value", [0, -1, KEEP_DAYS_MAX + 1, "ten", "", 1.5, True, None])
def test_keep_days_are_whole_days_within_bounds(value: object) -> None:
    with pytest.raises(ValueError, match=f"keep_days: a whole number of days from 1 to {KEEP_DAYS_MAX}"):
        check_keep_days(value)


def test_keep_until_is_days_from_now() -> None:
    assert keep_until(7, 1000.5) == 1001 + 7 * DAY_S
    assert check_keep_days("365") == 365


def test_an_import_refusal_counts_every_record() -> None:
    cutoff = Cutoff.of(Retention(steps_days=30), "steps", 1_795_000_000.0)
    assert import_refusal(704, 704, cutoff).startswith("704 refused: older than the steps retention cutoff")
    mixed = import_refusal(800, 704, cutoff)
    assert mixed.startswith("800 refused: 704 of them older than") and "whole or not at all" in mixed


# --- inserts ----------------------------------------------------------------------------------------------


def test_the_ttl_alone_drops_old_rows_that_an_insert_counted_as_written(store: Store, chdb_dir: Path) -> None:
    """The failure this guards against, on the engine itself: a year-old row sent past the store's check
    is counted as written and gone after the next merge."""
    client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
    try:
        summary = client.insert(
            f"{store.database}.steps",
            [[round(YEAR_AGO * 1000)], ["old-job"], [0], ["n"], [1], [1.0], [1], ["jsonl"]],
            column_names=["ts", "job", "rank", "node", "step", "duration_s", "steps", "source"],
            column_oriented=True,
        )
    finally:
        client.close()
    assert summary.written_rows == 1
    merge(chdb_dir, store, "steps")
    assert stored_steps(store) == 0


def test_old_steps_are_refused_and_reported_never_sent(store: Store) -> None:
    rows = steps(YEAR_AGO, 5) + steps(NOW - 3600, 3, job="recent-job")
    inserted = store.insert_steps(rows, token="mixed")
    assert (inserted, inserted.refused) == (3, 5)
    assert inserted + inserted.refused == len(rows)
    assert inserted.describe().startswith("5 refused: older than the steps retention cutoff ")
    assert inserted.describe().endswith("(steps_days=90)")
    assert store.query("SELECT DISTINCT job FROM steps").rows == [("recent-job",)]


def test_steps_kept_on_purpose_outlive_steps_days_through_merges(store: Store, chdb_dir: Path) -> None:
    kept = NOW + 30 * DAY_S
    inserted = store.insert_steps(steps(YEAR_AGO, 5), token="kept", keep_until=kept)
    assert (inserted, inserted.refused) == (5, 0)
    merge(chdb_dir, store, "steps")
    rows = store.query("SELECT count(), min(toUnixTimestamp(keep_until)) FROM steps").rows
    assert rows == [(5, int(kept))]


def test_a_keep_until_that_passed_keeps_nothing_and_the_cutoff_applies(store: Store) -> None:
    """A kept batch that waited in a spool past its keep_until: split by the cutoff like any."""
    inserted = store.insert_steps(
        steps(YEAR_AGO, 2) + steps(NOW, 1, "now"), token="late", keep_until=NOW - DAY_S
    )
    assert (inserted, inserted.refused) == (1, 2)


@pytest.mark.parametrize("bad", [float("nan"), -1.0, 2.0**33, "tomorrow", True])
def test_a_keep_until_that_is_no_time_is_rejected(store: Store, bad: object) -> None:
    with pytest.raises(StoreRejected, match="keep_until must be unix seconds"):
        store.insert_steps(steps(NOW, 1), token="bad", keep_until=bad)
    assert stored_steps(store) == 0


def test_old_samples_and_targets_are_refused_and_counted(store: Store) -> None:
    old = NOW - 401 * DAY_S
    batch = ScrapeBatch(
        "vela-001:9400", "vela-001", old, ["DCGM_FI_DEV_GPU_TEMP"] * 2, [{}, {"gpu": "1"}], [1, 2]
    )
    fresh = dataclasses.replace(batch, ts=NOW)
    inserted = store.insert_samples([batch, fresh], token="samples")
    assert (inserted, inserted.refused, inserted.cutoff.setting) == (2, 2, "raw_days")
    status = TargetStatus(NOW - 16 * DAY_S, "vela-001:9400", "vela-001", True, 0.1, 2)
    targets = store.insert_targets([status, dataclasses.replace(status, ts=NOW)], token="targets")
    assert (targets, targets.refused, targets.cutoff.setting) == (1, 1, "targets_days")
    counts = store.query("SELECT (SELECT count() FROM samples), (SELECT count() FROM targets)").rows
    assert counts == [(2, 1)]


# --- migration --------------------------------------------------------------------------------------------


def open_store_from_before_keep_until(chdb_dir: Path) -> str:
    """A database as fleetlens built it before migration 5: steps without keep_until, TTL steps_days only,
    schema version 4, one step stored; returns its name."""
    database = f"test_{uuid.uuid4().hex[:12]}"
    layout = Layout(database)
    old_steps = dataclasses.replace(
        schema.STEPS,
        columns=schema.STEPS.columns.replace(f",\n    {schema.STEPS_KEEP_UNTIL}", ""),
        expiry=Expiry("toDateTime(ts)", "steps_days"),
    )
    old = [
        dataclasses.replace(m, objects=tuple(old_steps if o is schema.STEPS else o for o in m.objects))
        for m in schema.MIGRATIONS
        if m.version <= 4
    ]
    client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
    try:
        build(client, layout, old)
        client.insert(
            f"{database}.steps",
            [[round(NOW * 1000)], ["before"], [0], ["n"], [1], [1.0], [1], ["jsonl"]],
            column_names=["ts", "job", "rank", "node", "step", "duration_s", "steps", "source"],
            column_oriented=True,
        )
        shown = client.query(f"SHOW CREATE TABLE {database}.steps").result_rows[0][0]
    finally:
        client.close()
    assert "keep_until" not in shown
    return database


def test_a_store_from_before_keep_until_migrates_and_keeps_its_rows(chdb_dir: Path) -> None:
    database = open_store_from_before_keep_until(chdb_dir)
    with Store.open(f"chdb://{chdb_dir}", database=database) as store:
        versions = store.query("SELECT version FROM schema_migrations ORDER BY version").rows
        assert (5,) in versions and versions[-1] == (schema.LATEST_VERSION,)
        assert store.query("SELECT job, toUnixTimestamp(keep_until) FROM steps").rows == [("before", 0)]
        client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
        try:
            shown = client.query(f"SHOW CREATE TABLE {database}.steps").result_rows[0][0]
        finally:
            client.close()
        assert "TTL greatest(toDateTime(ts) + toIntervalDay(90), keep_until)" in shown
        store.insert_steps(steps(YEAR_AGO, 3), token="kept", keep_until=NOW + DAY_S)
        merge(chdb_dir, store, "steps")
        assert stored_steps(store) == 4
    with Store.open(f"chdb://{chdb_dir}", database=database) as again:  # nothing to apply twice
        assert again.query("SELECT count() FROM schema_migrations WHERE version = 5").rows == [(1,)]

"""Store.query_frame: query()'s statement checks, limits and values, its result as columns."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from analytics.errors import QueryError
from analytics.store import Store
from analytics.store.records import ScrapeBatch
from tests.analytics.store.test_clickhouse import test_writes_and_outside_access_are_refused as refused_cases

NOW = time.time() - 60
REFUSED = [
    *next(mark.args[1] for mark in refused_cases.pytestmark if mark.name == "parametrize"),
    "SELECT * FROM system.one",
    "SELECT 1 SETTINGS readonly = 0",
]
PAST_LIMIT = "SELECT count() FROM numbers(1e12) WHERE sipHash64(number) % 7 = 3"
# (statement, max_seconds): a refused statement has ample time, as checking it takes the engine more than
# 0.3 s on a loaded machine (it then timed out instead of being refused); the one past the limit, 0.3 s
CASES = [*((sql, 30.0) for sql in REFUSED), (PAST_LIMIT, 0.3)]


def test_columns_hold_the_values_query_returns(store: Store) -> None:
    batches = [
        ScrapeBatch(
            "n:9100", f"node-{k % 3}", NOW + k, ["m", "m"], [{"gpu": "0"}, {"gpu": str(k)}], [k, k / 7]
        )
        for k in range(50)
    ]
    store.insert_samples(batches, token="frame")
    sql = (
        "SELECT series_id, toUnixTimestamp64Milli(ts) AS t, value, node FROM samples"
        " WHERE value >= {low:Float64} ORDER BY series_id, t"
    )
    rows = store.query(sql, parameters={"low": 3.0}, max_rows=1000)
    columns = store.query_frame(sql, parameters={"low": 3.0}, max_rows=1000)
    assert not columns.truncated and list(columns.frame.columns) == rows.columns
    assert list(columns.frame.itertuples(index=False, name=None)) == rows.rows


def test_text_maps_and_nulls_read_as_columns_hold_what_query_returns(store: Store) -> None:
    sql = (
        "SELECT CAST(number, 'String') AS text, map('gpu', toString(number), 'gpu', 'last') AS labels,"
        " if(number % 2 = 1, NULL, number / 4) AS maybe FROM numbers(4)"
    )
    rows = store.query(sql).rows
    columns = store.query_frame(sql).frame
    assert columns["text"].tolist() == [row[0] for row in rows] == ["0", "1", "2", "3"]
    assert columns["labels"].tolist() == [row[1] for row in rows] == [{"gpu": "last"}] * 4
    assert columns["maybe"].to_numpy().tolist()[::2] == [row[2] for row in rows][::2] == [0.0, 0.5]
    assert columns["maybe"].isna().tolist() == [False, True, False, True]


def test_a_type_without_a_column_is_refused_by_name(store: Store) -> None:
    with pytest.raises(QueryError, match=r"cannot be read as columns: .*union"):
        store.query_frame("SELECT CAST(1, 'Variant(UInt8, String)') AS v")


def test_at_most_max_rows_come_back_and_an_empty_result_keeps_its_columns(store: Store) -> None:
    cut = store.query_frame("SELECT number AS n FROM numbers(100)", max_rows=10)
    assert cut.truncated and cut.frame["n"].tolist() == list(range(10))
    empty = store.query_frame("SELECT series_id, value FROM samples WHERE 0")
    assert not empty.truncated and list(empty.frame.columns) == ["series_id", "value"] and empty.frame.empty


@pytest.mark.parametrize(("sql", "max_seconds"), CASES)
def test_what_query_refuses_query_frame_refuses_alike(
    store: Store, tmp_path: Path, sql: str, max_seconds: float
) -> None:
    out = tmp_path / "out.csv"
    with pytest.raises(QueryError) as by_rows:
        store.query(sql.format(out=out), max_seconds=max_seconds)
    with pytest.raises(QueryError) as by_columns:
        store.query_frame(sql.format(out=out), max_seconds=max_seconds)
    assert str(by_columns.value).split(":")[0] == str(by_rows.value).split(":")[0]  # a timeout says when
    assert not out.exists()

"""Store.query_numbers: query()'s checks and limits, its numeric columns as numpy arrays read from
ClickHouse's Native format (chDB's own output); and the Native reader on bodies cut or changed."""

from __future__ import annotations

from pathlib import Path

import clickhouse_connect
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors.base import read_numbers
from analytics.errors import NativeError, QueryError
from analytics.store import Store, native

# every type the reader takes, from rows past one block of chDB's output (65,409 rows a block)
TYPED_SQL = """
SELECT toUInt8(number % 256) AS u8, toUInt16(number) AS u16, toUInt32(number * 7) AS u32,
    toUInt64(number) * 1000003 AS u64, toInt8(number % 100 - 50) AS i8, toInt16(number % 3000 - 1500) AS i16,
    toInt32(toInt64(number) - 100000) AS i32, toInt64(number) * -7 AS i64, toFloat32(number / 3) AS f32,
    toFloat64(number) / 7 AS f64
FROM numbers({rows:UInt64})
"""
TYPES = {
    "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "i8": np.int8, "i16": np.int16,
    "i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64,
}  # fmt: skip


@pytest.mark.parametrize("rows", [0, 1, 150_000])
def test_numbers_hold_the_values_query_returns(store: Store, rows: int) -> None:
    found = store.query_numbers(TYPED_SQL, TYPES, parameters={"rows": rows}, max_rows=1_000_000)
    frame = store.query_frame(TYPED_SQL, parameters={"rows": rows}, max_rows=1_000_000).frame
    assert not found.truncated and list(found.columns) == list(TYPES)
    for name, dtype in TYPES.items():
        assert found.columns[name].dtype == dtype
        np.testing.assert_array_equal(found.columns[name], frame[name].to_numpy(dtype), name)
        assert not found.columns[name].flags.writeable
    if rows:
        assert found.columns["u64"][-1] == (rows - 1) * 1000003 and found.columns["f64"][-1] == (rows - 1) / 7


def test_rows_past_the_limit_are_cut_and_said(store: Store) -> None:
    found = store.query_numbers(TYPED_SQL, TYPES, parameters={"rows": 100}, max_rows=10)
    assert found.truncated and [len(column) for column in found.columns.values()] == [10] * len(TYPES)


@pytest.mark.parametrize(
    ("columns", "refused"),
    [
        ({"u8": np.uint8}, r"10 columns, expected 1 \(u8\)"),
        ({**TYPES, "u8": np.int8}, r"column 'u8' of type 'UInt8', expected 'u8' of int8"),
        ({"renamed" if name == "u8" else name: dtype for name, dtype in TYPES.items()}, r"column 'u8' of"),
    ],
)
def test_other_columns_or_types_are_refused_by_name(store: Store, columns: dict, refused: str) -> None:
    with pytest.raises(QueryError, match=refused):
        store.query_numbers(TYPED_SQL, columns, parameters={"rows": 3})


def test_text_is_refused_and_statements_are_checked_as_query_checks_them(store: Store) -> None:
    with pytest.raises(QueryError, match=r"column 'text' of type 'String'"):
        store.query_numbers("SELECT toString(number) AS text FROM numbers(3)", {"text": np.uint64})
    with pytest.raises(QueryError):
        store.query_numbers("INSERT INTO samples SELECT * FROM samples", {"x": np.uint64})


# a body's fuzzing: examples enough to cut and change every part of it
FUZZED = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def native_output(chdb_dir: Path, sql: str, rows: int) -> bytes:
    """chDB's own Native output of `sql` over `rows` rows (on the process's one chDB)."""
    session = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
    try:
        return session.raw_query(sql, parameters={"rows": rows}, fmt="Native")
    finally:
        session.close()


def damaged(body: bytes, data: st.DataObject) -> bytes:
    """`body` cut anywhere, up to three of the bytes left changed."""
    cut = data.draw(st.integers(0, len(body)))
    changed = bytearray(body[:cut])
    for at in data.draw(st.lists(st.integers(0, len(body) - 1), max_size=3)):
        if at < cut:
            changed[at] = data.draw(st.integers(0, 255))
    return bytes(changed)


@pytest.fixture(scope="module")
def body(chdb_dir: Path) -> bytes:
    """A real Native body of TYPED_SQL's two blocks."""
    return native_output(chdb_dir, TYPED_SQL, 70_000)


@FUZZED
@given(data=st.data())
def test_a_body_cut_or_changed_is_read_whole_or_refused(body: bytes, data: st.DataObject) -> None:
    """Cut anywhere, or bytes changed: the same columns as the whole body, other values in the same
    shapes, or NativeError saying where; never another exception, never a read past the body."""
    whole = native.numbers(body, TYPES)
    try:
        found = native.numbers(damaged(body, data), TYPES)
    except NativeError as error:
        assert "block" in str(error)
        return
    assert list(found) == list(whole)
    assert all(found[name].dtype == whole[name].dtype for name in TYPES)


# LowCardinality(String) as codes: 300 texts (two-byte indexes), "" among them, over three blocks
CODED_SQL = """
SELECT toLowCardinality(if(number % 300 = 7, '', concat('node-', toString(number % 300)))) AS node,
    toUInt64(number) AS n
FROM numbers({rows:UInt64})
"""
CODED = {"node": native.TEXT, "n": np.uint64}


@pytest.mark.parametrize("rows", [0, 5, 150_000])
def test_low_cardinality_text_is_read_as_codes_into_its_sorted_distinct_texts(
    store: Store, rows: int
) -> None:
    found = store.query_numbers(CODED_SQL, CODED, parameters={"rows": rows}, max_rows=1_000_000).columns
    frame = store.query_frame(CODED_SQL, parameters={"rows": rows}, max_rows=1_000_000).frame
    node = found["node"]
    assert isinstance(node, native.Coded) and len(node) == rows and not node.codes.flags.writeable
    assert node.texts.tolist() == sorted(set(frame["node"]))  # only texts some row has, each once
    assert node.texts[node.codes].tolist() == frame["node"].tolist()
    np.testing.assert_array_equal(found["n"], np.arange(rows, dtype=np.uint64))


def test_a_reader_without_native_reads_gets_the_same_codes(store: Store) -> None:
    """read_numbers on a Reader with query() alone (a HubClient, a fake) codes the text as a Store does."""

    class QueryOnly:
        def query(self, sql: str, *, parameters=None, max_rows: int = 10_000):
            return store.query(sql, parameters=parameters, max_rows=max_rows)

    parameters = {"rows": 1000}
    plain = read_numbers(QueryOnly(), CODED_SQL, CODED, parameters=parameters, max_rows=5000).columns
    direct = store.query_numbers(CODED_SQL, CODED, parameters=parameters, max_rows=5000).columns
    assert plain["node"].texts.tolist() == direct["node"].texts.tolist()
    np.testing.assert_array_equal(plain["node"].codes, direct["node"].codes)
    np.testing.assert_array_equal(plain["n"], direct["n"])


def test_text_asked_of_a_numeric_column_and_numbers_of_text_are_refused(store: Store) -> None:
    with pytest.raises(QueryError, match=r"column 'n' of type 'UInt64', expected 'n' of LowCardinality"):
        store.query_numbers(CODED_SQL, {"node": native.TEXT, "n": native.TEXT}, parameters={"rows": 3})
    with pytest.raises(QueryError, match=r"column 'node' of type 'LowCardinality\(String\)', expected"):
        store.query_numbers(CODED_SQL, {"node": np.uint64, "n": np.uint64}, parameters={"rows": 3})


@pytest.fixture(scope="module")
def coded_body(chdb_dir: Path) -> bytes:
    """A real Native body of CODED_SQL's three blocks."""
    return native_output(chdb_dir, CODED_SQL, 140_000)


@FUZZED
@given(data=st.data())
def test_a_coded_body_cut_or_changed_is_read_whole_or_refused(coded_body: bytes, data: st.DataObject) -> None:
    """As for numbers: a body with text, cut anywhere or bytes changed (a dictionary's length, an index
    past it, the index width, text that is not UTF-8), is read as columns of the same shapes or refused
    with NativeError saying where; every code found points into its texts."""
    try:
        found = native.numbers(damaged(coded_body, data), CODED)
    except NativeError as error:
        assert "block" in str(error)
        return
    node = found["node"]
    assert isinstance(node, native.Coded) and len(node) == len(found["n"])
    assert len(node.texts) == len(set(node.texts.tolist()))
    assert not len(node) or 0 <= node.codes.min() <= node.codes.max() < len(node.texts)

"""Queries from outside under ReadLimits (ReadSessions.query_json, what the hub's query API runs): the
attacks that took a hub's memory and CPU refused by ClickHouse naming the limit, an answer never over its
bytes however a value or a constant expands, no statement text that raises a limit, and a failed query's
unsent output never handed to the next query on its session."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import clickhouse_connect
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.errors import QueryError, QueryLimitExceeded
from analytics.store import Store, schema
from analytics.store.readonly import ReadLimits, ReadSessions

SMALL = ReadLimits(
    max_memory_bytes=32 << 20, max_rows_to_read=10_000, max_bytes_to_read=1 << 30, max_result_bytes=64 << 10
)
TIGHT_ANSWER = ReadLimits(max_memory_bytes=64 << 20, max_result_bytes=64 << 10)
MEMORY_PROBE = "SELECT length(groupArray(number)) FROM numbers(8000000)"  # 64 MiB of numbers in one array
ROWS_PROBE = "SELECT count() FROM numbers(100000)"  # reads 100,000 rows


@pytest.fixture
def reads(store: Store, chdb_dir: Path) -> Iterator[ReadSessions]:
    """The store's read sessions, one query at a time, so that a query after another reuses its session."""

    def connect(settings: dict) -> clickhouse_connect.driver.Client:
        return clickhouse_connect.get_client(
            interface="chdb", path=str(chdb_dir), database=store.database, settings=settings
        )

    sessions = ReadSessions(connect, store.database, schema.READABLE, max_concurrent=1)
    yield sessions
    sessions.close()


@pytest.mark.parametrize(
    ("sql", "limit"),
    [
        ("SELECT range(100000000)", "max_memory_bytes"),
        ("SELECT length(groupArray(number)) FROM numbers(80000000)", "max_memory_bytes"),
        ("SELECT count() FROM numbers(1e13)", "max_rows_to_read"),
        ("SELECT range(1000) FROM numbers(100000)", "max_memory_bytes"),  # a constant, 10^8 values as JSON
        ("SELECT materialize(range(30000)) FROM numbers(1000)", "max_result_bytes"),
        ("SELECT number % 10000000 AS k FROM numbers(30000000) GROUP BY k ORDER BY k", "max_memory_bytes"),
    ],
)
def test_attacks_are_refused_by_the_store_naming_the_limit(reads: ReadSessions, sql: str, limit: str):
    with pytest.raises(QueryLimitExceeded, match=f"than its limit of .* \\({limit}\\)") as refused:
        reads.query_json(sql, max_rows=100_000, max_seconds=30, limits=ReadLimits())
    assert refused.value.limit == limit


def test_a_huge_single_value_is_refused_before_python_sees_it(reads: ReadSessions):
    with pytest.raises(QueryError, match="too large"):
        reads.query_json("SELECT range(15000000)", max_rows=100_000, max_seconds=30, limits=ReadLimits())


def test_the_answer_is_json_of_the_rows_cut_at_max_rows(reads: ReadSessions):
    sql = (
        "SELECT number AS n, toString(number) AS s, toUInt64(18446744073709551615) AS big, nan AS x, "
        "unhex('ff') AS bad FROM numbers(10)"
    )
    answer = reads.query_json(sql, max_rows=3, max_seconds=10, limits=ReadLimits())
    assert answer.columns == ["n", "s", "big", "x", "bad"]
    assert answer.types == ["UInt64", "String", "UInt64", "Float64", "String"]
    assert json.loads(answer.rows) == [[n, str(n), 18446744073709551615, None, "\ufffd"] for n in range(3)]
    assert (answer.count, answer.truncated) == (3, True)
    empty = reads.query_json("SELECT node FROM samples", max_rows=3, max_seconds=10, limits=ReadLimits())
    assert (empty.columns, empty.types, empty.rows, empty.truncated) == (
        ["node"],
        ["LowCardinality(String)"],
        b"[]",
        False,
    )


def test_the_limits_bound_outside_queries_only(reads: ReadSessions):
    """The detectors' and reports' reads (query, query_frame, query_numbers) keep the store's defaults."""
    with pytest.raises(QueryLimitExceeded, match="max_rows_to_read"):
        reads.query_json(ROWS_PROBE, max_rows=10, max_seconds=10, limits=SMALL)
    assert reads.query(ROWS_PROBE).rows == [(100000,)]
    assert reads.query(MEMORY_PROBE).rows == [(8000000,)]


def test_a_failed_querys_unsent_rows_never_reach_the_next_query(reads: ReadSessions):
    """chDB may hand what a failed query had not sent to its session's next query (a detector's tape
    read after a timed-out one got the timed-out one's rows, or failed): the session is closed instead.
    It happens now and then, so the test tries many times on one read session."""
    failing = "SELECT number, intDiv(number, number - 70000) AS q FROM numbers(100000)"  # fails at 70,000
    for _ in range(20):
        with pytest.raises(QueryError, match="Division by zero"):
            reads.query_numbers(failing, {"number": np.uint64, "q": np.int64}, max_rows=100_000)
        answer = reads.query_numbers("SELECT toUInt64(42) AS x", {"x": np.uint64}, max_rows=100_000)
        assert answer.columns["x"].tolist() == [42]
        with pytest.raises(QueryError, match="Division by zero"):
            reads.query(failing, max_rows=100_000)
        assert reads.query("SELECT 43 AS x", max_rows=100_000).rows == [(43,)]
    for _ in range(5):
        with pytest.raises(QueryError, match="Division by zero"):
            reads.query_json(failing, max_rows=100_000, max_seconds=10, limits=ReadLimits())
        answer = reads.query_json("SELECT 44", max_rows=100_000, max_seconds=10, limits=ReadLimits())
        assert answer.rows == b"[[44]]"


SETTING_CHANGES = [
    "max_memory_usage = 0",
    "max_memory_usage = 100000000000",
    "max_rows_to_read = 0",
    "read_overflow_mode = 'break'",
    "max_bytes_to_read = 0",
    "readonly = 0",
    "max_result_bytes = 0",
    "result_overflow_mode = 'break'",
    "max_threads = 64, os_thread_priority = -20",
    "limit = 0",
]
FORMS = [
    "{probe}{gap}SETTINGS {change}",
    "{probe}{gap}sEtTiNgS {change}",
    "{probe};{gap}SET {change}",
    "SET {change};{gap}{probe}",
    "SELECT * FROM ({probe}{gap}SETTINGS {change})",
    "WITH q AS ({probe}{gap}SETTINGS {change}) SELECT * FROM q",
    "{probe} UNION ALL {probe}{gap}SETTINGS {change}",
]
GAPS = [" ", "\n", "\t", " /* SETTINGS */ ", " -- c\n"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    form=st.sampled_from(FORMS),
    change=st.sampled_from(SETTING_CHANGES),
    gap=st.sampled_from(GAPS),
    probe=st.sampled_from([MEMORY_PROBE, ROWS_PROBE]),
)
def test_no_statement_text_raises_a_limit(reads: ReadSessions, form: str, change: str, gap: str, probe: str):
    """A probe over its limit stays refused, whatever SETTINGS or SET is written around it."""
    sql = form.format(probe=probe, change=change, gap=gap)
    with pytest.raises(QueryError):
        reads.query_json(sql, max_rows=10, max_seconds=10, limits=SMALL)


VALUES = [
    "range({n})",
    "materialize(range({n}))",
    "repeat('x', {n})",
    "toLowCardinality(repeat('y', {n}))",
    "arrayMap(i -> toString(i), range({n}))",
    "[range({n}), range({n})]",
    "map(1, range({n}))",
    "tuple(range({n}), 'a')",
    "arrayStringConcat(arrayMap(i -> 'ab', range({n})))",
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    value=st.sampled_from(VALUES),
    n=st.integers(0, 2_000_000),
    rows=st.one_of(st.just(""), st.integers(1, 200_000).map(" FROM numbers({})".format)),
)
def test_no_answer_is_over_its_bytes_however_a_value_expands(
    reads: ReadSessions, value: str, n: int, rows: str
):
    """ClickHouse counts a constant column's value once, and a LowCardinality text once: the JSON it
    writes is counted as well, so an answer holds at most max_result_bytes whatever expands."""
    sql = f"SELECT {value.format(n=n)} AS v{rows}"
    try:
        answer = reads.query_json(sql, max_rows=1_000_000, max_seconds=10, limits=TIGHT_ANSWER)
    except QueryError:
        return
    assert len(answer.rows) <= TIGHT_ANSWER.max_result_bytes

"""Where SQL from outside runs: read-only sessions of its own, and only statements sqlpolicy accepts.

    reads = ReadSessions(connect, "fleetlens", tables)    # connect(settings) opens a new session
    reads.query("SELECT node, count() FROM steps GROUP BY node", max_rows=1000, max_seconds=10)

ClickHouse parses each statement (`parseQueryToJSON`), ReadPolicy checks the tree, and ClickHouse formats
the tree back to SQL (`formatQueryFromJSON`): that text, and only it, runs. It runs on a session whose
row and time limits and `readonly=1` were set before any statement, so ClickHouse itself refuses a write
or a change of setting whatever the statement says, and a session's state is never shared with a writer
(whose inserts would fail if a query could make its session read-only). A few sessions are kept between
queries and reused; at most `max_concurrent` queries run at once (the rest wait), none on a writer's
session, so a long query never delays an insert. Checked statements are remembered by their text, so the
UI's and the detectors' repeated queries are parsed once.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import clickhouse_connect
import numpy.typing as npt
import pyarrow
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from analytics.errors import QueryError, StoreUnavailable
from analytics.store import native
from analytics.store.clickhouse_errors import short, unreachable
from analytics.store.protocols import FrameResult, NumbersResult
from analytics.store.records import QueryResult
from analytics.store.sqlpolicy import FunctionCatalog, ReadPolicy

Connect = Callable[[Mapping[str, Any]], Client]  # a new session on the store, with these settings

MAX_SQL_CHARS = 256 * 1024  # ClickHouse's default max_query_size
CHECKED_STATEMENTS = 1024  # statements whose check is remembered
MAX_IDLE = 8  # read sessions kept open between queries
_PARSE = "SELECT parseQueryToJSON({sql:String}) AS tree, formatQueryFromJSON(tree)"
PARSER_FUNCTIONS = (
    "SELECT count() FROM system.functions WHERE name IN ('parseQueryToJSON', 'formatQueryFromJSON')"
)
_CATALOG = "SELECT name, categories, is_aggregate, alias_to, case_insensitive FROM system.functions"


def session_settings(max_rows: int, max_seconds: float) -> dict[str, Any]:
    """A read session's settings, `readonly` last: once it is set, no setting can change. A query gets at
    most half of the machine's cores, so that scraping and inserting keep theirs while it runs."""
    return {
        "max_threads": max(1, (os.cpu_count() or 2) // 2),
        "output_format_arrow_string_as_string": 1,  # query_frame's text: before 24.2 a server sent bytes
        "max_result_rows": max_rows + 1,
        "result_overflow_mode": "break",
        "max_execution_time": max_seconds,
        "timeout_overflow_mode": "throw",
        "readonly": 1,
    }


class ReadSessions:
    """Read-only sessions on one store, for statements that ReadPolicy accepts."""

    def __init__(
        self,
        connect: Connect,
        database: str,
        tables: Iterable[str],
        *,
        max_concurrent: int = 4,
        local_parser: Callable[[], Client] = lambda: clickhouse_connect.get_client(
            interface="chdb", settings=session_settings(1, 10.0)
        ),
    ) -> None:
        self._connect = connect
        self._local_parser = local_parser
        self._database = database
        self._tables = frozenset(tables)
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._lock = threading.Lock()
        self._idle: dict[tuple[int, float], list[Client]] = {}
        self._checked: OrderedDict[str, tuple[str, bool]] = OrderedDict()
        self._headers: OrderedDict[str, tuple[list[str], list[str]]] = OrderedDict()  # of empty results
        self._policy: ReadPolicy | None = None
        self._parser: Client | None = None  # where statements are parsed when the store's engine cannot
        self._closed = False

    def query(
        self,
        sql: str,
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = 10_000,
        max_seconds: float = 10.0,
    ) -> QueryResult:
        """Run one accepted statement; at most `max_rows` rows come back (`truncated` says when more
        matched) and ClickHouse stops it after `max_seconds`. QueryError says what was refused and why;
        StoreUnavailable when the store cannot be reached."""
        with self._checked_session(sql, max_rows, max_seconds) as (session, statement, is_select):
            started = time.perf_counter()
            result = _run(session, statement, parameters)
            columns, types = list(result.column_names), [column.name for column in result.column_types]
            if not columns and is_select:  # chDB sends no header with an empty result: ask for it
                columns, types = self._header(session, statement, parameters)
            rows = result.result_rows
            return QueryResult(
                columns=columns,
                types=types,
                rows=[tuple(row) for row in rows[:max_rows]],
                truncated=len(rows) > max_rows,
                elapsed_s=time.perf_counter() - started,
            )

    def query_frame(
        self,
        sql: str,
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = 10_000,
        max_seconds: float = 10.0,
    ) -> FrameResult:
        """query(), its result as columns (a DataFrame of numpy arrays) instead of a tuple per row: a
        read of many rows costs a fourth of query()'s, which builds a Python object per value. Read as
        Arrow, whose numeric columns pandas takes as they are, and whose empty result keeps its columns."""
        with self._checked_session(sql, max_rows, max_seconds) as (session, statement, _):
            result = _run(session, statement, parameters, columnar=True)
            return FrameResult(result.iloc[:max_rows], truncated=len(result) > max_rows)

    def query_numbers(
        self,
        sql: str,
        columns: Mapping[str, npt.DTypeLike],
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = 10_000,
        max_seconds: float = 10.0,
    ) -> NumbersResult:
        """query(), its result as numpy arrays of the numeric `columns` (name -> numpy type, in the
        result's order): read in ClickHouse's Native format, zero-copy (native.numbers), for reads of
        many numbers: chDB writes Arrow at more CPU, and query_frame's frame converts it once more.
        QueryError for a result of other columns or types."""
        with self._checked_session(sql, max_rows, max_seconds) as (session, statement, _):
            body = _run(session, statement, parameters, native_format=True)
        try:
            found = native.numbers(body, columns)
        except native.NativeError as error:
            raise QueryError(f"the result is not the numeric columns asked for: {error}") from None
        rows = len(next(iter(found.values()), ()))
        return NumbersResult({name: column[:max_rows] for name, column in found.items()}, rows > max_rows)

    @contextlib.contextmanager
    def _checked_session(
        self, sql: Any, max_rows: Any, max_seconds: Any
    ) -> Iterator[tuple[Client, str, bool]]:
        """A read session with these limits, and the statement to run for `sql` and whether it is a
        SELECT; QueryError for a statement or limits refused."""
        if not isinstance(sql, str):
            raise QueryError(f"the statement must be text, not {type(sql).__name__}")
        if len(sql) > MAX_SQL_CHARS:
            raise QueryError(f"the statement has {len(sql)} characters, over the limit of {MAX_SQL_CHARS}")
        if not (isinstance(max_rows, int) and max_rows >= 1 and isinstance(max_seconds, int | float)):
            raise QueryError(f"limits must be positive: max_rows={max_rows!r}, max_seconds={max_seconds!r}")
        if not 0 < max_seconds < float("inf"):
            raise QueryError(f"limits must be positive: max_rows={max_rows}, max_seconds={max_seconds}")
        with self._session(max_rows, float(max_seconds)) as session:
            yield (session, *self._checked_statement(sql, session))

    def close(self) -> None:
        """Close the idle sessions; sessions in use close when their query ends."""
        with self._lock:
            self._closed = True
            sessions = [session for idle in self._idle.values() for session in idle]
            sessions += [self._parser] if self._parser is not None else []
            self._idle.clear()
        for session in sessions:
            session.close()

    @contextlib.contextmanager
    def _session(self, max_rows: int, max_seconds: float) -> Iterator[Client]:
        """A read session for one query, with a row limit of at least `max_rows` + 1 (a power of two, so
        that callers asking for every row count share a few sessions; rows past `max_rows` are cut here)
        and this time limit; one of at most `max_concurrent` at a time. At most MAX_IDLE sessions are
        kept between queries, the least recently used closed first."""
        key = (1 << max_rows.bit_length(), max_seconds)
        with self._slots:
            with self._lock:
                if self._closed:
                    raise StoreUnavailable("the store is closed")
                idle = self._idle.setdefault(key, [])
                session = idle.pop() if idle else None
            if session is None:
                session = self._open(session_settings(key[0] - 1, max_seconds))
            try:
                yield session
            finally:
                self._put_back(key, session)

    def _put_back(self, key: tuple[int, float], session: Client) -> None:
        """Keep `session` for the next query with its limits, closing the least recently used past
        MAX_IDLE (or this one, once the store is closed)."""
        closing = []
        with self._lock:
            if self._closed:
                closing.append(session)
            else:
                self._idle.setdefault(key, []).append(session)
                self._idle[key] = self._idle.pop(key)  # most recently used last
                while sum(map(len, self._idle.values())) > MAX_IDLE:
                    oldest = next(iter(self._idle))
                    closing.append(self._idle[oldest].pop(0))
                    if not self._idle[oldest]:
                        del self._idle[oldest]
        for stale in closing:
            stale.close()

    def _open(self, settings: Mapping[str, Any]) -> Client:
        try:
            return self._connect(settings)
        except ClickHouseError as error:
            raise StoreUnavailable(f"opening a read session: {short(error)}") from error

    def _header(
        self, session: Client, statement: str, parameters: Mapping[str, Any] | None
    ) -> tuple[list[str], list[str]]:
        """The column names and types of a SELECT, remembered by text: a quiet detector's statement comes
        back empty every window, and DESCRIBE would analyse it a second time each time. Parameters are
        typed in the text, so their values cannot change the header."""

        def describe() -> tuple[list[str], list[str]]:
            described = _run(session, f"DESCRIBE ({statement})", parameters).result_rows
            return [row[0] for row in described], [row[1] for row in described]

        return self._remembered(self._headers, statement, describe)

    def _checked_statement(self, sql: str, session: Client) -> tuple[str, bool]:
        """The statement to run for `sql` (ClickHouse's formatting of the checked tree) and whether it is
        a SELECT; QueryError when the policy refuses it. Remembered by text, refusals are not."""

        def check() -> tuple[str, bool]:
            policy = self._policy or self._load_policy(session)
            try:
                text, formatted = _run(self._parser or session, _PARSE, {"sql": sql}).result_rows[0]
            except QueryError as error:
                if "parseQueryToJSON" not in str(error):
                    raise
                # parsed, but not into anything a SELECT is made of (INSERT ... VALUES, DESCRIBE, SHOW, ...)
                raise QueryError(
                    f"only SELECT statements (and EXPLAIN of one) are accepted: {error}"
                ) from None
            try:
                tree = json.loads(text)
                policy.check(tree)
            except RecursionError:
                raise QueryError("the statement is nested too deeply") from None
            return formatted, tree.get("type") == "SelectWithUnionQuery"

        return self._remembered(self._checked, sql, check)

    def _remembered(self, memo: OrderedDict[str, Any], text: str, compute: Callable[[], Any]) -> Any:
        """`memo`'s answer for `text`, else `compute()`'s, kept for the last CHECKED_STATEMENTS texts
        (what raises is not kept)."""
        with self._lock:
            if (known := memo.get(text)) is not None:
                memo.move_to_end(text)
                return known
        answer = compute()
        with self._lock:
            memo[text] = answer
            if len(memo) > CHECKED_STATEMENTS:
                memo.popitem(last=False)
        return answer

    def _load_policy(self, session: Client) -> ReadPolicy:
        """The policy, with the functions of the parsing engine's system.functions: the store's own, or,
        for a ClickHouse server older than 26.8 (no parseQueryToJSON), this process's embedded chDB."""
        parser = None
        if _run(session, PARSER_FUNCTIONS, None).result_rows[0][0] < 2:
            try:
                parser = self._local_parser()
            except ClickHouseError as error:
                raise QueryError(
                    f"this ClickHouse cannot parse queries for checking: {short(error)}"
                ) from error
        catalog = FunctionCatalog.from_rows(_run(parser or session, _CATALOG, None).result_rows)
        policy = ReadPolicy(self._database, self._tables, catalog)
        with self._lock:
            self._parser, self._policy = parser, policy
        return policy


def _run(
    session: Client,
    statement: str,
    parameters: Mapping[str, Any] | None,
    *,
    columnar: bool = False,
    native_format: bool = False,
) -> Any:
    """One statement on a read session, its result as a DataFrame when `columnar`, as the bytes of
    ClickHouse's Native format when `native_format`; QueryError for what ClickHouse refuses, StoreUnavailable
    when it could not be reached."""
    try:
        if native_format:
            return session.raw_query(statement, parameters=parameters, fmt="Native")
        if columnar:  # maps as dicts, as query() gives them; of a key given twice, the last
            table = session.query_arrow(statement, parameters=parameters)
            return table.to_pandas(maps_as_pydicts="lossy")
        return session.query(statement, parameters=parameters)
    except ClickHouseError as error:
        if unreachable(error):
            raise StoreUnavailable(f"query: {short(error)}") from error
        raise QueryError(short(error)) from error
    except pyarrow.ArrowException as error:  # a type pandas has no column for (a Variant)
        raise QueryError(f"the result cannot be read as columns: {error}") from error
    except (TypeError, ValueError) as error:  # a parameter clickhouse-connect cannot bind
        raise QueryError(f"parameters: {error}") from error

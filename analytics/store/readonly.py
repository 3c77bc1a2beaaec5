"""Where SQL from outside runs: read-only sessions of its own, and only statements sqlpolicy accepts.

    reads = ReadSessions(connect, "fleetlens", tables)    # connect(settings) opens a new session
    reads.query("SELECT node, count() FROM steps GROUP BY node", max_rows=1000, max_seconds=10)
    reads.query_json(sql, max_rows=1000, max_seconds=30, limits=ReadLimits())   # a query API's answer

ClickHouse parses each statement (`parseQueryToJSON`), ReadPolicy checks the tree, and ClickHouse formats
the tree back to SQL (`formatQueryFromJSON`): that text, and only it, runs. It runs on a session whose
row and time limits and `readonly=1` were set before any statement, so ClickHouse itself refuses a write
or a change of setting whatever the statement says, and a session's state is never shared with a writer
(whose inserts would fail if a query could make its session read-only). A few sessions are kept between
queries and reused; at most `max_concurrent` queries run at once (the rest wait), none on a writer's
session, so a long query never delays an insert. A session whose statement failed is closed, not
reused: chDB hands a failed query's unread output to the session's next query. Checked statements are
remembered by their text, so the UI's and the detectors' repeated queries are parsed once.

Queries from people and programs outside (the hub's query API) run under ReadLimits too: ClickHouse's
limits on memory, rows and bytes read, result size and threads, on the session before `readonly=1`, so no
statement can raise them; their answer is JSON that ClickHouse writes (`query_json`), counted in bytes as
it arrives and never turned into Python values, so that neither a huge value nor a huge result costs the
process more than its limits.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

import clickhouse_connect
import numpy as np
import numpy.typing as npt
import pyarrow
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from analytics.errors import NativeError, QueryError, QueryLimitExceeded, StoreUnavailable
from analytics.store import native
from analytics.store.clickhouse_errors import short, unreachable
from analytics.store.protocols import FrameResult, NumbersResult
from analytics.store.records import QueryResult
from analytics.store.sqlpolicy import FunctionCatalog, ReadPolicy

Connect = Callable[[Mapping[str, Any]], Client]  # a new session on the store, with these settings
SessionKey = tuple[int, float, "ReadLimits | None"]  # the rows, seconds and outside limits it was opened with

MAX_SQL_CHARS = 256 * 1024  # ClickHouse's default max_query_size
CHECKED_STATEMENTS = 1024  # statements whose check is remembered
MAX_IDLE = 8  # read sessions kept open between queries
MAX_CONCURRENT = 16  # queries at once on one store's read sessions (the hub admits its own: hub.queryslots)
OUTSIDE_NICE = 19  # an outside query's threads, where ClickHouse may renice them (CAP_SYS_NICE)
ANSWER_FORMAT = "JSONCompactEachRowWithNamesAndTypes"  # names, types, then a JSON array per row, a line each
READ_CHUNK = 1 << 20  # bytes of an answer read at a time, each counted before the next
MiB = 1 << 20
_PARSE = "SELECT parseQueryToJSON({sql:String}) AS tree, formatQueryFromJSON(tree)"
PARSER_FUNCTIONS = (
    "SELECT count() FROM system.functions WHERE name IN ('parseQueryToJSON', 'formatQueryFromJSON')"
)
_CATALOG = "SELECT name, categories, is_aggregate, alias_to, case_insensitive FROM system.functions"
CATALOG_ROWS = 1 << 20  # rows of system.functions read at most (ClickHouse has some 1,500)


@dataclass(frozen=True)
class ReadLimits:
    """What one query from outside may take of the store, enforced by ClickHouse on its session.

    The defaults leave a hub's ingest the memory and cores it needs on the same machine, with room for
    what the UI's pages ask through the hub's API (groupings and sorts over the rollups):
    - max_memory_bytes, 256 MiB: a range(1e8) or a groupArray of 80 million numbers is refused at once,
      and the four the hub runs at once by default (hub.queryslots) take a GiB at most.
    - max_rows_to_read, 1e9, and max_bytes_to_read, 32 GiB: over two hours of raw samples of a 192-node
      fleet scraped every second (126k samples/s); pages over longer spans read the rollups. A read of a
      table past them is refused before it starts (ClickHouse counts the rows its marks select).
    - max_result_bytes, 16 MiB: the result, as ClickHouse holds it and as the JSON answer; a page's
      100,000 rows of times, names and values take a few MiB. ClickHouse counts a constant column's
      value once, however many rows repeat it, so the JSON it writes is counted too, as it arrives
      (ReadSessions.query_json).
    - max_threads, 1: a query takes one core, at nice 19 where ClickHouse may renice its threads (a hub
      with CAP_SYS_NICE; without it the setting is ignored).
    Spilling GROUP BY and ORDER BY to disk is off: past its memory a query is refused, never written out.
    """

    max_memory_bytes: int = 256 * MiB
    max_rows_to_read: int = 1_000_000_000
    max_bytes_to_read: int = 32 << 30
    max_result_bytes: int = 16 * MiB
    max_threads: int = 1

    def __post_init__(self) -> None:
        for name in (field.name for field in fields(self)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise QueryError(f"read limit {name} must be a positive integer, got {value!r}")

    def settings(self, rows: int, max_seconds: float) -> dict[str, Any]:
        """An outside read session's settings: at most `rows` rows of a result (ClickHouse's `limit`,
        which cuts the outermost SELECT only), these limits, `readonly` last."""
        return {
            "max_threads": self.max_threads,
            "os_thread_priority": OUTSIDE_NICE,  # ignored without CAP_SYS_NICE
            "max_memory_usage": self.max_memory_bytes,
            "max_bytes_ratio_before_external_group_by": 0,
            "max_bytes_ratio_before_external_sort": 0,
            "max_rows_to_read": self.max_rows_to_read,
            "max_bytes_to_read": self.max_bytes_to_read,
            "read_overflow_mode": "throw",
            "limit": rows,
            "max_result_bytes": self.max_result_bytes,
            "result_overflow_mode": "throw",
            "max_execution_time": max_seconds,
            "timeout_overflow_mode": "throw",
            "output_format_json_quote_64bit_integers": 0,  # numbers, as JSON readers take them
            "output_format_json_validate_utf8": 1,  # a String's bytes that are not UTF-8 come out replaced
            "readonly": 1,
        }


@dataclass(frozen=True)
class JsonRows:
    """An answer as ClickHouse wrote it: the column names and types, `rows` as the bytes of one JSON array
    (an array per row), `count` rows in it, `truncated` when more matched, and how long it took."""

    columns: list[str]
    types: list[str]
    rows: bytes
    count: int
    truncated: bool
    elapsed_s: float


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
        max_concurrent: int = MAX_CONCURRENT,
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
        self._idle: dict[SessionKey, list[Client]] = {}
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
        except NativeError as error:
            raise QueryError(f"the result is not the numeric columns asked for: {error}") from None
        rows = len(next(iter(found.values()), ()))
        return NumbersResult({name: column[:max_rows] for name, column in found.items()}, rows > max_rows)

    def query_json(
        self,
        sql: str,
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = 10_000,
        max_seconds: float = 10.0,
        limits: ReadLimits,
    ) -> JsonRows:
        """query() for SQL from outside: run under `limits` too, its answer the JSON that ClickHouse
        writes (JSONCompactEachRow, 64-bit integers as numbers, NaN and infinities as null), at most
        `max_rows` rows of it. The answer is counted as it arrives and never parsed into Python values:
        past limits.max_result_bytes of it, the query is stopped. QueryLimitExceeded names the limit a
        query ran into, QueryError says what else was refused; StoreUnavailable."""
        with self._checked_session(sql, max_rows, max_seconds, limits) as (session, statement, _):
            started = time.perf_counter()
            body = _read_answer(session, statement, parameters, limits, max_seconds)
            elapsed = time.perf_counter() - started
        return _json_rows(body, max_rows, elapsed)

    @contextlib.contextmanager
    def _checked_session(
        self, sql: Any, max_rows: Any, max_seconds: Any, limits: ReadLimits | None = None
    ) -> Iterator[tuple[Client, str, bool]]:
        """A read session with these limits (and an outside query's `limits`), and the statement to run
        for `sql` and whether it is a SELECT; QueryError for a statement or limits refused."""
        if not isinstance(sql, str):
            raise QueryError(f"the statement must be text, not {type(sql).__name__}")
        if len(sql) > MAX_SQL_CHARS:
            raise QueryError(f"the statement has {len(sql)} characters, over the limit of {MAX_SQL_CHARS}")
        if not (isinstance(max_rows, int) and max_rows >= 1 and isinstance(max_seconds, int | float)):
            raise QueryError(f"limits must be positive: max_rows={max_rows!r}, max_seconds={max_seconds!r}")
        if not 0 < max_seconds < float("inf"):
            raise QueryError(f"limits must be positive: max_rows={max_rows}, max_seconds={max_seconds}")
        with self._session(max_rows, float(max_seconds), limits) as session:
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
    def _session(self, max_rows: int, max_seconds: float, limits: ReadLimits | None) -> Iterator[Client]:
        """A read session for one query, with a row limit of at least `max_rows` + 1 (a power of two, so
        that callers asking for every row count share a few sessions; rows past `max_rows` are cut here),
        this time limit and an outside query's `limits`; one of at most `max_concurrent` at a time. At
        most MAX_IDLE sessions are kept between queries, the least recently used closed first; one whose
        query failed is closed at once (chDB would hand what it had not sent to its next query)."""
        key = (1 << max_rows.bit_length(), max_seconds, limits)
        with self._slots:
            with self._lock:
                if self._closed:
                    raise StoreUnavailable("the store is closed")
                idle = self._idle.setdefault(key, [])
                session = idle.pop() if idle else None
            if session is None:
                rows = key[0]
                settings = session_settings(rows - 1, max_seconds)
                session = self._open(settings if limits is None else limits.settings(rows, max_seconds))
            try:
                yield session
            except BaseException:
                session.close()
                raise
            self._put_back(key, session)

    def _put_back(self, key: SessionKey, session: Client) -> None:
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
            policy = self._policy or self._load_policy()
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

    def _load_policy(self) -> ReadPolicy:
        """The policy, with the functions of the parsing engine's system.functions: the store's own, or,
        for a ClickHouse server older than 26.8 (no parseQueryToJSON), this process's embedded chDB. Read
        on a session of its own: a query's session may cut its results short (an outside query's)."""
        session = self._open(session_settings(CATALOG_ROWS, 10.0))
        try:
            return self._policy_on(session)
        finally:
            session.close()

    def _policy_on(self, session: Client) -> ReadPolicy:
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
        raise _refusal(error) from error
    except pyarrow.ArrowException as error:  # a type pandas has no column for (a Variant)
        raise QueryError(f"the result cannot be read as columns: {error}") from error
    except (TypeError, ValueError) as error:  # a parameter clickhouse-connect cannot bind
        raise QueryError(f"parameters: {error}") from error


def _refusal(
    error: ClickHouseError, limits: ReadLimits | None = None, max_seconds: float = 0.0
) -> QueryError | StoreUnavailable:
    """What ClickHouse's `error` means to the caller: StoreUnavailable when it could not be reached;
    under an outside query's `limits`, QueryLimitExceeded naming the limit it ran into; else QueryError."""
    if unreachable(error):
        return StoreUnavailable(f"query: {short(error)}")
    code = getattr(error, "code", None)
    if limits is not None and code in _LIMIT_CODES:
        name, what = _LIMIT_CODES[code]
        bound = f"{max_seconds:g} s" if name == "max_seconds" else _amount(name, getattr(limits, name))
        return QueryLimitExceeded(
            f"the query {what} than its limit of {bound} ({name}): {short(error)}", name
        )
    return QueryError(short(error))


# ClickHouse's error codes for the limits a ReadLimits sets: the limit, and what the query did
_LIMIT_CODES = {
    241: ("max_memory_bytes", "needs more memory"),  # MEMORY_LIMIT_EXCEEDED
    158: ("max_rows_to_read", "reads more rows"),  # TOO_MANY_ROWS
    307: ("max_bytes_to_read", "reads more bytes"),  # TOO_MANY_BYTES
    396: ("max_result_bytes", "has a bigger result"),  # TOO_MANY_ROWS_OR_BYTES (the result's)
    159: ("max_seconds", "runs longer"),  # TIMEOUT_EXCEEDED
}


def _amount(name: str, value: int) -> str:
    """A limit's value as people read it: bytes in MiB (or KiB, below one), rows as a number."""
    if not name.endswith("bytes"):
        return f"{value:,}"
    return f"{value / MiB:g} MiB" if value >= MiB else f"{value / 1024:g} KiB"


def _read_answer(
    session: Client,
    statement: str,
    parameters: Mapping[str, Any] | None,
    limits: ReadLimits,
    max_seconds: float,
) -> bytes:
    """The JSON answer ClickHouse writes for `statement`, read READ_CHUNK at a time; QueryLimitExceeded
    once it is over limits.max_result_bytes (the rest is not read: the session is closed with it)."""
    parts, size = [], 0
    try:
        with contextlib.closing(
            session.raw_stream(statement, parameters=parameters, fmt=ANSWER_FORMAT)
        ) as got:
            while chunk := got.read(READ_CHUNK):
                size += len(chunk)
                if size > limits.max_result_bytes:
                    bound = _amount("max_result_bytes", limits.max_result_bytes)
                    raise QueryLimitExceeded(
                        f"the query's answer is over its limit of {bound} as JSON (max_result_bytes)",
                        "max_result_bytes",
                    )
                parts.append(chunk)
    except ClickHouseError as error:
        raise _refusal(error, limits, max_seconds) from error
    except (TypeError, ValueError) as error:  # a parameter clickhouse-connect cannot bind
        raise QueryError(f"parameters: {error}") from error
    return b"".join(parts)


def _json_rows(body: bytes, max_rows: int, elapsed_s: float) -> JsonRows:
    """JsonRows of an ANSWER_FORMAT `body`: its first two lines the names and types, then a JSON array
    per row, a line each, of which the first `max_rows`. QueryError for a body that is not that (a
    server that broke off and wrote its error instead of the rest)."""
    names_end = body.find(b"\n")
    types_end = body.find(b"\n", names_end + 1)
    try:
        if names_end < 0 or types_end < 0:
            raise ValueError("no header")
        columns, types = json.loads(body[:names_end]), json.loads(body[names_end + 1 : types_end])
    except ValueError:
        raise QueryError(f"the store's answer is not rows of JSON: {body[:300]!r}") from None
    rows = memoryview(body)[types_end + 1 :]
    text = np.frombuffer(rows, dtype=np.uint8)
    ends = np.flatnonzero(text == ord("\n"))
    starts = np.concatenate(([0], ends[:-1] + 1)) if len(ends) else ends
    broken = len(text) and (text[-1] != ord("\n") or (text[starts] != ord("[")).any())
    if broken:
        at = int(starts[np.flatnonzero(text[starts] != ord("["))[0]]) if len(starts) else 0
        raise QueryError(f"the store's answer broke off: {bytes(rows[at : at + 300])!r}")
    count = min(len(ends), max_rows)
    cut = bytes(rows[: int(ends[count - 1])]) if count else b""
    return JsonRows(
        columns, types, b"[" + cut.replace(b"\n", b",") + b"]", count, len(ends) > max_rows, elapsed_s
    )

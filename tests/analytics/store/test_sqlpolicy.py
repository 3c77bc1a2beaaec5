"""The query policy, both ways, against the engine's own catalog: every function and table function that
ClickHouse lists is accepted exactly when the policy says it computes on its arguments only, on trees built
by ClickHouse's own parser; and whatever the policy does not know is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import clickhouse_connect
import pytest

from analytics.errors import QueryError
from analytics.store import schema
from analytics.store.sqlpolicy import (
    PURE_OTHERS,
    SAFE_CATEGORIES,
    SYNTAX_FUNCTIONS,
    FunctionCatalog,
    ReadPolicy,
)

# What reaches files, the network, other servers, the server's own state, or stalls: never accepted.
MUST_REFUSE = [
    "file", "getSetting", "getSettingOrDefault", "getServerSetting", "hostName", "FQDN", "currentUser",
    "currentDatabase", "sleep", "sleepEachRow", "joinGet", "dictGet", "dictGetString", "dictHas",
    "aiGenerate", "aiEmbed", "addressToSymbol", "demangle", "filesystemAvailable", "throwIf",
    "evalMLMethod", "hasColumnInTable", "getMacro", "serverUUID", "uptime", "timeSeriesIdToTags",
]  # fmt: skip
# What the project's own dashboards, postmortems and detectors call: always accepted.
MUST_ACCEPT = [
    "count", "countIf", "sum", "avg", "min", "max", "argMax", "quantileExact", "quantilesIf", "median",
    "uniqExact", "groupArray", "lagInFrame", "row_number", "toUnixTimestamp64Milli",
    "fromUnixTimestamp64Milli",
    "toStartOfInterval", "toStartOfMinute", "dateDiff", "now", "greatest", "least", "round", "abs", "if",
    "multiIf", "coalesce", "isNull", "arrayJoin", "has", "JSONExtractString", "toString", "CAST", "lower",
    "like", "match", "formatReadableSize", "COUNT", "caseWithExpression", "lambda", "exists",
]  # fmt: skip


@pytest.fixture(scope="module")
def engine(chdb_dir: Path) -> Iterator[clickhouse_connect.driver.Client]:
    client = clickhouse_connect.get_client(interface="chdb", path=str(chdb_dir))
    yield client
    client.close()


@pytest.fixture(scope="module")
def functions(engine) -> list[tuple[str, str, int, str, int]]:
    sql = "SELECT name, categories, is_aggregate, alias_to, case_insensitive FROM system.functions"
    return [tuple(row) for row in engine.query(sql).result_rows]


@pytest.fixture(scope="module")
def policy(functions) -> ReadPolicy:
    return ReadPolicy("fleetlens", schema.READABLE, FunctionCatalog.from_rows(functions))


def tree(engine, sql: str) -> dict:
    """ClickHouse's parse tree of `sql`, as the store checks it."""
    return json.loads(
        engine.query("SELECT parseQueryToJSON({sql:String})", parameters={"sql": sql}).result_rows[0][0]
    )


def safe(functions, name: str) -> bool:
    """The policy's rule, restated: the category of what `name` names (through aliases) is a pure one."""
    table = {row[0]: row for row in functions}
    seen = set()
    while table[name][3] and table[name][3] in table and name not in seen:
        seen.add(name)
        name = table[name][3]
    categories = {category.strip() for category in table[name][1].split(",")}
    return bool(categories & SAFE_CATEGORIES) or name in PURE_OTHERS


def call_tree(engine, name: str) -> dict | None:
    """The parse tree of a call of `name` with arguments its syntax takes; None if none of these parse."""
    for arguments in ("1", "'a', 1, 2", ""):
        try:
            return tree(engine, f"SELECT `{name}`({arguments})")
        except Exception:  # a function with syntax of its own (substring(x FROM 1), ...): try others
            continue
    return None


def test_every_listed_function_is_accepted_exactly_when_it_is_pure(engine, functions, policy):
    accepted, refused, unparsed = set(), set(), set()
    for name, *_ in functions:
        if (call := call_tree(engine, name)) is None:
            unparsed.add(name)
            continue
        try:
            policy.check(call)
            accepted.add(name)
        except QueryError as error:
            assert f"function {name}() is not accepted" in str(error)
            refused.add(name)
    assert len(unparsed) < 10, unparsed
    assert accepted == {name for name, *_ in functions if safe(functions, name)} - unparsed
    assert len(accepted) > 1000 and len(refused) > 200  # the catalog is the engine's, not a short list
    assert set(MUST_REFUSE) <= refused


@pytest.mark.parametrize("name", MUST_ACCEPT)
def test_what_the_projects_own_queries_call_is_accepted(engine, policy, name):
    call = {
        "lambda": "arrayMap(x -> x, [1])",
        "exists": "EXISTS (SELECT 1)",
        "quantilesIf": "quantilesIf(0.5)(1, 1)",
        "CAST": "CAST(1 AS String)",
    }
    policy.check(tree(engine, f"SELECT {call.get(name, f'{name}(1)')} FROM samples"))


@pytest.mark.parametrize("name", MUST_REFUSE)
def test_scalar_functions_that_reach_outside_are_refused_wherever_they_hide(engine, policy, name):
    for sql in (
        f"SELECT {name}('x')",
        f"SELECT arrayMap(p -> {name}(p), ['x'])",
        f"SELECT count() FROM samples WHERE metric IN (SELECT {name}('x'))",
        f"WITH q AS (SELECT {name}('x') AS v) SELECT * FROM q",
        f"SELECT * FROM samples ORDER BY {name}('x')",
    ):
        with pytest.raises(QueryError, match="is not accepted"):
            policy.check(tree(engine, sql))


def test_only_numbers_of_the_table_functions_is_accepted(engine, policy):
    names = [row[0] for row in engine.query("SELECT name FROM system.table_functions").result_rows]
    policy.check(tree(engine, "SELECT * FROM numbers(10)"))
    for name in set(names) - {"numbers"}:
        arguments = {"view": "SELECT 1", "viewIfPermitted": "SELECT 1 ELSE null('x String')"}.get(name, "'x'")
        with pytest.raises(QueryError, match=f"table function {name}\\(\\) is not accepted"):
            policy.check(tree(engine, f"SELECT * FROM `{name}`({arguments})"))
    assert len(names) > 50


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM steps",
        "SELECT * FROM fleetlens.steps AS s",
        "SELECT count() FROM samples WHERE metric IN metrics",
        "WITH recent AS (SELECT * FROM steps) SELECT * FROM recent",
        "SELECT * FROM (SELECT * FROM anomalies FINAL) JOIN alerts USING (node)",
        "EXPLAIN PIPELINE SELECT * FROM metrics_1m",
    ],
)
def test_the_projects_tables_views_and_the_statements_own_names_are_readable(engine, policy, sql):
    policy.check(tree(engine, sql))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM system.one",
        "SELECT * FROM other.steps",
        "SELECT * FROM `fleetlens.steps`",  # one name with a dot in it: no table of ours
        "SELECT 1 IN system.one",
        "SELECT * FROM INFORMATION_SCHEMA.TABLES",
        "SELECT * FROM steps_local",
    ],
)
def test_other_tables_are_refused(engine, policy, sql):
    with pytest.raises(QueryError, match="read only fleetlens's tables and views"):
        policy.check(tree(engine, sql))


@pytest.mark.parametrize(
    ("node", "refusal"),
    [
        (
            {"type": "SelectWithUnionQuery", "list_of_selects": {"type": "FutureNode"}},
            "FutureNode is not accepted",
        ),
        (
            {"type": "SelectWithUnionQuery", "future_clause": {"type": "Literal"}},
            "future_clause is not accepted",
        ),
        ({"type": "SelectWithUnionQuery", "is_outfile_append": True}, "INTO OUTFILE is not accepted"),
        (
            {"type": "ExplainQuery", "kind": "EXPLAIN TABLE OVERRIDE", "query": {}},
            "EXPLAIN TABLE OVERRIDE is not",
        ),
        ({"type": "CreateQuery"}, "only SELECT statements"),
        ({}, "only SELECT statements"),
    ],
)
def test_what_the_policy_does_not_know_is_refused(policy, node, refusal):
    with pytest.raises(QueryError, match=refusal):
        policy.check(node)


def test_syntax_functions_are_few_and_none_reaches_outside():
    assert {"lambda", "exists", "grouping"} == SYNTAX_FUNCTIONS

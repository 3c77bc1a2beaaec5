"""What SQL from outside may do: one read-only SELECT over fleetlens's own tables, decided on the parse tree
that ClickHouse's own parser builds.

The query API, the CLI and the UI's SQL box run SQL written by people and programs the hub does not trust.
A check over the text cannot be made safe (quoting, comments, heredocs, case and statements hidden in
strings all change what the text means to ClickHouse), so the store has ClickHouse parse the statement
(`parseQueryToJSON`) and `ReadPolicy.check` walks the tree: every node type, clause, table and function
must be on an allowlist, and whatever this module does not know is refused. The store then runs the tree
formatted back to SQL by ClickHouse (`formatQueryFromJSON`), so the statement checked is the statement run.

Accepted: one SELECT (WITH, UNION, INTERSECT, EXCEPT, subqueries, joins, window functions), or EXPLAIN of
one, that reads the project's tables and views (analytics.store.schema) in the store's database, the names its
own WITH clauses define, and the table function `numbers`, calling only the functions of FunctionCatalog:
ClickHouse's pure-computation categories in `system.functions` and a few named ones. Refused: every other
statement; table functions for files, URLs, other servers, processes and dictionaries; scalar functions
that touch them or the server (file, dictGet, joinGet, getSetting, sleep, ...); system and
information_schema tables; SETTINGS, FORMAT and INTO OUTFILE clauses; `{name:Identifier}` parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from analytics.errors import QueryError

# system.functions categories whose functions compute on their arguments only.
SAFE_CATEGORIES = frozenset(
    {
        "Aggregate Functions",
        "Arithmetic",
        "Arrays",
        "Bit",
        "Bitmap",
        "Comparison",
        "Conditional",
        "Dates and Times",
        "Distance",
        "Encoding",
        "Financial",
        "Hash",
        "IP Address",
        "JSON",
        "Logical",
        "Map",
        "Mathematical",
        "Null",
        "Random Number",
        "Rounding",
        "String",
        "String Replacement",
        "String Search",
        "String Splitting",
        "Time Window",
        "Tuple",
        "Type Conversion",
        "URL",  # parsing URL strings (domain, path, ...), never fetching one
        "UUID",
    }
)
# Functions of the "Other" and "Internal" categories that compute on their arguments only; the rest of
# those categories reach the server, files or settings (file, getSetting, hostName, sleep, joinGet, ...).
PURE_OTHERS = frozenset(
    {
        "bar",
        "caseWithExpression",  # CASE x WHEN ...
        "countDigits",
        "finalizeAggregation",
        "formatReadableDecimalSize",
        "formatReadableQuantity",
        "formatReadableSize",
        "formatReadableTimeDelta",
        "identity",
        "ignore",
        "isConstant",
        "materialize",
        "neighbor",
        "parseReadableSize",
        "parseReadableSizeOrNull",
        "parseReadableSizeOrZero",
        "parseTimeDelta",
        "runningAccumulate",
        "runningDifference",
        "runningDifferenceStartingWithFirstValue",
        "toColumnTypeName",
        "toTypeName",
        "transform",
        "visibleWidth",
    }
)
# Syntax that parses into a function system.functions does not list: x -> ..., EXISTS (...), GROUPING().
SYNTAX_FUNCTIONS = frozenset({"lambda", "exists", "grouping"})
# Suffixes that turn an aggregate function into another (countIf, sumArray, argMaxState, ...).
AGGREGATE_COMBINATORS = (
    "SimpleState",
    "MergeState",
    "OrDefault",
    "Resample",
    "Distinct",
    "ForEach",
    "ArgMin",
    "ArgMax",
    "OrNull",
    "State",
    "Merge",
    "Array",
    "Map",
    "If",
)
TABLE_FUNCTIONS = frozenset({"numbers"})
_IN_FUNCTIONS = frozenset(
    {"in", "notIn", "globalIn", "globalNotIn", "nullIn", "notNullIn", "globalNullIn", "globalNotNullIn"}
)
# EXPLAIN (PLAN) and the kinds that only describe a SELECT, as parseQueryToJSON spells them.
_EXPLAIN_KINDS = frozenset(
    f"EXPLAIN{kind}" for kind in ("", " AST", " SYNTAX", " QUERY TREE", " PLAN", " PIPELINE", " ESTIMATE")
)
_OUTFILE_FLAGS = ("is_outfile_append", "is_outfile_truncate", "is_into_outfile_with_stdout")

# Every node type a read may contain, with the keys it may carry; any other type or key is refused.
NODE_KEYS: Mapping[str, frozenset[str]] = {
    name: frozenset(keys.split())
    for name, keys in {
        "SelectWithUnionQuery": f"union_mode list_of_modes list_of_selects {' '.join(_OUTFILE_FLAGS)}",
        "ExplainQuery": f"kind query {' '.join(_OUTFILE_FLAGS)}",
        "SelectQuery": (
            "with recursive_with select distinct tables prewhere where group_by group_by_with_totals"
            " group_by_with_rollup group_by_with_cube group_by_with_grouping_sets group_by_all having"
            " window qualify order_by order_by_all interpolate limit_by limit_by_length limit_by_offset"
            " limit_by_all limit_length limit_offset limit_with_ties"
        ),
        "ExpressionList": "children",
        "WithElement": "name subquery",
        "Subquery": "alias children cte_name",
        "TablesInSelectQuery": "children",
        "TablesInSelectQueryElement": "table_expression table_join array_join",
        "TableExpression": "database_and_table_name table_function subquery final sample_size sample_offset",
        "TableIdentifier": "name name_parts alias",
        "TableJoin": "kind strictness locality on_expression using_expression_list",
        "ArrayJoin": "kind expression_list",
        "SampleRatio": "numerator denominator",
        "Identifier": "name name_parts alias",
        "Literal": "value alias",
        "QueryParameter": "name param_type alias",
        "Function": (
            "name arguments parameters alias is_operator is_lambda_function is_window_function kind"
            " window_definition window_name nulls_action"
        ),
        "Asterisk": "transformers",
        "QualifiedAsterisk": "qualifier transformers",
        "ColumnsRegexpMatcher": "pattern transformers",
        "ColumnsListMatcher": "column_list transformers",
        "QualifiedColumnsRegexpMatcher": "qualifier pattern transformers",
        "QualifiedColumnsListMatcher": "qualifier column_list transformers",
        "ColumnsTransformerList": "children",
        "ColumnsExceptTransformer": "children pattern is_strict",
        "ColumnsReplaceTransformer": "children is_strict",
        "ColumnsReplaceTransformerReplacement": "name children",
        "OrderByElement": (
            "expression direction nulls_direction nulls_direction_was_explicitly_specified collation"
            " with_fill fill_from fill_to fill_step fill_staleness"
        ),
        "InterpolateElement": "column expr",
        "WindowListElement": "name definition",
        "WindowDefinition": (
            "parent_window_name partition_by order_by frame_is_default frame_type frame_begin_type"
            " frame_begin_offset frame_begin_preceding frame_end_type frame_end_offset frame_end_preceding"
        ),
    }.items()
}
# What people wrote, for the refusals of the keys that matter most.
_CLAUSES = {
    "settings": "a SETTINGS clause (the store sets every query's limits)",
    "format_ast": "a FORMAT clause",
    "out_file": "INTO OUTFILE",
    "compression": "INTO OUTFILE ... COMPRESSION",
}


@dataclass(frozen=True)
class FunctionCatalog:
    """The functions user SQL may call: by exact name, and (lower-cased) those ClickHouse takes in any case.

    Built from the engine's own `system.functions`, so a function a newer ClickHouse adds is allowed only
    when its category is one of SAFE_CATEGORIES: unknown means refused."""

    names: frozenset[str]
    any_case: frozenset[str]
    aggregates: frozenset[str]  # allowed aggregate functions, and lower-cased the case-insensitive ones

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, str, int, str, int]]) -> FunctionCatalog:
        """From `SELECT name, categories, is_aggregate, alias_to, case_insensitive FROM system.functions`;
        an alias (empty categories) counts as what it aliases."""
        table = {
            name: (categories, bool(aggregate), alias_to, bool(any_case))
            for name, categories, aggregate, alias_to, any_case in rows
        }

        def resolved(name: str) -> tuple[str, bool, str]:
            seen = {name}
            categories, aggregate, alias_to, _ = table[name]
            while alias_to and alias_to in table and alias_to not in seen:
                seen.add(alias_to)
                name = alias_to
                categories, aggregate, alias_to, _ = table[name]
            return categories, aggregate, name

        names, any_case, aggregates = set(SYNTAX_FUNCTIONS), set(), set()
        for name, (_, _, _, insensitive) in table.items():
            categories, aggregate, target = resolved(name)
            if not (target in PURE_OTHERS or {c.strip() for c in categories.split(",")} & SAFE_CATEGORIES):
                continue
            names.add(name)
            if insensitive:
                any_case.add(name.lower())
            if aggregate:
                aggregates.add(name.lower() if insensitive else name)
        return cls(frozenset(names), frozenset(any_case), frozenset(aggregates))

    def allows(self, name: str) -> bool:
        """True for a catalogued function, or an aggregate one followed by combinators (countIf, ...)."""
        if name in self.names or name.lower() in self.any_case:
            return True
        return self._combined(name) is not None

    def _combined(self, name: str) -> str | None:
        """The aggregate function `name` applies combinators to, if it does."""
        for suffix in AGGREGATE_COMBINATORS:
            base = name.removesuffix(suffix)
            if base == name or not base:
                continue
            if base in self.aggregates or base.lower() in self.aggregates:
                return base
            if (inner := self._combined(base)) is not None:
                return inner
        return None


@dataclass(frozen=True)
class ReadPolicy:
    """The statements user SQL may be: reads of `tables` in `database` calling `functions`."""

    database: str
    tables: frozenset[str]
    functions: FunctionCatalog
    table_functions: frozenset[str] = TABLE_FUNCTIONS

    def check(self, tree: Mapping[str, Any]) -> None:
        """Raise QueryError naming the first construct of `tree` (parseQueryToJSON's output) outside the
        policy; return None when the whole statement is inside it."""
        _Walk(self, frozenset(_cte_names(tree))).statement(tree)


class _Walk:
    """One walk over one statement's tree."""

    def __init__(self, policy: ReadPolicy, ctes: frozenset[str]) -> None:
        self.policy = policy
        self.ctes = ctes

    def statement(self, tree: Mapping[str, Any]) -> None:
        kind = tree.get("type")
        if kind == "ExplainQuery":
            if tree.get("kind") not in _EXPLAIN_KINDS:
                raise QueryError(
                    f"{tree.get('kind')} is not accepted; EXPLAIN, EXPLAIN PLAN, AST, SYNTAX, ... are"
                )
            self.node(tree)
            kind = (tree.get("query") or {}).get("type")
        elif kind == "SelectWithUnionQuery":
            self.node(tree)
            return
        if kind != "SelectWithUnionQuery":
            raise QueryError(f"only SELECT statements (and EXPLAIN of one) are accepted, not {_named(kind)}")

    def node(self, node: Mapping[str, Any]) -> None:
        kind = node.get("type")
        allowed = NODE_KEYS.get(kind)  # type: ignore[arg-type]
        if allowed is None:
            raise QueryError(f"{_named(kind)} is not accepted in a query")
        for key, value in node.items():
            if key == "type":
                continue
            if key not in allowed:
                raise QueryError(f"{_CLAUSES.get(key, f'{kind}.{key}')} is not accepted in a query")
            if key in _OUTFILE_FLAGS and value:
                raise QueryError("INTO OUTFILE is not accepted in a query")
        getattr(self, f"_{kind}", self._children)(node)

    def _children(self, node: Mapping[str, Any]) -> None:
        for key, value in node.items():
            if key != "type":
                for child in _nodes(value):
                    self.node(child)

    def _Literal(self, node: Mapping[str, Any]) -> None:
        """Data only: nothing in a literal's value is a node."""

    def _Function(self, node: Mapping[str, Any]) -> None:
        name = str(node.get("name", ""))
        if not self.policy.functions.allows(name):
            raise QueryError(f"function {name}() is not accepted in a query (it is not on the allowlist)")
        if name in _IN_FUNCTIONS:
            arguments = (node.get("arguments") or {}).get("children") or []
            if len(arguments) == 2 and arguments[1].get("type") == "Identifier":
                self.table(arguments[1], "IN")
        self._children(node)

    def _TableExpression(self, node: Mapping[str, Any]) -> None:
        function = node.get("table_function")
        if function is not None:
            name = function.get("name") if function.get("type") == "Function" else function.get("type")
            if name not in self.policy.table_functions:
                raise QueryError(
                    f"table function {name}() is not accepted in a query; read the tables and views "
                    f"(or {', '.join(sorted(self.policy.table_functions))}())"
                )
            self._table_function(function)
        self._children({key: value for key, value in node.items() if key != "table_function"})

    def _table_function(self, function: Mapping[str, Any]) -> None:
        """An allowed table function's arguments, checked as any expression's."""
        if unknown := set(function) - NODE_KEYS["Function"] - {"type"}:
            raise QueryError(
                f"table function {function.get('name')}(): {', '.join(sorted(unknown))} not accepted"
            )
        self._children({key: value for key, value in function.items() if key != "name"})

    def _TableIdentifier(self, node: Mapping[str, Any]) -> None:
        self.table(node, "FROM")

    def _Identifier(self, node: Mapping[str, Any]) -> None:
        if node.get("children"):
            raise QueryError("identifiers from parameters ({name:Identifier}) are not accepted in a query")

    def _QueryParameter(self, node: Mapping[str, Any]) -> None:
        if str(node.get("param_type", "")).strip().lower().startswith("identifier"):
            raise QueryError("identifiers from parameters ({name:Identifier}) are not accepted in a query")

    def table(self, node: Mapping[str, Any], where: str) -> None:
        """A table named in FROM, JOIN or IN: one of the project's, or a name this statement's WITH made."""
        if node.get("children"):
            raise QueryError("identifiers from parameters ({name:Identifier}) are not accepted in a query")
        parts = list(node.get("name_parts") or [node.get("name", "")])
        name = ".".join(parts)
        if len(parts) == 1 and (parts[0] in self.policy.tables or parts[0] in self.ctes):
            return
        if len(parts) == 2 and parts[0] == self.policy.database and parts[1] in self.policy.tables:
            return
        raise QueryError(
            f"{where} {name}: queries read only fleetlens's tables and views "
            f"({', '.join(sorted(self.policy.tables))})"
        )


def _nodes(value: Any) -> Iterator[Mapping[str, Any]]:
    """The tree nodes in a value: a node, or the nodes of a list."""
    if isinstance(value, Mapping) and "type" in value:
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _nodes(item)


def _cte_names(tree: Any) -> Iterator[str]:
    """Every name a WITH clause of the statement gives to a subquery."""
    if isinstance(tree, Mapping):
        if tree.get("type") == "WithElement" and isinstance(tree.get("name"), str):
            yield tree["name"]
        for key, value in tree.items():
            if not (tree.get("type") == "Literal" and key == "value"):
                yield from _cte_names(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from _cte_names(item)


def _named(kind: object) -> str:
    """A node type as people know it: ClickHouse's AST names end in Query for statements."""
    text = str(kind or "an unknown statement")
    return text.removesuffix("Query").upper() + " statement" if text.endswith("Query") else text

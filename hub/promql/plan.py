"""PromQL text to a plan the hub can evaluate: parsed by promql_parser (the Prometheus grammar), then
turned into this module's nodes, refusing with PromQLError (bad_data) every construct the hub does not
evaluate yet, named ("function predict_linear is not supported"). promql_parser checks each call's
number and types of arguments; string arguments that cannot work (a bad regular expression or label
name) are refused here, naming the function.

Supported: selectors with = != =~ !~, `offset` and `@` (a time, start() or end(): pin_at fixes the last
two once the query's times are known); range selectors and subqueries inside RANGE_FUNCTIONS, or as an
instant query's result; AGGREGATIONS with by/without (and their parameter); functions.FUNCTIONS over
instant vectors and scalars; number literals and unary minus; ARITHMETIC and
COMPARISONS (with `bool`) between scalars and vectors, SET_OPERATORS between vectors, with Matching's
on/ignoring and group_left/group_right.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import promql_parser as pp
import re2

from collectors.logtext import printable
from hub.errors import PromQLError
from hub.promql.functions import FUNCTIONS, LABEL_NAME, SCALAR_FUNCTIONS, anchored, check_arguments
from hub.promql.request import MAX_POINTS, MAX_TIMESTAMP_MS

RANGE_FUNCTIONS = frozenset(
    {
        "rate",
        "increase",
        "irate",
        "avg_over_time",
        "min_over_time",
        "max_over_time",
        "sum_over_time",
        "count_over_time",
        "last_over_time",
        "delta",
        "deriv",
        "quantile_over_time",
        "stddev_over_time",
        "stdvar_over_time",
        "present_over_time",
        "changes",
        "resets",
    }
)
AGGREGATIONS = frozenset(
    {
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "stddev",
        "stdvar",
        "group",
    }
)
ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "^", "atan2"})
COMPARISONS = frozenset({">", "<", ">=", "<=", "==", "!="})
SET_OPERATORS = frozenset({"and", "or", "unless"})
CARDINALITIES = (  # promql_parser.VectorMatchCardinality is not hashable
    (pp.VectorMatchCardinality.OneToOne, "one-to-one"),
    (pp.VectorMatchCardinality.ManyToOne, "many-to-one"),
    (pp.VectorMatchCardinality.OneToMany, "one-to-many"),
    (pp.VectorMatchCardinality.ManyToMany, "many-to-many"),
)
AT_EDGES = ((pp.AtModifierType.Start, "start"), (pp.AtModifierType.End, "end"))
DEFAULT_RESOLUTION_MS = 60_000  # a subquery's step when it names none: Prometheus's evaluation_interval
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MATCH_OPS = (  # promql_parser.MatchOp is not hashable
    (pp.MatchOp.Equal, "="),
    (pp.MatchOp.NotEqual, "!="),
    (pp.MatchOp.Re, "=~"),
    (pp.MatchOp.NotRe, "!~"),
)
MAX_QUERY_CHARS = 64 * 1024
# Operators and brackets a query may hold: a bound on how deep its parse tree nests. promql_parser parses
# recursively on the thread's stack and ends the process on some thousands (a "x+x+...+x" of 10 KB).
MAX_NESTING = 200
OPERATOR_CHARACTERS = frozenset("+-*/%^<>=!([")  # outside label matchers' braces and quotes
OPERATOR_WORDS = frozenset({"and", "or", "unless", "atan2"})


At = int | str | None  # `@`: a time in ms, "start" or "end" (until pin_at), or None for none


@dataclass(frozen=True)
class Selector:
    """Series by their label matchers ((name, op, value), op one of = != =~ !~), read `offset_ms` back
    from the evaluation time or from `at`; `range_ms` > 0 for a range selector [d], 0 for an instant one."""

    matchers: tuple[tuple[str, str, str], ...]
    offset_ms: int
    range_ms: int = 0
    at: At = None


@dataclass(frozen=True)
class Subquery:
    """`expr[range:step]`: `expr` evaluated at each multiple of `step_ms` in [t - range, t], t being the
    evaluation time (or `at`) moved back by `offset_ms`."""

    expr: Node
    range_ms: int
    step_ms: int
    offset_ms: int
    at: At = None


@dataclass(frozen=True)
class Number:
    value: float


@dataclass(frozen=True)
class RangeFunction:
    """One of RANGE_FUNCTIONS over a range selector or a subquery; `parameter` the scalar before it
    (quantile_over_time's φ)."""

    name: str
    source: Selector | Subquery
    parameter: Node | None = None


@dataclass(frozen=True)
class Aggregation:
    """One of AGGREGATIONS, grouping by `labels` (or by all but them and __name__, `without`)."""

    op: str
    labels: tuple[str, ...]
    without: bool
    expr: Node
    parameter: Node | str | None = None  # topk, bottomk, quantile: a scalar; count_values: a label name


@dataclass(frozen=True)
class Function:
    """One of functions.FUNCTIONS (absent aside) over instant vectors and scalars: `args` holds the
    argument nodes and string literals (label_replace's, label_join's) in call order."""

    name: str
    args: tuple[Node | str, ...]


@dataclass(frozen=True)
class Absent:
    """absent(expr): 1 with `labels` (the equality matchers of a selector argument) when expr is empty."""

    expr: Node
    labels: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Matching:
    """How two vectors' series pair up: on `labels` (`on`), or on all labels but them and __name__;
    `card` one of CARDINALITIES' names; `include`: the labels group_left/group_right copy from the "one"
    side."""

    on: bool = False
    labels: tuple[str, ...] = ()
    card: str = "one-to-one"
    include: tuple[str, ...] = ()


@dataclass(frozen=True)
class Binary:
    """An arithmetic, comparison or set operator; `return_bool` for a comparison with `bool`."""

    op: str
    lhs: Node
    rhs: Node
    return_bool: bool
    matching: Matching = Matching()


Node = Selector | Subquery | Number | RangeFunction | Aggregation | Binary | Function | Absent


def plan(query: str) -> Node:
    """The plan of `query`; PromQLError (bad_data) naming a parse error or an unsupported construct."""
    if len(query) > MAX_QUERY_CHARS:
        raise PromQLError(f"the query is longer than {MAX_QUERY_CHARS} characters")
    if _operators(query) > MAX_NESTING:
        raise PromQLError(f"the query holds more than {MAX_NESTING} operators and brackets")
    try:
        tree = pp.parse(query)
    except (ValueError, RecursionError, OverflowError) as error:
        raise PromQLError(f'invalid parameter "query": {printable(str(error))[:500]}') from None
    while isinstance(tree, pp.ParenExpr):
        tree = tree.expr
    if isinstance(tree, pp.MatrixSelector):
        return _selector(tree.vector_selector, _millis(tree.range))
    if isinstance(tree, pp.SubqueryExpr):
        return _subquery(tree)
    return _node(tree)


def _operators(query: str) -> int:
    """How many operators and brackets `query` holds outside quotes and label matchers: at least the
    depth its parse tree can reach. A bound checked before the parser runs, not a reading of the query,
    which only the parser makes."""
    count, quote, escaped, braces, word = 0, "", False, 0, ""
    for char in query + " ":
        if quote:
            if escaped:
                escaped = False
            elif char == "\\" and quote != "`":  # backquoted strings have no escapes
                escaped = True
            elif char == quote:
                quote = ""
            continue
        if char.isalnum() or char in "_:":
            word += char
            continue
        count += word.lower() in OPERATOR_WORDS
        word = ""
        if char in "\"'`":
            quote = char
        elif char in "{}":
            braces += 1 if char == "{" else -1
        elif braces <= 0 and char in OPERATOR_CHARACTERS:
            count += 1
    return count


def is_range_vector(node: Node) -> bool:
    """Whether `node` evaluates to a range vector (a range selector or a subquery)."""
    return isinstance(node, Subquery) or (isinstance(node, Selector) and node.range_ms > 0)


def pin_at(node: Node, start_ms: int, end_ms: int) -> Node:
    """`node` with each `@ start()` and `@ end()` replaced by the query's start or end time (ms)."""
    changes: dict[str, Any] = {}
    for item in fields(node):
        value = getattr(node, item.name)
        if isinstance(value, Node):
            changes[item.name] = pin_at(value, start_ms, end_ms)
        elif isinstance(value, tuple) and any(isinstance(child, Node) for child in value):
            changes[item.name] = tuple(
                pin_at(child, start_ms, end_ms) if isinstance(child, Node) else child for child in value
            )
    if isinstance(node, Selector | Subquery) and isinstance(node.at, str):
        changes["at"] = start_ms if node.at == "start" else end_ms
    return replace(node, **changes)


def children(node: Node) -> Iterator[Node]:
    """The nodes `node` holds, in its fields or in tuples there (a node type's fields say what it holds)."""
    for item in fields(node):
        value = getattr(node, item.name)
        for child in value if isinstance(value, tuple) else (value,):
            if isinstance(child, Node):
                yield child


def is_scalar(node: Node) -> bool:
    """Whether `node` evaluates to a scalar (else an instant vector)."""
    if isinstance(node, Binary):
        return is_scalar(node.lhs) and is_scalar(node.rhs)
    if isinstance(node, Function):
        return node.name in SCALAR_FUNCTIONS
    return isinstance(node, Number)


def _node(tree: Any) -> Node:
    if isinstance(tree, pp.ParenExpr):
        return _node(tree.expr)
    if isinstance(tree, pp.NumberLiteral):
        return Number(float(tree.val))
    if isinstance(tree, pp.VectorSelector):
        return _selector(tree, 0)
    if isinstance(tree, pp.UnaryExpr):
        inner = _node(tree.expr)
        return Number(-inner.value) if isinstance(inner, Number) else Binary("*", Number(-1.0), inner, False)
    if isinstance(tree, pp.Call):
        return _call(tree)
    if isinstance(tree, pp.AggregateExpr):
        return _aggregation(tree)
    if isinstance(tree, pp.BinaryExpr):
        return _binary(tree)
    if isinstance(tree, pp.MatrixSelector | pp.SubqueryExpr):
        raise PromQLError("a range vector is supported only as a function's argument or the query's result")
    if isinstance(tree, pp.StringLiteral):
        raise PromQLError("string literals are not supported")
    raise PromQLError(f"the expression {type(tree).__name__} is not supported yet")


def _selector(tree: pp.VectorSelector, range_ms: int) -> Selector:
    if tree.matchers.or_matchers:
        raise PromQLError("`or` between label matchers is not supported yet")
    matchers = [(m.name, _match_op(m.op), m.value) for m in tree.matchers.matchers]
    for name, op, value in matchers:
        if op in ("=~", "!~"):
            _check_regex(name, op, value)
    if tree.name is not None:
        matchers.insert(0, ("__name__", "=", tree.name))
    return Selector(tuple(matchers), _offset(tree.offset), range_ms, _at(tree.at))


def _check_regex(name: str, op: str, value: str) -> None:
    """PromQLError (bad_data) naming the matcher whose regular expression RE2 refuses, as ClickHouse
    would when running it (the parser's own regex engine accepts more, such as repeats above 1000)."""
    try:
        anchored(value)
    except re2.error as error:
        matcher = printable(f"{name}{op}{json.dumps(value, ensure_ascii=False)}")[:200]
        reason = error.args[0] if error.args else ""
        reason = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise PromQLError(
            f'invalid parameter "query": invalid regular expression in matcher {matcher}: '
            f"{printable(reason)[:200]}"
        ) from None


def _subquery(tree: pp.SubqueryExpr) -> Subquery:
    step_ms = _millis(tree.step) if tree.step is not None else DEFAULT_RESOLUTION_MS
    if step_ms <= 0:
        raise PromQLError("a subquery's step must be positive")
    if _millis(tree.range) // step_ms >= MAX_POINTS:
        raise PromQLError(f"a subquery's range holds more than {MAX_POINTS} steps: make its step longer")
    expr = _vector(tree.expr, "subquery")
    return Subquery(expr, _millis(tree.range), step_ms, _offset(tree.offset), _at(tree.at))


def _offset(offset: timedelta | None) -> int:
    return _millis(offset) if offset is not None else 0


def _at(at: Any) -> At:
    """The `@` of a selector or subquery: ms since the epoch, "start", "end", or None."""
    if at is None:
        return None
    if at.type == pp.AtModifierType.At:
        try:
            at_ms = _millis(at.at - EPOCH)
        except (ValueError, OverflowError):  # promql_parser's datetime cannot hold it
            at_ms = MAX_TIMESTAMP_MS + 1
        if at_ms > MAX_TIMESTAMP_MS:
            raise PromQLError("the @ modifier's time is out of range")
        return at_ms
    return next(text for known, text in AT_EDGES if known == at.type)


def _match_op(op: pp.MatchOp) -> str:
    return next(text for known, text in MATCH_OPS if known == op)


def _call(tree: pp.Call) -> Node:
    """A function call; promql_parser has checked its arguments' number and types."""
    name = tree.func.name
    if name in RANGE_FUNCTIONS:
        *parameters, argument = tree.args
        parameter = _node(parameters[0]) if parameters else None
        while isinstance(argument, pp.ParenExpr):
            argument = argument.expr
        if isinstance(argument, pp.SubqueryExpr):
            return RangeFunction(name, _subquery(argument), parameter)
        if not isinstance(argument, pp.MatrixSelector):
            raise PromQLError(f"function {name}: expected a range selector or a subquery as its argument")
        return RangeFunction(name, _selector(argument.vector_selector, _millis(argument.range)), parameter)
    if name not in FUNCTIONS:
        raise PromQLError(f"function {name} is not supported yet")
    args = tuple(str(arg.val) if isinstance(arg, pp.StringLiteral) else _node(arg) for arg in tree.args)
    check_arguments(name, args)
    if name == "absent":
        (vector,) = args
        assert not isinstance(vector, str)
        return Absent(vector, _absent_labels(vector))
    return Function(name, args)


def _absent_labels(node: Node) -> tuple[tuple[str, str], ...]:
    """The labels absent() gives a selector, in parentheses or not: those it matches with `=` once, but
    __name__; none for any other argument."""
    if not isinstance(node, Selector):
        return ()
    named = [name for name, _, _ in node.matchers]
    equal = {
        name: value
        for name, op, value in node.matchers
        if op == "=" and name != "__name__" and named.count(name) == 1 and value
    }
    return tuple(sorted(equal.items()))


def _aggregation(tree: pp.AggregateExpr) -> Aggregation:
    op = str(tree.op)
    if op not in AGGREGATIONS:
        raise PromQLError(f"aggregation {op} is not supported yet")
    parameter: Node | str | None = None
    if isinstance(tree.param, pp.StringLiteral):
        parameter = str(tree.param.val)
        if not LABEL_NAME.fullmatch(parameter):
            raise PromQLError(f"aggregation {op}: invalid label name {parameter!r}")
    elif tree.param is not None:
        parameter = _node(tree.param)
    modifier = tree.modifier
    expr = _vector(tree.expr, f"aggregation {op}")
    if modifier is None:
        return Aggregation(op, (), False, expr, parameter)
    without = modifier.type == pp.AggModifierType.Without
    return Aggregation(op, tuple(modifier.labels), without, expr, parameter)


def _binary(tree: pp.BinaryExpr) -> Binary:
    op = str(tree.op)
    if op not in ARITHMETIC | COMPARISONS | SET_OPERATORS:
        raise PromQLError(f"binary operator {op} is not supported yet")
    lhs, rhs = _node(tree.lhs), _node(tree.rhs)
    modifier = tree.modifier
    default = Matching(card="many-to-many" if op in SET_OPERATORS else "one-to-one")
    if modifier is None:
        return Binary(op, lhs, rhs, False, default)
    card = next(text for known, text in CARDINALITIES if known == modifier.card)
    on, labels = default.on, default.labels
    if modifier.matching is not None:
        on = modifier.matching.type == pp.LabelModifierType.Include
        labels = tuple(modifier.matching.labels)
    include = tuple(modifier.group_labels) if card in ("many-to-one", "one-to-many") else ()
    return Binary(op, lhs, rhs, bool(modifier.return_bool), Matching(on, labels, card, include))


def _vector(tree: Any, where: str) -> Node:
    node = _node(tree)
    if is_scalar(node):
        raise PromQLError(f"{where}: expected an instant vector, got a scalar")
    return node


def _millis(duration: timedelta) -> int:
    return round(duration.total_seconds() * 1000)

"""Binary operators at one evaluation time, with the rules of Prometheus 2 (promql/engine.go VectorBinop,
VectorAnd/Or/Unless, VectorscalarBinop, signatureFunc and resultMetric):

- two series pair up when their labels agree on `on(...)`'s labels, or on all but `ignoring(...)`'s and
  __name__; one-to-one unless group_left/group_right names the side with many series per match group,
  whose series keep their labels plus those group_x names, copied from the "one" side;
- arithmetic (but atan2, as Prometheus 2.42's shouldDropMetricName) and `bool` comparisons drop
  __name__; a filtering comparison keeps the left value, a vector-scalar one the vector's;
- and/or/unless keep the series as they are (or: the left's, then the right's that match none of them);
- ambiguous matches are Prometheus's execution errors (PromQLError, execution, 422).
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Iterator

from hub.errors import PromQLError
from hub.promql.functions import collect, drop_name, go_divide, group_of
from hub.promql.plan import COMPARISONS, SET_OPERATORS, Binary, Matching
from hub.promql.sql import Labels

Vector = dict[Labels, float]

COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
DROPS_NAME = frozenset({"+", "-", "*", "/", "%", "^"})


def binary(node: Binary, lhs: Vector | float, rhs: Vector | float) -> Vector | float:
    """`lhs node.op rhs`, each side a scalar or an instant vector."""
    if isinstance(lhs, float) and isinstance(rhs, float):
        if node.op in COMPARISONS:
            return float(COMPARE[node.op](lhs, rhs))
        return arithmetic(node.op, lhs, rhs)
    if isinstance(lhs, dict) and isinstance(rhs, dict):
        if node.op in SET_OPERATORS:
            return _set_operation(node.op, node.matching, lhs, rhs)
        return _vectors(node, lhs, rhs)
    vector_on_left = isinstance(lhs, dict)
    vector, scalar = (lhs, rhs) if vector_on_left else (rhs, lhs)
    assert isinstance(vector, dict) and isinstance(scalar, float)
    return collect(_vector_scalar(node, vector, scalar, vector_on_left))


def _vector_scalar(
    node: Binary, vector: Vector, scalar: float, vector_on_left: bool
) -> Iterator[tuple[Labels, float]]:
    """Each sample of `vector op scalar` (or `scalar op vector`); series that dropping __name__ makes
    one label set stay apart here, for collect to refuse as Prometheus does."""
    for labels, value in vector.items():
        left, right = (value, scalar) if vector_on_left else (scalar, value)
        if node.op not in COMPARISONS:
            yield (drop_name(labels) if node.op in DROPS_NAME else labels), arithmetic(node.op, left, right)
        elif node.return_bool:
            yield drop_name(labels), float(COMPARE[node.op](left, right))
        elif COMPARE[node.op](left, right):
            yield labels, value


def arithmetic(op: str, left: float, right: float) -> float:
    """`left op right` as Go's float64 arithmetic and math package: ±Inf or NaN, never an error."""
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if op == "/":
        return go_divide(left, right)
    if op == "%":
        return _modulo(left, right)
    if op == "^":
        return _power(left, right)
    return math.atan2(left, right)


def _modulo(left: float, right: float) -> float:
    """Go's math.Mod: NaN for a zero divisor or an infinite or NaN dividend, the sign of `left`."""
    if right == 0 or math.isinf(left) or math.isnan(left) or math.isnan(right):
        return math.nan
    return math.fmod(left, right)


def _power(base: float, exponent: float) -> float:
    """Go's math.Pow, where Python's raises: overflow is ±Inf, 0 to a negative power ±Inf, a negative
    base to a fractional power NaN."""
    odd = exponent.is_integer() and exponent % 2 == 1
    try:
        return math.pow(base, exponent)
    except OverflowError:
        return -math.inf if base < 0 and odd else math.inf
    except ValueError:
        if base == 0:
            return math.copysign(math.inf, base) if odd else math.inf
        return math.nan


def _signature(matching: Matching) -> Callable[[Labels], Labels]:
    """The labels two series must share to match: `on`'s, or all but `ignoring`'s and __name__."""
    chosen = frozenset(matching.labels)
    return lambda labels: group_of(labels, chosen, not matching.on)


def _set_operation(op: str, matching: Matching, lhs: Vector, rhs: Vector) -> Vector:
    signature = _signature(matching)
    if op == "or":
        left = {signature(labels) for labels in lhs}
        return {**lhs, **{labels: v for labels, v in rhs.items() if signature(labels) not in left}}
    right = {signature(labels) for labels in rhs}
    wanted = op == "and"
    return {labels: v for labels, v in lhs.items() if (signature(labels) in right) == wanted}


def _vectors(node: Binary, lhs: Vector, rhs: Vector) -> Vector:
    """An arithmetic or comparison operator between two vectors, matched as `node.matching` says."""
    matching = node.matching
    if not lhs or not rhs:
        return {}
    signature = _signature(matching)
    swapped = matching.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    ones: dict[Labels, tuple[Labels, float]] = {}
    for labels, value in one.items():
        key = signature(labels)
        if key in ones:
            side = "left" if swapped else "right"
            raise PromQLError(
                f"found duplicate series for the match group {_text(key)} on the {side} hand-side of the "
                f"operation: [{_text(labels)}, {_text(ones[key][0])}];many-to-many matching not allowed: "
                "matching labels must be unique on one side",
                "execution",
                422,
            )
        ones[key] = (labels, value)
    result: Vector = {}
    produced: dict[Labels, set[Labels]] = {}
    for labels, value in many.items():
        key = signature(labels)
        if key not in ones:
            continue
        one_labels, one_value = ones[key]
        left, right = (one_value, value) if swapped else (value, one_value)
        if node.op in COMPARISONS:
            kept = COMPARE[node.op](left, right)
            if not kept and not node.return_bool:
                continue
            value = float(kept) if node.return_bool else left
        else:
            value = arithmetic(node.op, left, right)
        metric = _result_labels(node, labels, one_labels)
        seen = produced.setdefault(key, set())
        if matching.card == "one-to-one" and seen:
            raise PromQLError(
                "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)",
                "execution",
                422,
            )
        if metric in seen:
            raise PromQLError(
                "multiple matches for labels: grouping labels must ensure unique matches", "execution", 422
            )
        seen.add(metric)
        result[metric] = value
    return result


def _result_labels(node: Binary, many: Labels, one: Labels) -> Labels:
    """resultMetric: the "many" side's labels, __name__ dropped as DROPS_NAME and `bool` say, cut to the
    matching labels one-to-one, with group_x's labels taken from the "one" side (dropped where it lacks
    them)."""
    matching = node.matching
    labels = dict(many)
    if node.op in DROPS_NAME or node.return_bool:
        labels.pop("__name__", None)
    if matching.card == "one-to-one":
        chosen = set(matching.labels)
        labels = {k: v for k, v in labels.items() if (k in chosen) == matching.on}
    from_one = dict(one)
    for name in matching.include:
        if from_one.get(name):
            labels[name] = from_one[name]
        else:
            labels.pop(name, None)
    return tuple(sorted(labels.items()))


def _text(labels: Labels) -> str:
    """Labels as Prometheus writes them in messages: {name="value", ...}."""
    return "{" + ", ".join(f"{name}={json.dumps(value)}" for name, value in labels) + "}"

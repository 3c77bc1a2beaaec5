"""PromQL's functions and parametric aggregations with Prometheus 2's rules (promql/functions.go,
quantile.go and the aggregation in engine.go): Go's float64 semantics throughout (NaN and ±Inf, never a
Python exception), RE2 regular expressions with Go's `$1`/`${name}` expansion, and the label rules
Prometheus applies (functions drop __name__; label_replace and label_join keep it unless they set it).

Every function here takes Python floats or Sequences of them (lists or numpy arrays); every number it
returns is a Python float.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence

import re2

from hub.errors import PromQLError

Labels = tuple[tuple[str, str], ...]  # as hub.promql.sql's, which imports this module through plan
Vector = dict[Labels, float]
Points = tuple[Sequence[int], Sequence[float]]  # times (ms) and values of one series within a range
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
GO_FLOAT = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity|nan)", re.IGNORECASE)
GO_HEX_FLOAT = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?\d+")
INT64_RANGE = 2.0**63
QUIET = re2.Options()
QUIET.log_errors = False  # a bad pattern is answered to the client, not logged


def collect(pairs: Iterable[tuple[Labels, float]]) -> Vector:
    """The vector of `pairs`; Prometheus's execution error when two share a label set."""
    result: Vector = {}
    for labels, value in pairs:
        if labels in result:
            raise PromQLError("vector cannot contain metrics with the same labelset", "execution", 422)
        result[labels] = value
    return result


@functools.lru_cache(maxsize=1 << 16)
def group_of(labels: Labels, chosen: frozenset[str], without: bool) -> Labels:
    """The group of a series with `labels`: those `chosen`, or (`without`) all but them and __name__;
    remembered, as a range query asks it of the same series at every step."""
    if without:
        return tuple((k, v) for k, v in labels if k not in chosen and k != "__name__")
    return tuple((k, v) for k, v in labels if k in chosen)


def drop_name(labels: Labels) -> Labels:
    return tuple(pair for pair in labels if pair[0] != "__name__")


def with_label(labels: Labels, name: str, value: str) -> Labels:
    """`labels` with `name` set to `value`, or removed when `value` is empty (as Prometheus's builder)."""
    kept = [pair for pair in labels if pair[0] != name]
    return tuple(sorted([*kept, (name, value)])) if value else tuple(kept)


# ---- float64 as Go computes it ----------------------------------------------------------------------


def go_max(a: float, b: float) -> float:
    """Go's math.Max: +Inf beats NaN, NaN beats the rest, +0 beats -0."""
    if a == math.inf or b == math.inf:
        return math.inf
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == b == 0:
        return b if math.copysign(1, a) < 0 else a
    return a if a > b else b


def go_min(a: float, b: float) -> float:
    """Go's math.Min: -Inf beats NaN, NaN beats the rest, -0 beats +0."""
    return -go_max(-a, -b)


def go_floor(x: float) -> float:
    return x if not math.isfinite(x) else math.copysign(float(math.floor(x)), x)


def go_ceil(x: float) -> float:
    return x if not math.isfinite(x) else math.copysign(float(math.ceil(x)), x)


def _logarithm(log: Callable[[float], float]) -> Callable[[float], float]:
    """Go's logarithm: NaN below zero, -Inf at zero."""
    return lambda x: math.nan if x < 0 else -math.inf if x == 0 else x if not math.isfinite(x) else log(x)


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _sgn(x: float) -> float:
    return 1.0 if x > 0 else -1.0 if x < 0 else x


def go_divide(left: float, right: float) -> float:
    """`left / right` as Go's float64 division: by zero it is ±Inf or NaN."""
    if right != 0:
        return left / right
    if left == 0 or math.isnan(left):
        return math.nan
    return math.copysign(math.inf, left) * math.copysign(1, right)


def kahan_add(increment: float, total: float, compensation: float) -> tuple[float, float]:
    """Prometheus's kahanSumInc (Neumaier's variant): the new sum and compensation."""
    new_total = total + increment
    if abs(total) >= abs(increment):
        compensation += (total - new_total) + increment
    else:
        compensation += (increment - new_total) + total
    return new_total, compensation


MATH: dict[str, Callable[[float], float]] = {
    "abs": math.fabs,
    "ceil": go_ceil,
    "floor": go_floor,
    "sqrt": lambda x: math.nan if x < 0 else math.sqrt(x),
    "exp": _exp,
    "ln": _logarithm(math.log),
    "log2": _logarithm(math.log2),
    "log10": _logarithm(math.log10),
    "sgn": _sgn,
}


# ---- range functions ---------------------------------------------------------------------------------


def quantile(q: float, values: Sequence[float]) -> float:
    """Prometheus's quantile: the φ-quantile of `values` interpolated between neighbours, -Inf below
    φ = 0 and +Inf above 1; NaN values sort first."""
    if not values or math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(values, key=lambda v: (not math.isnan(v), v))
    rank = q * (len(ordered) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return float(ordered[lower] * (1 - weight) + ordered[upper] * weight)


def kahan_sum(values: Sequence[float]) -> float:
    """sum_over_time's compensated sum; an infinite sum without its compensation (which is NaN)."""
    total = compensation = 0.0
    for value in values:
        total, compensation = kahan_add(value, total, compensation)
    return float(total if math.isinf(total) else total + compensation)


def mean_over_time(values: Sequence[float]) -> float:
    """avg_over_time: the mean moved by each value's share (never overflowing where the sum would),
    Kahan-compensated, as Prometheus's funcAvgOverTime."""
    count = mean = compensation = 0.0
    for value in values:
        count += 1
        if not _keeps_infinite_mean(mean, value):
            mean, compensation = kahan_add(value / count - mean / count, mean, compensation)
    return float(mean if math.isinf(mean) else mean + compensation)


def _keeps_infinite_mean(mean: float, value: float) -> bool:
    """Whether an infinite `mean` stays as it is when `value` joins: an Inf of its sign or a finite
    value would otherwise make it Inf - Inf, NaN."""
    if not math.isinf(mean):
        return False
    if math.isinf(value):
        return (mean > 0) == (value > 0)
    return not math.isnan(value)


def variance_over_time(points: Points, start: int, end: int) -> float:
    """stdvar_over_time: the population variance, by Welford's method with Kahan-summed terms."""
    count = mean = mean_c = aux = aux_c = 0.0
    for value in points[1]:
        count += 1
        delta = value - (mean + mean_c)
        mean, mean_c = kahan_add(delta / count, mean, mean_c)
        aux, aux_c = kahan_add(delta * (value - (mean + mean_c)), aux, aux_c)
    return float((aux + aux_c) / count)


def deriv(points: Points, start: int, end: int) -> float | None:
    """The slope per second of the least-squares line through the samples (Prometheus's
    linearRegression, times taken from the first sample's); None below two samples."""
    times, values = points
    if len(values) < 2:
        return None
    if all(value == values[0] for value in values):
        return math.nan if math.isinf(values[0]) else 0.0
    n = sum_x = c_x = sum_y = c_y = sum_xy = c_xy = sum_x2 = c_x2 = 0.0
    for t, value in zip(times, values, strict=True):
        n += 1
        x = (t - times[0]) / 1000
        sum_x, c_x = kahan_add(x, sum_x, c_x)
        sum_y, c_y = kahan_add(value, sum_y, c_y)
        sum_xy, c_xy = kahan_add(x * value, sum_xy, c_xy)
        sum_x2, c_x2 = kahan_add(x * x, sum_x2, c_x2)
    sum_x, sum_y, sum_xy, sum_x2 = sum_x + c_x, sum_y + c_y, sum_xy + c_xy, sum_x2 + c_x2
    return float(go_divide(sum_xy - sum_x * sum_y / n, sum_x2 - sum_x * sum_x / n))


def _count_pairs(before: Callable[[float, float], bool]) -> Callable[[Points, int, int], float]:
    """How many neighbouring samples (previous, current) `before` holds for."""
    return lambda points, start, end: float(
        sum(1 for previous, current in itertools.pairwise(points[1]) if before(previous, current))
    )


def _changed(previous: float, current: float) -> bool:
    return current != previous and not (math.isnan(current) and math.isnan(previous))


CHANGES = _count_pairs(_changed)
RESETS = _count_pairs(operator.gt)


# ---- instant-vector functions -------------------------------------------------------------------------


def check_arguments(name: str, args: Sequence[object]) -> None:
    """PromQLError (bad_data) naming `name` when its string arguments cannot work: an invalid regular
    expression or label name."""
    strings = [arg for arg in args if isinstance(arg, str)]
    if name == "label_replace":
        destination, _, _, regex = strings
        try:
            anchored(regex)
        except re2.error:
            raise PromQLError(f"invalid regular expression in label_replace(): {regex}") from None
        names = {"destination": [destination]}
    elif name == "label_join":
        names = {"source": strings[2:], "destination": [strings[0]]}  # in the order Prometheus checks
    else:
        return
    for role, labels in names.items():
        for label in labels:
            if not LABEL_NAME.fullmatch(label):
                raise PromQLError(f"invalid {role} label name in {name}(): {label}")


@functools.lru_cache(maxsize=256)
def anchored(regex: str) -> re2._Regexp:
    """`regex` compiled by RE2, anchored at both ends as Prometheus anchors label_replace's."""
    return re2.compile(f"^(?:{regex})$", QUIET)


def label_replace(vector: Vector, destination: str, replacement: str, source: str, regex: str) -> Vector:
    """Each series with `destination` set to `replacement` expanded over `regex`'s match of `source`'s
    value; a series whose value does not match is kept as it is."""
    pattern = anchored(regex)
    pairs = []
    for labels, value in vector.items():
        match = pattern.search(dict(labels).get(source, ""))
        if match is not None:
            labels = with_label(labels, destination, expand(replacement, match))
        pairs.append((labels, value))
    return collect(pairs)


def label_join(vector: Vector, destination: str, separator: str, *sources: str) -> Vector:
    """Each series with `destination` set to the values of `sources` joined by `separator`."""
    pairs = []
    for labels, value in vector.items():
        found = dict(labels)
        joined = separator.join(found.get(source, "") for source in sources)
        pairs.append((with_label(labels, destination, joined), value))
    return collect(pairs)


def expand(template: str, match: re2._Match) -> str:
    """Go's Regexp.Expand: `$$` is `$`; `$name`, `${name}`, `$1` and `${1}` a group's text (empty when
    it took no part or does not exist; a name runs as far as letters, digits and `_` go); a malformed
    `$` is kept as text."""
    out, rest = [], template
    while "$" in rest:
        before, rest = rest.split("$", 1)
        out.append(before)
        if rest.startswith("$"):
            out.append("$")
            rest = rest[1:]
            continue
        braced = rest.startswith("{")
        length = _name_length(rest[braced:])
        if length == 0 or (braced and rest[1 + length : 2 + length] != "}"):
            out.append("$")
            continue
        out.append(_group(match, rest[braced : braced + length]))
        rest = rest[length + 2 * braced :]
    return "".join(out) + rest


def _name_length(text: str) -> int:
    """How many leading characters of `text` Go's Expand takes as a name: letters, digits (Nd), `_`."""
    length = 0
    for char in text:
        if not (char == "_" or char.isalpha() or unicodedata.category(char) == "Nd"):
            break
        length += 1
    return length


def _group(match: re2._Match, name: str) -> str:
    if name.isascii() and name.isdigit() and not (name.startswith("0") and len(name) > 1) and len(name) <= 9:
        index = int(name)
    else:
        index = match.re.groupindex.get(name, -1)
    if not 0 <= index <= match.re.groups:
        return ""
    return match.group(index) or ""


def histogram_quantile(q: float, vector: Vector) -> Vector:
    """The φ-quantile of each classic histogram (its `le` buckets, grouped by their other labels), as
    Prometheus's bucketQuantile; a series whose `le` is missing or not a number is skipped."""
    histograms: dict[Labels, list[tuple[float, float]]] = {}
    for labels, value in vector.items():
        bound = go_parse_float(dict(labels).get("le", ""))
        if bound is not None:
            key = tuple(pair for pair in labels if pair[0] != "le")
            histograms.setdefault(key, []).append((bound, value))
    return collect((drop_name(key), bucket_quantile(q, buckets)) for key, buckets in histograms.items())


def go_parse_float(text: str) -> float | None:
    """`text` read as Go's strconv.ParseFloat reads it (decimal, hexadecimal with an exponent, Inf,
    NaN), None where Go refuses it."""
    if GO_FLOAT.fullmatch(text):
        return float(text)
    if GO_HEX_FLOAT.fullmatch(text):
        return float.fromhex(text)
    return None


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's bucketQuantile over (upper bound, cumulative count) pairs: NaN without a +Inf
    bucket, fewer than two bounds or no observations; buckets of one bound summed and counts made
    monotonic; linear interpolation within the bucket the rank falls in."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets, key=operator.itemgetter(0))
    if buckets[-1][0] != math.inf:
        return math.nan
    bounds: list[float] = []
    counts: list[float] = []
    for bound, count in buckets:
        if bounds and bounds[-1] == bound:
            counts[-1] += count
        else:
            bounds.append(bound)
            counts.append(count)
    highest = -math.inf
    for index, count in enumerate(counts):
        if count > highest:
            highest = count
        elif count < highest:
            counts[index] = highest
    if len(bounds) < 2 or counts[-1] == 0:
        return math.nan
    rank = q * counts[-1]
    b = next((i for i in range(len(bounds) - 1) if counts[i] >= rank), len(bounds) - 1)
    if b == len(bounds) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, count = 0.0, counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return float(start + (bounds[b] - start) * go_divide(rank, count))


def clamp(vector: Vector, low: float, high: float) -> Vector:
    """Each value held within [low, high]; nothing when high < low."""
    if high < low:
        return {}
    return collect(
        (drop_name(labels), float(go_max(low, go_min(high, value)))) for labels, value in vector.items()
    )


def round_to(vector: Vector, to_nearest: float = 1.0) -> Vector:
    """Each value rounded to the nearest multiple of `to_nearest`, halves up, as Prometheus's round."""
    inverse = go_divide(1.0, to_nearest)
    return collect(
        (drop_name(labels), float(go_divide(go_floor(value * inverse + 0.5), inverse)))
        for labels, value in vector.items()
    )


def apply_math(name: str, vector: Vector) -> Vector:
    """One of MATH on each value, __name__ dropped."""
    function = MATH[name]
    return collect((drop_name(labels), float(function(value))) for labels, value in vector.items())


def call(name: str, args: Sequence[Vector | float | str], t_ms: int) -> Vector | float:
    """The function `name` (one of FUNCTIONS but absent and timestamp of a selector) at `t_ms` over its
    evaluated arguments."""
    if name == "time":
        return t_ms / 1000
    first = args[0]
    if name == "vector":
        assert isinstance(first, float)
        return {(): first}
    if name in VECTOR_FUNCTIONS:
        return VECTOR_FUNCTIONS[name](*args)
    assert isinstance(first, dict)
    if name == "scalar":
        return float(next(iter(first.values()))) if len(first) == 1 else math.nan
    if name == "timestamp":
        return collect((drop_name(labels), t_ms / 1000) for labels in first)
    return apply_math(name, first)


VECTOR_FUNCTIONS: Mapping[str, Callable[..., Vector]] = {
    "clamp": clamp,
    "clamp_min": lambda vector, low: clamp(vector, low, math.inf),
    "clamp_max": lambda vector, high: clamp(vector, -math.inf, high),
    "round": round_to,
    "label_replace": label_replace,
    "label_join": label_join,
    "histogram_quantile": histogram_quantile,
}
FUNCTIONS = frozenset({*MATH, *VECTOR_FUNCTIONS, "time", "vector", "scalar", "timestamp", "absent"})
SCALAR_FUNCTIONS = frozenset({"time", "scalar"})


# ---- parametric aggregations ---------------------------------------------------------------------------


def variance(values: Sequence[float]) -> float:
    """stdvar's population variance by Welford's method, as Prometheus's aggregation computes it: from
    the first value as the mean and 0 as the sum of squares (so one NaN or Inf alone varies by 0)."""
    count, mean, total = 1.0, values[0], 0.0
    for value in values[1:]:
        count += 1
        delta = value - mean
        mean += delta / count
        total += delta * (value - mean)
    return float(total / count)


def mean(values: Sequence[float]) -> float:
    """avg's incremental mean, without compensation, as Prometheus's aggregation computes it."""
    result = values[0]
    for count, value in enumerate(values[1:], start=2):
        if not _keeps_infinite_mean(result, value):
            result += value / count - result / count
    return float(result)


def top(samples: Sequence[tuple[Labels, float]], k: float, largest: bool) -> list[tuple[Labels, float]]:
    """topk's (`largest`) or bottomk's `k` samples, NaN ranked last; none for k < 1; Prometheus's
    execution error when k is not an int64."""
    if math.isnan(k) or not -INT64_RANGE <= k <= INT64_RANGE:
        raise PromQLError(f"Scalar value {k} overflows int64", "execution", 422)
    if int(k) < 1:
        return []
    sign = -1.0 if largest else 1.0
    return sorted(samples, key=lambda sample: (math.isnan(sample[1]), sign * sample[1]))[: int(k)]

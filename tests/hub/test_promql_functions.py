"""PromQL's functions and parametric aggregations on the hub equal Prometheus's own: counters with resets,
gauges with gaps, classic histograms (`le` buckets with +Inf, one non-monotonic, one without +Inf) and
series to relabel, remote-written to the hub and to Debian's Prometheus, asked the same queries through
`promtool query instant|range`. Bad arguments answer bad_data naming the function."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support import remote_write
from tests.support.promqlpeers import (
    assert_same,
    comparable,
    compare_instant,
    compare_range,
    get,
    hub_and_prometheus,
)

pytestmark = pytest.mark.integration

START_MS = (int(time.time()) - 2 * 3600) // 60 * 60_000  # inside both stores' windows, on a whole minute


def at(minute: float) -> int:
    return START_MS + round(minute * 60_000)


def counter(every_s: int, resets: set[int], step: float) -> list[tuple[int, float]]:
    """A counter sampled every `every_s` seconds for an hour, restarting from 1 at the indexes `resets`."""
    samples, value = [], 0.0
    for index in range(3600 // every_s):
        value = 1.0 if index in resets else value + step + index % 5 * 0.5
        samples.append((at(index * every_s / 60), value))
    return samples


def gauge(every_s: int, shift: float, gap: tuple[float, float] = (0.0, 0.0)) -> list[tuple[int, float]]:
    """A gauge around 50 sampled every `every_s` seconds for an hour, silent within `gap` (minutes)."""
    return [
        (at(index * every_s / 60), 40.0 + (index * 11 % 29) * 0.7 + shift)
        for index in range(3600 // every_s)
        if not gap[0] < index * every_s / 60 < gap[1]
    ]


def buckets(job: str, node: str, counts: dict[str, list[float]]) -> list[remote_write.Series]:
    """A classic histogram's bucket series, one per `le`, sampled every 30 s."""
    return [
        (
            {"__name__": "fl_latency_seconds_bucket", "node": node, "job": job, "le": le},
            [(at(index / 2), count) for index, count in enumerate(values)],
        )
        for le, values in counts.items()
    ]


def power(node: str, gpu: str) -> dict[str, str]:
    return {"__name__": "fl_power_watts", "node": node, "instance": f"{node}:9400", "gpu": gpu}


RANGE = range(120)
ODD = [math.nan, math.inf, -math.inf, -0.0, 2.5, -3.5, 1e308, 0.5]  # Go's float64 corners


def odd(series: int) -> list[tuple[int, float]]:
    """Every 15 s, the values of ODD in turn, each series `series` places further on."""
    return [(at(index / 4), ODD[(index + series) % len(ODD)]) for index in range(240)]


SERIES: list[remote_write.Series] = [
    ({"__name__": "fl_jobs_total", "node": "n1", "job": "a"}, counter(15, {60, 150}, 2.0)),
    ({"__name__": "fl_jobs_total", "node": "n2", "job": "b"}, counter(30, {70}, 5.0)),
    ({"__name__": "fl_jobs_again_total", "node": "n1", "job": "a"}, counter(15, set(), 1.0)),  # as n1's
    (power("n1", "0"), gauge(15, 0.0)),
    (power("n1", "1"), gauge(15, 0.35, gap=(20, 30))),
    (power("n2", "0"), gauge(20, 3.1)),
    *buckets(
        "a",
        "n1",
        {
            "0.1": [2.0 * i for i in RANGE],
            "0.5": [5.0 * i for i in RANGE],
            "1": [7.0 * i for i in RANGE],
            "+Inf": [8.0 * i + 1 for i in RANGE],
        },
    ),
    *buckets(
        "b",
        "n2",
        {
            "0.1": [3.0 * i for i in RANGE],
            "0.5": [3.0 * i - (2 if i % 5 == 0 else -4) for i in RANGE],  # at times below the 0.1 bucket
            "1": [2.0 * i for i in RANGE],  # with "1.0", one bucket in two series
            "1.0": [4.0 * i + 6 for i in RANGE],
            "+Inf": [9.0 * i + 7 for i in RANGE],
        },
    ),
    *(({"__name__": "fl_odd_value", "node": "n3", "k": str(k)}, odd(k)) for k in range(6)),
    *buckets("c", "n2", {"0.1": [1.0 * i for i in RANGE], "1": [2.0 * i for i in RANGE], "x": [3.0] * 120}),
    *(
        (
            {"__name__": "fl_huge_value", "node": "n4", "k": k},
            [(at(index / 4), 1e308) for index in range(240)],
        )
        for k in "ab"
    ),
    (
        {"__name__": "fl_signed_zero", "node": "n4"},
        [(at(index / 4), (0.0, -0.0)[index % 2]) for index in range(240)],
    ),
    (  # sums that lose the 1 unless compensated
        {"__name__": "fl_cancelling_value", "node": "n4"},
        [(at(index / 4), (1e16, 1.0, -1e16)[index % 3]) for index in range(240)],
    ),
]


@pytest.fixture(scope="module")
def peers(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with hub_and_prometheus(SERIES, chdb_dir, tmp_path_factory.mktemp("promql-functions")) as both:
        yield both


QUERIES = [
    "delta(fl_power_watts[5m])",
    "delta(fl_jobs_total[10m])",
    "deriv(fl_power_watts[5m])",
    "deriv(fl_jobs_total[10m] offset 1m)",
    "quantile_over_time(0.9, fl_power_watts[10m])",
    "quantile_over_time(0.25, fl_jobs_total[3m])",
    "quantile_over_time(1.5, fl_power_watts[2m])",
    "stddev_over_time(fl_power_watts[10m])",
    "stdvar_over_time(fl_jobs_total[5m])",
    "present_over_time(fl_power_watts[2m])",
    "changes(fl_power_watts[10m])",
    "changes(fl_jobs_total[15m])",
    "resets(fl_jobs_total[30m])",
    'quantile_over_time(scalar(fl_jobs_total{job="a"}) / 300, fl_power_watts[5m])',
    "deriv(fl_power_watts[10m:1m])",
    "quantile_over_time(0.5, abs(fl_power_watts - 50)[5m:30s])",
    "changes(round(fl_power_watts / 10)[15m:])",
    "topk(2, fl_power_watts)",
    "topk by (node) (1, fl_power_watts)",
    "bottomk(1, fl_power_watts)",
    "bottomk without (gpu) (2.9, fl_power_watts)",
    "quantile(0.5, fl_power_watts)",
    "quantile by (node) (0.9, fl_power_watts)",
    'count_values("value", round(fl_power_watts / 5))',
    'count_values by (node) ("bin", floor(fl_power_watts / 10))',
    'count_values without (instance) ("gpu", ceil(fl_power_watts / 20))',
    "stddev(fl_power_watts)",
    "stdvar by (node) (fl_power_watts)",
    "group by (job) (fl_jobs_total)",
    "abs(fl_power_watts - 50)",
    "ceil(fl_power_watts / 7)",
    "floor(fl_power_watts / 7)",
    "round(fl_power_watts / 7)",
    "round(fl_power_watts, 5)",
    "round(fl_power_watts, 0.3)",
    "clamp(fl_power_watts, 45, 55)",
    "clamp_min(fl_power_watts, 50)",
    "clamp_max(fl_power_watts, 50)",
    "sqrt(fl_power_watts - 50)",
    "exp(fl_power_watts / 10)",
    "ln(fl_power_watts - 50)",
    "log2(fl_power_watts)",
    "log10(fl_power_watts - 50)",
    "sgn(fl_power_watts - 50)",
    'label_replace(fl_power_watts, "host", "$1", "instance", "(.*):.*")',
    'label_replace(fl_power_watts, "port", "${2}_$1x $$ $name", "instance", "(?P<name>n.)(?::(.*))")',
    'label_replace(fl_power_watts, "odd", "${1 $ $01 ${x} $2é $", "instance", "(n.):(.*)")',
    'label_replace(fl_power_watts, "gpu", "", "gpu", "1")',
    'label_join(max_over_time(fl_power_watts[10m] @ end()), "where", "@", "node", "gpu")',
    'label_replace(fl_power_watts, "where", "here", "instance", "n1")',
    'label_join(fl_power_watts, "where", "/", "node", "gpu", "missing")',
    'label_join(fl_power_watts, "__name__", "_", "node", "gpu")',
    'absent(fl_missing{job="x", node=~"n.", gpu="0", gpu="1"})',
    'absent(fl_power_watts{node="n9"})',
    "absent(sum(fl_missing))",
    'absent((fl_missing{job="x"}))',
    "time()",
    "vector(time())",
    "fl_power_watts - time() / 1e6",
    'scalar(fl_jobs_total{job="a"})',
    "scalar(fl_power_watts)",
    "timestamp(fl_power_watts)",
    "timestamp(fl_power_watts offset 2m)",
    "timestamp(fl_power_watts * 1)",
    f"timestamp(fl_power_watts @ {at(40) / 1000})",
    f"topk(1, fl_power_watts @ {at(40) / 1000})",
    "abs(fl_odd_value)",
    "ceil(fl_odd_value)",
    "round(fl_odd_value, 0.5)",
    "clamp(fl_odd_value, -1, 1)",
    "sqrt(fl_odd_value)",
    "ln(fl_odd_value)",
    "exp(fl_odd_value)",
    "sgn(fl_odd_value)",
    "topk(3, fl_odd_value)",
    "bottomk(3, fl_odd_value)",
    "quantile(0.3, fl_odd_value)",
    'count_values("v", fl_odd_value)',
    "stddev(fl_odd_value)",
    "changes(fl_odd_value[5m])",
    "resets(fl_odd_value[5m])",
    "quantile_over_time(0.5, fl_odd_value[1m])",
    "stdvar_over_time(fl_odd_value[1m])",
    "deriv(fl_odd_value[1m])",
    "delta(fl_odd_value[1m])",
    "avg(fl_huge_value)",
    "avg_over_time(fl_huge_value[1m])",
    "sum(fl_huge_value)",
    "sum_over_time(fl_cancelling_value[1m])",
    "avg_over_time(fl_cancelling_value[1m])",
    "sum(fl_cancelling_value or fl_huge_value * 0 + 1)",
    "avg(fl_odd_value)",
    "avg_over_time(fl_odd_value[1m])",
    "sum_over_time(fl_odd_value[1m])",
    "histogram_quantile(0.9, fl_latency_seconds_bucket)",
    "histogram_quantile(0.5, rate(fl_latency_seconds_bucket[5m]))",
    "histogram_quantile(0.99, sum by (le) (rate(fl_latency_seconds_bucket[5m])))",
    "histogram_quantile(0.01, fl_latency_seconds_bucket)",
    "histogram_quantile(1.5, fl_latency_seconds_bucket)",
]
PEERS = ("hub", "prometheus")
INSTANT_TIMES = (at(25), at(41.5), at(59.75))  # in a gap, midway, at the end


@pytest.mark.parametrize("query", QUERIES)
def test_functions_answer_as_prometheus_does(peers, query):
    """The same answers at each of INSTANT_TIMES and over a range stepping across gaps and resets."""
    assert compare_instant(peers, query, INSTANT_TIMES), f"{query}: no instant data, nothing compared"
    assert compare_range(peers, query, at(-2), at(66), "45s"), f"{query}: no range data, nothing compared"


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        (
            'label_replace(fl_power_watts, "a", "$1", "gpu", "(")',
            "invalid regular expression in label_replace()",
        ),
        (
            'label_replace(fl_power_watts, "a-b", "$1", "gpu", "(.*)")',
            "invalid destination label name in label_replace()",
        ),
        (
            'label_join(fl_power_watts, "a", ",", "gpu", "b c")',
            "invalid source label name in label_join(): b c",
        ),
        ('count_values("a b", fl_power_watts)', "aggregation count_values: invalid label name"),
        ("topk(fl_power_watts, fl_power_watts)", "expected type scalar in aggregation expression"),
        ('round(fl_power_watts, "5")', "expected type scalar in call to function 'round'"),
    ],
)
def test_bad_arguments_answer_bad_data_naming_the_function(peers, query, reason):
    status, answer = get(peers["hub"], "/api/v1/query", {"query": query, "time": str(at(30) / 1000)})
    assert (status, answer["status"], answer["errorType"]) == (400, "error", "bad_data"), answer
    assert reason in answer["error"]


@pytest.mark.parametrize(
    "query",
    [
        'label_replace(fl_power_watts, "gpu", "", "gpu", ".*")',  # n1's two GPUs become one label set
        "topk(1e300, fl_power_watts)",
        'rate({__name__=~"fl_jobs(_again)?_total", job="a"}[5m])',  # two series once __name__ is dropped
    ],
)
def test_failing_evaluation_answers_execution_as_prometheus_does(peers, query):
    instant = ("/api/v1/query", {"query": query, "time": str(at(40) / 1000)})
    ranged = (
        "/api/v1/query_range",
        {"query": query, "start": str(at(10) / 1000), "end": str(at(50) / 1000), "step": "60"},
    )
    for path, parameters in (instant, ranged):
        ours, theirs = (get(peers[side], path, parameters) for side in PEERS)
        assert theirs[0] == 422 and theirs[1]["errorType"] == "execution", (path, theirs)
        assert (ours[0], ours[1]["errorType"]) == (theirs[0], theirs[1]["errorType"]), (path, ours)


@pytest.mark.parametrize(
    "query", ["min_over_time(fl_signed_zero[50s])", "max_over_time(fl_signed_zero[50s])"]
)
def test_min_and_max_of_signed_zeros_keep_the_first_as_prometheus_does(peers, query):
    """Windows of four zeros, 0 and -0 in turn, some starting with each (steps of 75 s), print the first
    of the equal zeros as Prometheus does ("0" or "-0"), over steps at least as long as the range."""
    parameters = {"query": query, "start": str(at(1) / 1000), "end": str(at(59) / 1000), "step": "75"}
    texts = []
    for side in PEERS:
        status, answer = get(peers[side], "/api/v1/query_range", parameters)
        assert status == 200, (side, answer)
        texts.append([[text for _, text in one["values"]] for one in answer["data"]["result"]])
    assert texts[0] == texts[1]
    assert {"0", "-0"} <= set(texts[1][0]), "both signs compared"


REGEX_PARTS = st.sampled_from(
    ["(", ")", "n", ".", "*", "+?", ":", "\\d", "[0-9]", "|", "(?P<g>", "^", "$", "é", "(?i)"]
)
TEMPLATE_PARTS = st.sampled_from(["$", "$$", "${", "}", "1", "2", "g", "x", "_", "-", "é", " ", "0"])


@settings(max_examples=80, deadline=None)
@given(
    regex=st.lists(REGEX_PARTS, max_size=6).map("".join),
    template=st.lists(TEMPLATE_PARTS, max_size=8).map("".join),
)
@example(regex="(", template="$1")  # refused by both
@example(regex="(?P<g>n.):(.*)", template="${g}$2x$$")
def test_label_replace_expands_any_pattern_as_prometheus_does(peers, regex, template):
    """Whatever the pattern and template, the hub labels as Prometheus does, or refuses the pattern
    Prometheus refuses with the same message (as bad_data, before evaluating)."""
    quoted = [json.dumps(text, ensure_ascii=False) for text in (template, regex)]
    query = f'label_replace(fl_power_watts, "out", {quoted[0]}, "instance", {quoted[1]})'
    parameters = {"query": query, "time": str(at(40) / 1000)}
    (status, ours), (their_status, theirs) = (get(peers[side], "/api/v1/query", parameters) for side in PEERS)
    if their_status == 200:
        assert status == 200, (query, ours)
        assert_same(comparable(ours["data"]["result"]), comparable(theirs["data"]["result"]), query)
    else:
        assert (status, ours["errorType"], ours["error"]) == (400, "bad_data", theirs["error"]), (
            query,
            theirs,
        )

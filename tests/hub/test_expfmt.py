"""The exposition parser reads real bodies sample for sample as prometheus_client does, names broken lines,
enforces its limits and CPU budget while parsing, keeps the first of a series sent twice, and stays right
when its series cache answers instead of the full parse."""

from __future__ import annotations

import itertools
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from hub import expfmt
from hub.errors import DeadlineExceeded, ExpositionError
from hub.expfmt import ExpositionParser, counter_increase

Sample = tuple[str, dict[str, str], float, float | None]


@pytest.fixture(scope="module")
def bodies(fixtures: Path, procfs_sys: Path) -> dict[str, str]:
    """Real expositions: ours from `fleetlens collect`, node_exporter's and dcgm-exporter's from fixtures."""
    command = ["collect", "--gpu-backend", "sim", "--sysfs-root", str(procfs_sys), "--node", "vela-001"]
    collect = subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", *command],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    dcgm = fixtures / "dcgm-exporter"
    readme = (dcgm / "readme-metrics-sample.txt").read_text().splitlines()
    return {
        "fleetlens collect, 8 sim GPUs": collect.stdout,
        "node_exporter e2e-output.txt": (fixtures / "node_exporter" / "e2e-output.txt").read_text(),
        "dcgm-exporter V100": (dcgm / "issue250-v100-metrics-excerpt.prom").read_text(),
        "dcgm-exporter H100 MIG": (dcgm / "issue512-h100-mig-metrics-excerpt.prom").read_text(),
        # the README's sample, without its `curl` command line and `...` elisions
        "dcgm-exporter README": "\n".join(line for line in readme if line.startswith(("#", "DCGM"))),
    }


def reference(text: str) -> list[Sample]:
    """prometheus_client's reading, less its one rename: it appends `_total` to the samples of a counter
    whose TYPE line lacks it (dcgm-exporter's), where the exposition and Prometheus keep the name as sent."""
    typed_counter = set(re.findall(r"^\s*# TYPE (\S+) counter\s*$", text, re.M))
    samples = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name.removesuffix("_total") if family.name in typed_counter else s.name
            samples.append((name, s.labels, float(s.value), s.timestamp))
    return samples


def ours(parser: ExpositionParser, text: str) -> list[Sample]:
    parsed = parser.parse(text)
    return [
        (name, labels, value, parsed.timestamps.get(i))
        for i, (name, labels, value) in enumerate(
            zip(parsed.names, parsed.labels, parsed.values, strict=True)
        )
    ]


def comparable(samples: list[Sample]) -> list[Sample]:
    """NaN never equals itself; compare it as a marker."""
    return [(n, labels, "NaN" if math.isnan(v) else v, ts) for n, labels, v, ts in samples]


@pytest.mark.parametrize(
    "body",
    [
        "fleetlens collect, 8 sim GPUs",
        "node_exporter e2e-output.txt",
        "dcgm-exporter V100",
        "dcgm-exporter H100 MIG",
        "dcgm-exporter README",
    ],
)
def test_real_bodies_parse_as_prometheus_client_parses_them(bodies: dict[str, str], body: str) -> None:
    text = bodies[body]
    expected = comparable(reference(text))
    parser = ExpositionParser()
    assert expected
    assert comparable(ours(parser, text)) == expected
    assert comparable(ours(parser, text)) == expected, "the second scrape, answered from the cache"
    assert comparable(ours(ExpositionParser(), text.replace("\n", "\r\n"))) == expected


def test_type_lines_say_which_families_are_counters(bodies: dict[str, str]) -> None:
    text = bodies["fleetlens collect, 8 sim GPUs"]
    types = ExpositionParser().parse(text).types
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"  # dcgm style: no _total
    assert types["node_infiniband_port_data_received_bytes_total"] == "counter"
    assert types["DCGM_FI_DEV_GPU_TEMP"] == "gauge"
    for family in text_string_to_metric_families(text):
        assert family.type in (types.get(family.name), types.get(family.name + "_total")), family.name


ESCAPES = "\n".join(
    [
        r'quoted{path="C:\\dir\\",say="\"hi\", {she} said",lines="one\ntwo"} 1',
        r'other_escape{v="tab\there"} 2',
        'spaced { a = "x" , b="y z 3" , } 4',
        'brace_in_value{v="} 5"} 6',
        "tabbed\t7",
        "trailing_space 8 ",
        "  indented 9",
    ]
)


def test_escapes_spacing_and_quoted_punctuation() -> None:
    parser = ExpositionParser()
    expected = [
        ("quoted", {"path": "C:\\dir\\", "say": '"hi", {she} said', "lines": "one\ntwo"}, 1.0, None),
        ("other_escape", {"v": "tab\\there"}, 2.0, None),  # unknown escapes stay as written
        ("spaced", {"a": "x", "b": "y z 3"}, 4.0, None),
        ("brace_in_value", {"v": "} 5"}, 6.0, None),
        ("tabbed", {}, 7.0, None),
        ("trailing_space", {}, 8.0, None),
        ("indented", {}, 9.0, None),
    ]
    assert ours(parser, ESCAPES) == expected
    assert ours(parser, ESCAPES) == expected
    assert reference(ESCAPES) == expected


def test_special_values_timestamps_blank_lines_and_comments() -> None:
    text = (
        "# a free comment\n#\n\n   \n# HELP m A value.\n# TYPE m gauge\n"
        'm{s="nan"} NaN\nm{s="inf"} +Inf\nm{s="-inf"} -Inf\nm{s="exp"} 1.5e-3\n'
        'm{s="ts"} 2 1700000000123\n  # TYPE n counter\nn 3\n'
    )
    parser = ExpositionParser()
    for _ in range(2):  # the second time, every series is cached: timestamps must still be read
        parsed = parser.parse(text)
        assert math.isnan(parsed.values[0])
        assert parsed.values[1:5] == [math.inf, -math.inf, 0.0015, 2.0]
        assert parsed.timestamps == {4: 1700000000.123}
        assert parsed.types == {"m": "gauge", "n": "counter"}
        assert comparable(ours(parser, text)) == comparable(reference(text))


@pytest.mark.parametrize(
    "bad",
    [
        "metric_without_value",
        'm{a="unterminated} 1',
        "m{a=unquoted} 1",
        'm{1a="x"} 1',
        'm{a="x",a="y"} 1',
        'm{a="x" b="y"} 1',
        'm{,a="x"} 1',
        "m 1.2.3",
        "m 1_000",
        "m 1 1.5",
        "m 1 2 3",
        "9m 1",
        "# TYPE m bogus",
        "# TYPE m",
    ],
)
def test_a_broken_line_fails_the_body_naming_its_number_and_text(bad: str) -> None:
    body = f"# TYPE good gauge\ngood 1\n{bad}\ngood_too 2\n"
    with pytest.raises(ExpositionError, match="line 3") as caught:
        ExpositionParser().parse(body)
    assert repr(bad) in str(caught.value)


def test_a_cached_series_with_a_broken_value_is_still_an_error() -> None:
    parser = ExpositionParser()
    parser.parse('gpu_temp{gpu="0"} 41\n')
    for value in ("hot", "4_1", ""):
        with pytest.raises(ExpositionError, match="line 1"):
            parser.parse(f'gpu_temp{{gpu="0"}} {value}\n')


def test_sample_limit_names_the_limit() -> None:
    body = "".join(f'm{{i="{i}"}} {i}\n' for i in range(11))
    assert len(ExpositionParser(max_samples=11).parse(body)) == 11
    with pytest.raises(ExpositionError, match=r"^line 11: sample 11 is over max_samples=10; parsing stopped"):
        ExpositionParser(max_samples=10).parse(body)


def numbered_body(samples: int, comment_every: int = 10) -> list[str]:
    """The lines of a body of `samples` distinct series, with a HELP line before every `comment_every`th."""
    lines = []
    for i in range(samples):
        if i % comment_every == 0:
            lines.append(f"# HELP m_{i // comment_every} A family of {comment_every}.")
        lines.append(f'm_{i // comment_every}{{i="{i}",pad="{"x" * 20}"}} {i}')
    return lines


def test_the_sample_limit_stops_the_parse_at_the_first_sample_over_it() -> None:
    """A body of a million series costs what its first max_samples do: nothing after the limit is read."""
    lines = numbered_body(30_000)
    over = next(n for n, line in enumerate(lines, 1) if line.startswith('m_2000{i="20000"'))
    body = "\n".join([*lines, "this line is broken", ""])  # 1 MB: the limit falls in a later chunk
    parser = ExpositionParser(max_samples=20_000)
    with pytest.raises(ExpositionError) as caught:
        parser.parse(body)
    assert str(caught.value) == f"line {over}: sample 20001 is over max_samples=20000; parsing stopped there"
    assert len(parser._series) <= 20_001, "no series past the limit was parsed"
    assert len(ExpositionParser(max_samples=30_000).parse("\n".join(lines))) == 30_000


class CpuClock:
    """A CPU clock that advances `per_read` on every read (the parse's own steps taking time), and by
    whatever a test adds to `now` (other parses and threads running between its steps); reads counted."""

    def __init__(self, per_read: float = 1.0) -> None:
        self.per_read = per_read
        self.now = 0.0
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        self.now += self.per_read
        return self.now


def test_a_cpu_budget_stops_the_parse_between_runs_naming_the_line_reached() -> None:
    text = "\n".join(numbered_body(40_000)) + "\n"  # about 1.5 MB
    reached = []
    for budget in (0, 1, 2):  # each run of lines costs the parse 1 s on this clock
        with pytest.raises(DeadlineExceeded, match=r"^parsing used up its CPU time \(line \d+\)$") as caught:
            ExpositionParser(clock=CpuClock()).parse(text, budget)
        reached.append(caught.value.lineno)
    assert reached[0] == 1 and reached[0] < reached[1] < reached[2] < 44_000, reached
    clock = CpuClock()
    assert len(ExpositionParser(max_samples=40_000, clock=clock).parse(text, cpu_budget_s=1e9)) == 40_000
    assert 2 <= clock.calls <= len(text) // 25_000, "read twice a run of lines, not on every line"


def test_the_cpu_budget_counts_the_parses_own_steps_not_the_time_between_them() -> None:
    """The scraper's one thread parses many bodies a step at a time, and waits for the GIL that other
    threads hold: a parse is charged for its own steps only, however long it waited between them."""
    text = "\n".join(numbered_body(40_000)) + "\n"
    for per_step, completes in ((0.0, True), (0.25, False)):
        clock = CpuClock(per_read=per_step)  # a step's run of lines lies between two reads
        steps = ExpositionParser(clock=clock).parse_steps(text, cpu_budget_s=1.0)
        lines = []
        with pytest.raises(StopIteration if completes else DeadlineExceeded) as ended:
            while True:
                lines.append(next(steps))
                clock.now += 10.0  # ten seconds of other work before the parse's next step
        if completes:
            assert len(ended.value.value) == 40_000 and len(lines) > 4
        else:
            assert ended.value.lineno == lines[-1] and len(lines) == 4, "stopped once its steps took 1 s"


def test_without_a_budget_the_clock_is_never_read() -> None:
    def no_clock() -> float:
        raise AssertionError("read the clock")

    assert len(ExpositionParser(clock=no_clock).parse("\n".join(numbered_body(10_000)))) == 10_000


def test_a_series_sent_twice_keeps_its_first_sample_and_the_rest_are_counted() -> None:
    body = (
        "# TYPE a gauge\n"
        'a{x="1",y="2"} 1\n'
        "b 5\n"
        'a{y="2",x="1"} 2\n'  # the same series written otherwise
        'a{x="1",y="2"} 3 1700000000000\n'
        "b 6\n"
        "c 7 1700000000123\n"
    )
    parser = ExpositionParser(target_labels={"cluster": "vela"})
    for _ in range(2):  # the second time, from the cache
        parsed = parser.parse(body)
        assert (parsed.names, parsed.values, parsed.duplicates) == (["a", "b", "c"], [1.0, 5.0, 7.0], 3)
        assert parsed.labels[0] == {"x": "1", "y": "2", "cluster": "vela"}
        assert parsed.timestamps == {2: 1700000000.123}
    clean = '# TYPE a gauge\na{x="1",y="2"} 1\nb 5\nc 7 1700000000123\n'
    assert parser.parse(clean).duplicates == 0
    assert parser.parse(clean + 'a{x="1",y="2"} 9\n').duplicates == 1, "a steady body that starts repeating"


@pytest.mark.parametrize(
    "line",
    ['m{pod="' + "x" * 1_000_000 + '"} 1', "m{" + "k" * 300 + '="v"} 1', "m" * 300 + " 1"],
    ids=["1 MB label value", "long label name", "long metric name"],
)
def test_label_length_limit_names_the_limit_in_a_short_message(line: str) -> None:
    with pytest.raises(ExpositionError, match=r"line 2: .* over max_label_length=256") as caught:
        ExpositionParser(max_label_length=256).parse("ok 1\n" + line + "\n")
    assert len(str(caught.value)) < 600


def test_target_labels_join_every_sample_and_exposed_clashes_are_kept_as_exported() -> None:
    parser = ExpositionParser(target_labels={"cluster": "vela", "job": "train"})
    parsed = parser.parse('m{job="dcgm",gpu="0"} 1\nn 2\n')
    assert parsed.labels == [
        {"exported_job": "dcgm", "gpu": "0", "cluster": "vela", "job": "train"},
        {"cluster": "vela", "job": "train"},
    ]


def test_a_full_cache_starts_over_and_parses_the_same() -> None:
    body = "".join(f'm{{i="{i}"}} {i}\n' for i in range(50))
    parser = ExpositionParser(cache_size=8)
    assert ours(parser, body) == ours(parser, body) == reference(body)
    assert len(parser._series) <= 8


def test_counter_increase_never_goes_negative_across_an_exporter_restart() -> None:
    readings = [10.0, 15.0, 15.0, 3.0, 8.0]  # the exporter restarted between 15 and 3
    increases = [counter_increase(a, b) for a, b in itertools.pairwise(readings)]
    assert increases == [5.0, 0.0, 3.0, 5.0]  # a reset counts the new value, as Prometheus's increase()
    assert sum(increases) == 13.0


def test_series_whose_hashes_collide_stay_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(expfmt, "hash", lambda _: 0, raising=False)  # every series the same hash
    parsed = ExpositionParser().parse('a{x="1"} 1\na{x="2"} 2\nb 3\na{x="1"} 4\n')
    assert (parsed.labels, parsed.values, parsed.duplicates) == ([{"x": "1"}, {"x": "2"}, {}], [1, 2, 3], 1)


def outcome(parser: ExpositionParser, body: str) -> object:
    """What a parse gives, comparable: the Exposition's columns (values by repr, for NaN), or the error."""
    try:
        parsed = parser.parse(body)
    except ExpositionError as error:
        return type(error).__name__, str(error)
    return parsed.names, parsed.labels, list(map(repr, parsed.values)), parsed.types, parsed.timestamps


STEADY = (
    "# HELP gpu_temp GPU temperature.\n# TYPE gpu_temp gauge\n"
    + "".join(f'gpu_temp{{gpu="{g}",UUID="GPU-{g}"}} {40 + g}\n' for g in range(8))
    + '\n# TYPE xid counter\nxid{gpu="0"} 0\nup 1\n'
)
VALUES = ["1", "-2.5", "1e3", "NaN", "+Inf", "-Inf", "2\t", "007"]
BAD_VALUES = ["0x1", "1_000", "abc", "", "1 1700000000000", " 3", "1  "]


@given(
    tokens=st.lists(st.sampled_from(VALUES), min_size=10, max_size=10),
    bad=st.none() | st.tuples(st.integers(0, 9), st.sampled_from(BAD_VALUES)),
    kind=st.sampled_from(["gauge", "counter", "gauge ", "gauges", ""]),
    edits=st.lists(
        st.tuples(st.integers(0, len(STEADY)), st.integers(0, 2), st.sampled_from(list(' {}"=,#\n\r\t_x0.'))),
        max_size=2,
    ),
)
@settings(max_examples=400, deadline=None)
def test_a_steady_bodys_values_only_path_gives_exactly_what_the_full_parse_gives(
    tokens: list[str], bad: tuple[int, str] | None, kind: str, edits: list[tuple[int, int, str]]
) -> None:
    """After a body, a parser reads only the values of the next one if its text is the same but for them.
    Whatever the next body is (new values of any kind, a timestamp, damaged text), it must give what a
    fresh parser's full parse gives: the same samples and types, or the same error."""
    if bad is not None:
        tokens[bad[0]] = bad[1]
    values = iter(tokens)
    body = re.sub(r"(?m)(?<=[} a-z]) \d+$", lambda _: " " + next(values), STEADY)
    body = body.replace("gpu_temp gauge", f"gpu_temp {kind}")
    for position, removed, inserted in edits:  # damage: replace `removed` characters at `position`
        body = body[:position] + inserted + body[position + removed :]
    parser = ExpositionParser(max_samples=20, target_labels={"cluster": "vela"})
    parser.parse(STEADY)
    assert parser._shape is not None, "a steady body makes a shape"
    assert outcome(parser, body) == outcome(
        ExpositionParser(max_samples=20, target_labels={"cluster": "vela"}), body
    )


@pytest.mark.parametrize("line", ["12", "1e3", "Inf", "up1", "upp 1"])
def test_a_sample_line_that_lost_its_series_is_not_read_as_a_value(line: str) -> None:
    """A steady body whose last sample line (`up 1`) became a bare number or other text without the
    series before its value: the values-only path must not take that text as up's value."""
    parser = ExpositionParser()
    parser.parse(STEADY)
    changed = STEADY.replace("\nup 1\n", f"\n{line}\n")
    assert outcome(parser, changed) == outcome(ExpositionParser(), changed)
    assert not parser.steady


def test_a_steady_body_reads_only_its_values(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = ExpositionParser()
    first = parser.parse(STEADY)
    monkeypatch.setattr(parser, "_lines", None)  # the full parse would fail: only the values are read
    changed = STEADY.replace(" 1\n", " 0\n").replace(" 40\n", " 41.5\n")
    assert outcome(parser, changed) == outcome(ExpositionParser(), changed)
    steady = parser.parse(changed)
    assert steady.values[0] == 41.5
    # the series columns are the first parse's lists, not copies: no per-sample copy, nothing for the GC
    assert (steady.names, steady.labels, steady.types) == (first.names, first.labels, first.types)
    assert steady.names is first.names and steady.labels is first.labels
    with pytest.raises(TypeError):  # a new series is not a steady body: the full parse is tried
        parser.parse(STEADY + "new 1\n")

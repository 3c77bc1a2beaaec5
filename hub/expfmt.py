"""A fast parser for the Prometheus text format (0.0.4), into the columns of a ScrapeBatch (the store's row).

The hub parses every exporter's body every second: a Vela-sized fleet is about 200k samples/s. The
`name{labels}` part of a line is the same from one scrape of a target to the next, so a parser keeps a
bounded cache from that text to its parsed (name, labels) and, for a line it has seen, only splits off
and converts the value. New or odd lines (timestamps, tabs, extra spaces) take the full, validating
path. A body whose text is the last one's but for its values (a steady target's) is cheaper still: its
lines are compared with the last body's, and only its values converted (_Shape), giving exactly what
the full parse would; any other body takes the full parse. One parser per target keeps each cache small
and needs no lock.

A body is parsed all or nothing: the first broken line raises ExpositionError naming its line number
and text, so a scrape is never half-stored (Prometheus fails the whole scrape too). A hostile body costs
little: the body is split a chunk at a time, parsing stops at the first sample over max_samples, and the
CPU time the parse has used is checked against its budget between runs of lines. The budget counts the
parse's own CPU time, not the wall clock: a parse that waits (for the GIL held by another thread, or while
the scraper's one thread parses other bodies) is not charged for the wait. A series that appears twice
in one body keeps its first sample only, as in Prometheus; the rest are dropped and counted. Label dicts
are shared between parses of the same series, and a steady body's names and labels lists and types with
the parse before it: treat them as read-only. Sharing them is what makes a steady round cheap downstream:
no copy per sample, no young lists of a round's every series for the garbage collector to walk, and the
store's comparison of a target's series with its last batch's (KnownSeries) is one identity test.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from operator import itemgetter

from hub.errors import DeadlineExceeded, ExpositionError

METRIC_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_NAME_RE = re.compile(_NAME)
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_SAMPLE_LINE = re.compile(
    rf"[ \t]*(?P<series>(?P<name>{_NAME})[ \t]*(?:\{{(?P<labels>(?:[^\"}}]|{_QUOTED})*)\}})?)"
    r"[ \t]+(?P<value>[^ \t]+)(?:[ \t]+(?P<timestamp>[^ \t]+))?[ \t]*"
)
_LABEL_PAIR = re.compile(
    r'[ \t]*(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"(?P<value>(?:[^"\\]|\\.)*)"[ \t]*(?:,|\Z)'
)
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_SHOWN_CHARS = 160
# A body is split into lines a chunk at a time (a usual body is one chunk), and parsed in runs of lines
# between which the CPU budget and max_samples are checked. A run is at most _RUN_LINES lines and about
# _RUN_CHARS characters (parsing costs about in proportion to them, up to 0.2 us each for lines full of
# escapes), so a parse stops within milliseconds of its budget, and checking costs nothing measurable.
_CHUNK_CHARS = 512 * 1024
_RUN_LINES = 4096
_RUN_CHARS = 128 * 1024


Series = tuple[str, dict[str, str]]


@dataclass(frozen=True, slots=True)
class Exposition:
    """One parsed body: sample i is (names[i], labels[i], values[i]), as in ScrapeBatch.

    `types` maps each family named in a `# TYPE` line to its type (the hub computes rates only for
    counters). `timestamps` holds the few samples that carried one: {sample index: unix seconds}.
    `duplicates` counts the samples dropped because their series already appeared earlier in the body.
    """

    names: list[str]
    labels: list[dict[str, str]]
    values: list[float]
    types: dict[str, str]
    timestamps: dict[int, float]
    duplicates: int = 0

    def __len__(self) -> int:
        return len(self.values)


def counter_increase(previous: float, current: float) -> float:
    """How much a counter grew between two readings; never negative.

    A counter only goes down when its exporter restarted and it began again from zero, so a drop
    counts the whole current value as the increase, as Prometheus's rate() and increase() do.
    """
    return current - previous if current >= previous else current


def _shown(line: str) -> str:
    """A line for an error message: a label value of a megabyte must not make a megabyte message."""
    if len(line) <= _SHOWN_CHARS:
        return repr(line)
    return f"{line[:_SHOWN_CHARS]!r}... ({len(line)} characters)"


def _remember(cache: dict, key: str, value: object, size: int) -> None:
    """Add to a bounded cache; a full one starts over (a target's series rarely all change at once)."""
    if len(cache) >= size:
        cache.clear()
    cache[key] = value


@dataclass(slots=True)
class _Parsed:
    """What a parse has found so far: Exposition's columns, with the series as (name, labels)."""

    found: list[Series] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    timestamps: dict[int, float] = field(default_factory=dict)


def _chunks(text: str) -> Iterator[tuple[list[str], int]]:
    """The body's lines, a chunk of about _CHUNK_CHARS characters at a time (a 16 MB body is never split
    into a million strings at once), each with its number of characters."""
    if len(text) <= _CHUNK_CHARS:
        yield text.split("\n"), len(text)
        return
    start = 0
    while start < len(text):
        end = text.find("\n", start + _CHUNK_CHARS)
        if end < 0:
            end = len(text)
        yield text[start:end].split("\n"), end - start
        start = end + 1


def _first_of_each(
    found: list[Series], values: list[float], timestamps: dict[int, float]
) -> tuple[list[Series], list[float], dict[int, float], int]:
    """The samples less those whose series appeared earlier in the body (series are interned, so the same
    series is the same object), and how many were dropped."""
    if len(set(map(id, found))) == len(found):
        return found, values, timestamps, 0
    seen: set[int] = set()
    keep = []
    for index, series in enumerate(found):
        if id(series) not in seen:
            seen.add(id(series))
            keep.append(index)
    kept_timestamps = {new: timestamps[old] for new, old in enumerate(keep) if old in timestamps}
    return [found[i] for i in keep], [values[i] for i in keep], kept_timestamps, len(found) - len(keep)


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _UNESCAPED[m.group(0)], value) if "\\" in value else value


def _number(token: str) -> float:
    """A sample value; Python's float() also takes `1_000`, which the format (Go's ParseFloat) does not."""
    if "_" in token:
        raise ValueError(token)
    return float(token)


def _picker(indices: list[int]) -> Callable[[list[str]], tuple[str, ...]]:
    """A function taking the lines at `indices` from a list of lines, as a tuple (in C: itemgetter)."""
    if len(indices) > 1:
        return itemgetter(*indices)
    return lambda lines: tuple(lines[i] for i in indices)


@dataclass(frozen=True, slots=True)
class _Shape:
    """A body less its values: a steady target sends the same text but for the values from one scrape to
    the next, and such a body needs only its values read.

    `values_of` answers a body whose lines are the same in number, whose comments and blank lines are
    the same text, and whose sample lines are the same up to their last space; and only when every value
    after it is one the full parse's cached path takes (float(), no "_"). Each sample line has its last
    body's text up to the value and a space (`prefixes`) removed, with no space left after (then that
    space is its last), which makes no string but the value's. A line that does not start with its prefix
    is left whole, so the values' total length tells whether every prefix was there: it is the body's
    length less that of the rest (`fixed_chars`: newlines, comments and prefixes) exactly when each line
    lost its prefix, all of them being longer than nothing. Then it gives what the full
    parse would: the last body's series, its types, no timestamps or duplicates. Any other body, broken
    or changed, returns None and takes the full parse. A shape is only made from a body whose sample
    lines all took the cached path (series text, a space, a value; no timestamp, no duplicate).
    """

    lines: int
    samples: Callable[[list[str]], tuple[str, ...]]
    others: Callable[[list[str]], tuple[str, ...]]
    other_text: tuple[str, ...]
    prefixes: list[str]
    fixed_chars: int
    names: list[str]
    labels: list[dict[str, str]]
    types: dict[str, str]

    @classmethod
    def of(
        cls, text: str, found: list[Series], series: dict[str, Series], parsed: Exposition
    ) -> _Shape | None:
        """The shape of a body just parsed into `parsed` (`found` its series), or None if some sample
        line did not take the cached path and so cannot be told apart by its text up to the value."""
        lines = text.split("\n")
        samples = [i for i, line in enumerate(lines) if line and line[0] != "#"]
        if len(samples) != len(found):
            return None
        heads = [lines[i].rpartition(" ")[0] for i in samples]
        if any(series.get(head) is not one for head, one in zip(heads, found, strict=True)):
            return None
        others = [i for i, line in enumerate(lines) if not line or line[0] == "#"]
        pick_others = _picker(others)
        prefixes = [head + " " for head in heads]
        other_text = pick_others(lines)
        fixed_chars = len(lines) - 1 + sum(map(len, other_text)) + sum(map(len, prefixes))
        return cls(
            len(lines), _picker(samples), pick_others, other_text, prefixes, fixed_chars,
            parsed.names, parsed.labels, parsed.types,
        )  # fmt: skip

    def values_of(self, text: str) -> Exposition | None:
        lines = text.split("\n")
        if len(lines) != self.lines or self.others(lines) != self.other_text:
            return None
        tokens = list(map(str.removeprefix, self.samples(lines), self.prefixes))
        joined = "".join(tokens)
        if len(joined) != len(text) - self.fixed_chars or " " in joined or "_" in joined:
            return None
        try:
            values = list(map(float, tokens))
        except ValueError:
            return None
        return Exposition(self.names, self.labels, values, self.types, {}, 0)


class _CpuBudget:
    """CPU time one parse may still use (`left`), counted on a CPU clock only while the parse's own steps
    run: from `resume` (a step starts; creating the budget starts the first) to `pause` (it yields)."""

    def __init__(self, clock: Callable[[], float], seconds: float) -> None:
        self._clock = clock
        self.left = seconds
        self._since = clock()

    def resume(self) -> None:
        self._since = self._clock()

    def pause(self) -> None:
        self.left -= self._clock() - self._since


class ExpositionParser:
    """Parses the bodies of one target, remembering the series it has seen.

    `target_labels` (the target's file_sd labels) are added to every sample, as Prometheus attaches
    target labels; an exposed label of the same name is kept as `exported_<name>`. Limits fail the
    whole body as soon as they are exceeded: a sample past the first `max_samples`, or a metric name,
    label name or label value longer than `max_label_length` characters. `clock` is the CPU clock a
    parse's budget is counted on (the calling thread's CPU time).
    """

    def __init__(
        self,
        *,
        max_samples: int = 50_000,
        max_label_length: int = 2048,
        target_labels: Mapping[str, str] | None = None,
        cache_size: int = 100_000,
        clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.max_samples = max_samples
        self.max_label_length = max_label_length
        self.target_labels = dict(target_labels or {})
        self.cache_size = cache_size
        self.clock = clock
        self._series: dict[str, Series] = {}  # series text as written -> its interned series
        self._interned: dict[int, Series] = {}  # hash of (name, label set) -> the one series object
        self._comments: dict[str, tuple[str, str] | tuple[()]] = {}
        self._last_found: list[Series] = []  # the last body's series, known free of duplicates
        self._shape: _Shape | None = None  # the last body less its values, when it can be reused
        self.steady = False  # whether the last parse read only values: every series was known

    def parse(self, text: str, cpu_budget_s: float | None = None) -> Exposition:
        """Parse a whole body; raises ExpositionError at its first broken line or exceeded limit, and
        DeadlineExceeded once the parse has used `cpu_budget_s` of CPU time (checked every few thousand
        lines)."""
        steps = self.parse_steps(text, cpu_budget_s)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def parse_steps(self, text: str, cpu_budget_s: float | None = None) -> Generator[int, None, Exposition]:
        """`parse`, a run of lines per step, each step yielding the number of the next line to parse: the
        scraper's one thread parses many bodies at once, each a step in turn between its reads of the
        sockets. Only the CPU time of this parse's own steps counts against `cpu_budget_s`: what other
        parses and threads take between its steps does not."""
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        if self._shape is not None:
            same = self._shape.values_of(text)
            self.steady = same is not None
            if same is not None:
                return same
        self.steady = False
        self._shape = None
        parsed = _Parsed()
        lineno = 1
        budget = None if cpu_budget_s is None else _CpuBudget(self.clock, cpu_budget_s)
        try:
            for lines, chars in _chunks(text):
                yield from self._chunk(lines, chars, lineno, budget, parsed)
                lineno += len(lines)
        finally:
            self._trim_cache()
        found, values, timestamps, duplicates = parsed.found, parsed.values, parsed.timestamps, 0
        if found != self._last_found:  # a steady target sends the same series: identical objects, cheap
            found, values, timestamps, duplicates = _first_of_each(found, values, timestamps)
            self._last_found = found
        names = list(map(itemgetter(0), found))
        labels = list(map(itemgetter(1), found))
        exposition = Exposition(names, labels, values, parsed.types, timestamps, duplicates)
        if not parsed.timestamps and not duplicates and len(text) <= _CHUNK_CHARS:
            self._shape = _Shape.of(text, parsed.found, self._series, exposition)
        return exposition

    def _chunk(
        self, lines: list[str], chars: int, first: int, budget: _CpuBudget | None, parsed: _Parsed
    ) -> Iterator[int]:
        """Parse a chunk's lines (`chars` characters, the first on line `first`) in runs, checking the
        budget before each, yielding the next line's number after each, and stopping at the first sample
        over max_samples: no run is long enough to cross the limit, so the hot loop needs no check of its
        own."""
        run_lines = min(_RUN_LINES, max(1, len(lines) * _RUN_CHARS // max(chars, 1)))
        start = 0
        while start < len(lines):
            if budget is not None and budget.left <= 0:
                raise DeadlineExceeded(first + start)
            room = self.max_samples - len(parsed.values)
            stop = min(len(lines), start + run_lines, start + max(room, 1))
            run = lines if stop - start == len(lines) else lines[start:stop]
            self._lines(run, first + start, parsed)
            if len(parsed.values) > self.max_samples:
                raise ExpositionError(
                    f"line {first + stop - 1}: sample {len(parsed.values)} is over "
                    f"max_samples={self.max_samples}; parsing stopped there"
                )
            start = stop
            if budget is None:
                yield first + start
            else:
                budget.pause()
                yield first + start
                budget.resume()

    def _lines(self, lines: list[str], first: int, parsed: _Parsed) -> None:
        """The hot loop: a line whose series text is cached only has its value converted."""
        found, values, types, timestamps = parsed.found, parsed.values, parsed.types, parsed.timestamps
        known_series, known_comment = self._series.get, self._comments.get
        for lineno, line in enumerate(lines, first):
            if not line:
                continue
            if line[0] == "#":
                typed = known_comment(line)
                if typed is None:
                    typed = self._comment(line, lineno)
                if typed:
                    types[typed[0]] = typed[1]
                continue
            head, _, last = line.rpartition(" ")
            series = known_series(head)
            if series is not None and "_" not in last:
                try:
                    values.append(float(last))
                except ValueError:
                    pass
                else:
                    found.append(series)
                    continue
            stripped = line.strip(" \t")
            if not stripped:
                continue
            if stripped[0] == "#":
                typed = self._comment(stripped, lineno)
                if typed:
                    types[typed[0]] = typed[1]
                continue
            series, value, timestamp = self._sample(line, lineno)
            if timestamp is not None:
                timestamps[len(values)] = timestamp
            found.append(series)
            values.append(value)

    def _trim_cache(self) -> None:
        """Start the series cache over once it is full; only between bodies, so that within one body
        the same series is always the same object (which is how duplicates are found)."""
        if len(self._series) > self.cache_size:
            self._series.clear()
            self._interned.clear()
            self._last_found = []
            self._shape = None

    def _comment(self, line: str, lineno: int) -> tuple[str, str] | tuple[()]:
        """(family, type) of a `# TYPE` line; () for HELP lines and other comments. Remembered by line."""
        parts = line.split(None, 3)
        typed: tuple[str, str] | tuple[()] = ()
        if len(parts) >= 2 and parts[1] == "TYPE":
            if len(parts) != 4 or not _NAME_RE.fullmatch(parts[2]) or parts[3].strip() not in METRIC_TYPES:
                raise ExpositionError(
                    f"line {lineno}: expected '# TYPE <name> <{'|'.join(sorted(METRIC_TYPES))}>': "
                    + _shown(line)
                )
            typed = (parts[2], parts[3].strip())
        _remember(self._comments, line, typed, self.cache_size)
        return typed

    def _sample(self, line: str, lineno: int) -> tuple[Series, float, float | None]:
        """The full, validating parse of a sample line: (series, value, timestamp or None)."""
        match = _SAMPLE_LINE.fullmatch(line)
        if match is None:
            raise ExpositionError(
                f"line {lineno}: expected 'name{{labels}} value [timestamp]': {_shown(line)}"
            )
        series = self._series.get(match["series"]) or self._new_series(match, lineno, line)
        token = match["value"]
        try:
            value = _number(token)
        except ValueError:
            raise ExpositionError(f"line {lineno}: value {token!r} is not a number: {_shown(line)}") from None
        timestamp = match["timestamp"]
        if timestamp is None:
            return series, value, None
        try:
            return series, value, int(timestamp) / 1000
        except ValueError:
            raise ExpositionError(
                f"line {lineno}: timestamp {timestamp!r} is not an integer of milliseconds: {_shown(line)}"
            ) from None

    def _new_series(self, match: re.Match[str], lineno: int, line: str) -> Series:
        """Parse and validate a series text seen for the first time, and remember it; the same series
        written otherwise (labels in another order, other spacing) is given the object it already has."""
        name = match["name"]
        exposed = self._labels(match["labels"] or "", lineno, line)
        for key, value in (("__name__", name), *exposed.items()):
            if len(key) > self.max_label_length or len(value) > self.max_label_length:
                longest = max(len(key), len(value))
                raise ExpositionError(
                    f"line {lineno}: label {key[:40]!r} is {longest} characters long, over "
                    f"max_label_length={self.max_label_length}: {_shown(line)}"
                )
        new: Series = (name, self._with_target_labels(exposed))
        series = self._interned.setdefault(hash((name, frozenset(new[1].items()))), new)
        if series != new:  # another series with the same hash: this one stays apart
            series = new
        self._series[match["series"]] = series
        return series

    @staticmethod
    def _labels(text: str, lineno: int, line: str) -> dict[str, str]:
        labels: dict[str, str] = {}
        pos, end = 0, len(text.rstrip(" \t"))
        while pos < end:
            pair = _LABEL_PAIR.match(text, pos)
            if pair is None:
                raise ExpositionError(
                    f'line {lineno}: bad label at {text[pos : pos + 40]!r} (want name="value"): '
                    + _shown(line)
                )
            key = pair["key"]
            if key in labels:
                raise ExpositionError(f"line {lineno}: label {key!r} given twice: {_shown(line)}")
            labels[key] = _unescape(pair["value"])
            pos = pair.end()
        return labels

    def _with_target_labels(self, exposed: dict[str, str]) -> dict[str, str]:
        if not self.target_labels:
            return exposed
        merged = {(f"exported_{k}" if k in self.target_labels else k): v for k, v in exposed.items()}
        merged.update(self.target_labels)
        return merged

"""A fast parser for the Prometheus text format (0.0.4), into the columns of analytics.records.ScrapeBatch.

The hub parses every exporter's body every second: a Vela-sized fleet is about 200k samples/s. The
`name{labels}` part of a line is the same from one scrape of a target to the next, so a parser keeps a
bounded cache from that text to its parsed (name, labels) and, for a line it has seen, only splits off
and converts the value. New or odd lines (timestamps, tabs, extra spaces) take the full, validating
path. One parser per target keeps each cache small and needs no lock.

A body is parsed all or nothing: the first broken line raises ExpositionError naming its line number
and text, so a scrape is never half-stored (Prometheus fails the whole scrape too). Label dicts are
shared between parses of the same series: treat them as read-only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter

from collectors.errors import CollectorError

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


class ExpositionError(CollectorError):
    """A scrape body is not valid Prometheus text format, or exceeds a limit; the message says where."""


Series = tuple[str, dict[str, str]]


@dataclass(frozen=True, slots=True)
class Exposition:
    """One parsed body: sample i is (names[i], labels[i], values[i]), as in ScrapeBatch.

    `types` maps each family named in a `# TYPE` line to its type (the hub computes rates only for
    counters). `timestamps` holds the few samples that carried one: {sample index: unix seconds}.
    """

    names: list[str]
    labels: list[dict[str, str]]
    values: list[float]
    types: dict[str, str]
    timestamps: dict[int, float]

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


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _UNESCAPED[m.group(0)], value) if "\\" in value else value


def _number(token: str) -> float:
    """A sample value; Python's float() also takes `1_000`, which the format (Go's ParseFloat) does not."""
    if "_" in token:
        raise ValueError(token)
    return float(token)


class ExpositionParser:
    """Parses the bodies of one target, remembering the series it has seen.

    `target_labels` (the target's file_sd labels) are added to every sample, as Prometheus attaches
    target labels; an exposed label of the same name is kept as `exported_<name>`. Limits fail the
    whole body: more than `max_samples` samples, or a metric name, label name or label value longer
    than `max_label_length` characters.
    """

    def __init__(
        self,
        *,
        max_samples: int = 50_000,
        max_label_length: int = 2048,
        target_labels: Mapping[str, str] | None = None,
        cache_size: int = 100_000,
    ) -> None:
        self.max_samples = max_samples
        self.max_label_length = max_label_length
        self.target_labels = dict(target_labels or {})
        self.cache_size = cache_size
        self._series: dict[str, Series] = {}
        self._comments: dict[str, tuple[str, str] | tuple[()]] = {}

    def parse(self, text: str) -> Exposition:
        """Parse a whole body; raises ExpositionError at its first broken line or exceeded limit."""
        if "\r" in text:
            text = text.replace("\r\n", "\n")
        found: list[Series] = []
        values: list[float] = []
        types: dict[str, str] = {}
        timestamps: dict[int, float] = {}
        known_series, known_comment = self._series.get, self._comments.get
        for lineno, line in enumerate(text.split("\n"), 1):
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
        if len(values) > self.max_samples:
            raise ExpositionError(f"body has {len(values)} samples, over max_samples={self.max_samples}")
        names = list(map(itemgetter(0), found))
        labels = list(map(itemgetter(1), found))
        return Exposition(names, labels, values, types, timestamps)

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
        """Parse and validate a series seen for the first time, and remember it."""
        name = match["name"]
        exposed = self._labels(match["labels"] or "", lineno, line)
        for key, value in (("__name__", name), *exposed.items()):
            if len(key) > self.max_label_length or len(value) > self.max_label_length:
                longest = max(len(key), len(value))
                raise ExpositionError(
                    f"line {lineno}: label {key[:40]!r} is {longest} characters long, over "
                    f"max_label_length={self.max_label_length}: {_shown(line)}"
                )
        series = (name, self._with_target_labels(exposed))
        _remember(self._series, match["series"], series, self.cache_size)
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

"""Silences: label matchers with an expiry that mute matching alerts, as Alertmanager's do.

A matcher is `name=value`, `name!=value`, `name=~regex` or `name!~regex` (regular expressions are
anchored at both ends, as Alertmanager's); a silence mutes an alert that every one of its matchers
matches, from `starts_at` until `ends_at`. A muted alert keeps its state and history, is not sent to
receivers, and holds the drain controller's hand: a node under a silence is not drained.

Silences live in the store's `silences` table, so the hub, the CLI and the UI see the same ones.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from alerts.errors import SilenceError
from analytics.records import SilenceRow

OPERATORS = ("=~", "!~", "!=", "=")  # longest first, so that `=~` is not read as `=`
_MATCHER = re.compile(r"^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$")


@dataclass(frozen=True)
class Matcher:
    """One condition on one label; a missing label reads as ""."""

    name: str
    operator: str
    value: str

    def __post_init__(self) -> None:
        if self.operator not in OPERATORS:
            raise SilenceError(f"matcher {self}: operator must be one of {', '.join(OPERATORS)}")
        if self.operator in ("=~", "!~"):
            try:
                re.compile(self.value)
            except re.error as error:
                raise SilenceError(f"matcher {self}: not a regular expression: {error}") from None

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        return re.compile(self.value)

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.name, "")
        match self.operator:
            case "=":
                return value == self.value
            case "!=":
                return value != self.value
            case "=~":
                return self._pattern.fullmatch(value) is not None
            case _:
                return self._pattern.fullmatch(value) is None

    def __str__(self) -> str:
        return f"{self.name}{self.operator}{json.dumps(self.value)}"


def parse_matcher(text: str) -> Matcher:
    """`node=vela-007`, `kind=~"link_.*"`, ... as a Matcher; SilenceError naming the text otherwise."""
    found = _MATCHER.match(text)
    if not found:
        raise SilenceError(f"matcher {text!r}: expected NAME=VALUE, NAME!=VALUE, NAME=~REGEX or NAME!~REGEX")
    name, operator, value = found.groups()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = json.loads(value)
    return Matcher(name, operator, value)


@dataclass(frozen=True)
class Silence:
    """Mutes the alerts every matcher matches, over [starts_at, ends_at)."""

    id: str
    matchers: tuple[Matcher, ...]
    starts_at: float
    ends_at: float
    created_by: str = ""
    comment: str = ""

    def active(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def mutes(self, labels: Mapping[str, str], now: float) -> bool:
        return self.active(now) and all(matcher.matches(labels) for matcher in self.matchers)

    def row(self, updated_at: float) -> SilenceRow:
        matchers = json.dumps([[m.name, m.operator, m.value] for m in self.matchers])
        return SilenceRow(
            self.id, matchers, self.starts_at, self.ends_at, self.created_by, self.comment, updated_at
        )

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> Silence:
        """A silence from a `silences` row (columns by name, times in unix seconds)."""
        matchers = tuple(Matcher(*entry) for entry in json.loads(str(row["matchers"])))
        return cls(
            str(row["id"]),
            matchers,
            float(row["starts_at"]),  # type: ignore[arg-type]
            float(row["ends_at"]),  # type: ignore[arg-type]
            str(row["created_by"]),
            str(row["comment"]),
        )


def new_silence(
    matchers: Sequence[str],
    duration_s: float,
    *,
    created_by: str,
    comment: str,
    now: float | None = None,
) -> Silence:
    """A silence starting now for `duration_s` seconds; SilenceError for no matchers, a bad matcher, a
    duration that is not positive, or no comment (a person reading the audit needs to know why)."""
    if not matchers:
        raise SilenceError("a silence needs at least one matcher, e.g. node=vela-007")
    if not duration_s > 0:
        raise SilenceError(f"a silence needs a positive duration, got {duration_s} s")
    if not comment.strip():
        raise SilenceError("a silence needs a comment saying why")
    start = time.time() if now is None else now
    parsed = tuple(parse_matcher(text) for text in matchers)
    return Silence(str(uuid.uuid4()), parsed, start, start + duration_s, created_by, comment)


def muted_by(silences: Sequence[Silence], labels: Mapping[str, str], now: float) -> str | None:
    """The id of the first silence muting `labels` at `now`, or None."""
    return next((silence.id for silence in silences if silence.mutes(labels, now)), None)

"""Silences: label matchers with an expiry that mute matching alerts, as Alertmanager's do.

A matcher is `name=value`, `name!=value`, `name=~regex` or `name!~regex`; a silence mutes an alert that
every one of its matchers matches, from `starts_at` until `ends_at`. A muted alert keeps its state and
history, is not sent to receivers, and holds the drain controller's hand: a node under a silence is not
drained.

Regular expressions are RE2's, as Alertmanager's matchers are: matched against the whole label value
(fullmatch: anchored at both ends), in time linear in the value whatever the pattern, so `(a+)+$` costs
what `a+` does. What RE2 does not have (backreferences, lookaround) is refused as not a regular
expression, and so is a pattern whose compiled program would need more than REGEX_MAX_MEM
(`(.*a){1000}`): each matcher's program is compiled once and run on every alert of every cycle.

Silences live in the store's `silences` table, so the hub, the CLI and the UI see the same ones. What a
row must hold to be a silence is checked in one place, `silence_from_row`: by new_silence, by every
write (`validate_row`, which alerts.commands runs for the CLI and the hub's API alike: create, update,
expire, import), and by every reader, which skips a row that fails it rather than fail on it
(alerts.commands). The checks, each failure a SilenceError naming the field:

    id, comment         non-empty strings of valid Unicode, at most MAX_TEXT_CHARS (created_by may be empty)
    matchers            JSON: a list of 1 to MAX_MATCHERS [name, operator, value] string triples; a name
                        is a label name, an operator one of OPERATORS, a value (an RE2 regular expression
                        for =~ and !~, which must compile) at most MAX_VALUE_CHARS
    starts_at, ends_at  unix seconds within TIME_RANGE_S, ends_at after starts_at (updated_at too, in range)

The one row a write may hold that fails them is the expiry of a silence stored by an older version that
did not check it: `expiry_row` of the row the store holds, ending by now (validate_row). Any other change
to such a row is refused, so nothing invalid gets in by ending soon.
"""

from __future__ import annotations

import json
import re
import reprlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import re2

from alerts.errors import SilenceError
from analytics.store.records import SilenceRow

OPERATORS = ("=~", "!~", "!=", "=")  # longest first, so that `=~` is not read as `=`
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MATCHER = re.compile(rf"^\s*({_LABEL_NAME.pattern})\s*(=~|!~|!=|=)\s*(.*?)\s*$")
MAX_MATCHERS = 64
MAX_VALUE_CHARS = 1024  # of a matcher's label name and value: a regular expression is compiled every cycle
MAX_TEXT_CHARS = 4096  # of id, created_by and comment
TIME_RANGE_S = (0.0, 7_258_118_400.0)  # 1970-01-01 to 2200-01-01 UTC, inside the store's DateTime64(3)
EXPIRY_CLOCK_SKEW_S = 60.0  # how far a client's clock may run ahead of the hub's when it expires a silence
REGEX_MAX_MEM = 128 << 10  # RE2's memory budget per pattern: programs to about 2,700 instructions


@dataclass(frozen=True)
class Matcher:
    """One condition on one label; a missing label reads as "". `regex` is the value as RE2 compiled it,
    for =~ and !~ (None for = and !=)."""

    name: str
    operator: str
    value: str
    regex: re2._Regexp | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        if len(self.name) > MAX_VALUE_CHARS or not _LABEL_NAME.fullmatch(self.name):
            raise SilenceError(
                f"matcher name {reprlib.repr(self.name)} is not a label name ({_LABEL_NAME.pattern})"
            )
        if self.operator not in OPERATORS:
            raise SilenceError(
                f"matcher {reprlib.repr(self.name)}: operator {reprlib.repr(self.operator)} is not one of "
                f"{', '.join(OPERATORS)}"
            )
        if len(self.value) > MAX_VALUE_CHARS:
            raise SilenceError(
                f"matcher {self.name}: value of {len(self.value)} characters, more than {MAX_VALUE_CHARS}"
            )
        if self.operator in ("=~", "!~"):  # compiled once, here, so that what RE2 refuses is refused here
            object.__setattr__(self, "regex", _compiled(self))

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.name, "")
        match self.operator:
            case "=":
                return value == self.value
            case "!=":
                return value != self.value
            case "=~":
                return self._fullmatch(value)
            case _:
                return not self._fullmatch(value)

    def _fullmatch(self, value: str) -> bool:
        """Whether the whole of `value` matches; a label that is not valid Unicode is matched as its bytes."""
        assert self.regex is not None  # set for the regex operators, the only ones that call this
        return self.regex.fullmatch(value.encode("utf-8", "surrogatepass")) is not None

    def __str__(self) -> str:
        return f"{self.name}{self.operator}{json.dumps(self.value)}"


def _compiled(matcher: Matcher) -> re2._Regexp:
    """`matcher`'s value compiled by RE2 within REGEX_MAX_MEM; SilenceError naming the matcher when RE2
    refuses it (its syntax, a backreference or lookaround, a program over the budget)."""
    options = re2.Options()
    options.max_mem = REGEX_MAX_MEM
    options.log_errors = False
    try:
        return re2.compile(matcher.value, options)
    except re2.error as error:
        reason = error.args[0].decode(errors="replace")[:200] if error.args else "refused"  # RE2 echoes it
        raise SilenceError(f"matcher {matcher}: not a regular expression (RE2): {reason}") from None
    except UnicodeEncodeError as error:
        raise SilenceError(f"matcher {matcher.name}: value is not valid Unicode ({error.reason})") from None


def parse_matcher(text: str) -> Matcher:
    """`node=vela-007`, `kind=~"link_.*"`, ... as a Matcher; SilenceError naming the text otherwise."""
    found = _MATCHER.match(text)
    if not found:
        raise SilenceError(f"matcher {text!r}: expected NAME=VALUE, NAME!=VALUE, NAME=~REGEX or NAME!~REGEX")
    name, operator, value = found.groups()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            value = json.loads(value)
        except ValueError as error:
            raise SilenceError(f"matcher {text!r}: the quoted value is not a JSON string: {error}") from None
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


def silence_from_row(row: SilenceRow) -> Silence:
    """The silence a `silences` row holds; SilenceError naming the field that keeps it from being one
    (the checks are in the module docstring)."""
    silence_id = _text("id", row.id, empty="must not be empty")
    matchers = _matchers(row.matchers)
    starts_at, ends_at = _time("starts_at", row.starts_at), _time("ends_at", row.ends_at)
    _time("updated_at", row.updated_at)
    if not ends_at > starts_at:
        raise SilenceError(f"ends_at: {ends_at} is not after starts_at {starts_at}")
    created_by = _text("created_by", row.created_by)
    comment = _text("comment", row.comment, empty="a silence needs a comment saying why")
    return Silence(silence_id, matchers, starts_at, ends_at, created_by, comment)


def validate_row(
    row: SilenceRow,
    stored: Callable[[str], SilenceRow | None] = lambda silence_id: None,
    now: float | None = None,
) -> Silence | None:
    """What may be written to `silences`, whoever writes it: a row that holds a silence (returned), or
    the expiry of the row `stored(row.id)` says the store holds (None: it mutes nothing); that row is
    looked up only for a row that is no silence. SilenceError naming the field otherwise."""
    try:
        return silence_from_row(row)
    except SilenceError:
        if not isinstance(row.id, str) or (held := stored(row.id)) is None or not _expires(row, held, now):
            raise
        return None


def expiry_row(stored: SilenceRow, now: float) -> SilenceRow:
    """The row that ends silence `stored` at `now`: the same row, ending now (and starting no later)."""
    return replace(stored, starts_at=min(stored.starts_at, now), ends_at=now, updated_at=now)


def _expires(row: SilenceRow, stored: SilenceRow, now: float | None) -> bool:
    """Whether `row` is expiry_row(stored) as a client makes it: ending by `now` on the hub's clock, give
    or take EXPIRY_CLOCK_SKEW_S, and otherwise the stored row as it is."""
    try:
        ends_at, updated_at = _time("ends_at", row.ends_at), _time("updated_at", row.updated_at)
    except SilenceError:
        return False
    now = time.time() if now is None else now
    return ends_at <= now + EXPIRY_CLOCK_SKEW_S and row == replace(
        expiry_row(stored, ends_at), updated_at=updated_at
    )


def _text(name: str, value: object, empty: str = "", limit: int | None = MAX_TEXT_CHARS) -> str:
    """`value` if it is a string the store can hold (valid Unicode, at most `limit` characters, and not
    blank where `empty` says why it must not be); SilenceError naming `name` otherwise."""
    if not isinstance(value, str):
        raise SilenceError(f"{name}: must be a string, got {reprlib.repr(value)}")
    if limit is not None and len(value) > limit:
        raise SilenceError(f"{name}: {len(value)} characters, more than {limit}")
    if empty and not value.strip():
        raise SilenceError(f"{name}: {empty}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise SilenceError(f"{name}: not valid Unicode ({error.reason} at character {error.start})") from None
    return value


def _time(name: str, value: object) -> float:
    """`value` as unix seconds within TIME_RANGE_S; SilenceError naming `name` otherwise."""
    low, high = TIME_RANGE_S
    if isinstance(value, int | float) and not isinstance(value, bool) and low <= value <= high:  # not NaN
        return float(value)
    raise SilenceError(
        f"{name}: must be unix seconds from {low:.0f} (1970-01-01) to {high:.0f} (2200-01-01), "
        f"got {reprlib.repr(value)}"
    )


def _matchers(text: object) -> tuple[Matcher, ...]:
    """The matchers of a row's JSON text; SilenceError naming the matcher that is wrong."""
    text = _text("matchers", text, limit=None)
    try:
        entries = json.loads(text)
    except RecursionError:
        raise SilenceError("matchers: JSON nested too deeply") from None
    except ValueError as error:
        raise SilenceError(f"matchers: not JSON ({error})") from None
    if not isinstance(entries, list) or not entries:
        raise SilenceError(
            'matchers: a silence needs at least one matcher, a JSON list like [["node", "=", "vela-007"]]'
        )
    if len(entries) > MAX_MATCHERS:
        raise SilenceError(f"matchers: {len(entries)} matchers, more than {MAX_MATCHERS}")
    return tuple(_matcher(index, entry) for index, entry in enumerate(entries))


def _matcher(index: int, entry: object) -> Matcher:
    if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(part, str) for part in entry)):
        raise SilenceError(
            f"matchers[{index}]: must be [name, operator, value], three strings; got {reprlib.repr(entry)}"
        )
    try:
        return Matcher(*entry)
    except SilenceError as error:
        raise SilenceError(f"matchers[{index}]: {error}") from None


def new_silence(
    matchers: Sequence[str],
    duration_s: float,
    *,
    created_by: str,
    comment: str,
    now: float | None = None,
) -> Silence:
    """A silence starting now for `duration_s` seconds; SilenceError for a bad matcher, a duration that
    is not positive, or anything silence_from_row refuses (no matcher; no comment: a person reading the
    audit needs to know why)."""
    if not duration_s > 0:
        raise SilenceError(f"a silence needs a positive duration, got {duration_s} s")
    start = time.time() if now is None else now
    parsed = tuple(parse_matcher(text) for text in matchers)
    draft = Silence(str(uuid.uuid4()), parsed, start, start + duration_s, created_by, comment)
    return silence_from_row(draft.row(start))


def muted_by(silences: Sequence[Silence], labels: Mapping[str, str], now: float) -> str | None:
    """The id of the first silence muting `labels` at `now`, or None."""
    return next((silence.id for silence in silences if silence.mutes(labels, now)), None)

"""The step record: the JSON-lines contract of the step SDK, and the row the hub stores of every step.

One module, with nothing but the standard library, so that the SDK in a training job and the hub's
receivers read and write the same record without the hub loading the OpenTelemetry SDK.

JSON lines: one object per rank and step, keys in this order, optional ones omitted when unknown:

    {"ts": <unix seconds, step end>, "job": str, "rank": int, "node": str, "step": int,
     "duration_s": float, "compute_s"?: float, "comm_s"?: float, "data_s"?: float,
     "dp_rank"?: int, "pp_stage"?: int, "tp_rank"?: int}

Every value must fit the store's `steps` column it goes to, so that nothing accepted is refused later:
ts within TS_RANGE_S, durations finite and >= 0, rank and topology integers from 0 to UINT32_MAX, step
from 0 to UINT64_MAX. Job and node are names: printable Unicode, refused with a control character (C0,
DEL, C1: a NUL, an ESC that recolours a terminal, a newline that forges a log line) or a lone surrogate
(bytes that were not UTF-8); one rule (`check_value`) for the SDK, JSON lines and OTLP alike, and nothing
rewritten. A file or request holds each (job, rank, step, ts) once.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from collectors.errors import LogParseError, StepRecordError

PHASES = ("compute", "comm", "data")  # the order of their *_s keys in a JSON line
STEP_DURATION = "fleetlens.step.duration"
PHASE_DURATION = "fleetlens.step.phase.duration"


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One line of the JSON-lines contract, typed; and a row of the store's `steps` table, which also
    holds what OTLP histograms give: a run of `steps` steps of one rank seen only in aggregate (duration_s
    is then their mean and `step` the number of the last one), and where the record came from."""

    ts: float
    job: str
    rank: int
    node: str
    step: int
    duration_s: float
    compute_s: float | None = None
    comm_s: float | None = None
    data_s: float | None = None
    dp_rank: int | None = None
    pp_stage: int | None = None
    tp_rank: int | None = None
    steps: int = 1
    source: str = "jsonl"  # jsonl | otlp


# The keys a JSON line may hold, in their order: every field but the two the store adds.
CONTRACT_KEYS = tuple(field.name for field in fields(StepRecord) if field.name not in ("steps", "source"))


# What the store's `steps` columns hold (STEPS in analytics/store/schema.py): a value outside is refused
# where it is read, naming the key and the range, instead of being accepted and then refused by the store.
UINT32_MAX = (1 << 32) - 1  # rank, dp_rank, pp_stage, tp_rank; and the steps an OTLP row stands for
UINT64_MAX = (1 << 64) - 1  # step
TS_RANGE_S = (0.0, 7_258_118_400.0)
"""Unix seconds a step may end at: 1970-01-01 to 2200-01-01 UTC. The store's DateTime64(3) holds 1900 to
2299; a step before 1970 or after 2200 comes from a broken clock, and the margin keeps clear of the edges."""
TS_RANGE_TEXT = " to ".join(  # for messages: "0 (1970-01-01 UTC) to 7258118400 (2200-01-01 UTC)"
    f"{bound:.0f} ({datetime.fromtimestamp(bound, UTC):%Y-%m-%d} UTC)" for bound in TS_RANGE_S
)

_FLOAT_KEYS = {"ts", "duration_s", "compute_s", "comm_s", "data_s"}
_INT_MAX = {"rank": UINT32_MAX, "step": UINT64_MAX} | dict.fromkeys(
    ("dp_rank", "pp_stage", "tp_rank"), UINT32_MAX
)
NAME_KEYS = ("job", "node")  # the names of a record: printable Unicode (check_value)
_NOT_IN_NAMES = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # control characters, lone surrogates
_REQUIRED_KEYS = ("ts", "job", "rank", "node", "step", "duration_s")


def check_value(key: str, value: Any) -> Any:
    """The value of `key` as its record type; StepRecordError naming the key and what it must be otherwise."""
    if key in NAME_KEYS:
        if isinstance(value, str):
            if (bad := _NOT_IN_NAMES.search(value)) is None:
                return value
            problem = _name_problem(bad)
            raise StepRecordError(f"{key!r} must be printable Unicode: {problem} of {reprlib.repr(value)}")
        wanted = "a string of printable Unicode"
    elif key in _INT_MAX:
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _INT_MAX[key]:
            return value
        wanted = f"a non-negative integer up to {_INT_MAX[key]}"
    else:
        number = _finite(value)
        low, high = TS_RANGE_S if key == "ts" else (0.0, math.inf)
        if number is not None and low <= number <= high:
            return number
        wanted = f"unix seconds from {TS_RANGE_TEXT}" if key == "ts" else "a finite non-negative number"
    raise StepRecordError(f"{key!r} must be {wanted}, got {reprlib.repr(value)}")


def _finite(value: Any) -> float | None:
    """A JSON number as a float; None for anything else, NaN, infinities and integers past the float range."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    try:
        return float(value)  # an integer is a finite float, or too large to be one
    except OverflowError:
        return None


def _name_problem(bad: re.Match) -> str:
    """What the character `bad` found in a name is, and where."""
    code = ord(bad[0])
    surrogate = 0xD800 <= code <= 0xDFFF
    kind = "a lone surrogate (bytes that are not UTF-8)" if surrogate else "a control character"
    return f"U+{code:04X}, {kind}, at index {bad.start()}"


def parse_step_record(line: str) -> StepRecord:
    """One JSON line as a StepRecord; StepRecordError saying what is wrong with it."""
    try:
        values = json.loads(line)
    except RecursionError:
        raise StepRecordError("JSON nested too deeply") from None
    if not isinstance(values, dict):
        raise StepRecordError(f"expected a JSON object, got {type(values).__name__}")
    missing = [key for key in _REQUIRED_KEYS if key not in values]
    if missing:
        raise StepRecordError(f"missing key(s) {', '.join(missing)}")
    unknown = sorted(set(values) - set(CONTRACT_KEYS))
    if unknown:
        raise StepRecordError(f"unknown key(s) {', '.join(map(reprlib.repr, unknown))}")
    return StepRecord(**{key: check_value(key, value) for key, value in values.items()})


class SeenSteps:
    """The line each (job, rank, step, ts) was first read on, to refuse a second record of the same step:
    stored twice, a step would count twice in every mean and peer comparison made of it. The same step
    number at another time is no duplicate: a job resumed from a checkpoint runs its steps again."""

    def __init__(self) -> None:
        self._lines: dict[tuple[str, int, int, float], int] = {}

    def check(self, record: StepRecord, line: int) -> None:
        """Note `record`, read on `line`; StepRecordError naming both lines if its step was read before."""
        first = self._lines.setdefault((record.job, record.rank, record.step, record.ts), line)
        if first != line:
            raise StepRecordError(
                f"duplicate of line {first}: job {reprlib.repr(record.job)} rank {record.rank} "
                f"step {record.step} at ts {record.ts} again"
            )


def read_step_records(source: str | os.PathLike[str] | Iterable[str]) -> Iterator[StepRecord]:
    """Yield the records of a JSON-lines file (a path) or of lines already read (any other iterable).

    Blank lines are skipped. A malformed line, or a second record of a step already read, raises
    LogParseError naming the file (or "<lines>") and the line number, after every record before it has
    been yielded.
    """
    if isinstance(source, str | os.PathLike):
        # bytes that are not UTF-8 come through as lone surrogates, which the line's checks then refuse
        with open(source, encoding="utf-8", errors="surrogateescape") as lines:
            yield from _parse_lines(lines, os.fspath(source))
    else:
        yield from _parse_lines(source, "<lines>")


def _parse_lines(lines: Iterable[str], name: str) -> Iterator[StepRecord]:
    seen = SeenSteps()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = parse_step_record(line)
            seen.check(record, number)
        except ValueError as error:
            raise LogParseError(f"{name}:{number}: {error}") from error
        yield record

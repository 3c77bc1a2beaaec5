"""Retention at insert time: rows the TTL would drop at once are refused and reported, never sent.

ClickHouse applies a table's TTL to what it is given without a word: a row older than its retention is
dropped at the insert or at the next merge, and the insert still counts it as written. For a postmortem
that is silent data loss (a year-old job imported and gone). So every insert into a table with a TTL
splits off, before sending, the rows whose TTL has already passed, and reports them (Inserted); the doors
in front of the store (`fleetlens steps import`, the hub's /api/v1/steps and /v1/metrics) check the same
cutoff first, so that the sender hears of it.

    cutoff = Cutoff.of(store.retention, "steps", time.time())
    cutoff.describe()   # "older than the steps retention cutoff 2026-09-02T19:04:30Z (steps_days=90)"

Imported history may be kept on purpose: a step row with `keep_until` (unix seconds) expires at the later
of ts + steps_days and keep_until (schema.STEPS_KEEP_UNTIL), so `keep_until(days, now)` keeps rows of any
age `days` from now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from analytics.errors import SettingError
from analytics.store.schema import Retention

DAY_S = 86_400
KEEP_DAYS_MAX = 3650  # ten years: past that, keeping history is an archive's job, not a TTL's
# The retention settings that keep a row of each table the store inserts into. A sample reaches the
# rollups only from raw samples (schema.roll_up_minutes), so one older than raw_days is kept by nothing.
KEPT_BY = {"samples": ("raw_days",), "steps": ("steps_days",), "targets": ("targets_days",)}

Row = TypeVar("Row")


@dataclass(frozen=True, slots=True)
class Cutoff:
    """Rows of `table` older than `at` (unix seconds) would be dropped at once: `setting` (a Retention
    field) keeps them `days` days."""

    table: str
    setting: str
    days: int
    at: float

    @classmethod
    def of(cls, retention: Retention, table: str, now: float) -> Cutoff:
        """The cutoff of `table` at `now`, from the longest of the retention settings that keep its rows."""
        setting = max(KEPT_BY[table], key=lambda name: getattr(retention, name))
        days = getattr(retention, setting)
        return cls(table, setting, days, now - days * DAY_S)

    @property
    def iso(self) -> str:
        """The cutoff as ISO 8601 UTC, to the second."""
        return datetime.fromtimestamp(self.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def describe(self) -> str:
        """Why rows are refused, in words an operator can act on."""
        return f"older than the {self.table} retention cutoff {self.iso} ({self.setting}={self.days})"

    def split(self, rows: Sequence[Row], time_of: Callable[[Row], float]) -> tuple[list[Row], list[Row]]:
        """(rows at or after the cutoff, rows before it), each in the order given."""
        kept: list[Row] = []
        refused: list[Row] = []
        for row in rows:
            (refused if self._before(time_of(row)) else kept).append(row)
        return kept, refused

    def _before(self, ts: object) -> bool:
        """Whether `ts` is before the cutoff; a value that is no time is not (the insert refuses it,
        naming the column, as it did before any cutoff)."""
        try:
            return ts < self.at  # type: ignore[operator]
        except TypeError:
            return False


class Inserted(int):
    """What an insert did: the rows it sent (an int, as the store's inserts have always returned), the
    rows it refused as older than the table's retention `cutoff` (None when it refused none), and those
    it dropped as already stored (analytics.store.ledger): `duplicates` with the stored value, `conflicts`
    with another."""

    refused: int
    cutoff: Cutoff | None
    duplicates: int
    conflicts: int

    def __new__(
        cls,
        sent: int,
        refused: int = 0,
        cutoff: Cutoff | None = None,
        *,
        duplicates: int = 0,
        conflicts: int = 0,
    ) -> Inserted:
        inserted = super().__new__(cls, sent)
        inserted.refused = refused
        inserted.cutoff = cutoff if refused else None
        inserted.duplicates = duplicates
        inserted.conflicts = conflicts
        return inserted

    def describe(self) -> str:
        """ "N refused: older than ..." or "" when nothing was refused."""
        return f"{self.refused} refused: {self.cutoff.describe()}" if self.cutoff else ""


def check_keep_days(value: object, name: str = "keep_days") -> int:
    """`value` as whole days to keep imported history, 1 to KEEP_DAYS_MAX; SettingError naming `name`."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= KEEP_DAYS_MAX:
        raise SettingError(f"{name}: a whole number of days from 1 to {KEEP_DAYS_MAX}, got {value!r}")
    return value


def keep_until(keep_days: int, now: float) -> float:
    """The keep_until (unix seconds, whole) that keeps rows `keep_days` days from `now`."""
    return float(math.ceil(now + check_keep_days(keep_days) * DAY_S))


def import_refusal(records: int, old: int, cutoff: Cutoff) -> str:
    """Why an import of `records` step records, `old` of them past `cutoff`, stored none of them (an
    import is stored whole or not at all): "704 refused: older than the steps retention cutoff ..."."""
    if old == records:
        return f"{records} refused: {cutoff.describe()}"
    return (
        f"{records} refused: {old} of them {cutoff.describe()}, and an import is stored whole or not at all"
    )

"""The placements table's reads and writes (schema.PLACEMENTS): which job ran on which node, with which
GPUs, from when to when, as each scheduler (a Source: slurm, k8s) says it.

`replacement` turns what a source says now (records.Placement) into the rows to write, as for the
topology (analytics.store.topology): a placement not said any more ends at `now`; one said to have ended
(a finished job still listed) ends at its own `until`; a new one opens at its own `since` (not after
`now`); the rest are left alone. Ending a placement writes the same row again with valid_to set and
closed = 1, which replaces the open one on merge (reads use FINAL). Saying the same again writes nothing,
and a replayed batch carries the same insert token. One writer per source at a time (the hub).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from analytics.errors import StoreRejected
from analytics.store.records import Placement
from analytics.store.topology import Changes, Reader, Replacement
from analytics.topology.model import Source

COLUMNS = ("source", "job", "user", "node", "gpus", "valid_from", "valid_to", "closed")
MAX_PLACEMENTS = 1_000_000  # rows one read returns; a larger answer is refused, not cut
_SECONDS = "toFloat64(toUnixTimestamp64Milli({column})) / 1000"
_KEY = tuple[str, str, str, tuple[int, ...]]  # job, user, node, gpus: what makes two placements the same


def held(table: str) -> str:
    """A source's placements still open, and the stored ones of the jobs in {jobs} (those it now says
    ended): what `replacement` takes. `table` is qualified."""
    return f"""SELECT job, user, node, gpus,
    toUnixTimestamp64Milli(valid_from), toUnixTimestamp64Milli(valid_to)
FROM {table} FINAL
WHERE source = {{source:String}} AND (valid_to IS NULL OR has({{jobs:Array(String)}}, job))"""


def replacement(
    source: Source, placements: Iterable[Placement], held_rows: Sequence[tuple], now: float
) -> Replacement:
    """The rows that make `source` say exactly `placements` from `now` on, given its `held_rows` (`held`);
    StoreRejected for a placement of another source, or when `now` is before a held placement opened (a
    clock gone back)."""
    now_ms = _millis(now)
    stored: dict[_KEY, tuple[int, int | None]] = {
        (job, user, node, tuple(gpus)): (int(since), None if until is None else int(until))
        for job, user, node, gpus, since, until in held_rows
    }
    if (latest := max((since for since, _ in stored.values()), default=now_ms)) > now_ms:
        raise StoreRejected(
            f"placements: {source} opened one at {latest / 1000:.3f}, after now ({now:.3f}):"
            " a clock gone back?"
        )
    said: dict[_KEY, Placement] = {}
    for placement in placements:
        if placement.source != source:
            raise StoreRejected(f"placements: a placement of {placement.source} given as one of {source}")
        said[(placement.job, placement.user, placement.node, placement.gpus)] = placement
    rows, opened, closed, unchanged = [], 0, 0, 0
    for key, (since, until) in sorted(stored.items()):
        if until is None and key not in said:
            rows.append(_row(source, key, since, now_ms))
            closed += 1
    for key, placement in sorted(said.items()):
        until = None if placement.until is None else min(_millis(placement.until), now_ms)
        if key in stored and (stored[key][1] is not None or until is None):
            unchanged += 1  # already stored as it is now
            continue
        since = stored[key][0] if key in stored else min(_millis(placement.since), until or now_ms)
        rows.append(_row(source, key, since, until))
        opened += key not in stored
        closed += until is not None
    digest = hashlib.sha256(json.dumps([str(source), now_ms, rows]).encode()).hexdigest()
    columns = [list(column) for column in zip(*rows, strict=True)] if rows else []
    return Replacement(columns, digest, Changes(opened=opened, closed=closed, unchanged=unchanged))


def between_sql(table: str, node: bool, job: bool) -> str:
    """The placements in force at any time in [{since}, {until}), of {node} and/or {job} where asked."""
    where = " AND node = {node:String}" * node + " AND job = {job:String}" * job
    return f"""SELECT source, job, user, node, gpus,
    {_SECONDS.format(column="valid_from")}, {_SECONDS.format(column="valid_to")}
FROM {table} FINAL
WHERE valid_from < {{until:DateTime64(3, 'UTC')}}
    AND (valid_to IS NULL OR valid_to > {{since:DateTime64(3, 'UTC')}}){where}
ORDER BY valid_from, source, job, node"""


def placements_between(
    reader: Reader, since: float, until: float, *, node: str | None = None, job: str | None = None
) -> list[Placement]:
    """The placements in force at some time in [since, until) (unix seconds), of `node` and/or `job`
    where given, earliest first; rows of a source this code does not know are left out. StoreRejected
    when there are more than one read returns."""
    parameters: dict[str, Any] = {
        "since": datetime.fromtimestamp(since, UTC),
        "until": datetime.fromtimestamp(until, UTC),
        "node": node or "",
        "job": job or "",
    }
    sql = between_sql("placements", node is not None, job is not None)
    result = reader.query(sql, parameters=parameters, max_rows=MAX_PLACEMENTS)
    if result.truncated:
        raise StoreRejected(f"placements: more than one read returns ({len(result.rows)}); narrow the window")
    known = {str(source) for source in Source}
    return [
        Placement(
            Source(source), job_, user, node_, tuple(gpus), float(start), None if end is None else float(end)
        )
        for source, job_, user, node_, gpus, start, end in result.rows
        if source in known
    ]


def _row(source: Source, key: _KEY, since_ms: int, until_ms: int | None) -> tuple:
    job, user, node, gpus = key
    return (str(source), job, user, node, list(gpus), since_ms, until_ms, int(until_ms is not None))


def _millis(ts: float) -> int:
    return round(ts * 1000)

"""The checks table's reads (schema.CHECKS): active health checks' verdicts per node, check and target,
as `fleetlens checks run` posted them (records.CheckRow). Rows are only appended; a replayed insert
carries the same token and writes nothing."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import astuple
from datetime import UTC, datetime
from typing import Any

from analytics.errors import StoreRejected
from analytics.store.records import CheckRow
from analytics.store.topology import Reader

COLUMNS = tuple(CheckRow.__slots__)
MAX_CHECKS = 100_000  # rows one read returns; a larger answer is refused, not cut


def insert_token(rows: Sequence[CheckRow]) -> str:
    """The insert token of `rows`: the same rows sent again are stored once."""
    return hashlib.sha256(json.dumps([astuple(row) for row in rows]).encode()).hexdigest()


def between_sql(node: bool) -> str:
    """The checks started in [{since}, {until}), of {node} where asked, earliest first."""
    where = " AND node = {node:String}" * node
    return f"""SELECT node, check, target, status, value, unit, threshold, evidence,
    toFloat64(toUnixTimestamp64Milli(started)) / 1000, duration_s
FROM checks
WHERE started >= {{since:DateTime64(3, 'UTC')}} AND started < {{until:DateTime64(3, 'UTC')}}{where}
ORDER BY started, node, check, target"""


def latest_sql(node: bool) -> str:
    """The last check started in [{since}, {until}) of each node, check and target (of {node} where
    asked): argMax over `started`, so a late-posted older result does not hide a newer one."""
    where = " AND node = {node:String}" * node
    columns = ", ".join(
        f"argMax({column}, started)" for column in ("status", "value", "unit", "threshold", "evidence")
    )
    return f"""SELECT node, check, target, {columns},
    toFloat64(toUnixTimestamp64Milli(max(started))) / 1000, argMax(duration_s, started)
FROM checks
WHERE started >= {{since:DateTime64(3, 'UTC')}} AND started < {{until:DateTime64(3, 'UTC')}}{where}
GROUP BY node, check, target
ORDER BY node, check, target"""


def checks_between(reader: Reader, since: float, until: float, *, node: str | None = None) -> list[CheckRow]:
    """The checks started in [since, until) (unix seconds), of `node` where given, earliest first, from a
    Store or a HubClient. StoreRejected when there are more than one read returns."""
    return _read(reader, between_sql(node is not None), since, until, node)


def latest_checks(reader: Reader, since: float, until: float, *, node: str | None = None) -> list[CheckRow]:
    """The last check started in [since, until) of each node, check and target (of `node` where given),
    ordered by node, check and target: what a node's health is now. StoreRejected as checks_between."""
    return _read(reader, latest_sql(node is not None), since, until, node)


def _read(reader: Reader, sql: str, since: float, until: float, node: str | None) -> list[CheckRow]:
    parameters: dict[str, Any] = {
        "since": datetime.fromtimestamp(since, UTC),
        "until": datetime.fromtimestamp(until, UTC),
        "node": node or "",
    }
    result = reader.query(sql, parameters=parameters, max_rows=MAX_CHECKS)
    if result.truncated:
        raise StoreRejected(f"checks: more than one read returns ({len(result.rows)}); narrow the window")
    return [CheckRow(*row) for row in result.rows]

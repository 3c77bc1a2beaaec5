"""What the demo tells its user: a line per anomaly and drain decision as the hub records them, and
the verdict of a timed run."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from alerts import commands
from analytics.evidence import Evidence, as_dict, stored
from analytics.store.hubclient import HubClient
from analytics.store.records import ActionRow, Anomaly
from sim.evaluation import CONFOUNDER, TRUE, ScenarioResult

ANOMALIES_SQL = """
SELECT id, toUnixTimestamp64Milli(start) / 1000 AS start,
    if(end IS NULL, NULL, toUnixTimestamp64Milli(assumeNotNull(end)) / 1000) AS end,
    kind, node, component, job, severity, score, evidence, detector, detector_version, explained_by
FROM anomalies FINAL
WHERE start >= fromUnixTimestamp64Milli(toInt64({since:Float64} * 1000))
ORDER BY start, node, kind
"""


class Narrator:
    """One line per anomaly as it opens, as a shared fault explains it and as it closes, and per drain
    decision, from the hub's store."""

    def __init__(self, client: HubClient, since: float) -> None:
        self._client = client
        self._since = since
        self._told: dict[str, tuple[bool, str]] = {}  # id -> (ended, explained_by) as last told
        self._actions_since = since
        self._actions_told: set[ActionRow] = set()

    def poll(self) -> Iterator[str]:
        anomalies = read_anomalies(self._client, self._since)
        places = {anomaly.id: _where(anomaly) for anomaly in anomalies}
        for anomaly in anomalies:
            ended = anomaly.end is not None
            told = self._told.get(anomaly.id)
            if told == (ended, anomaly.explained_by):
                continue
            self._told[anomaly.id] = (ended, anomaly.explained_by)
            verb = "closed" if ended else "explained" if told is not None else "opened"
            at = anomaly.end if anomaly.end is not None else anomaly.start
            what = f"{verb} {anomaly.kind} ({anomaly.severity}) on {_where(anomaly)} at {clock(at)}"
            if explainer := anomaly.explained_by:
                what += f", explained by shared_fault on {places.get(explainer, explainer)}"
            yield f"{clock(time.time())}  anomaly   {what}: {_brief(anomaly.evidence)}"
        for row in commands.actions(self._client, since=self._actions_since):
            if row in self._actions_told:  # rows at the last poll's time come again
                continue
            self._actions_told.add(row)
            self._actions_since = max(self._actions_since, row.ts)
            decision = f"{row.action} {row.node}: {row.outcome} ({row.mode} mode)"
            yield f"{clock(time.time())}  drain     {decision}: {row.reason}"


def read_anomalies(client: HubClient, since: float) -> list[Anomaly]:
    result = client.query(ANOMALIES_SQL, parameters={"since": since}, max_rows=100_000)
    """The anomalies the hub's store holds from `since` on, each's evidence read from its stored text."""
    rows = [dict(zip(result.columns, row, strict=True)) for row in result.rows]
    return [Anomaly(**{**row, "evidence": stored(row["kind"], row["evidence"])}) for row in rows]


def _where(anomaly: Anomaly) -> str:
    """Where an anomaly is: its node and component ("demo-026 gpu:2"; a shared fault's "leaf-03 leaf")."""
    return f"{anomaly.node} {anomaly.component}".strip()


def _brief(evidence: Evidence, width: int = 100) -> str:
    """The evidence as key=value pairs, numbers to 4 significant digits, cut at `width` characters."""
    text = " ".join(f"{key}={_short(value)}" for key, value in as_dict(evidence).items())
    return text if len(text) <= width else text[: width - 3] + "..."


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def clock(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%H:%M:%S")


def passed(result: ScenarioResult) -> bool:
    """Every fault detected, no confounder reported, no child of a shared fault drained."""
    return all(outcome.detected and not outcome.drained_children for outcome in result.faults) and not any(
        report.verdict == CONFOUNDER for report in result.reports
    )


def verdict_lines(result: ScenarioResult) -> list[str]:
    lines = ["", "injected                                         detected"]
    for outcome in result.faults:
        fault = outcome.fault
        where = f"{fault.node} {fault.component}".strip()
        found = f"after {outcome.latency_s:g} s" if outcome.detected else "MISSED"
        if outcome.drained_children:
            found += f", CHILDREN DRAINED: {', '.join(outcome.drained_children)}"
        lines.append(f"  {fault.kind:17} {where:30} {found}")
    confounders = [report for report in result.reports if report.verdict == CONFOUNDER]
    for report in confounders:
        anomaly = report.report.anomaly
        why = "; ".join(report.explained_by)
        lines.append(f"  CONFOUNDER REPORTED: {anomaly.kind} on {anomaly.node} ({why})")
    detected = sum(outcome.detected for outcome in result.faults)
    other = sum(report.verdict not in (TRUE, CONFOUNDER) for report in result.reports)
    lines.append(
        f"{detected} of {len(result.faults)} faults detected, {len(confounders)} confounder reports, "
        f"{other} other reports: {'PASS' if passed(result) else 'FAIL'}"
    )
    return lines

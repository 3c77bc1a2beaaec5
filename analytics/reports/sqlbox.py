"""The SQL box of the UI's Postmortem page and `fleetlens query`'s friendlier sibling: saved queries for the
usual questions, and run_sql, which sends only the parameters a statement names and explains a refusal
(a write, a syntax error with its line and column, a limit) in words."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from analytics.errors import QueryError
from analytics.reports.postmortem.model import IN_WINDOW
from analytics.store.protocols import Reader
from analytics.store.records import QueryResult

SAVED_QUERIES: dict[str, str] = {
    "Anomalies on the node": """
SELECT start, end, kind, component, job, severity, round(score, 3) AS score, evidence, detector
FROM anomalies FINAL
WHERE node = {node:String} AND start < {end:DateTime64(3)}
    AND (end IS NULL OR end >= {start:DateTime64(3)})
ORDER BY start""",
    "Alert changes on the node": f"""
SELECT ts, alertname, state, labels['component'] AS component, annotations['summary'] AS summary, fingerprint
FROM alerts
WHERE labels['node'] = {{node:String}} AND {IN_WINDOW}
ORDER BY ts""",
    "Drain decisions on the node": f"""
SELECT ts, action, outcome, mode, reason, decision_id
FROM actions
WHERE node = {{node:String}} AND {IN_WINDOW}
ORDER BY ts""",
    "Failed scrapes of the node": f"""
SELECT ts, target, error
FROM targets
WHERE node = {{node:String}} AND up = 0 AND {IN_WINDOW}
ORDER BY ts""",
    "Lowest SM clock and hottest temperature per GPU": f"""
SELECT labels['gpu'] AS gpu,
    minIf(value, metric = 'DCGM_FI_DEV_SM_CLOCK') AS min_sm_clock_mhz,
    medianIf(value, metric = 'DCGM_FI_DEV_SM_CLOCK') AS median_sm_clock_mhz,
    maxIf(value, metric = 'DCGM_FI_DEV_GPU_TEMP') AS max_temp_c
FROM metrics
WHERE metric IN ('DCGM_FI_DEV_SM_CLOCK', 'DCGM_FI_DEV_GPU_TEMP')
    AND node = {{node:String}} AND {IN_WINDOW}
GROUP BY gpu
ORDER BY toUInt32OrZero(gpu)""",
    "Xid errors per GPU": f"""
SELECT labels['gpu'] AS gpu, labels['xid'] AS xid, max(value) - min(value) AS new_errors
FROM metrics
WHERE metric = 'fleetlens_gpu_xid_errors_total' AND node = {{node:String}} AND {IN_WINDOW}
GROUP BY gpu, xid
HAVING new_errors > 0
ORDER BY new_errors DESC""",
    "RoCE ports: worst state, link downs, traffic": f"""
SELECT labels['device'] AS device, labels['port'] AS port,
    minIf(value, metric = 'node_infiniband_state_id') AS worst_state_id,
    maxIf(value, metric = 'node_infiniband_link_downed_total')
        - minIf(value, metric = 'node_infiniband_link_downed_total') AS link_downs,
    (maxIf(value, metric = 'node_infiniband_port_data_received_bytes_total')
        - minIf(value, metric = 'node_infiniband_port_data_received_bytes_total'))
        / greatest(1, dateDiff('second', min(ts), max(ts))) AS rx_bytes_per_s,
    maxIf(value, metric = 'node_infiniband_np_cnp_packets_sent_total')
        - minIf(value, metric = 'node_infiniband_np_cnp_packets_sent_total') AS cnp_sent
FROM metrics
WHERE metric IN ('node_infiniband_state_id', 'node_infiniband_link_downed_total',
        'node_infiniband_port_data_received_bytes_total', 'node_infiniband_np_cnp_packets_sent_total')
    AND node = {{node:String}} AND {IN_WINDOW}
GROUP BY device, port
ORDER BY device, port""",
    "Step time of the node against its jobs' median": f"""
SELECT job, node, count() AS steps, round(avg(duration_s), 4) AS mean_step_s,
    round(avg(compute_s), 4) AS mean_compute_s
FROM steps
WHERE job IN (SELECT DISTINCT job FROM steps WHERE node = {{node:String}} AND {IN_WINDOW})
    AND {IN_WINDOW}
GROUP BY job, node
ORDER BY job, mean_step_s DESC""",
    "Anomalies across the fleet by kind": """
SELECT kind, severity, count() AS anomalies, uniqExact(node) AS nodes, min(start) AS first, max(start) AS last
FROM anomalies FINAL
WHERE start < {end:DateTime64(3)} AND (end IS NULL OR end >= {start:DateTime64(3)})
GROUP BY kind, severity
ORDER BY anomalies DESC""",
}
_PLACEHOLDER = re.compile(r"\{(\w+):")
_SYNTAX_ERROR = re.compile(r"Syntax error: failed at position (\d+)")


def run_sql(
    source: Reader, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = 10_000
) -> QueryResult:
    """Run the SQL box's statement read-only: at most `max_rows` rows (`truncated` says when more matched).

    Only the `parameters` the statement names as {name:Type} are sent, so a statement without any (one
    with `LIKE 'vela%'`, say) is sent as written. Bad input (a write, a syntax error, an unknown column,
    a limit exceeded) raises QueryError saying what is wrong and where; nothing else does."""
    if max_rows < 1:
        raise QueryError(f"the SQL box needs a row limit of at least 1, not {max_rows}")
    named = set(_PLACEHOLDER.findall(sql))
    used = {name: value for name, value in (parameters or {}).items() if name in named}
    try:
        return source.query(sql, parameters=used or None, max_rows=max_rows)
    except QueryError as error:
        raise QueryError(_explained(str(error), sql)) from error


def _explained(message: str, sql: str) -> str:
    """The store's refusal in the SQL box's words: where a syntax error is, in the user's own text."""
    found = _SYNTAX_ERROR.search(message)
    if not found:
        return f"query refused: {message}"
    statement = sql.rstrip().removesuffix(";").rstrip()
    position = int(found.group(1)) - 1  # ClickHouse counts from 1 in the text as written
    if position >= len(statement):
        return (
            f"syntax error: the statement ends too early, after `{' '.join(statement.split())[-40:]}`; "
            "is a clause, an operand or a closing parenthesis missing?"
        )
    line = statement.count("\n", 0, position) + 1
    column = position - statement.rfind("\n", 0, position)
    near = " ".join(statement[position:].split())[:30]
    return f"syntax error at line {line}, column {column}, near `{near}`"

"""What the Node, Actions and Postmortem pages show of a node's life: the jobs the schedulers placed on it
(the `placements` table), the latest active check results (the `checks` table), where each node stands
in the lifecycle (analytics.reports.lifecycle), and the lifecycle audit rows (the `actions` rows of
LIFECYCLE_ACTIONS, apart from the drain controller's)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd
import streamlit as st

from analytics.reports.lifecycle import node_states
from analytics.reports.postmortem import Report
from analytics.store.checks import latest_checks
from analytics.store.placements import placements_between
from analytics.store.protocols import Reader
from analytics.store.records import Placement
from ui import window

LIFECYCLE_ACTIONS = ("test", "return", "fail")  # a drained node tested, returned to service, or failed
STATUS_ORDER = ("FAIL", "ERROR", "WARN", "PASS")  # failures first
CHECK_COLUMNS = ("node", "check", "target", "status", "value", "unit", "threshold", "started", "duration_s")
PLACEMENT_COLUMNS = ("job", "user", "gpus", "from", "until", "source")


def check_results(reader: Reader, span: window.TimeRange, node: str | None = None) -> pd.DataFrame:
    """The last result of each node, check and target started in the range (of `node` where given):
    failures first, then by node, check and target; evidence as a JSON object."""
    rows = latest_checks(reader, span.start, span.end, node=node)
    frame = pd.DataFrame(
        [[getattr(row, column) for column in CHECK_COLUMNS] for row in rows], columns=list(CHECK_COLUMNS)
    )
    frame["evidence"] = [json.loads(row.evidence) for row in rows]
    frame["started"] = pd.to_datetime(frame["started"], unit="s", utc=True)
    rank = frame["status"].map({status: index for index, status in enumerate(STATUS_ORDER)})
    return frame.assign(rank=rank).sort_values(["rank", "node", "check", "target"]).drop(columns="rank")


def show_check_results(results: pd.DataFrame, key: str) -> None:
    failed = int(results["status"].isin(STATUS_ORDER[:2]).sum())
    st.subheader(f"Check results ({len(results)}, {failed} failed)")
    if results.empty:
        st.caption("no active check ran in the range (`fleetlens checks run --hub URL` posts them)")
        return
    st.dataframe(
        results,
        hide_index=True,
        column_config={**window.utc_columns("started"), "evidence": st.column_config.JsonColumn("evidence")},
        key=key,
    )


def show_states(reader: Reader) -> None:
    """The nodes fleetlens holds out of service: drained, testing or failed, since when and why."""
    states = node_states(reader)
    st.subheader(f"Node lifecycle ({len(states)} out of service)")
    if not states:
        st.caption("every node is in service: fleetlens holds none drained, testing or failed")
        return
    frame = pd.DataFrame(
        [[node, state.state, state.since, state.reason] for node, state in sorted(states.items())],
        columns=["node", "state", "since", "reason"],
    )
    frame["since"] = pd.to_datetime(frame["since"], unit="s", utc=True)
    st.dataframe(frame, hide_index=True, column_config=window.utc_columns("since"), key="actions.states")


def show_placements(reader: Reader, node: str, span: window.TimeRange) -> None:
    """What ran on `node` in the range, as its schedulers say: job, user, GPUs, from, until, source."""
    placed = placements_between(reader, span.start, span.end, node=node)
    st.subheader(f"What ran here ({len(placed)})")
    if not placed:
        st.caption(f"no scheduler placed a job on {node} in {span.label}")
        return
    _placements_table(placed, PLACEMENT_COLUMNS, "node.placements")


def show_report_placements(report: Report) -> None:
    """A postmortem's placements (what ran on its node, where its job ran), and, for a job that sent no
    step times, that its nodes and span came from them."""
    if report.nodes_from == "placements":
        st.info("the job sent no step times: its nodes and span come from its placements")
    if report.placements:
        st.subheader(f"Placements ({len(report.placements)})")
        _placements_table(report.placements, ("node", *PLACEMENT_COLUMNS), "postmortem.placements")


def jobs(reader: Reader, span: window.TimeRange, scopes: pd.DataFrame) -> list[str]:
    """The jobs of the range: those with step records (dashboards.nodes_and_jobs' `jobs`) and those the
    schedulers placed."""
    placed = placements_between(reader, span.start, span.end)
    return sorted({job for listed in scopes["jobs"] for job in listed} | {p.job for p in placed})


def _placements_table(placed: Sequence[Placement], columns: Sequence[str], key: str) -> None:
    """Newest first; GPUs as "0, 1"; an open placement's until empty."""
    cells = {
        "node": lambda p: p.node,
        "job": lambda p: p.job,
        "user": lambda p: p.user,
        "gpus": lambda p: ", ".join(map(str, p.gpus)),
        "from": lambda p: p.since,
        "until": lambda p: p.until,
        "source": lambda p: str(p.source),
    }
    frame = pd.DataFrame(
        [[cells[column](p) for column in columns] for p in reversed(placed)], columns=columns
    )
    for column in ("from", "until"):
        frame[column] = pd.to_datetime(frame[column], unit="s", utc=True)
    st.dataframe(frame, hide_index=True, column_config=window.utc_columns("from", "until"), key=key)


def split_audit(audit: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The drain controller's rows and the lifecycle rows (LIFECYCLE_ACTIONS) of an actions frame."""
    lifecycle = audit["action"].isin(LIFECYCLE_ACTIONS)
    return audit[~lifecycle], audit[lifecycle]

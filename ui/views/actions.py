"""Actions: drains waiting for approval with approve and deny buttons, the nodes drained, where each node
fleetlens holds stands in the lifecycle (drained, testing, failed), the latest active check results
(failures first), the audit log of the drain controller, the lifecycle audit (nodes
tested, returned, failed), and the limits the controller enforces. A button sends a request
(alerts.commands.request) that the hub's controller carries out on its next cycle; the audit shows both."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from alerts import commands
from analytics.reports import dashboards
from ui import lifecycle, source, window

BY_KEY = "actions.by"


def ask(action: str, decision_id: str, node: str) -> None:
    """Send a person's approve or deny of one pending drain, naming who asks."""
    by = st.session_state.get(BY_KEY, "").strip()
    if not by:
        st.warning(f"{action} {node}: enter your name above first; it goes into the audit with the request")
        return
    with source.reported(f"{action} {node} ({decision_id})"):
        commands.request(source.current(), action, decision_id, by)
        st.success(f"{action} of the drain of {node} requested by {by}: the hub's controller acts next cycle")


def show_queue(queue: pd.DataFrame) -> None:
    waiting = queue[queue["state"] == "draining"]
    st.subheader(f"Waiting for approval ({len(waiting)})")
    st.text_input("Your name (recorded with your decision)", key=BY_KEY)
    for row in waiting.itertuples():
        text, approve, deny = st.columns([6, 1, 1])
        text.markdown(
            f"**{row.node}** since {row.since:%Y-%m-%d %H:%M:%S} UTC: {row.reason}"
            f" (decision `{row.decision_id}`{', job ' + row.job if row.job else ''})"
            + (f"  \n{row.request}, waiting for the controller" if row.request else "")
        )
        if approve.button("Approve", key=f"approve.{row.decision_id}", type="primary"):
            ask("approve", row.decision_id, row.node)
        if deny.button("Deny", key=f"deny.{row.decision_id}"):
            ask("deny", row.decision_id, row.node)
    drained = queue[queue["state"] == "drained"]
    st.subheader(f"Drained ({len(drained)})")
    st.dataframe(drained.drop(columns=["state"]), hide_index=True, column_config=window.utc_columns("since"))


def show_policy() -> None:
    policy = source.drain_policy()
    st.subheader("Limits in force")
    if policy is None:
        st.info("`fleetlens ui` passed no drain policy: start the app with it to see the hub's limits")
        return
    mode = policy.get("mode", "")
    if mode != "approve":
        st.caption(
            f"drain mode {mode}: drains " + ("are only recorded" if mode == "dry-run" else "run at once")
        )
    limits = policy.get("limits", {})
    st.table(pd.DataFrame({"limit": list(limits), "value": [str(value) for value in limits.values()]}))
    st.caption(
        f"mode {mode}, cooldown {policy.get('cooldown_s')} s per node, return after healthy: "
        f"{policy.get('return_after_healthy_s') or 'by hand'}"
    )


st.title("Actions")
span = window.current()
with source.reported("reading the drain controller's audit"):
    show_queue(dashboards.drain_queue(source.current(), time.time()))
with source.reported("reading the node lifecycle"):
    lifecycle.show_states(source.current())
with source.reported("reading the check results"):
    lifecycle.show_check_results(lifecycle.check_results(source.current(), span), key="actions.checks")
with source.reported("reading the drain controller's audit"):
    drains, tested = lifecycle.split_audit(dashboards.actions(source.current(), span.start, span.end))
    st.subheader(f"Audit log ({len(drains)})")
    st.caption(span.label)
    st.dataframe(drains, hide_index=True, column_config=window.utc_columns("ts"), key="actions.audit")
    st.subheader(f"Lifecycle audit ({len(tested)})")
    st.caption(f"nodes tested, returned to service or failed, {span.label}")
    st.dataframe(tested, hide_index=True, column_config=window.utc_columns("ts"), key="actions.lifecycle")
with source.reported("reading the drain policy"):
    show_policy()

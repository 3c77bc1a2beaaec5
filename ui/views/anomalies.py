"""Anomalies and alerts: a timeline across the fleet, filters by kind, severity, node and job, the
evidence of each anomaly and what each straggler costs its job, and the alerts raised from them."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analytics.evidence import as_dict
from analytics.reports import dashboards
from ui import costs, explained, plots, source, window

SEVERITIES = ["critical", "warning", "info"]


def filters(span: window.TimeRange) -> dict[str, list[str]]:
    """The filter widgets, offering what the range holds; an empty filter lets everything through."""
    reader = source.current()
    kinds = sorted(set(dashboards.anomaly_counts(reader, span.start, span.end)["kind"]))
    scopes = dashboards.nodes_and_jobs(reader, span.start, span.end)
    jobs = sorted({job for listed in scopes["jobs"] for job in listed})
    columns = st.columns(4)
    return {
        "kinds": columns[0].multiselect("Kind", kinds, key="anomalies.kinds"),
        "severities": columns[1].multiselect("Severity", SEVERITIES, key="anomalies.severities"),
        "nodes": columns[2].multiselect("Node", list(scopes["node"]), key="anomalies.nodes"),
        "jobs": columns[3].multiselect("Job", jobs, key="anomalies.jobs"),
    }


def show_evidence(found: pd.DataFrame) -> None:
    """One anomaly's evidence in full: the numbers that triggered it."""
    labels = {
        row.id: f"{row.kind} on {row.node} {row.component} from {row.start:%Y-%m-%d %H:%M:%S} UTC"
        for row in found.itertuples()
    }
    chosen = st.selectbox("Evidence of", list(labels), format_func=labels.get, key="anomalies.evidence")
    st.json(as_dict(found.set_index("id").at[chosen, "evidence"]))


def show_anomalies(span: window.TimeRange) -> list[str]:
    """The filtered anomalies; returns the node filter, which the alerts below follow too."""
    chosen = filters(span)
    found = dashboards.anomalies(source.current(), span.start, span.end, **chosen)
    st.subheader(f"Anomalies ({len(found)})")
    if found.attrs["truncated"]:
        st.warning("more anomalies match than shown: narrow the range or the filters")
    if found.empty:
        st.info(f"no anomaly matches in {span.label}")
        return chosen["nodes"]
    st.altair_chart(
        plots.anomaly_timeline(found.drop(columns=["evidence"]), pd.Timestamp(span.end, unit="s", tz="UTC")),
        width="stretch",
    )
    st.dataframe(
        costs.with_evidence_text(found.drop(columns=["id"])),
        hide_index=True,
        column_config={
            **window.utc_columns("start", "end"),
            **costs.cost_columns(),
            **explained.COLUMNS,
            "evidence": st.column_config.JsonColumn("evidence"),
        },
        key="anomalies.table",
    )
    costs.show_costs(found)
    explained.show_explained(found)
    show_evidence(found)
    return chosen["nodes"]


def show_alerts(span: window.TimeRange, nodes: list[str]) -> None:
    raised = dashboards.alerts(source.current(), span.start, span.end, nodes=nodes)
    st.subheader(f"Alerts ({len(raised)})")
    st.dataframe(
        raised,
        hide_index=True,
        column_config=window.utc_columns("starts_at", "ends_at", "changed_at"),
        key="anomalies.alerts",
    )


st.title("Anomalies and alerts")
span = window.current()
st.caption(span.label)
with source.reported("reading anomalies and alerts"):
    show_alerts(span, show_anomalies(span))

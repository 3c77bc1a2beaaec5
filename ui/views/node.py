"""Node: one node's GPU and RoCE time series with its anomaly periods shaded, what ran on it (its
placements), its step or compute time against its peers, its latest check results, and its anomalies
(with what it costs its job as a straggler), alerts and drain decisions. The node comes from ?node=."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analytics.reports import dashboards, topology
from ui import costs, explained, lifecycle, plots, source, window


def pick_node(span: window.TimeRange) -> str:
    """The node of ?node=, offered among the nodes seen in the range; the choice goes back to the URL."""
    known = list(dashboards.nodes_and_jobs(source.current(), span.start, span.end)["node"])
    asked = st.query_params.get("node", "")
    nodes = known if asked in known or not asked else [asked, *known]
    if not nodes:
        st.info(f"no node was scraped in {span.label}")
        st.stop()
    node = st.selectbox("Node", nodes, index=nodes.index(asked) if asked in nodes else 0, key="node.pick")
    st.query_params["node"] = node
    return node


def show_peers(node: str, span: window.TimeRange) -> None:
    band = dashboards.peer_band(source.current(), node, span.start, span.end)
    st.subheader("Against its peers (same job and pipeline stage)")
    if band.empty:
        st.info(f"{node} ran no job with step records in {span.label}")
        return
    for (job, stage), part in band.groupby(["job", "stage"]):
        own, peers = part["value"].median(), part["peer_median"].median()
        signal = part["signal"].iloc[0]
        st.metric(
            f"{job}, stage {stage}: median {signal} time of {node} (peers {peers:.3f} s)",
            f"{own:.3f} s",
            delta=f"{(own / peers - 1) * 100:+.1f}% vs peers" if peers else None,
            delta_color="inverse",
        )
        st.altair_chart(plots.peer_band(part, node), width="stretch")


def show_layers(node: str, span: window.TimeRange) -> None:
    """Where the node sits at the range's end: its host, leaf, spine, rack and rails."""
    view = topology.node_layers(source.current(), node, span.end)
    if view is None:
        st.caption(f"{node} is not in the topology at the range's end (docs/topology.md: how to add it)")
        return
    layers = [
        f"{layer} **{', '.join(value) if isinstance(value, list) else value}**"
        for layer in topology.VIEW_COLUMNS[1:]
        if (value := view.get(layer))
    ]
    st.markdown(f"Sits under: {' · '.join(layers) or 'no layer the sources name'}")


def show_series(node: str, span: window.TimeRange, anomalies: pd.DataFrame) -> None:
    data = dashboards.node_series(source.current(), node, span.start, span.end)
    if data.empty:
        st.info(f"no GPU or RoCE samples of {node} in {span.label}")
        return
    shaded = plots.periods(anomalies, pd.Timestamp(span.end, unit="s", tz="UTC"))
    columns = st.columns(2)
    for position, name in enumerate(dashboards.NODE_METRICS):
        metric = dashboards.METRICS[name]
        part = data[data["metric"] == name]
        if not part.empty:
            chart = plots.series(part, shaded, title=metric.title, unit=metric.unit)
            columns[position % 2].altair_chart(chart, width="stretch")


def show_node(span: window.TimeRange) -> None:
    node = pick_node(span)
    reader = source.current()
    found = dashboards.anomalies(reader, span.start, span.end, nodes=[node])
    st.caption(f"{node}, {span.label}; shaded: its anomalies")
    show_layers(node, span)
    show_series(node, span, found.drop(columns=["evidence"]))  # a chart's data: numbers and names
    lifecycle.show_placements(reader, node, span)
    show_peers(node, span)
    lifecycle.show_check_results(lifecycle.check_results(reader, span, node), key="node.checks")
    st.subheader(f"Anomalies ({len(found)})")
    st.dataframe(
        costs.with_evidence_text(found.drop(columns=["id", "node"])),
        hide_index=True,
        column_config={
            **window.utc_columns("start", "end"),
            **costs.cost_columns(),
            **explained.COLUMNS,
            "evidence": st.column_config.JsonColumn("evidence"),
        },
        key="node.anomalies",
    )
    costs.show_costs(found)
    explained.show_explained(found)
    alerts = dashboards.alerts(reader, span.start, span.end, nodes=[node])
    st.subheader(f"Alerts ({len(alerts)})")
    st.dataframe(
        alerts.drop(columns=["node"]),
        hide_index=True,
        column_config=window.utc_columns("starts_at", "ends_at", "changed_at"),
        key="node.alerts",
    )
    decisions = dashboards.actions(reader, span.start, span.end, nodes=[node])
    st.subheader(f"Drain decisions ({len(decisions)})")
    st.dataframe(decisions, hide_index=True, column_config=window.utc_columns("ts"), key="node.actions")


st.title("Node")
with source.reported("reading the node"):
    show_node(window.current())

"""Fleet: every node's status at a glance, its GPUs and RoCE ports as matrices, anomalies by kind, and
where the nodes sit (leaf x its VMs, the parents in trouble marked); it refreshes itself, and a node
picked in the table (or the drill-down box) opens the Node page."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from analytics.reports import dashboards, topology
from ui import plots, source, window

REFRESH_S = {"off": None, "10 s": 10, "30 s": 30, "1 min": 60}
PORT_MEASURES = {
    "flaps": "link flaps (count)",
    "rx_bytes_per_s": "RoCE received (bytes/s)",
    "tx_bytes_per_s": "RoCE sent (bytes/s)",
    "cnp_handled_per_s": "CNPs handled (packets/s)",
    "cnp_sent_per_s": "CNPs sent (packets/s)",
}
NODE_PAGE = "views/node.py"

st.title("Fleet")
controls = st.columns(3)
refresh = controls[0].selectbox("Auto refresh", list(REFRESH_S), index=2, key="fleet.refresh")
metric = controls[1].selectbox(
    "GPU metric",
    dashboards.GPU_METRICS,
    format_func=lambda name: f"{dashboards.METRICS[name].title} ({dashboards.METRICS[name].unit})",
    key="fleet.metric",
)
measure = controls[2].selectbox(
    "Port measure", list(PORT_MEASURES), format_func=PORT_MEASURES.get, key="fleet.port_measure"
)


def open_node(node: str) -> None:
    st.switch_page(NODE_PAGE, query_params={"node": node})


def show_status(status: pd.DataFrame) -> None:
    """Counts per status, a tile per node, and the table whose rows open the Node page."""
    counts = status["status"].value_counts()
    for column, name in zip(st.columns(len(dashboards.STATUSES)), reversed(dashboards.STATUSES), strict=True):
        column.metric(name, int(counts.get(name, 0)))
    st.altair_chart(plots.status_tiles(status), width="stretch")
    picked = st.dataframe(
        status,
        hide_index=True,
        on_select="rerun",
        selection_mode="single-row",
        key="fleet.status",
        column_config={
            **window.utc_columns("last_scrape"),
            "failed_scrapes": st.column_config.NumberColumn(
                f"failed scrapes (last {dashboards.DOWN_AFTER_S:.0f} s)"
            ),
        },
    )
    if picked.selection.rows:
        open_node(status["node"].iloc[picked.selection.rows[0]])


def show_gpus(span: window.TimeRange) -> None:
    chosen = dashboards.METRICS[metric]
    matrix = dashboards.gpu_matrix(source.current(), metric, span.start, span.end)
    st.subheader(f"{chosen.title} per GPU, mean over the range")
    if matrix.empty:
        st.info(f"no {metric} samples in {span.label}")
        return
    title = f"{chosen.title} ({chosen.unit})"
    st.altair_chart(
        plots.heatmap(matrix, x="node", y="gpu", value="mean", title=title, tooltip=list(matrix.columns)),
        width="stretch",
    )


def show_ports(span: window.TimeRange) -> None:
    ports = dashboards.port_matrix(source.current(), span.start, span.end)
    st.subheader("RoCE ports")
    if ports.empty:
        st.info(f"no RoCE port samples in {span.label}")
        return
    st.altair_chart(
        plots.heatmap(
            ports,
            x="node",
            y="port",
            value=measure,
            title=PORT_MEASURES[measure],
            tooltip=list(ports.columns),
        ),
        width="stretch",
    )
    troubled = ports[(ports["state"] != "active") | (ports["flaps"] > 0)]
    st.caption(f"{len(troubled)} of {len(ports)} ports not active or flapping in the range")
    st.dataframe(troubled, hide_index=True, key="fleet.ports")


def show_counts(span: window.TimeRange) -> None:
    counts = dashboards.anomaly_counts(source.current(), span.start, span.end)
    st.subheader("Anomalies by kind")
    if counts.empty:
        st.info(f"no anomalies in {span.label}")
        return
    st.altair_chart(plots.counts_by_kind(counts), width="stretch")


def show_topology(span: window.TimeRange) -> None:
    """Leaf x its nodes as one heat map, and the parents with a shared fault or anomalous children."""
    st.subheader("Topology")
    fleet = topology.fleet_topology(source.current(), span.end)
    if fleet.empty:
        st.info(topology.HOW_TO_ADD)
        return
    parents = fleet.parents
    faulted = parents[parents["shared_fault"] != ""]
    troubled = parents[(parents["shared_fault"] != "") | (parents["anomalous"] > 0)]
    st.caption(
        f"{len(fleet.nodes)} nodes under {(parents['layer'] == 'leaf').sum()} leaves as of the range's end;"
        f" {len(faulted)} parents with a shared fault, {len(troubled)} with anomalous nodes or a fault"
    )
    st.altair_chart(plots.topology_map(fleet.nodes), width="stretch")
    st.dataframe(
        troubled,
        hide_index=True,
        key="fleet.parents",
        column_config={
            "nodes": st.column_config.NumberColumn("nodes below"),
            "anomalous": st.column_config.NumberColumn("with open anomalies"),
            "shared_fault": st.column_config.TextColumn("open shared fault"),
        },
    )


@st.fragment(run_every=REFRESH_S[refresh])
def overview() -> None:
    span = window.current()
    st.caption(f"{span.label}; statuses as of its end")
    with source.reported("reading the fleet"):
        status = dashboards.fleet_status(source.current(), span.end)
        if status.empty:
            st.info(f"no node was scraped in the day before {window.shown(span.end)} UTC")
            return
        show_status(status)
        drill = st.columns([3, 1])
        node = drill[0].selectbox("Drill down to a node", status["node"], key="fleet.drill")
        if drill[1].button("Open node page", key="fleet.open"):
            open_node(node)
        left, right = st.columns(2)
        with left:
            show_gpus(span)
        with right:
            show_counts(span)
        show_ports(span)
        show_topology(span)


overview()

"""Per-node anomalies a shared fault explains, as the Anomalies and Node pages state them."""

from __future__ import annotations

import pandas as pd
import streamlit as st

COLUMNS = {
    "explained_by_parent": st.column_config.TextColumn(
        "explained by", help="the shared fault (layer and parent) that explains this anomaly"
    ),
    "explained_by": st.column_config.TextColumn("shared fault id"),
}


def show_explained(anomalies: pd.DataFrame) -> None:
    """One line per anomaly (dashboards.anomalies) a shared fault explains, "link_flap mlx5_0:1 on
    vela-001: explained by the shared fault of leaf leaf-00"; nothing when none is."""
    explained = anomalies[anomalies["explained_by_parent"] != ""]
    if explained.empty:
        return
    lines = [
        f"- {row.kind} {row.component} on **{row.node}**: explained by the shared fault of "
        f"**{row.explained_by_parent}**"
        for row in explained.itertuples()
    ]
    st.markdown(
        f"**Explained by shared faults**: {len(explained)} of {len(anomalies)} anomalies (a fault above"
        " the node: check the parent, not the node)\n\n" + "\n".join(lines)
    )

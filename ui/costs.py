"""What the stragglers among a page's anomalies cost their jobs, as the Node and Anomalies pages show it:
the settings of the job_slowdown and lost_gpu_hours columns (dashboards.with_straggler_cost), and one line
per straggler whose evidence states its cost, since a table's cells are not text a reader can search; and
the evidence column those tables show beside them."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
import streamlit as st

from analytics.evidence import as_dict
from analytics.reports.straggler import StragglerCost, cost_text, gpu_hours
from ui import window


def cost_columns() -> dict[str, Any]:
    """Column settings: the job slowdown as a percentage, the GPU-hours lost with two decimals; an
    anomaly whose evidence does not say shows an empty cell."""
    return {
        "job_slowdown": st.column_config.NumberColumn(
            "job slowdown", format="percent", help="how much shorter the job's steps would be without it"
        ),
        "lost_gpu_hours": st.column_config.NumberColumn(
            "GPU-hours lost", format="%.2f", help="GPU-hours of the whole job lost to the node so far"
        ),
    }


def with_evidence_text(anomalies: pd.DataFrame) -> pd.DataFrame:
    """`anomalies` (dashboards.anomalies) with their evidence as the JSON text st's JsonColumn shows: its
    fields (analytics.evidence.as_dict), or for a row the store holds unreadable, the error saying why."""
    return anomalies.assign(evidence=[json.dumps(as_dict(evidence)) for evidence in anomalies["evidence"]])


def show_costs(anomalies: pd.DataFrame) -> None:
    """One line per anomaly whose cost is known, "vela-012 slows job run-42 by 31% (2.4 GPU-hours lost
    so far), from ... UTC", and their total; nothing when none states its cost."""
    costed = anomalies[anomalies["job_slowdown"].notna() & anomalies["lost_gpu_hours"].notna()]
    if costed.empty:
        return
    lines = [
        f"- **{row.node}** {cost_text(StragglerCost(row.job_slowdown, row.lost_gpu_hours), row.job)}, "
        f"from {row.start.strftime(window.SHOWN)} UTC"
        for row in costed.itertuples()
    ]
    total = gpu_hours(float(costed["lost_gpu_hours"].sum()))
    st.markdown(f"**What the stragglers cost**: {total} GPU-hours lost in all\n\n" + "\n".join(lines))

"""Postmortem: a node's or a job's incident in the chosen range (analytics.reports): its timeline of
anomalies, alerts, drain decisions, target gaps and the metric excursions that mattered, with plots and
exports to Markdown and CSV, the topology of its nodes as it was and the shared faults above them; and a
read-only SQL box with saved queries for the usual questions."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from analytics.errors import QueryError
from analytics.reports import dashboards, postmortem, sqlbox
from analytics.reports.straggler import gpu_hours
from ui import costs, lifecycle, plots, source, window

SQL_KEY, SAVED_KEY = "postmortem.sql", "postmortem.saved"
SQL_MAX_ROWS = 10_000


def pick_scope(span: window.TimeRange) -> dict[str, str] | None:
    """A node or a job of the range, as build_report's scope; None when the range has none."""
    scopes = dashboards.nodes_and_jobs(source.current(), span.start, span.end)
    kind = st.radio("Report on", ["node", "job"], horizontal=True, key="postmortem.scope")
    offered = list(scopes["node"]) if kind == "node" else lifecycle.jobs(source.current(), span, scopes)
    if not offered:
        st.info(f"no {kind} in {span.label}")
        return None
    asked = st.query_params.get(kind, "")
    chosen = st.selectbox(
        kind.capitalize(),
        offered,
        index=offered.index(asked) if asked in offered else 0,
        key=f"postmortem.{kind}",
    )
    return {kind: chosen}


def as_utc(data: pd.DataFrame, *columns: str) -> pd.DataFrame:
    return data.assign(
        **{name: pd.to_datetime(data[name].astype(float), unit="s", utc=True) for name in columns}
    )


def show_summary(report: postmortem.Report, scope: str) -> None:
    """The report's headline, as the Markdown export opens with it."""
    summary = postmortem.summarize(report)
    by_kind = summary["anomalies_by_kind"]
    headline = {
        "anomalies opened": sum(by_kind.values()),
        "alerts fired": len(summary["alerts_fired"]),
        "drain decisions": len(summary["drains"]),
        "target gaps": summary["target_gaps"],
        "metric excursions": len(report.excursions),
        "GPU-hours lost to stragglers": gpu_hours(summary["gpu_hours_lost_to_stragglers"]),
    }
    for column, (label, value) in zip(st.columns(len(headline)), headline.items(), strict=True):
        column.metric(label, value)
    st.markdown(
        f"**{scope}**, {window.TimeRange(report.start, report.end).label}  \n"
        f"anomalies by kind: {', '.join(f'{kind} {n}' for kind, n in by_kind.items()) or 'none'}  \n"
        f"nodes involved: {', '.join(summary['nodes_involved']) or 'none'}  \n"
        f"alerts fired: {', '.join(summary['alerts_fired']) or 'none'}"
    )


def show_report(report: postmortem.Report, kind: str, name: str) -> None:
    """The report on `kind` (node or job) `name`: headline, exports, timeline, excursions."""
    show_summary(report, f"{kind} {name}")
    exports = st.columns(2)
    # written when clicked: a week of a job's timeline takes a good part of the page to write out
    exports[0].download_button(
        "Download Markdown",
        lambda: postmortem.to_markdown(report),
        file_name=f"postmortem-{name}.md",
        mime="text/markdown",
    )
    exports[1].download_button(
        "Download CSV", lambda: postmortem.to_csv(report), file_name=f"postmortem-{name}.csv", mime="text/csv"
    )
    lifecycle.show_report_placements(report)
    show_timeline(report)
    show_layers(report)


def show_timeline(report: postmortem.Report) -> None:
    if not report.events:
        st.info("nothing happened to the scope in this range")
        return
    events = as_utc(pd.DataFrame(map(postmortem.as_dict, report.events)), "ts", "end")
    st.subheader("Timeline")
    st.altair_chart(plots.event_timeline(events.drop(columns=["evidence"])), width="stretch")
    st.dataframe(
        events.assign(evidence=events["evidence"].map(lambda numbers: json.dumps(numbers, default=str))),
        hide_index=True,
        column_config={
            **window.utc_columns("ts", "end"),
            **costs.cost_columns(),
            "evidence": st.column_config.JsonColumn("evidence"),
        },
        key="postmortem.events",
    )
    if report.excursions:
        st.subheader("Metric excursions that mattered")
        excursions = as_utc(pd.DataFrame(map(postmortem.as_dict, report.excursions)), "start", "end")
        st.dataframe(excursions, hide_index=True, column_config=window.utc_columns("start", "end"))


def show_layers(report: postmortem.Report) -> None:
    """The scope's nodes in the topology as it was, and the shared faults above them in the range."""
    st.subheader(f"Topology as it was at {window.shown(report.topology_at)} UTC")
    if report.topology:
        views = [{**view, "rail": ", ".join(view.get("rail", []))} for view in report.topology]
        st.dataframe(pd.DataFrame(views), hide_index=True, key="postmortem.topology")
    else:
        st.info("the store held no topology of these nodes then (docs/topology.md says how to add one)")
    if report.shared_faults:
        st.subheader("Shared faults above these nodes")
        faults = as_utc(pd.DataFrame(map(postmortem.as_dict, report.shared_faults)), "start", "end")
        faults = faults.assign(
            **{name: faults[name].map("; ".join) for name in ("anomalous_children", "explained")}
        )
        st.dataframe(
            faults, hide_index=True, column_config=window.utc_columns("start", "end"), key="postmortem.faults"
        )


def fill_saved_query() -> None:
    st.session_state[SQL_KEY] = sqlbox.SAVED_QUERIES[st.session_state[SAVED_KEY]].strip()


def sql_box(span: window.TimeRange, node: str) -> None:
    """Read-only SQL on the store, with {start}, {end} and {node} filled from the page."""
    st.subheader("SQL (read-only)")
    st.selectbox(
        "Saved queries",
        list(sqlbox.SAVED_QUERIES),
        index=None,
        key=SAVED_KEY,
        on_change=fill_saved_query,
        placeholder="the usual questions",
    )
    sql = st.text_area(
        "Query; {start:DateTime64(3)}, {end:DateTime64(3)} and {node:String} are the page's range and node",
        key=SQL_KEY,
        height=160,
    )
    if not st.button("Run", key="postmortem.run") or not sql.strip():
        return
    try:
        result = sqlbox.run_sql(
            source.current(), sql, parameters={**span.datetimes(), "node": node}, max_rows=SQL_MAX_ROWS
        )
    except QueryError as error:
        st.error(str(error))
        return
    if result.truncated:
        st.warning(
            f"the result has more than {SQL_MAX_ROWS:,} rows: showing the first {SQL_MAX_ROWS:,}; "
            "add a LIMIT or aggregate"
        )
    st.caption(f"{len(result.rows):,} rows in {result.elapsed_s:.2f} s")
    st.dataframe(
        pd.DataFrame.from_records(result.rows, columns=result.columns),
        hide_index=True,
        key="postmortem.result",
    )


st.title("Postmortem")
span = window.current()
scope: dict[str, str] | None = None
with source.reported("reading the nodes and jobs"):
    scope = pick_scope(span)
report_tab, sql_tab = st.tabs(["Report", "SQL"])
if scope is not None:
    ((kind, name),) = scope.items()
    with report_tab, source.reported(f"building the report on {kind} {name}"):
        show_report(
            postmortem.build_report(source.current(), start=span.start, end=span.end, **scope), kind, name
        )
with sql_tab, source.reported("running the query"):
    sql_box(span, (scope or {}).get("node", ""))

"""The app's charts (Altair, which Streamlit ships): times on UTC axes titled with the zone, a unit on
every quantitative axis and legend, the same colours for the same statuses and severities everywhere."""

from __future__ import annotations

import altair as alt
import pandas as pd

UTC_AXIS = alt.Axis(title="time (UTC)", labelExpr="utcFormat(datum.value, '%m-%d %H:%M')", labelAngle=0)
STATUS_COLOURS = {
    "healthy": "#4c9a2a",
    "anomalous": "#e8a317",
    "draining": "#8e6bbf",
    "drained": "#6d6d6d",
    "down": "#d62728",
}
NODE_STATE_COLOURS = {"explained": "#d62728", "anomalous": "#e8a317", "healthy": "#4c9a2a"}
SEVERITY_COLOURS = {"info": "#6baed6", "warning": "#e8a317", "critical": "#d62728"}
TILES_PER_ROW = 16
TILES_MIN_HEIGHT = 120  # pixels: room for the legend of the five statuses beside one row of tiles


def _tips(*fields: str | alt.Tooltip) -> list[alt.Tooltip]:
    """Tooltip channels, column names wrapped here: Altair wraps each name given as text through
    SchemaBase.from_dict, about 7 ms apiece, which cost the Fleet page a sixth of its time. Every
    encoding in this module is a channel object for the same reason."""
    return [alt.Tooltip(field) if isinstance(field, str) else field for field in fields]


def _time(field: str, title: str = "time (UTC)") -> alt.Tooltip:
    return alt.Tooltip(f"{field}:T", title=title, format="%Y-%m-%d %H:%M:%S", formatType="utc")


def _x_time(field: str = "ts") -> alt.X:
    return alt.X(f"{field}:T", axis=UTC_AXIS, scale=alt.Scale(type="utc"))


def _palette(colours: dict[str, str]) -> alt.Scale:
    return alt.Scale(domain=list(colours), range=list(colours.values()))


def status_tiles(status: pd.DataFrame) -> alt.Chart:
    """One tile per node, coloured by its status, TILES_PER_ROW to a row: the fleet at a glance."""
    tiles = status.assign(
        column=[i % TILES_PER_ROW for i in range(len(status))],
        row=[i // TILES_PER_ROW for i in range(len(status))],
    )
    base = alt.Chart(tiles).encode(
        x=alt.X("column:O", axis=None),
        y=alt.Y("row:O", axis=None),
        tooltip=_tips("node", "status", "job", "kinds"),
    )
    squares = base.mark_rect(cornerRadius=4).encode(
        color=alt.Color("status:N", scale=_palette(STATUS_COLOURS), title="status")
    )
    names = base.mark_text(fontSize=10, color="white").encode(text=alt.Text("node:N"))
    rows = tiles["row"].max() + 1 if len(tiles) else 1
    return (squares + names).properties(height=max(TILES_MIN_HEIGHT, 36 * rows))


def heatmap(data: pd.DataFrame, *, x: str, y: str, value: str, title: str, tooltip: list[str]) -> alt.Chart:
    """A matrix of `value` (whose legend `title` carries the unit) with `x` across and `y` down."""
    return (
        alt.Chart(data)
        .mark_rect()
        .encode(
            x=alt.X(f"{x}:N", title=x, axis=alt.Axis(labelAngle=-60)),
            y=alt.Y(f"{y}:O", title=y),
            color=alt.Color(f"{value}:Q", title=title, scale=alt.Scale(scheme="viridis")),
            tooltip=_tips(*tooltip),
        )
    )


def topology_map(nodes: pd.DataFrame) -> alt.Chart:
    """One cell per node, a row per leaf (its label marks a shared fault and counts the anomalous), coloured
    by the node's state: thousands of VMs in one chart (analytics.reports.topology.FleetTopology.nodes)."""
    rows = nodes["row"].nunique() if len(nodes) else 1
    return (
        alt.Chart(nodes)
        .mark_rect(cornerRadius=2)
        .encode(
            x=alt.X("slot:O", title="node under the leaf", axis=None),
            y=alt.Y("row:N", title="leaf", sort=None),
            color=alt.Color("state:N", scale=_palette(NODE_STATE_COLOURS), title="node"),
            tooltip=_tips(
                "node", "host", "leaf", "spine", "rack", "rail", "state", "kinds", "open_anomalies"
            ),
        )
        .properties(height=max(TILES_MIN_HEIGHT, 14 * rows))
    )


def counts_by_kind(counts: pd.DataFrame) -> alt.Chart:
    """Anomalies per kind, stacked by severity."""
    return (
        alt.Chart(counts)
        .mark_bar()
        .encode(
            x=alt.X("sum(anomalies):Q", title="anomalies (count)", axis=alt.Axis(format="d", tickMinStep=1)),
            y=alt.Y("kind:N", title="kind", sort="-x"),
            color=alt.Color("severity:N", scale=_palette(SEVERITY_COLOURS)),
            tooltip=_tips("kind", "severity", "anomalies", "nodes", "open"),
        )
    )


def periods(anomalies: pd.DataFrame, end: pd.Timestamp) -> pd.DataFrame:
    """Anomalies as shaded periods; one still open runs to `end`."""
    return anomalies.assign(until=anomalies["end"].fillna(end))


def series(data: pd.DataFrame, shaded: pd.DataFrame, *, title: str, unit: str) -> alt.LayerChart:
    """Lines per component over time, with the anomaly periods of `shaded` (start, until, kind) behind."""
    lines = (
        alt.Chart(data)
        .mark_line()
        .encode(
            x=_x_time(),
            y=alt.Y("value:Q", title=unit, axis=alt.Axis(format="~s")),
            color=alt.Color("component:N", title="component"),
            tooltip=_tips(_time("ts"), "component", alt.Tooltip("value:Q", title=unit, format=",.4~g")),
        )
    )
    shading = (
        alt.Chart(shaded)
        .mark_rect(opacity=0.18, color="#d62728")
        .encode(
            x=_x_time("start"), x2=alt.X2("until:T"), tooltip=_tips("kind:N", "component:N", "severity:N")
        )
    )
    return (shading + lines).properties(title=title, height=220)


def peer_band(band: pd.DataFrame, node: str) -> alt.LayerChart:
    """The node's value against its peers' median (dashed) and 10th-90th percentile band (shaded)."""
    signal = band["signal"].iloc[0] if len(band) else "step"
    spread = (
        alt.Chart(band)
        .mark_area(opacity=0.25, color="#7f7f7f")
        .encode(
            x=_x_time(),
            y=alt.Y("peer_low:Q", title=f"{signal} time (s)"),
            y2=alt.Y2("peer_high:Q"),
            tooltip=_tips(_time("ts"), "peer_low", "peer_high", "peers"),
        )
    )
    median = (
        alt.Chart(band)
        .mark_line(strokeDash=[4, 3], color="#4d4d4d")
        .encode(x=_x_time(), y=alt.Y("peer_median:Q"))
    )
    own = (
        alt.Chart(band)
        .mark_line(color="#d62728", point=True)
        .encode(x=_x_time(), y=alt.Y("value:Q"), tooltip=[_time("ts"), alt.Tooltip("value:Q", title=node)])
    )
    return (spread + median + own).properties(
        title=f"{node} {signal} time against its peers (median dashed, 10th-90th percentile shaded)",
        height=240,
    )


def anomaly_timeline(anomalies: pd.DataFrame, end: pd.Timestamp) -> alt.Chart:
    """Anomalies as bars from start to end (open ones to `end`), a row per node, coloured by kind."""
    shaded = periods(anomalies, end)
    rows = max(1, shaded["node"].nunique())
    return (
        alt.Chart(shaded)
        .mark_bar(height=10)
        .encode(
            x=_x_time("start"),
            x2=alt.X2("until:T"),
            y=alt.Y("node:N", title="node"),
            color=alt.Color("kind:N", title="kind"),
            tooltip=_tips(
                _time("start", "start (UTC)"),
                _time("until", "until (UTC)"),
                "node",
                "kind",
                "component",
                "severity",
                "score",
            ),
        )
        .properties(height=min(900, 24 * rows + 40))
    )


def event_timeline(events: pd.DataFrame) -> alt.Chart:
    """Postmortem events as marks on a time axis, a row per node, shaped and coloured by their source;
    those that last (anomalies, gaps, excursions) as bars to their end."""
    rows = max(1, events["node"].nunique())
    base = alt.Chart(events).encode(
        x=_x_time(),
        y=alt.Y("node:N", title="node"),
        color=alt.Color("source:N", title="source"),
        tooltip=_tips(_time("ts"), "source", "node", "what", "detail"),
    )
    lasting = (
        base.transform_filter("isValid(datum.end)").mark_bar(height=8, opacity=0.5).encode(x2=alt.X2("end:T"))
    )
    instants = base.mark_point(filled=True, size=70).encode(shape=alt.Shape("source:N", title="source"))
    return (lasting + instants).properties(height=min(900, 30 * rows + 60))

"""The queries behind the UI's pages: each one aggregates in ClickHouse SQL and returns a small DataFrame.

    status = fleet_status(store, now=time.time())           # one row per node: healthy ... down
    temps = gpu_matrix(hub_client, "DCGM_FI_DEV_GPU_TEMP", start, end)

`source` is anything with `query(sql, parameters=, max_rows=)`: a Store, or a HubClient reading through
the hub's API. Times go in as unix seconds (Float64 parameters) and come back as unix seconds, turned into
UTC timestamps here, so that both transports give the same frames (the hub's JSON has no datetime type).
A frame whose query hit the row limit says so in `frame.attrs["truncated"]`.

The metric queries read the tables behind the `metrics` views (samples, samples_1m, series), as the
detectors do: grouping samples by series id and joining each series' labels once costs a fraction of
grouping the view's rows. Ranges longer than RAW_MAX_S read the 1-minute rollup (raw samples for the
minutes not rolled up yet); over MINUTES_MAX_S, the hourly one for the whole hours of the range (see
HOURLY), when the query needs no finer buckets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analytics.evidence import stored
from analytics.reports.straggler import JOB_SLOWDOWN, LOST_GPU_HOURS, straggler_cost
from analytics.store.protocols import Reader
from analytics.store.schema import minute_rows

RAW_MAX_S = 6 * 3600.0  # longer ranges read samples_1m
MINUTES_MAX_S = 86400.0  # longer ranges read samples_1h for their whole hours
HOUR_S = 3600
MAX_POINTS = 360  # per series in a time series plot: buckets are widened to stay under this
DOWN_AFTER_S = 300.0  # a node whose last scrape failed, or with no scrape for this long, is down
KNOWN_FOR_S = 86400.0  # the fleet is every node scraped within this long
MAX_ROWS = 100_000
PORT_BUCKETS, PORT_BUCKET_S = 60, 60  # the port matrix reads counters in 60 buckets, a minute at least

# The query parameters as ClickHouse times: every query takes its times as unix seconds.
START = "toDateTime64({start:Float64}, 3, 'UTC')"
END = "toDateTime64({end:Float64}, 3, 'UTC')"
NOW = "toDateTime64({now:Float64}, 3, 'UTC')"
FIRST_HOUR = "toDateTime(ceil({start:Float64} / 3600) * 3600, 'UTC')"  # the first whole hour's start
ROLLED = "(SELECT max(hour) + 3600 FROM samples_1h)"  # the end of the hours rolled up so far
# the end of the whole hours read from samples_1h: the start of the hour of `end`, or of the first hour not
# rolled up yet, and not before FIRST_HOUR
LAST_HOUR = (
    f"greatest({FIRST_HOUR}, least(toDateTime(floor({{end:Float64}} / 3600) * 3600, 'UTC'), {ROLLED}))"
)
SEVERITY_RANK = "multiIf(severity = 'critical', 3, severity = 'warning', 2, 1)"
STATUSES = ("drained", "down", "draining", "anomalous", "healthy")  # a node shows the first that applies
PORT_STATES = {1: "down", 2: "init", 3: "armed", 4: "active", 5: "active_defer"}  # InfiniBand state ids
STATE_IDS, STATE_NAMES = list(PORT_STATES), list(PORT_STATES.values())  # as ClickHouse array literals


def _in_range(column: str) -> str:
    """`column` within [start, end)."""
    return f"{column} >= {START} AND {column} < {END}"


def _unix(column: str) -> str:
    """A DateTime64 column (Nullable allowed) as unix seconds, which every transport carries alike."""
    return f"toUnixTimestamp64Milli({column}) / 1000"


@dataclass(frozen=True)
class Metric:
    """A metric as the pages show it: a title, the unit of its axis, and whether it is a counter (shown as
    a rate per second)."""

    name: str
    title: str
    unit: str
    counter: bool = False


METRICS = {
    metric.name: metric
    for metric in (
        Metric("DCGM_FI_DEV_GPU_TEMP", "GPU temperature", "°C"),
        Metric("DCGM_FI_DEV_SM_CLOCK", "SM clock", "MHz"),
        Metric("DCGM_FI_DEV_POWER_USAGE", "Power draw", "W"),
        Metric("DCGM_FI_DEV_GPU_UTIL", "GPU utilization", "%"),
        Metric("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory copy utilization", "%"),
        Metric("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature", "°C"),
        Metric("DCGM_FI_DEV_FB_USED", "Framebuffer used", "MiB"),
        Metric("node_infiniband_port_data_received_bytes_total", "RoCE received", "bytes/s", counter=True),
        Metric("node_infiniband_port_data_transmitted_bytes_total", "RoCE sent", "bytes/s", counter=True),
        Metric("node_infiniband_np_cnp_packets_sent_total", "CNPs sent", "packets/s", counter=True),
        Metric("node_infiniband_rp_cnp_packets_handled_total", "CNPs handled", "packets/s", counter=True),
        Metric("node_infiniband_link_downed_total", "Link downs", "downs/s", counter=True),
        Metric("node_infiniband_state_id", "Port state", "state id (4 active, 1 down)"),
    )
}
GPU_METRICS = [name for name in METRICS if name.startswith("DCGM_FI_")]  # the Fleet heatmap's choices
NODE_METRICS = [  # the Node page's series
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_UTIL",
    "node_infiniband_port_data_received_bytes_total",
    "node_infiniband_port_data_transmitted_bytes_total",
    "node_infiniband_rp_cnp_packets_handled_total",
]
STATE_ID, LINK_DOWNED, RECEIVED, SENT, CNP_SENT, CNP_HANDLED = (
    "node_infiniband_state_id",
    "node_infiniband_link_downed_total",
    "node_infiniband_port_data_received_bytes_total",
    "node_infiniband_port_data_transmitted_bytes_total",
    "node_infiniband_np_cnp_packets_sent_total",
    "node_infiniband_rp_cnp_packets_handled_total",
)


@dataclass(frozen=True)
class Resolution:
    """Where a range's samples come from: raw samples, or the 1-minute rollup for long ranges. `summary`
    aggregates a series' rows into total, samples, low and high; `ends` into the value and time (unix
    seconds) of its first and last sample: earliest_value, earliest_ts, latest_value, latest_ts. The
    rollup keeps no first value: its minimum and the start of its first minute stand in, which for a
    counter that did not reset is the same value. `time` is the time column of the rows `scan` reads."""

    table: str
    time: str
    summary: str
    ends: str
    step_s: float

    def scan(self, where: str) -> str:
        """FROM the rows in [start, end) that match `where` (on metric, node or series_id)."""
        return f"FROM {self.table} WHERE {where} AND {_in_range(self.time)}"


def _minutes(where: str, since: str, until: str) -> str:
    """The 1-minute rollup's rows that match `where` with minutes in [since, until): samples_1m's up to the
    last minute rolled up, raw samples as minute rows after it (schema.minute_rows)."""
    return minute_rows("samples_1m", "samples", f"{where} AND minute >= {since} AND minute < {until}")


class Minutes(Resolution):
    """The 1-minute rollup's rows, the minutes not rolled up yet read from raw samples."""

    def scan(self, where: str) -> str:
        return f"FROM ({_minutes(where, START, END)})"


class Hourly(Resolution):
    """The 1-minute rollup's rows, the range's whole hours read from the hourly rollup instead: the same
    aggregates as the minute rows of [start, end) (the minutes before the first whole hour and from the
    last one on, or from the first hour not rolled up yet, come from the minute rows), from 60 times
    fewer rows. Buckets must be whole hours."""

    def scan(self, where: str) -> str:
        hours = "SELECT metric, node, series_id, hour AS minute, min, max, sum, count, last FROM samples_1h"
        return f"""FROM (
        {_minutes(where, START, FIRST_HOUR)}
        UNION ALL {hours} WHERE {where} AND hour >= {FIRST_HOUR} AND hour < {LAST_HOUR}
        UNION ALL {_minutes(where, LAST_HOUR, END)}
    )"""


RAW = Resolution(
    table="samples",
    time="ts",
    summary="sum(value) AS total, count() AS samples, min(value) AS low, max(value) AS high",
    ends=f"argMin(value, ts) AS earliest_value, {_unix('min(ts)')} AS earliest_ts,"
    f" argMax(value, ts) AS latest_value, {_unix('max(ts)')} AS latest_ts",
    step_s=10.0,
)
ROLLUP = Minutes(
    table="samples_1m",
    time="minute",
    summary="sum(sum) AS total, sum(count) AS samples, min(min) AS low, max(max) AS high",
    ends="min(min) AS earliest_value, toFloat64(toUnixTimestamp(min(minute))) AS earliest_ts,"
    f" argMax(last.2, last.1) AS latest_value, {_unix('max(last.1)')} AS latest_ts",
    step_s=60.0,
)
HOURLY = Hourly("samples_1h", "minute", ROLLUP.summary, ROLLUP.ends, float(HOUR_S))


def resolution(start: float, end: float, bucket_s: float = HOUR_S) -> Resolution:
    """Raw samples for ranges up to RAW_MAX_S, the hourly rollup beyond MINUTES_MAX_S when buckets of
    `bucket_s` seconds (a whole range: any) are whole hours, the 1-minute rollup otherwise."""
    if end - start <= RAW_MAX_S:
        return RAW
    return HOURLY if end - start > MINUTES_MAX_S and bucket_s % HOUR_S == 0 else ROLLUP


def bucket_seconds(start: float, end: float, buckets: int = MAX_POINTS) -> int:
    """The bucket for [start, end) in at most `buckets` buckets: a multiple of the raw or minute step."""
    step = (RAW if end - start <= RAW_MAX_S else ROLLUP).step_s
    return int(step * max(1, math.ceil((end - start) / buckets / step)))


def frame(
    source: Reader,
    sql: str,
    parameters: Mapping[str, Any],
    *,
    times: Sequence[str] = (),
    max_rows: int = MAX_ROWS,
) -> pd.DataFrame:
    """The result of `sql` as a DataFrame, its `times` columns (unix seconds, NULL allowed) as UTC
    timestamps; attrs["truncated"] when the row limit cut it."""
    result = source.query(sql, parameters=dict(parameters), max_rows=max_rows)
    data = pd.DataFrame.from_records(result.rows, columns=result.columns)
    for column in times:
        data[column] = pd.to_datetime(data[column].astype(float), unit="s", utc=True)
    data.attrs["truncated"] = result.truncated
    return data


def _window(start: float, end: float, **more: Any) -> dict[str, Any]:
    return {"start": float(start), "end": float(end), **more}


def _series(where: str = "") -> str:
    """The metric, node and labels of the series of the metrics in {metrics:Array(String)} (and `where`),
    to join once to what was aggregated per series id: grouping by the id alone is the cheapest."""
    return f"""
    SELECT series_id, CAST(metric, 'String') AS metric, CAST(node, 'String') AS node,
        CAST(labels, 'Map(String, String)') AS labels
    FROM series WHERE metric IN {{metrics:Array(String)}}{where}"""


def _buckets(chosen: Resolution, stats: str, where: str = "") -> str:
    """One row per series of the metrics in {metrics:Array(String)} (and `where`) and bucket of
    {bucket_s:UInt32} seconds in [start, end): the series' `stats` in the bucket (its `ends` at least),
    and how its last value moved since the bucket before (`step`; in the first bucket, since its first
    sample) in how many `seconds`."""
    return f"""
    SELECT *, latest_value - lagInFrame(latest_value, 1, earliest_value) OVER w AS step,
        latest_ts - lagInFrame(latest_ts, 1, earliest_ts) OVER w AS seconds
    FROM (
        SELECT series_id, toStartOfInterval({chosen.time}, INTERVAL {{bucket_s:UInt32}} SECOND) AS bucket,
            {stats}
        {chosen.scan(f"metric IN {{metrics:Array(String)}}{where}")}
        GROUP BY series_id, bucket
    )
    WINDOW w AS (PARTITION BY series_id ORDER BY bucket ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)"""


# -- drains ----------------------------------------------------------------------------------------------

DRAIN_QUEUE_SQL = f"""
SELECT node, state, {_unix("since")} AS since, decision_id, job, reason, mode, request
FROM (
    SELECT CAST(node, 'String') AS node, 'drained' AS state, max(ts) AS since,
        argMax(decision_id, ts) AS decision_id, argMax(job, ts) AS job, argMax(reason, ts) AS reason,
        CAST(argMax(mode, ts), 'String') AS mode
    FROM actions
    WHERE (action IN ('drain', 'undrain', 'return') AND outcome IN ('done', 'dry-run')
        OR action = 'return' AND outcome = 'refused') AND ts <= {NOW}  -- return: alerts.lifecycle
    GROUP BY node
    HAVING argMax(action, ts) = 'drain'
    UNION ALL
    SELECT CAST(node, 'String'), 'draining', ts, decision_id, job, reason, CAST(mode, 'String')
    FROM actions
    WHERE action = 'drain' AND outcome = 'pending' AND ts <= {NOW}
        AND decision_id NOT IN (
            SELECT decision_id FROM actions
            WHERE action IN ('approve', 'deny') AND outcome IN ('approved', 'denied') AND ts <= {NOW}
        )
) AS queue
LEFT JOIN (
    SELECT decision_id, concat(argMax(CAST(action, 'String'), ts), ' ', argMax(reason, ts)) AS request
    FROM actions
    WHERE outcome = 'requested' AND decision_id != '' AND ts <= {NOW}
    GROUP BY decision_id
) AS requests USING decision_id
ORDER BY state, since
"""


def drain_queue(source: Reader, now: float) -> pd.DataFrame:
    """Nodes drained as of `now` (the last drain done or dry-run, not undrained) and drains waiting for
    approval (pending, neither approved nor denied yet), with the latest request people made about each
    ("approve requested by alice"): the controller's audit read as `fleetlens drain list` reads it."""
    return frame(source, DRAIN_QUEUE_SQL, {"now": float(now)}, times=["since"])


# -- fleet -----------------------------------------------------------------------------------------------

RECENT = "toDateTime64({now:Float64} - {recent_s:Float64}, 3, 'UTC')"
KNOWN = "toDateTime64({now:Float64} - {known_s:Float64}, 3, 'UTC')"
FLEET_STATUS_SQL = f"""
SELECT scraped.node AS node,
    multiIf(
        drains.drained, 'drained',
        scraped.last_up = 0 OR scraped.last_ts < {RECENT}, 'down',
        drains.draining, 'draining',
        open.anomalies > 0, 'anomalous',
        'healthy'
    ) AS status,
    jobs.job AS job, open.anomalies AS open_anomalies, open.kinds AS kinds,
    transform(open.worst, [1, 2, 3], ['info', 'warning', 'critical'], '') AS worst_severity,
    scraped.failed AS failed_scrapes, {_unix("scraped.last_ts")} AS last_scrape, drains.mode AS drain_mode
FROM (
    SELECT CAST(node, 'String') AS node, max(ts) AS last_ts, argMax(up, ts) AS last_up,
        countIf(up = 0 AND ts >= {RECENT}) AS failed
    FROM targets
    WHERE ts >= {KNOWN} AND ts <= {NOW}
    GROUP BY node
) AS scraped
LEFT JOIN (
    SELECT CAST(node, 'String') AS node, count() AS anomalies,
        arrayStringConcat(arraySort(groupUniqArray(CAST(kind, 'String'))), ', ') AS kinds,
        max({SEVERITY_RANK}) AS worst
    FROM anomalies FINAL
    WHERE start <= {NOW} AND (end IS NULL OR end > {NOW})
    GROUP BY node
) AS open ON open.node = scraped.node
LEFT JOIN (
    SELECT node, max(state = 'drained') AS drained, max(state = 'draining') AS draining,
        anyIf(mode, state = 'drained') AS mode
    FROM ({DRAIN_QUEUE_SQL})
    GROUP BY node
) AS drains ON drains.node = scraped.node
LEFT JOIN (
    SELECT CAST(node, 'String') AS node, CAST(argMax(job, ts), 'String') AS job
    FROM steps
    WHERE ts >= {KNOWN} AND ts <= {NOW}
    GROUP BY node
) AS jobs ON jobs.node = scraped.node
ORDER BY node
"""


def fleet_status(
    source: Reader, now: float, *, recent_s: float = DOWN_AFTER_S, known_s: float = KNOWN_FOR_S
) -> pd.DataFrame:
    """One row per node scraped in the `known_s` before `now`, with its status as of `now`, the first of
    STATUSES that applies: drained (the audit's last drain of it stands), down (its last scrape failed, or
    none came for `recent_s`), draining (a drain waits for approval), anomalous (an anomaly is open),
    healthy. Also its job, its open anomalies with their kinds and worst severity, its failed scrapes in
    the last `recent_s`, its last scrape and the mode of its drain (a dry-run drain only recorded it)."""
    parameters = {"now": float(now), "recent_s": float(recent_s), "known_s": float(known_s)}
    return frame(source, FLEET_STATUS_SQL, parameters, times=["last_scrape"])


def _gpu_matrix_sql(chosen: Resolution) -> str:
    return f"""
SELECT known.node AS node, toUInt32OrZero(known.labels['gpu']) AS gpu, sum(total) / sum(samples) AS mean,
    min(low) AS min, max(high) AS max, argMax(latest_value, latest_ts) AS last
FROM (
    SELECT series_id, {chosen.summary}, {chosen.ends}
    {chosen.scan("metric IN {metrics:Array(String)}")}
    GROUP BY series_id
) AS per_series
ANY LEFT JOIN ({_series()}) AS known USING series_id
GROUP BY node, gpu
ORDER BY node, gpu
"""


def gpu_matrix(source: Reader, metric: str, start: float, end: float) -> pd.DataFrame:
    """Node x GPU of one DCGM metric over [start, end): mean, min, max and last value of each GPU."""
    sql = _gpu_matrix_sql(resolution(start, end))
    return frame(source, sql, _window(start, end, metrics=[metric]))


PORT_METRICS = [STATE_ID, LINK_DOWNED, RECEIVED, SENT, CNP_SENT, CNP_HANDLED]


def _port_matrix_sql(chosen: Resolution) -> str:
    return f"""
SELECT known.node AS node, concat(known.labels['device'], ':', known.labels['port']) AS port,
    transform(toInt64(anyIf(last_value, known.metric = '{STATE_ID}')), {STATE_IDS}, {STATE_NAMES}, 'unknown')
        AS state,
    toUInt64(sumIf(increase, known.metric = '{LINK_DOWNED}')) AS flaps,
    sumIf(rate, known.metric = '{RECEIVED}') AS rx_bytes_per_s,
    sumIf(rate, known.metric = '{SENT}') AS tx_bytes_per_s,
    sumIf(rate, known.metric = '{CNP_SENT}') AS cnp_sent_per_s,
    sumIf(rate, known.metric = '{CNP_HANDLED}') AS cnp_handled_per_s
FROM (
    SELECT series_id, sum(if(step >= 0, step, latest_value)) AS increase,
        argMax(latest_value, bucket) AS last_value, max(latest_ts) - min(earliest_ts) AS span_s,
        if(span_s > 0, increase / span_s, 0) AS rate
    FROM ({_buckets(chosen, chosen.ends)})
    GROUP BY series_id
) AS per_series
ANY LEFT JOIN ({_series()}) AS known USING series_id
GROUP BY node, port
ORDER BY node, port
"""


def port_matrix(source: Reader, start: float, end: float) -> pd.DataFrame:
    """Node x RoCE port over [start, end): its state at the end, flaps (the increase of link_downed),
    receive and transmit bytes/s, CNPs sent and handled per second. Counters are read at the end of each
    of PORT_BUCKETS buckets (a minute at least, whole hours past MINUTES_MAX_S): a value below the one
    before is a reset (the exporter or the driver restarted) and counts from zero, as Prometheus's
    increase() does."""
    bucket_s = max(PORT_BUCKET_S, bucket_seconds(start, end, PORT_BUCKETS))
    if end - start > MINUTES_MAX_S:  # whole hours, for the hourly rollup
        bucket_s = HOUR_S * math.ceil(bucket_s / HOUR_S)
    parameters = _window(start, end, metrics=PORT_METRICS, bucket_s=bucket_s)
    return frame(source, _port_matrix_sql(resolution(start, end, bucket_s)), parameters)


# -- anomalies, alerts, actions --------------------------------------------------------------------------

OVERLAPS = f"start < {END} AND (end IS NULL OR end >= {START})"

ANOMALY_COUNTS_SQL = f"""
SELECT CAST(kind, 'String') AS kind, CAST(severity, 'String') AS severity, count() AS anomalies,
    uniqExact(node) AS nodes, countIf(end IS NULL) AS open
FROM anomalies FINAL
WHERE {OVERLAPS}
GROUP BY kind, severity
ORDER BY kind, {SEVERITY_RANK} DESC
"""


def anomaly_counts(source: Reader, start: float, end: float) -> pd.DataFrame:
    """Anomalies that overlap [start, end), counted by kind and severity, with the nodes they touch and
    how many are still open."""
    return frame(source, ANOMALY_COUNTS_SQL, _window(start, end))


def _any_of(column: str, parameter: str) -> str:
    """`column` is in the Array(String) parameter, or that parameter is empty (no filter)."""
    return f"(empty({{{parameter}:Array(String)}}) OR {column} IN {{{parameter}:Array(String)}})"


# explained_by_parent: the layer and parent of the shared fault its explained_by names ("leaf leaf-07")
ANOMALIES_SQL = f"""
SELECT id, {_unix("start")} AS start, {_unix("end")} AS end, CAST(kind, 'String') AS kind,
    CAST(node, 'String') AS node, component, job, CAST(severity, 'String') AS severity, score, evidence,
    CAST(detector, 'String') AS detector, explained_by,
    if(ifNull(faults.parent, '') = '', '', concat(faults.layer, ' ', faults.parent)) AS explained_by_parent
FROM (
    SELECT * FROM anomalies FINAL
    WHERE {OVERLAPS} AND {_any_of("kind", "kinds")} AND {_any_of("severity", "severities")}
        AND {_any_of("node", "nodes")} AND {_any_of("job", "jobs")}
) AS found
LEFT JOIN (
    SELECT id AS fault_id, component AS layer, CAST(node, 'String') AS parent
    FROM anomalies FINAL WHERE kind = 'shared_fault' AND start < {END}
) AS faults ON faults.fault_id = found.explained_by
ORDER BY start DESC, node, kind, component
LIMIT {{limit:UInt32}}
"""


def anomalies(
    source: Reader,
    start: float,
    end: float,
    *,
    kinds: Sequence[str] = (),
    severities: Sequence[str] = (),
    nodes: Sequence[str] = (),
    jobs: Sequence[str] = (),
    limit: int = 5000,
) -> pd.DataFrame:
    """Anomalies that overlap [start, end), newest first, each with its evidence (analytics.evidence's
    object, read from the stored text here; Unreadable where it cannot be read), the shared fault that
    explains it (explained_by, its id, and explained_by_parent, "leaf leaf-07"; "" for none) and, before
    its evidence, what a straggler costs its job (`with_straggler_cost`); an empty filter lets everything
    through. `end` is NaT while an anomaly lasts."""
    parameters = _window(
        start, end, kinds=list(kinds), severities=list(severities), nodes=list(nodes), jobs=list(jobs)
    )
    found = frame(source, ANOMALIES_SQL, {**parameters, "limit": limit}, times=["start", "end"])
    typed = [stored(kind, text) for kind, text in zip(found["kind"], found["evidence"], strict=True)]
    found["evidence"] = pd.Series(typed, index=found.index, dtype=object)
    return with_straggler_cost(found)


def with_straggler_cost(anomalies: pd.DataFrame) -> pd.DataFrame:
    """`anomalies` with job_slowdown (a fraction: 0.31 = the job's steps 31% shorter without the node)
    and lost_gpu_hours (so far) before their evidence column, read from it by analytics.reports.straggler:
    NaN where the evidence does not say (other kinds, older slow_node anomalies). Read here rather
    than with ClickHouse's JSON functions so that every reader applies the same rules to the figures."""
    costs = [straggler_cost(evidence) for evidence in anomalies["evidence"]]
    figures = {
        JOB_SLOWDOWN: [cost.job_slowdown for cost in costs],
        LOST_GPU_HOURS: [cost.lost_gpu_hours for cost in costs],
    }
    costed = anomalies.copy()
    at = costed.columns.get_loc("evidence")
    for offset, (name, values) in enumerate(figures.items()):
        costed.insert(at + offset, name, pd.Series(values, index=costed.index, dtype=float))
    return costed


ALERTS_SQL = f"""
SELECT fingerprint, argMax(alertname, ts) AS alertname, argMax(state, ts) AS state,
    argMax(labels['node'], ts) AS node, argMax(labels['kind'], ts) AS kind,
    argMax(labels['severity'], ts) AS severity, argMax(labels['component'], ts) AS component,
    argMax(annotations['summary'], ts) AS summary, {_unix("argMax(starts_at, ts)")} AS starts_at,
    {_unix("argMax(ends_at, ts)")} AS ends_at, {_unix("max(ts)")} AS changed_at
FROM alerts
WHERE ts <= {END}
GROUP BY fingerprint
HAVING (state != 'resolved' OR max(ts) >= {START}) AND {_any_of("node", "nodes")}
ORDER BY changed_at DESC
"""


def alerts(source: Reader, start: float, end: float, *, nodes: Sequence[str] = ()) -> pd.DataFrame:
    """Each alert's state as of `end`, for the alerts pending or firing at some time in [start, end):
    its labels (node, kind, severity, component), summary, and start and end."""
    parameters = _window(start, end, nodes=list(nodes))
    return frame(source, ALERTS_SQL, parameters, times=["starts_at", "ends_at", "changed_at"])


ACTIONS_SQL = f"""
SELECT {_unix("ts")} AS ts, CAST(action, 'String') AS action, CAST(node, 'String') AS node, job,
    CAST(outcome, 'String') AS outcome, CAST(mode, 'String') AS mode, decision_id, reason
FROM (SELECT * FROM actions WHERE {_in_range("ts")} AND {_any_of("node", "nodes")})
ORDER BY ts DESC, action
"""


def actions(source: Reader, start: float, end: float, *, nodes: Sequence[str] = ()) -> pd.DataFrame:
    """The drain controller's audit in [start, end), newest first: decisions, refusals and requests."""
    return frame(source, ACTIONS_SQL, _window(start, end, nodes=list(nodes)), times=["ts"])


# -- one node --------------------------------------------------------------------------------------------


def _node_series_sql(chosen: Resolution) -> str:
    return f"""
SELECT ts, known.metric AS metric,
    if(has(known.labels, 'gpu'), concat('gpu:', known.labels['gpu']),
        concat(known.labels['device'], ':', known.labels['port'])) AS component,
    if(metric IN {{counters:Array(String)}}, rate, mean) AS value
FROM (
    SELECT series_id, toUnixTimestamp(bucket) AS ts, total / samples AS mean,
        if(seconds > 0 AND step >= 0, step / seconds, NULL) AS rate
    FROM ({_buckets(chosen, f"{chosen.summary}, {chosen.ends}", " AND node = {node:String}")})
) AS bucketed
ANY LEFT JOIN ({_series(" AND node = {node:String}")}) AS known USING series_id
WHERE value IS NOT NULL
ORDER BY metric, component, ts
"""


def node_series(
    source: Reader, node: str, start: float, end: float, metrics: Sequence[str] = NODE_METRICS
) -> pd.DataFrame:
    """Time series of one node's GPUs and RoCE ports over [start, end) (`metrics`, names of METRICS), one
    row per metric, component ("gpu:3", "mlx5_1:1") and bucket: the mean of a gauge, the per-second rate
    of a counter (none across a reset). Buckets keep each series under MAX_POINTS points."""
    parameters = _window(
        start,
        end,
        node=node,
        metrics=list(metrics),
        counters=[name for name in metrics if METRICS[name].counter],
        bucket_s=bucket_seconds(start, end),
    )
    chosen = resolution(start, end, parameters["bucket_s"])
    return frame(source, _node_series_sql(chosen), parameters, times=["ts"])


PEER_BAND_SQL = f"""
SELECT toUnixTimestamp(bucket) AS ts, job, stage, signal, anyIf(seconds, node = {{node:String}}) AS value,
    quantileExactInclusiveIf(0.5)(seconds, node != {{node:String}}) AS peer_median,
    quantileExactInclusiveIf(0.1)(seconds, node != {{node:String}}) AS peer_low,
    quantileExactInclusiveIf(0.9)(seconds, node != {{node:String}}) AS peer_high,
    countIf(node != {{node:String}}) AS peers
FROM (
    SELECT CAST(job, 'String') AS job, ifNull(pp_stage, 0) AS stage, CAST(node, 'String') AS node,
        toStartOfInterval(ts, INTERVAL {{bucket_s:UInt32}} SECOND) AS bucket,
        if(count(compute_s) > 0, 'compute', 'step') AS signal,
        if(count(compute_s) > 0, quantileExact(0.5)(assumeNotNull(compute_s)),
            quantileExact(0.5)(duration_s)) AS seconds
    FROM steps
    WHERE {_in_range("ts")} AND (job, ifNull(pp_stage, 0)) IN (
        SELECT job, ifNull(pp_stage, 0) FROM steps WHERE node = {{node:String}} AND {_in_range("ts")}
    )
    GROUP BY job, stage, node, bucket
)
GROUP BY job, stage, signal, bucket
HAVING countIf(node = {{node:String}}) > 0
ORDER BY job, stage, ts
"""


def peer_band(source: Reader, node: str, start: float, end: float) -> pd.DataFrame:
    """The node's median compute time per bucket (its step time when its job reports no phases: `signal`
    says which), in seconds, next to the median and the 10th-90th percentile band of its peers: the other
    nodes of the same job and pipeline stage, the only fair comparison (a slower stage or a job-wide
    stall moves them all)."""
    parameters = _window(start, end, node=node, bucket_s=bucket_seconds(start, end))
    return frame(source, PEER_BAND_SQL, parameters, times=["ts"])


# Grouped by node alone: by node and job, ClickHouse's grouping on two LowCardinality keys took four times
# as long over a week of a 64-node job's steps (bench/ui.py).
SCOPES_SQL = f"""
SELECT node, arraySort(arrayFilter(job -> job != '', groupUniqArrayArray(jobs))) AS jobs
FROM (
    SELECT CAST(node, 'String') AS node, [] :: Array(String) AS jobs
    FROM targets WHERE {_in_range("ts")} GROUP BY targets.node
    UNION ALL
    SELECT CAST(node, 'String'), groupUniqArray(CAST(job, 'String'))
    FROM steps WHERE {_in_range("ts")} GROUP BY steps.node
)
GROUP BY node
ORDER BY node
"""


def nodes_and_jobs(source: Reader, start: float, end: float) -> pd.DataFrame:
    """Every node scraped or stepping in [start, end), with the jobs it ran: what the pickers offer."""
    return frame(source, SCOPES_SQL, _window(start, end))

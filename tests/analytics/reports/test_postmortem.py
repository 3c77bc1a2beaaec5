"""Postmortem reports on a real store: a GPU throttled on a simulated fleet (the real collectors), found by
the real detector, alerted, drained and followed by a scrape gap; and the SQL box's refusals."""

from __future__ import annotations

import csv
import io
import json
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors.base import Window
from analytics.errors import PostmortemError, QueryError
from analytics.evidence import as_dict
from analytics.evidence import to_json as stored_text
from analytics.reports.postmortem import build_report, to_csv, to_json, to_markdown
from analytics.reports.sqlbox import SAVED_QUERIES, run_sql
from analytics.store import Store
from analytics.store.records import Anomaly, ScrapeBatch, TargetStatus
from collectors.steprecord import StepRecord
from tests.support.evidence import example
from tests.support.incident import NODE, THROTTLED_GPU, Incident, seed_incident

RX_BYTES = "node_infiniband_port_data_received_bytes_total"
T0 = time.time() // 3600 * 3600 - 6 * 3600  # recent enough that no TTL drops the rows


@pytest.fixture
def incident(store: Store, tmp_path: Path) -> Incident:
    return seed_incident(store, tmp_path)


def node_report(store: Store, incident: Incident):
    return build_report(store, node=NODE, start=incident.start, end=incident.end)


def test_a_node_report_tells_the_anomaly_alert_drain_and_gap_in_time_order(store: Store, incident: Incident):
    report = node_report(store, incident)

    story = [(event.source, event.what) for event in report.events if event.source != "excursion"]
    assert story == [
        ("anomaly", "gpu_throttle gpu:1 opened"),
        ("alert", "FleetlensGpuThrottle pending"),
        ("alert", "FleetlensGpuThrottle firing"),
        ("action", f"drain {NODE}: pending"),
        ("anomaly", "gpu_throttle gpu:1 closed"),
        ("alert", "FleetlensGpuThrottle resolved"),
        ("target", f"{NODE}:9400 unreachable"),
    ]
    times = [event.ts for event in report.events]
    assert times == sorted(times)
    opened = report.events[[event.what for event in report.events].index("gpu_throttle gpu:1 opened")]
    assert (opened.ts, opened.end) == (incident.anomaly.start, incident.anomaly.end)
    assert opened.evidence == as_dict(incident.anomaly.evidence)
    assert opened.evidence["sm_clock_mhz"] < 0.75 * opened.evidence["peers_sm_clock_mhz"]
    assert "hw_thermal_slowdown" in opened.evidence["reasons"]
    assert f"sm_clock_mhz={opened.evidence['sm_clock_mhz']:,.0f}" in opened.detail
    [gap] = report.gaps
    assert (gap.ts, gap.end, gap.evidence["failed_scrapes"]) == (*incident.gap, 3)
    assert {event.node for event in report.events} == {NODE}


def test_a_job_report_covers_the_nodes_that_ran_it_and_no_other(store: Store, incident: Incident):
    job_a = build_report(store, job="job-a", start=incident.start, end=incident.end)
    job_b = build_report(store, job="job-b", start=incident.start, end=incident.end)

    assert job_a.nodes == ("vela-001", NODE) and job_b.nodes == ("vela-003",)
    assert [event.what for event in job_a.events if event.source == "anomaly"] == [
        "gpu_throttle gpu:1 opened",
        "gpu_throttle gpu:1 closed",
    ]
    assert [gap.node for gap in job_a.gaps] == [NODE] and [gap.node for gap in job_b.gaps] == ["vela-003"]
    assert {event.node for event in job_b.events} == {"vela-003"}


def test_excursions_show_the_throttled_gpus_clock_drop_and_heat_against_their_baseline(
    store: Store, incident: Incident
):
    report = node_report(store, incident)

    series = {(x.metric, x.labels): x for x in report.excursions}
    assert set(series) == {("DCGM_FI_DEV_SM_CLOCK", 'gpu="1"'), ("DCGM_FI_DEV_GPU_TEMP", 'gpu="1"')}
    clock = series["DCGM_FI_DEV_SM_CLOCK", 'gpu="1"']
    before, during = gpu_values(store, "DCGM_FI_DEV_SM_CLOCK", incident)
    assert clock.baseline == pytest.approx(sorted(before)[len(before) // 2], rel=0.01)
    assert clock.peak == min(during) and clock.peak <= 0.75 * clock.baseline
    assert (clock.start, clock.end, clock.unit) == (incident.anomaly.start, incident.anomaly.end, "MHz")
    heat = series["DCGM_FI_DEV_GPU_TEMP", 'gpu="1"']
    assert heat.peak >= 90 > heat.baseline + 20 and heat.unit == "°C"
    changes = [abs(x.peak - x.baseline) / x.baseline for x in report.excursions]
    assert changes == sorted(changes, reverse=True)
    excursion_events = [event for event in report.events if event.source == "excursion"]
    assert {event.what for event in excursion_events} >= {'DCGM_FI_DEV_SM_CLOCK{gpu="1"} fell to 1,386 MHz'}


def gpu_values(store: Store, metric: str, incident: Incident) -> tuple[list[float], list[float]]:
    """The throttled GPU's values of `metric` before the fault, and while it lasted."""
    result = store.query(
        "SELECT toUnixTimestamp64Milli(ts) / 1000, value FROM metrics WHERE metric = {metric:String}"
        " AND node = {node:String} AND labels['gpu'] = {gpu:String}",
        parameters={"metric": metric, "node": NODE, "gpu": str(THROTTLED_GPU)},
    )
    first, last = incident.throttled
    before = [value for ts, value in result.rows if ts < first]
    during = [value for ts, value in result.rows if first <= ts <= last]
    return before, during


def test_markdown_json_and_csv_carry_the_same_timeline(store: Store, incident: Incident):
    report = node_report(store, incident)
    markdown = to_markdown(report)
    document = json.loads(json.dumps(to_json(report)))
    rows = list(csv.DictReader(io.StringIO(to_csv(report))))

    title = markdown.splitlines()[0]
    assert title == f"# Postmortem: node {NODE}"
    assert f"From {utc(incident.start)} to {utc(incident.end)}; every time below is UTC." in markdown
    timeline = markdown.split("## Timeline")[1].split("##")[0].strip().splitlines()[2:]
    cells = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in timeline]
    assert [(cell[0], cell[2], cell[4]) for cell in cells] == [
        (utc(event.ts), event.source, event.what) for event in report.events
    ]
    assert [(e["source"], e["what"]) for e in document["events"]] == [(r["source"], r["what"]) for r in rows]
    assert [(e["source"], e["what"]) for e in document["events"]] == [
        (e.source, e.what) for e in report.events
    ]
    assert [json.loads(row["evidence"]) for row in rows] == [e["evidence"] for e in document["events"]]
    assert document["summary"]["anomalies_by_kind"] == {"gpu_throttle": 1}
    assert document["summary"]["drains"][0]["outcome"] == "pending"
    assert "- Drains: vela-002 pending (approve)" in markdown
    assert (document["summary"]["stragglers"], document["summary"]["gpu_hours_lost_to_stragglers"]) == ([], 0)
    assert "- GPU-hours lost to stragglers: none" in markdown
    assert {(row["job_slowdown"], row["lost_gpu_hours"]) for row in rows} == {("", "")}


def straggler(key: str, node: str, start: float, end: float | None, evidence: str) -> Anomaly:
    """A slow_node anomaly of `node` in job run-42, as the store holds it (`evidence` as text)."""
    kind = "slow_node"
    return Anomaly(key, start, end, kind, node, "", "run-42", "warning", 0.4, evidence, kind, "2")


def seed_stragglers(store: Store) -> None:
    """Job run-42 on three nodes over an hour from T0: vela-012 slowed it by 31% for 20 minutes, vela-013
    by 5% from minute 40 on; an older anomaly of vela-012 without the cost, one with evidence that is not
    JSON; vela-014 was never slow."""
    nodes = ("vela-012", "vela-013", "vela-014")
    store.insert_steps(
        [
            StepRecord(T0 + 60 * minute, "run-42", rank, node, minute, 10.0, compute_s=9.0, pp_stage=0)
            for minute in range(60)
            for rank, node in enumerate(nodes)
        ],
        token="steps",
    )
    cost = example("slow_node", ratio=1.45, job_slowdown=0.314, lost_gpu_hours=2.43, job_gpus=24)
    later = example("slow_node", job_slowdown=0.05, lost_gpu_hours=0.57)
    store.insert_anomalies(
        [
            straggler("s-0", "vela-012", T0 + 60, T0 + 300, '{"ratio": 1.2}'),
            straggler("s-1", "vela-012", T0 + 600, T0 + 1800, stored_text(cost)),
            straggler("s-2", "vela-013", T0 + 2400, None, stored_text(later)),
            straggler("s-3", "vela-013", T0 + 120, T0 + 180, "{not json"),
        ],
        token="stragglers",
    )


def test_a_stragglers_events_carry_its_cost_and_the_summary_totals_the_gpu_hours_lost(store: Store):
    seed_stragglers(store)
    report = build_report(store, job="run-42", start=T0, end=T0 + 3600)

    costs = [
        (event.node, event.what, event.job_slowdown, event.lost_gpu_hours)
        for event in report.events
        if event.source == "anomaly"
    ]
    assert costs == [
        ("vela-012", "slow_node opened", None, None),  # written before the detector reported its cost
        ("vela-013", "slow_node opened", None, None),  # evidence that is not JSON: no cost, no crash
        ("vela-013", "slow_node closed", None, None),
        ("vela-012", "slow_node closed", None, None),
        ("vela-012", "slow_node opened", 0.314, 2.43),
        ("vela-012", "slow_node closed", 0.314, 2.43),
        ("vela-013", "slow_node opened", 0.05, 0.57),
    ]
    costed = [event for event in report.events if event.job_slowdown is not None]
    assert "job run-42; slows its job by 31% (2.4 GPU-hours lost so far): ratio=1.45" in costed[0].detail
    assert costed[1].detail == "after 20m, 2.4 GPU-hours of its job lost"

    summary = to_json(report)["summary"]
    assert summary["gpu_hours_lost_to_stragglers"] == pytest.approx(3.0)
    assert [(s["node"], s["job_slowdown"], s["lost_gpu_hours"]) for s in summary["stragglers"]] == [
        ("vela-012", 0.314, 2.43),
        ("vela-013", 0.05, 0.57),
    ]
    markdown = to_markdown(report)
    assert (
        "- GPU-hours lost to stragglers: 3 (vela-012: 2.4, slowing its job by 31%; "
        "vela-013: 0.57, slowing its job by 5%)"
    ) in markdown
    assert "slows its job by 31% (2.4 GPU-hours lost so far)" in markdown.split("## Timeline")[1]

    rows = [row for row in csv.DictReader(io.StringIO(to_csv(report))) if row["source"] == "anomaly"]
    assert [(row["job_slowdown"], row["lost_gpu_hours"]) for row in rows] == [
        (f"{e.job_slowdown}", f"{e.lost_gpu_hours}") if e.job_slowdown is not None else ("", "")
        for e in report.events
        if e.source == "anomaly"
    ]
    never_slow = to_markdown(build_report(store, node="vela-014", start=T0, end=T0 + 3600))
    assert "- GPU-hours lost to stragglers: none" in never_slow


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_every_saved_query_answers_for_the_node(store: Store, incident: Incident):
    parameters = {"node": NODE, **Window(incident.start, incident.end).parameters}
    answers = {title: run_sql(store, sql, parameters=parameters) for title, sql in SAVED_QUERIES.items()}

    anomalies = answers["Anomalies on the node"]
    assert [row[anomalies.columns.index("component")] for row in anomalies.rows] == ["gpu:1"]
    assert len(answers["Failed scrapes of the node"].rows) == 3
    gpus = answers["Lowest SM clock and hottest temperature per GPU"]
    lowest = {row[0]: row[gpus.columns.index("min_sm_clock_mhz")] for row in gpus.rows}
    assert lowest["1"] < 0.75 * lowest["0"]


def test_consecutive_failed_scrapes_merge_into_one_gap_with_their_error(store: Store):
    outcomes = ["", "connection refused", "connection refused", "", "context deadline exceeded", ""]
    store.insert_targets(
        [
            TargetStatus(T0 + 10 * i, "vela-009:9400", "vela-009", not error, 0.01, 0, error)
            for i, error in enumerate(outcomes)
        ],
        token="targets",
    )

    report = build_report(store, node="vela-009", start=T0, end=T0 + 60)

    assert [(gap.ts, gap.end, gap.evidence["failed_scrapes"]) for gap in report.gaps] == [
        (T0 + 10, T0 + 20, 2),
        (T0 + 40, T0 + 40, 1),
    ]
    assert report.gaps[0].detail == "2 failed scrapes over 10s: connection refused"
    assert report.gaps[1].detail == "1 failed scrape: context deadline exceeded"
    assert f"| {utc(T0 + 10)} | {utc(T0 + 20)} | vela-009 | vela-009:9400 | 2 | connection refused |" in (
        to_markdown(report)
    )


def merged_gaps(scrapes: list[TargetStatus]) -> list[tuple[str, float, float, int]]:
    """Runs of failed scrapes of each target, merged one scrape at a time: target, first, last, count."""
    gaps: list[list] = []
    last_up: dict[str, bool] = {}
    for scrape in sorted(scrapes, key=lambda s: (s.target, s.ts)):
        if not scrape.up:
            if last_up.get(scrape.target, True):
                gaps.append([scrape.target, scrape.ts, scrape.ts, 0])
            gaps[-1][2:] = [scrape.ts, gaps[-1][3] + 1]
        last_up[scrape.target] = scrape.up
    return sorted((target, first, last, count) for target, first, last, count in gaps)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(outcomes=st.lists(st.lists(st.booleans(), min_size=1, max_size=40), min_size=1, max_size=3))
def test_gaps_merged_in_sql_are_the_runs_of_failed_scrapes_merged_one_by_one(
    store: Store, outcomes: list[list[bool]]
):
    """Random up/down sequences of a node's targets (one store for every example, each example a node
    and an insert token of its own: hypothesis repeats examples)."""
    node = f"n-{uuid.uuid4().hex[:12]}"
    scrapes = [
        TargetStatus(T0 + 10 * i, f"{node}:{9400 + t}", node, up, 0.01, 0, "" if up else "timeout")
        for t, ups in enumerate(outcomes)
        for i, up in enumerate(ups)
    ]
    store.insert_targets(scrapes, token=node)

    report = build_report(store, node=node, start=T0, end=T0 + 600)

    got = sorted((g.evidence["target"], g.ts, g.end, g.evidence["failed_scrapes"]) for g in report.gaps)
    assert got == merged_gaps(scrapes)


def test_an_anomaly_lasting_hours_is_read_from_the_rollup_and_still_shows_its_excursion(store: Store):
    hours = 5
    clock = [1980.0 if minute < 60 or minute >= 240 else 1400.0 for minute in range(hours * 60)]
    store.insert_samples(
        [
            ScrapeBatch(
                "vela-009:9400", "vela-009", T0 + 60 * i, ["DCGM_FI_DEV_SM_CLOCK"], [{"gpu": "0"}], [v]
            )
            for i, v in enumerate(clock)
        ],
        token="clock",
    )
    throttled = Anomaly(
        "a-1",
        T0 + 3600,
        T0 + 4 * 3600,
        "gpu_throttle",
        "vela-009",
        "gpu:0",
        "",
        "warning",
        0.3,
        "{}",
        "gpu_throttle",
        "2",
    )
    store.insert_anomalies([throttled], token="anomaly")

    report = build_report(store, node="vela-009", start=T0, end=T0 + hours * 3600)

    [excursion] = report.excursions
    assert (excursion.baseline, excursion.peak) == (1980.0, 1400.0)
    assert excursion.start == T0 + 3600 and T0 + 4 * 3600 <= excursion.end <= T0 + 4 * 3600 + 600


def test_a_counters_excursion_is_its_rate_and_a_counter_reset_is_no_excursion(store: Store):
    received, total = [], 0.0
    for i in range(180):  # 30 minutes at 10 s: 1 GB/s, 200 MB/s from minute 20 to 25, the counter reset at 22
        total = 0.0 if i == 132 else total + (2e9 if 120 <= i < 150 else 1e10)
        received.append(total)
    port = {"device": "mlx5_0", "port": "1"}
    store.insert_samples(
        [
            ScrapeBatch("vela-009:9400", "vela-009", T0 + 10 * i, [RX_BYTES], [port], [value])
            for i, value in enumerate(received)
        ],
        token="rx",
    )
    degraded = Anomaly(
        "a-2",
        T0 + 1200,
        T0 + 1500,
        "dma_degraded",
        "vela-009",
        "mlx5_0:1",
        "",
        "warning",
        0.8,
        "{}",
        "dma",
        "1",
    )
    store.insert_anomalies([degraded], token="anomaly")

    [excursion] = build_report(store, node="vela-009", start=T0, end=T0 + 1800).excursions

    assert (excursion.metric, excursion.labels, excursion.unit) == (
        RX_BYTES,
        'device="mlx5_0",port="1"',
        "B/s",
    )
    assert (excursion.baseline, excursion.peak) == (1e9, 2e8)
    assert (excursion.start, excursion.end) == (T0 + 1200, T0 + 1500)


def test_an_anomaly_whose_series_were_never_scraped_is_told_without_excursions(store: Store):
    """A GPU that fell off the bus before any scrape: the timeline has it, there is nothing to plot."""
    lost = Anomaly(
        "a-3", T0 + 60, None, "gpu_fault", "vela-011", "gpu:5", "", "critical", 1.0, "{}", "gpu", "1"
    )
    store.insert_anomalies([lost], token="anomaly")
    store.insert_targets([TargetStatus(T0, "vela-011:9400", "vela-011", True, 0.01, 10)], token="target")

    report = build_report(store, node="vela-011", start=T0, end=T0 + 600)

    assert [event.kind for event in report.events if event.source == "anomaly"] == ["gpu_fault"]
    assert report.excursions == ()


@pytest.mark.parametrize(
    ("scope", "message"),
    [
        ({"node": NODE, "job": "job-a"}, "one node or one job; given node 'vela-002' and job 'job-a'"),
        ({}, "one node or one job; given neither"),
        ({"node": "vela-999"}, "node 'vela-999' is unknown to the store"),
        ({"job": "job-z"}, f"job 'job-z' has no steps and no placements from {utc(T0)} to {utc(T0 + 3600)}"),
    ],
)
def test_a_bad_scope_is_refused_naming_it(store: Store, scope: dict, message: str):
    with pytest.raises(PostmortemError, match=message):
        build_report(store, start=T0, end=T0 + 3600, **scope)


def test_a_window_that_ends_before_it_starts_is_refused(store: Store):
    with pytest.raises(
        PostmortemError, match=f"must end after it starts: from {utc(T0 + 3600)} to {utc(T0)}"
    ):
        build_report(store, node=NODE, start=T0 + 3600, end=T0)


# -- the SQL box ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sql", ["INSERT INTO steps (job) VALUES ('x')", "DROP TABLE steps"])
def test_the_sql_box_refuses_writes_saying_it_only_reads(store: Store, sql: str):
    with pytest.raises(QueryError, match=r"only SELECT statements \(and EXPLAIN of one\) are accepted"):
        run_sql(store, sql)
    assert run_sql(store, "SELECT count() FROM steps").rows == [(0,)]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT node,, job FROM steps", "syntax error at line 1, column 15, near `job FROM steps`"),
        ("\n  SELECT node\nFROM steps\nGROUP node", "syntax error at line 4, column 7, near `node`"),
        (
            "SELECT node FROM steps WHERE",
            "syntax error: the statement ends too early, after `SELECT node FROM steps WHERE`",
        ),
        ("SELECT nod FROM steps", "Unknown expression identifier `nod`"),
    ],
)
def test_the_sql_box_explains_a_bad_statement_where_it_is_wrong(store: Store, sql: str, message: str):
    with pytest.raises(QueryError, match=message):
        run_sql(store, sql)


def test_the_sql_box_cuts_a_huge_result_and_says_so(store: Store):
    result = run_sql(store, "SELECT number FROM numbers(1e7)", max_rows=1000)

    assert result.truncated and len(result.rows) == 1000


def test_the_sql_box_sends_only_the_parameters_a_statement_uses(store: Store):
    parameters = {"node": NODE, **Window(T0, T0 + 3600).parameters}

    assert run_sql(store, "SELECT 'vela-002' LIKE 'vela%'", parameters=parameters).rows == [(1,)]
    assert run_sql(store, "SELECT {node:String}", parameters=parameters).rows == [(NODE,)]

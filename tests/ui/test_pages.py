"""Every page of the app, run by Streamlit's AppTest on a store seeded by the real collectors and the
real detectors: a lost GPU, a flapped port, a node whose scrapes fail, drains done and pending, an alert
and step times with one slow node. The pages must show those nodes, rows and numbers."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from alerts import commands
from analytics.detectors import build
from analytics.detectors.runner import DetectionRunner, store_anomalies
from analytics.store import Store
from analytics.store.records import ActionRow, AlertChange, Anomaly
from collectors.steprecord import StepRecord
from tests.support.evidence import example
from tests.support.fleetdata import SimulatedFleet
from ui import environment, source, window

APP = Path(__file__).resolve().parents[2] / "ui" / "app.py"
COMPUTE_S = {"vela-001": 3.0, "vela-002": 3.6, "vela-003": 3.02, "vela-004": 3.04, "vela-005": 3.01}
PEERS_OF_SLOW = sorted(seconds for node, seconds in COMPUTE_S.items() if node != "vela-002")
PEER_MEDIAN = (PEERS_OF_SLOW[1] + PEERS_OF_SLOW[2]) / 2
DRAINED, PENDING = "decision-drained-5", "decision-pending-3"


def seed(store: Store, root: Path) -> float:
    """The incident every page test looks at; returns its end (unix seconds): the pages' Until."""
    with SimulatedFleet(store, root, nodes=5, gpus=2, nics=2) as fleet:
        start = fleet.clock()
        fleet.tick(3)
        fault_window = fleet.clock()
        fleet["vela-002"].gpus.set_fault(1, "gpu_lost")
        fleet["vela-003"].sysfs.set_link(1, up=False)
        fleet.tick()
        fleet["vela-003"].sysfs.set_link(1, up=True)
        fleet.tick(2)
        fleet.tick(2, skip=["vela-004"])
        end = fleet.clock() + fleet.interval_s
    runner = DetectionRunner(build(["gpu_fault", "link_flap"]))
    store_anomalies(store, runner.run(store, fault_window, end))
    store.insert_steps(
        [
            StepRecord(
                start + 10 * tick, "llm-7b", rank, node, tick, seconds + 1, compute_s=seconds, pp_stage=0
            )
            for tick in range(1, 9)
            for rank, (node, seconds) in enumerate(COMPUTE_S.items())
        ],
        token="steps",
    )
    alert_labels = {"node": "vela-002", "kind": "gpu_fault", "severity": "critical", "component": "gpu:1"}
    store.insert_alert_changes(
        [
            AlertChange(
                end - 30,
                "f00d",
                "FleetlensGpuFault",
                "firing",
                alert_labels,
                {"summary": "lost"},
                end - 30,
                None,
            )
        ],
        token="alerts",
    )
    store.insert_actions(
        [
            ActionRow(
                end - 40, "drain", "vela-005", "", "fleetlens: gpu_fault 1234", "auto", "done", DRAINED
            ),
            ActionRow(
                end - 20, "drain", "vela-003", "", "fleetlens: link_flap 5678", "approve", "pending", PENDING
            ),
        ],
        token="actions",
    )
    return end


@pytest.fixture
def incident(store: Store, tmp_path: Path) -> float:
    return seed(store, tmp_path)


def app(store: Store, path: str = "", until: float | None = None, **query: str) -> AppTest:
    """The app reading `store` on the page at `path` (default: Fleet), its time range ending at `until`
    (default: now), run once."""
    test = AppTest.from_file(APP, default_timeout=30)
    test.session_state[source.SESSION_KEY] = store
    if until is not None:
        test.session_state[window.UNTIL_KEY] = datetime.fromtimestamp(until, UTC).strftime(
            "%Y-%m-%d %H:%M:%S"
        )
    test.query_params.update(query)
    if path:
        test.switch_page(path)
    test.run()
    assert not test.exception, [error.value for error in test.exception]
    return test


def chart_data(test: AppTest) -> list[tuple[dict, list]]:
    """Every chart on the page: its Vega-Lite spec and the data frames it plots."""
    charts = []
    for chart in test.get("vega_lite_chart"):
        frames = [pa.ipc.open_stream(named.data.data).read_pandas() for named in chart.proto.datasets]
        charts.append((json.loads(chart.proto.spec), frames))
    return charts


def axis_titles(spec: dict) -> list[str]:
    """The titles of the quantitative x and y axes of a (layered) spec."""
    layers = spec.get("layer", [spec])
    return [
        channel["title"]
        for layer in layers
        for name, channel in layer.get("encoding", {}).items()
        if name in ("x", "y") and channel.get("type") == "quantitative" and "title" in channel
    ]


def test_fleet_page_shows_every_nodes_status_its_gpus_and_ports_and_drills_down(
    store: Store, incident: float
):
    fleet = app(store, until=incident)

    status = fleet.dataframe[0].value.set_index("node")
    assert status["status"].to_dict() == {
        "vela-001": "healthy",
        "vela-002": "anomalous",  # its GPU 1 fell off the bus
        "vela-003": "draining",  # a drain waits for approval (its port also flapped)
        "vela-004": "down",  # its last two scrapes failed
        "vela-005": "drained",
    }
    assert status.loc["vela-002", ["kinds", "worst_severity"]].tolist() == ["gpu_fault", "critical"]
    assert status.loc["vela-004", "failed_scrapes"] == 2
    assert {metric.label: metric.value for metric in fleet.metric} == {
        "healthy": "1",
        "anomalous": "1",
        "draining": "1",
        "down": "1",
        "drained": "1",
    }
    flapped = [["vela-003", "mlx5_1:1", "active", 1]]
    assert fleet.dataframe[1].value[["node", "port", "state", "flaps"]].values.tolist() == flapped
    plotted = {title for spec, _ in chart_data(fleet) for title in axis_titles(spec)}
    assert "anomalies (count)" in plotted

    fleet.selectbox(key="fleet.metric").select("DCGM_FI_DEV_SM_CLOCK").run()
    assert "SM clock per GPU, mean over the range" in [header.value for header in fleet.subheader]
    clocks = next(frames[0] for _, frames in chart_data(fleet) if frames and "gpu" in frames[0].columns)
    assert set(clocks["node"]) == set(COMPUTE_S)
    assert clocks["mean"].between(300, 3000).all()  # MHz, as simulated H100s clock

    fleet.selectbox(key=window.LENGTH_KEY).select("24 h").run()  # read from the 1-minute rollup
    assert fleet.dataframe[1].value[["node", "port", "state", "flaps"]].values.tolist() == flapped

    fleet.selectbox(key="fleet.drill").select("vela-002")
    fleet.button(key="fleet.open").click().run()
    assert [title.value for title in fleet.title] == ["Node"]
    assert fleet.query_params["node"] == "vela-002"


def test_node_page_shades_its_anomaly_and_compares_it_with_its_peers(store: Store, incident: float):
    node = app(store, "views/node.py", incident, node="vela-002")

    [anomaly] = node.dataframe[0].value.to_dict("records")
    assert (anomaly["kind"], anomaly["component"], anomaly["severity"]) == ("gpu_fault", "gpu:1", "critical")
    assert json.loads(anomaly["evidence"])["lost"] == "fleetlens_gpu_up 0"
    [alert] = node.dataframe[1].value.to_dict("records")
    assert (alert["alertname"], alert["state"]) == ("FleetlensGpuFault", "firing")

    [peers] = node.metric
    assert peers.value == "3.600 s"
    assert f"peers {PEER_MEDIAN:.3f} s" in peers.label
    assert peers.delta == f"{(3.6 / PEER_MEDIAN - 1) * 100:+.1f}% vs peers"

    charts = chart_data(node)
    shaded = [frame for _, frames in charts for frame in frames if "until" in frame.columns]
    assert shaded and all(frame["kind"].tolist() == ["gpu_fault"] for frame in shaded)
    for spec, _ in charts:  # every time series has a unit on its value axis
        assert all(title for title in axis_titles(spec)), spec.get("title")
    titles = {spec.get("title") for spec, _ in charts}
    assert {"SM clock", "GPU temperature", "RoCE received"} <= titles

    node.selectbox(key=window.LENGTH_KEY).select("24 h").run()  # read from the 1-minute rollup
    lines = [frame for _, frames in chart_data(node) for frame in frames if "component" in frame.columns]
    assert {"gpu:0", "mlx5_0:1"} <= {component for frame in lines for component in frame["component"]}


def test_anomalies_page_filters_by_kind_severity_and_node_and_shows_the_evidence(
    store: Store, incident: float
):
    anomalies = app(store, "views/anomalies.py", incident)
    listed = anomalies.dataframe[0].value
    assert sorted(zip(listed["node"], listed["kind"], strict=True)) == [
        ("vela-002", "gpu_fault"),
        ("vela-003", "link_flap"),
    ]

    anomalies.multiselect(key="anomalies.kinds").select("link_flap").run()
    [flap] = anomalies.dataframe[0].value.to_dict("records")
    assert (flap["node"], flap["component"]) == ("vela-003", "mlx5_1:1")
    assert json.loads(anomalies.json[0].value)["link_downed"] == 1.0

    anomalies.multiselect(key="anomalies.kinds").unselect("link_flap")
    anomalies.multiselect(key="anomalies.severities").select("critical")
    anomalies.multiselect(key="anomalies.nodes").select("vela-002").run()
    assert anomalies.dataframe[0].value["kind"].tolist() == ["gpu_fault"]
    assert anomalies.dataframe[1].value[["alertname", "node"]].values.tolist() == [
        ["FleetlensGpuFault", "vela-002"]
    ]


def add_stragglers(store: Store, end: float) -> None:
    """vela-002's slowness as two slow_node anomalies: one whose evidence says what it costs job llm-7b,
    and an older one written before the detector reported the cost."""
    costed = example("slow_node", ratio=1.19, job_slowdown=0.314, lost_gpu_hours=2.43, job_gpus=10)
    store_anomalies(
        store,
        [Anomaly("slow-new", end - 60, None, "slow_node", "vela-002", "", "llm-7b", "warning", 0.19,
                 costed, "slow_node", "2")],
    )  # fmt: skip
    store.insert_anomalies(  # a row as the store holds it, evidence as its text
        [Anomaly("slow-old", end - 80, end - 70, "slow_node", "vela-002", "", "llm-7b", "warning", 0.19,
                 '{"ratio": 1.19}', "slow_node", "1")],  # type: ignore[arg-type]
        token="slow-old",
    )  # fmt: skip


def cost_formats(table) -> dict[str, str]:
    """How a table formats its cost columns (from their settings as the browser gets them)."""
    settings = json.loads(table.proto.columns)
    return {name: settings[name]["type_config"]["format"] for name in ("job_slowdown", "lost_gpu_hours")}


def test_the_node_anomalies_and_postmortem_pages_show_what_a_straggler_costs(store: Store, incident: float):
    add_stragglers(store, incident)
    stated = "**vela-002** slows job llm-7b by 31% (2.4 GPU-hours lost so far)"

    node = app(store, "views/node.py", incident, node="vela-002")
    listed = node.dataframe[0].value.set_index("kind")
    slow = listed.loc["slow_node"]  # newest first
    assert (slow["job_slowdown"].iloc[0], slow["lost_gpu_hours"].iloc[0]) == (0.314, 2.43)
    assert slow.iloc[1][["job_slowdown", "lost_gpu_hours"]].isna().all()  # written before the cost: none
    assert pd.isna(listed.loc["gpu_fault", "job_slowdown"])  # other kinds: no cost
    assert cost_formats(node.dataframe[0]) == {"job_slowdown": "percent", "lost_gpu_hours": "%.2f"}
    [costs] = [text.value for text in node.markdown if "What the stragglers cost" in text.value]
    assert stated in costs and "2.4 GPU-hours lost in all" in costs and costs.count("slows job") == 1

    anomalies = app(store, "views/anomalies.py", incident)
    table = anomalies.dataframe[0]
    costed = table.value.dropna(subset=["job_slowdown"])
    assert costed[["node", "kind", "job_slowdown", "lost_gpu_hours"]].values.tolist() == [
        ["vela-002", "slow_node", 0.314, 2.43]
    ]
    columns = list(table.value.columns)
    at = columns.index("evidence")
    assert columns[at - 2 : at] == ["job_slowdown", "lost_gpu_hours"]  # beside the evidence they come from
    assert cost_formats(table) == {"job_slowdown": "percent", "lost_gpu_hours": "%.2f"}
    assert any(stated in text.value for text in anomalies.markdown)

    anomalies.multiselect(key="anomalies.kinds").select("link_flap").run()  # no straggler: no cost line
    assert not any("What the stragglers cost" in text.value for text in anomalies.markdown)

    report = app(store, "views/postmortem.py", incident, node="vela-002")
    headline = {metric.label: metric.value for metric in report.metric}
    assert headline["GPU-hours lost to stragglers"] == "2.4"
    events = report.dataframe[0].value
    assert events.dropna(subset=["job_slowdown"])["what"].tolist() == ["slow_node opened"]


def test_actions_page_approves_a_pending_drain_and_shows_the_limits(
    store: Store, incident: float, monkeypatch: pytest.MonkeyPatch
):
    policy = {"mode": "approve", "limits": {"max_nodes": 3, "max_per_hour": 2}, "cooldown_s": 600.0}
    monkeypatch.setenv(environment.LIMITS, json.dumps(policy))
    actions = app(store, "views/actions.py")

    [waiting] = [text.value for text in actions.markdown if PENDING in text.value]
    assert "vela-003" in waiting and "link_flap" in waiting
    approvable = {
        button.key.removeprefix("approve.") for button in actions.button if "approve." in button.key
    }
    controller = commands.drain_status(store)  # what `fleetlens drain list` and the controller read
    assert approvable == {row.decision_id for row in controller["pending"]} == {PENDING}
    drained = actions.dataframe[0].value["node"].tolist()
    assert drained == [row.node for row in controller["drained"]] == ["vela-005"]
    assert dict(actions.table[0].value.values.tolist()) == {"max_nodes": "3", "max_per_hour": "2"}

    actions.button(key=f"approve.{PENDING}").click().run()
    assert "enter your name" in actions.warning[0].value
    actions.text_input(key="actions.by").input("alice")
    actions.button(key=f"approve.{PENDING}").click().run()
    assert "requested by alice" in actions.success[0].value

    requests = store.query("SELECT action, decision_id, reason FROM actions WHERE outcome = 'requested'").rows
    assert requests == [("approve", PENDING, "requested by alice")]
    actions.run()
    assert any("approve requested by alice" in text.value for text in actions.markdown)


def test_postmortem_page_reports_the_node_and_answers_a_saved_query(store: Store, incident: float):
    report = app(store, "views/postmortem.py", incident, node="vela-002")

    events = report.dataframe[0].value
    assert "gpu_fault gpu:1 opened" in events["what"].tolist()
    assert "FleetlensGpuFault firing" in events["what"].tolist()
    assert set(events["node"]) == {"vela-002"}
    headline = {metric.label: metric.value for metric in report.metric}
    assert (headline["anomalies opened"], headline["alerts fired"]) == ("1", "1")
    assert any("anomalies by kind: gpu_fault 1" in text.value for text in report.markdown)
    assert [button.label for button in report.get("download_button")] == ["Download Markdown", "Download CSV"]

    report.selectbox(key="postmortem.saved").select("Anomalies on the node").run()
    report.button(key="postmortem.run").click().run()
    answer = report.dataframe[-1].value
    assert answer[["kind", "component"]].values.tolist() == [["gpu_fault", "gpu:1"]]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("DROP TABLE samples", "only SELECT statements"),
        ("SELECT count( FROM samples", "syntax error at line 1"),
    ],
)
def test_the_sql_box_explains_what_it_refuses(store: Store, sql: str, message: str):
    box = app(store, "views/postmortem.py")
    box.text_area(key="postmortem.sql").input(sql)
    box.button(key="postmortem.run").click().run()
    assert message in box.error[0].value


def test_the_sql_box_cuts_a_huge_result_and_says_so(store: Store):
    box = app(store, "views/postmortem.py")
    box.text_area(key="postmortem.sql").input("SELECT number FROM numbers(1000000)")
    box.button(key="postmortem.run").click().run()
    assert "more than 10,000 rows" in box.warning[0].value
    assert len(box.dataframe[-1].value) == 10_000


def test_an_app_started_without_a_source_says_which_setting_is_missing(monkeypatch: pytest.MonkeyPatch):
    for name in (environment.HUB, environment.STORE):
        monkeypatch.delenv(name, raising=False)
    started = AppTest.from_file(APP, default_timeout=30).run()
    assert environment.HUB in started.error[0].value and environment.STORE in started.error[0].value

"""The Node and Actions pages show a node's life: what the schedulers placed on it, the latest active check
results (failures first, a newer result replacing an older one), and the lifecycle audit apart from the
drain audit. Rows go through the real store (chDB); the app runs in Streamlit's AppTest."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from analytics.store import Store
from analytics.store.records import ActionRow, CheckRow, Placement
from analytics.topology.model import Source
from ui import source, window

APP = Path(__file__).resolve().parents[2] / "ui" / "app.py"
NODE = "vela-004"
END = time.time() // 60 * 60 - 60  # the pages' Until: recent enough that no TTL drops the rows


def check(node: str, name: str, target: str, status: str, value: float | None, at: float) -> CheckRow:
    return CheckRow(node, name, target, status, value, "GB/s", 20.0, json.dumps({"run": at}), at, 1.5)


@pytest.fixture
def seeded(store: Store) -> Store:
    store.insert_checks(
        [
            check(NODE, "pcie_bandwidth", "gpu:0", "FAIL", 3.1, END - 900),
            check(NODE, "pcie_bandwidth", "gpu:0", "PASS", 24.5, END - 300),  # the newer: passes now
            check(NODE, "pcie_bandwidth", "gpu:1", "FAIL", 2.9, END - 300),
            check("vela-001", "dcgm_diag", "", "PASS", None, END - 600),
            check("vela-002", "ping_mesh", "peer:vela-001", "ERROR", None, END - 120),
        ]
    )
    store.replace_placements(
        Source.SLURM,
        [
            Placement(Source.SLURM, "4242", "ana", NODE, (0, 1), END - 1200, END - 700),
            Placement(Source.SLURM, "4243", "bo", "vela-001", (0,), END - 1200, None),
        ],
        now=END - 30,
    )
    store.insert_actions(
        [
            ActionRow(END - 500, "drain", NODE, "", "fleetlens: pcie 1", "auto", "done", "d-1"),
            ActionRow(END - 400, "test", NODE, "", "heavy checks on a drained node", "auto", "done", "d-1"),
            ActionRow(END - 100, "fail", NODE, "", "pcie_bandwidth gpu:1 FAIL", "auto", "done", "d-1"),
        ],
        token="lifecycle",
    )
    return store


def app(store: Store, path: str, **query: str) -> AppTest:
    test = AppTest.from_file(APP, default_timeout=30)
    test.session_state[source.SESSION_KEY] = store
    test.session_state[window.UNTIL_KEY] = datetime.fromtimestamp(END, UTC).strftime("%Y-%m-%d %H:%M:%S")
    test.query_params.update(query)
    test.switch_page(path)
    test.run()
    assert not test.exception, [error.value for error in test.exception]
    return test


def tables(test: AppTest, *columns: str) -> list:
    """The page's tables, in page order, that have all of `columns`."""
    return [frame.value for frame in test.dataframe if set(columns) <= set(frame.value.columns)]


def test_the_node_page_shows_what_ran_there_and_its_latest_checks(seeded: Store):
    page = app(seeded, "views/node.py", node=NODE)

    [placed] = tables(page, "job", "user", "gpus", "source")
    assert placed[["job", "user", "gpus", "source"]].values.tolist() == [["4242", "ana", "0, 1", "slurm"]]
    assert (
        placed["from"].iloc[0].timestamp() == END - 1200 and placed["until"].iloc[0].timestamp() == END - 700
    )
    [checks] = tables(page, "check", "target", "status")
    assert checks[["target", "status", "value"]].values.tolist() == [
        ["gpu:1", "FAIL", 2.9],
        ["gpu:0", "PASS", 24.5],
    ]
    assert "Check results (2, 1 failed)" in [header.value for header in page.subheader]


def test_the_actions_page_shows_check_results_failures_first_and_the_lifecycle_audit(seeded: Store):
    page = app(seeded, "views/actions.py")

    [checks] = tables(page, "check", "target", "status")
    assert checks[["node", "check", "target", "status"]].values.tolist() == [
        [NODE, "pcie_bandwidth", "gpu:1", "FAIL"],
        ["vela-002", "ping_mesh", "peer:vela-001", "ERROR"],
        ["vela-001", "dcgm_diag", "", "PASS"],
        [NODE, "pcie_bandwidth", "gpu:0", "PASS"],
    ]
    assert checks["evidence"].iloc[0] == {"run": END - 300}
    [states] = tables(page, "state", "since")
    assert states[["node", "state", "reason"]].values.tolist() == [
        [NODE, "failed", "pcie_bandwidth gpu:1 FAIL"]
    ]
    assert states["since"].iloc[0].timestamp() == END - 100
    assert "Node lifecycle (1 out of service)" in [header.value for header in page.subheader]
    drains, lifecycle = tables(page, "action", "reason")
    assert drains["action"].tolist() == ["drain"]
    assert lifecycle[["action", "node", "reason"]].values.tolist() == [
        ["fail", NODE, "pcie_bandwidth gpu:1 FAIL"],
        ["test", NODE, "heavy checks on a drained node"],
    ]


def test_pages_without_placements_or_checks_say_so(store: Store):
    page = app(store, "views/node.py", node=NODE)

    captions = [caption.value for caption in page.caption]
    assert any(f"no scheduler placed a job on {NODE}" in text for text in captions)
    assert any("no active check ran in the range" in text for text in captions)


def test_the_postmortem_page_offers_a_placed_job_without_steps_and_says_where_its_nodes_came_from(
    seeded: Store,
):
    page = app(seeded, "views/postmortem.py", job="4242")
    page.radio(key="postmortem.scope").set_value("job").run()

    assert not page.exception, [error.value for error in page.exception]
    assert "4242" in page.selectbox(key="postmortem.job").options
    assert page.selectbox(key="postmortem.job").value == "4242"
    assert "the job sent no step times: its nodes and span come from its placements" in [
        info.value for info in page.info
    ]
    [placed] = tables(page, "node", "job", "gpus")
    assert placed[["node", "job", "user", "gpus"]].values.tolist() == [[NODE, "4242", "ana", "0, 1"]]

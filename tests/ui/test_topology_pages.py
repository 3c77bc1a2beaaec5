"""Where each node sits, on the pages and in the postmortem: a store seeded with the page tests' incident,
an inventory imported as `fleetlens topology import --format inventory` does, and a shared fault of leaf-00
explaining link flaps on two of its nodes. The inventory changes after the incident: the postmortem must
show the topology as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analytics.detectors.runner import store_anomalies
from analytics.reports.postmortem import build_report, to_csv, to_json, to_markdown
from analytics.store import Store
from analytics.store.records import Anomaly
from analytics.topology import inventory
from analytics.topology.model import Source
from tests.support.evidence import example
from tests.ui.test_pages import app, chart_data, seed

BEFORE = """
nodes:
  vela-001: {host: host-000, rails: [rail-0]}
  vela-002: {host: host-000}
  vela-003: {host: host-001}
  vela-004: {host: host-002}
  vela-005: {host: host-002}
hosts:
  host-000: {leaf: leaf-00, rack: rack-00}
  host-001: {leaf: leaf-00, rack: rack-00}
  host-002: {leaf: leaf-01, rack: rack-01}
leaves:
  leaf-00: {spine: spine-0}
  leaf-01: {spine: spine-0}
"""
AFTER = BEFORE.replace("vela-001: {host: host-000, rails: [rail-0]}", "vela-001: {host: host-002}")
FAULT, FLAPS = "fault-leaf-00", ("flap-001", "flap-002")
CHECK = "leaf-00: link flaps on 2 of 3 nodes; check optics and switch logs"
AS_IT_WAS = {"node": "vela-001", "host": "host-000", "leaf": "leaf-00", "spine": "spine-0", "rack": "rack-00",
             "rail": ["rail-0"]}  # fmt: skip


def import_inventory(store: Store, text: str, now: float) -> None:
    """What `fleetlens topology import FILE --format inventory --store DSN` does, at `now`."""
    store.replace_links(Source.INVENTORY, inventory.parse(text, "topology.yaml"), now)


def add_shared_fault(store: Store, end: float) -> None:
    """Link flaps on vela-001 and vela-002 from a minute before `end`, both explained by leaf-00's fault."""
    flaps = [
        Anomaly(flap, end - 60, None, "link_flap", node, "mlx5_0:1", "", "warning", 1.0,
                example("link_flap", link_downed=1.0), "link_flap", "1", explained_by=FAULT)
        for flap, node in zip(FLAPS, ("vela-001", "vela-002"), strict=True)
    ]  # fmt: skip
    evidence = example(
        "shared_fault",
        layer="leaf",
        parent="leaf-00",
        n=3,
        k=2,
        children=("vela-001", "vela-002", "vela-003"),
        anomalous_children=("vela-001", "vela-002"),
        explains=FLAPS,
        kinds={"link_flap": 2},
        dominant_kind="link_flap",
        p_corrected=0.01,
        check=CHECK,
    )
    fault = Anomaly(FAULT, end - 60, None, "shared_fault", "leaf-00", "leaf", "", "warning", 2.0, evidence,
                    "shared_fault", "1")  # fmt: skip
    store_anomalies(store, [*flaps, fault])


@pytest.fixture
def faulted(store: Store, tmp_path: Path) -> float:
    """The incident, the inventory from an hour before its end, and leaf-00's shared fault; its end."""
    end = seed(store, tmp_path)
    import_inventory(store, BEFORE, end - 3600)
    add_shared_fault(store, end)
    return end


def test_the_fleet_page_marks_the_leaf_with_a_shared_fault_and_colours_its_nodes(
    store: Store, faulted: float
):
    fleet = app(store, until=faulted)

    parents = fleet.dataframe[-1].value
    [leaf] = parents[parents["parent"] == "leaf-00"].to_dict("records")
    assert (leaf["layer"], leaf["shared_fault"], leaf["check"], leaf["nodes"]) == ("leaf", FAULT, CHECK, 3)
    assert leaf["anomalous"] >= 2
    assert parents.iloc[0]["parent"] == "leaf-00"  # the faulted parent first
    [cells] = [frames[0] for _, frames in chart_data(fleet) if frames and "slot" in frames[0].columns]
    rows = cells.set_index("node")["row"]
    assert rows["vela-001"].startswith("leaf-00 SHARED FAULT") and rows["vela-001"] == rows["vela-003"]
    assert "SHARED FAULT" not in rows["vela-004"]
    states = cells.set_index("node")["state"]
    assert (states["vela-001"], states["vela-002"]) == ("explained", "explained")


def test_a_fleet_without_topology_says_how_to_add_one(store: Store, tmp_path: Path):
    fleet = app(store, until=seed(store, tmp_path))
    assert any("fleetlens topology import" in info.value and "docs/topology.md" in info.value
               for info in fleet.info)  # fmt: skip
    assert len(fleet.dataframe) == 2  # the status table and the ports: as without the topology section


def test_the_node_page_shows_its_layers_and_the_anomalies_page_the_explanation(store: Store, faulted: float):
    node = app(store, "views/node.py", faulted, node="vela-001")
    [layers] = [text.value for text in node.markdown if text.value.startswith("Sits under")]
    for shown in ("host **host-000**", "leaf **leaf-00**", "spine **spine-0**", "rack **rack-00**",
                  "rail **rail-0**"):  # fmt: skip
        assert shown in layers

    anomalies = app(store, "views/anomalies.py", faulted)
    listed = anomalies.dataframe[0].value
    explained = listed[listed["explained_by"] == FAULT]
    assert sorted(explained["node"]) == ["vela-001", "vela-002"]
    assert set(explained["explained_by_parent"]) == {"leaf leaf-00"}
    assert set(listed.loc[listed["kind"] == "gpu_fault", "explained_by_parent"]) == {""}
    [stated] = [text.value for text in anomalies.markdown if "Explained by shared faults" in text.value]
    assert "link_flap mlx5_0:1 on **vela-001**: explained by the shared fault of **leaf leaf-00**" in stated


def test_the_postmortem_shows_the_topology_as_it_was_and_what_the_shared_fault_explained(
    store: Store, faulted: float
):
    import_inventory(store, AFTER, faulted + 60)  # vela-001 moved after the incident
    report = build_report(store, node="vela-001", start=faulted - 3000, end=faulted)

    assert [dict(view) for view in report.topology] == [AS_IT_WAS]
    [fault] = report.shared_faults
    assert (fault.layer, fault.parent, fault.k, fault.n, fault.check) == ("leaf", "leaf-00", 2, 3, CHECK)
    assert fault.explained == ("link_flap mlx5_0:1 on vela-001", "link_flap mlx5_0:1 on vela-002")
    assert "shared_fault leaf opened" in [event.what for event in report.events if event.node == "leaf-00"]

    markdown = to_markdown(report)
    assert "| vela-001 | host-000 | leaf-00 | spine-0 | rack-00 | rail-0 |" in markdown
    assert "host-002" not in markdown  # where it went after the window
    assert CHECK in markdown and "link_flap mlx5_0:1 on vela-002" in markdown
    written = json.loads(json.dumps(to_json(report)))
    assert written["topology"]["nodes"] == [AS_IT_WAS]
    assert written["shared_faults"][0]["explained"] == list(fault.explained)
    assert "shared_fault leaf opened" in to_csv(report)

    page = app(store, "views/postmortem.py", faulted, node="vela-001")
    shown = [table.value for table in page.dataframe]
    topology = next(table for table in shown if "host" in table.columns)
    assert topology.to_dict("records") == [{**AS_IT_WAS, "rail": "rail-0"}]
    faults = next(table for table in shown if "check" in table.columns)
    assert faults[["parent", "check"]].values.tolist() == [["leaf-00", CHECK]]

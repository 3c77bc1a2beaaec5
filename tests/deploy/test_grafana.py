"""deploy/grafana: the Fleet, Node and Job dashboards. Each has the structure Grafana needs to import it
(checked against a JSON schema of the fields Grafana reads, and for what a schema cannot say: unique panel
ids, panels inside the 24-column grid and not overlapping, every panel on the `${datasource}` variable,
every variable referenced defined), and every panel's every expression, its variables resolved as Grafana
resolves them, answers with data from the hub's /api/v1/query_range over the demo's fleet played offline."""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from analytics.store import Store
from fleetlens.demo.run import SCENARIO
from hub.app import Hub
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from sim.offline import simulate_offline
from sim.scenario import load_scenario
from tests.support.hubserver import on_loopback
from tests.support.promqlpeers import get

DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASHBOARDS = {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARDS_DIR.glob("*.json"))}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
EPOCH = (time.time() // 86_400 - 1) * 86_400  # yesterday at midnight: the store's retention keeps it
PLAYED_S = 240  # the demo's first four minutes: every fault it injects has started
START_S, END_S, STEP_S = 60, PLAYED_S, 15  # the range every expression is asked over
# What Grafana puts for its own interval variables, as a dashboard over the range above would have them
BUILTINS = {"__rate_interval": "1m", "__interval": f"{STEP_S}s", "__range": f"{END_S - START_S}s"}
# Grafana's variables a panel's links and options may use (never sent to the data source)
LINK_BUILTINS = {"__field", "__url_time_range", "__value", "__series", "__data"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
LABEL_VALUES = re.compile(r"label_values\((?P<selector>.+),\s*(?P<label>\w+)\)")
REGEX_SPECIALS = re.compile(r"([\\^$*+?.()|{}\[\]])")

TARGET = {"type": "object", "required": ["refId", "expr", "datasource"]}
PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": ["row", "timeseries", "stat", "table"]},
        "title": {"type": "string", "minLength": 1},
        "gridPos": {
            "type": "object",
            "required": ["h", "w", "x", "y"],
            "properties": {key: {"type": "integer", "minimum": 0} for key in "hwxy"},
        },
        "targets": {"type": "array", "minItems": 1, "items": TARGET},
    },
    "if": {"properties": {"type": {"not": {"const": "row"}}}},
    "then": {"required": ["datasource", "targets", "fieldConfig", "description"]},
}
VARIABLE_SCHEMA = {
    "type": "object",
    "required": ["name", "type"],
    "properties": {"type": {"enum": ["datasource", "query"]}, "name": {"pattern": r"^\w+$"}},
    "if": {"properties": {"type": {"const": "query"}}},
    "then": {
        "required": ["datasource", "query", "definition", "refresh"],
        "properties": {"query": {"type": "object", "required": ["query"]}},
    },
}
DASHBOARD_SCHEMA = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": r"^[\w-]{1,40}$"},
        "schemaVersion": {"const": 39},
        "panels": {"type": "array", "minItems": 1, "items": PANEL},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": VARIABLE_SCHEMA}},
        },
    },
}


def queried_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels that ask the data source (every panel but the rows)."""
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return dashboard["templating"]["list"]


def referenced(text: str) -> set[str]:
    """The variable names `text` refers to, in each of Grafana's three syntaxes."""
    return {next(name for name in match.groups() if name) for match in VARIABLE.finditer(text)}


def substitute(text: str, values: dict[str, list[str]]) -> str:
    """`text` with its variables replaced as Grafana's Prometheus data source does: one value as it is,
    several as a regular expression matching any of them (each escaped)."""

    def value(match: re.Match[str]) -> str:
        name = next(group for group in match.groups() if group)
        if name in BUILTINS:
            return BUILTINS[name]
        chosen = values[name]
        if len(chosen) == 1:
            return chosen[0]
        return "(" + "|".join(REGEX_SPECIALS.sub(r"\\\\\1", item) for item in chosen) + ")"

    return VARIABLE.sub(value, text)


def query_range(hub: str, expr: str) -> dict[str, Any]:
    """The hub's answer to `expr` over the test's range; the test fails naming the expression if it errs."""
    status, answer = get(
        hub,
        "/api/v1/query_range",
        {"query": expr, "start": str(EPOCH + START_S), "end": str(EPOCH + END_S), "step": str(STEP_S)},
    )
    assert status == 200 and answer["status"] == "success", (expr, status, answer)
    return answer["data"]


def label_values(hub: str, definition: str) -> list[str]:
    """What Grafana lists for a `label_values(selector, label)` variable: its Prometheus data source asks
    /api/v1/label/<label>/values with the selector as match[] over the dashboard's range."""
    parsed = LABEL_VALUES.fullmatch(definition)
    assert parsed, f"not a label_values(selector, label) query: {definition}"
    window = {"start": str(EPOCH + START_S), "end": str(EPOCH + END_S)}
    path = f"/api/v1/label/{parsed['label']}/values"
    status, answer = get(hub, path, {"match[]": parsed["selector"], **window})
    assert status == 200 and answer["status"] == "success", (definition, status, answer)
    return answer["data"]


def resolve_variables(hub: str, dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Each query variable's values, in order (a later one may use an earlier one), through its `regex`
    (Grafana's: /pattern/, the first group is the value): all of them for a multi-value variable with
    All, else the first, as Grafana selects on a dashboard's first load."""
    values: dict[str, list[str]] = {}
    for variable in variables(dashboard):
        if variable["type"] != "query":
            continue
        found = label_values(hub, substitute(variable["query"]["query"], values))
        if variable.get("regex"):
            pattern = re.compile(variable["regex"].strip("/"))
            found = sorted({m.group(1) for m in map(pattern.search, found) if m})
        assert found, f"{dashboard['uid']}: variable {variable['name']} lists no value on the demo's store"
        values[variable["name"]] = found if variable.get("includeAll") else found[:1]
    return values


@pytest.fixture(scope="module")
def demo_hub(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A hub on the store of the demo's fleet (fleetlens/demo/fleet.yaml) played offline for PLAYED_S."""
    scenario = load_scenario(SCENARIO)
    scenario = dataclasses.replace(scenario.until(PLAYED_S), duration_s=PLAYED_S)
    work = tmp_path_factory.mktemp("grafana")
    with Store.open(f"chdb://{chdb_dir}", database=f"test_{uuid.uuid4().hex[:12]}") as store:
        simulate_offline(scenario, store, work, EPOCH)
        hub = Hub(store, Writer(store, Spool(work / "spool", 1 << 20)), OtlpStepReceiver())
        with on_loopback(hub) as url:
            yield url


def test_the_three_dashboards_are_there_with_their_own_uids():
    assert set(DASHBOARDS) == {"fleet", "node", "job"}
    assert len({dashboard["uid"] for dashboard in DASHBOARDS.values()}) == len(DASHBOARDS)


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_has_the_structure_grafana_imports(name: str):
    dashboard = DASHBOARDS[name]
    jsonschema.validate(dashboard, DASHBOARD_SCHEMA)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), f"{name}: panel ids repeat: {ids}"
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, f"{name}: {panel['title']} leaves the 24-column grid"
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{name}: {panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_reads_the_datasource_variable_with_a_unit(name: str):
    dashboard = DASHBOARDS[name]
    datasource = variables(dashboard)[0]
    assert (datasource["name"], datasource["type"], datasource["query"]) == (
        "datasource",
        "datasource",
        "prometheus",
    )
    for panel in queried_panels(dashboard):
        assert panel["datasource"] == DATASOURCE, f"{name}: {panel['title']}"
        assert all(target["datasource"] == DATASOURCE for target in panel["targets"]), panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{name}: {panel['title']} has no unit"
    for variable in variables(dashboard)[1:]:
        assert variable["datasource"] == DATASOURCE, f"{name}: variable {variable['name']}"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_variable_referenced_is_defined(name: str):
    dashboard = DASHBOARDS[name]
    defined = {variable["name"] for variable in variables(dashboard)}
    queries = [variable["query"] for variable in variables(dashboard)]
    used = referenced(json.dumps(dashboard["panels"])) | referenced(json.dumps(queries))
    undefined = used - defined - set(BUILTINS) - LINK_BUILTINS
    assert not undefined, f"{name}: variables used but not defined: {sorted(undefined)}"


def test_a_reference_to_an_undefined_variable_is_found():
    """The check above can fail: a panel naming a variable nobody defined is caught."""
    assert referenced('rate(x{node="$nodes"}[$__rate_interval]) ${gpu:regex} [[rank]]') == {
        "nodes",
        "__rate_interval",
        "gpu",
        "rank",
    }


def test_several_values_become_one_escaped_regular_expression():
    assert substitute('x{node=~"$n"}', {"n": ["demo-1", "a.b"]}) == 'x{node=~"(demo-1|a\\\\.b)"}'
    assert substitute('x{node="$n"}[$__rate_interval]', {"n": ["demo-1"]}) == 'x{node="demo-1"}[1m]'


@pytest.fixture(scope="module")
def demo_variables(demo_hub: str) -> dict[str, dict[str, list[str]]]:
    """Each dashboard's variables resolved on the demo's store, as a first load of it would."""
    return {name: resolve_variables(demo_hub, dashboard) for name, dashboard in DASHBOARDS.items()}


PANEL_TARGETS = [
    pytest.param(name, panel["id"], target["refId"], id=f"{name}:{panel['id']}{target['refId']}")
    for name, dashboard in sorted(DASHBOARDS.items())
    for panel in queried_panels(dashboard)
    for target in panel["targets"]
]


@pytest.mark.parametrize(("name", "panel_id", "ref_id"), PANEL_TARGETS)
def test_every_panel_expression_returns_data_from_the_demo_store(
    demo_hub: str, demo_variables: dict[str, dict[str, list[str]]], name: str, panel_id: int, ref_id: str
):
    panel = next(panel for panel in DASHBOARDS[name]["panels"] if panel["id"] == panel_id)
    target = next(target for target in panel["targets"] if target["refId"] == ref_id)
    expr = substitute(target["expr"], demo_variables[name])
    data = query_range(demo_hub, expr)
    assert data["resultType"] == "matrix", expr
    assert data["result"] and all(s["values"] for s in data["result"]), f"{panel['title']}: no data: {expr}"

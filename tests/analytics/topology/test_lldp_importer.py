"""lldpcli -f json0 show neighbors: lldpd's own expected output, the caller's host, hostile documents."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from analytics.errors import TopologyError
from analytics.topology.importers import lldp
from analytics.topology.model import Entity, Kind, Link

FIXTURES = Path(__file__).parents[2] / "fixtures" / "topology"
JSON0 = (FIXTURES / "lldp-lldpd-json0-neighbors.json").read_text()
PF = Entity(Kind.PF, "host-005/eth0")


def test_the_pf_sits_under_the_neighbor_chassis_and_its_host() -> None:
    assert lldp.parse(JSON0, "/spool/host-005.json") == [
        Link(PF, Entity(Kind.LEAF, "ns-2.example.com")),
        Link(PF, Entity(Kind.HOST, "host-005")),
    ]
    assert lldp.neighbors(JSON0, "host-005.json") == [
        lldp.Neighbor("eth0", "ns-2.example.com", "00:00:00:00:00:02")
    ]


def test_a_command_source_takes_its_host_from_the_caller() -> None:
    parse = functools.partial(lldp.parse, host="hv-17")
    assert Link(Entity(Kind.PF, "hv-17/eth0"), Entity(Kind.HOST, "hv-17")) in parse(
        JSON0, "lldpcli -f json0 show neighbors"
    )


def test_a_neighbor_without_a_name_is_known_by_its_chassis_id_and_no_neighbor_is_no_link() -> None:
    document = json.loads(JSON0)
    del document["lldp"][0]["interface"][0]["chassis"][0]["name"]
    assert Link(PF, Entity(Kind.LEAF, "00:00:00:00:00:02")) in lldp.parse(
        json.dumps(document), "host-005.json"
    )
    assert lldp.parse('{"lldp": [{}]}', "host-005.json") == []


def _with(path: list[object], value: object) -> str:
    document = json.loads(JSON0)
    holder = document
    for key in path[:-1]:
        holder = holder[key]  # type: ignore[index]
    holder[path[-1]] = value  # type: ignore[index]
    return json.dumps(document)


INTERFACE: list[object] = ["lldp", 0, "interface", 0]


@pytest.mark.parametrize(
    ("text", "where", "fault"),
    [
        (JSON0[:200], "line ", "not JSON"),
        ('{"lldp": {}}', "$.lldp", "not list"),
        (_with([*INTERFACE, "name"], None), "$.lldp[0].interface[0].name", "text"),
        (_with([*INTERFACE, "name"], "eth0\r\nInjected: yes"), "$.lldp[0].interface[0].name", "control"),
        (_with([*INTERFACE, "chassis"], [{}]), "$.lldp[0].interface[0].chassis[0]", "neither a name nor"),
        (_with([*INTERFACE, "chassis"], "leaf"), "$.lldp[0].interface[0].chassis", "not list"),
        (
            _with([*INTERFACE, "chassis", 0, "name"], [{"value": 5}]),
            "$.lldp[0].interface[0].chassis[0].name[0]",
            "text",
        ),
    ],
)
def test_hostile_documents_are_refused_naming_the_json_path(text: str, where: str, fault: str) -> None:
    with pytest.raises(TopologyError, match=fault) as caught:
        lldp.parse(text, "host-005.json")
    assert caught.value.where.startswith(where)

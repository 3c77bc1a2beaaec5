"""A host agent's report as Links: its sysfs, libvirt and lldp parts joined on one host's names, built on
libvirt's and lldpd's own files; hostile reports refused whole, naming the JSON path."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics.errors import TopologyError
from analytics.topology.importers import host_agent, parser_of
from analytics.topology.model import Entity, Kind, Link, Source

FIXTURES = Path(__file__).parents[2] / "fixtures" / "topology"
DOMAIN_XML = (FIXTURES / "libvirt-hostdev-pci-address.xml").read_text()  # QEMUGuest2, hostdev 0000:06:12.5
LLDP_JSON0 = (FIXTURES / "lldp-lldpd-json0-neighbors.json").read_text()  # eth0 -> ns-2.example.com
REPORT = {
    "version": 1,
    "host": "hv-01",
    "pfs": [{"name": "eth0", "pci": "0000:06:00.0", "vfs": ["0000:06:12.4", "0000:06:12.5"]}],
    "domains": [{"name": "QEMUGuest2", "xml": DOMAIN_XML}],
    "lldp": LLDP_JSON0,
    "errors": {},
}
NODE = Entity(Kind.NODE, "QEMUGuest2")
HOST = Entity(Kind.HOST, "hv-01")
PF = Entity(Kind.PF, "hv-01/eth0")
VF = Entity(Kind.VF, "hv-01/0000:06:12.5")
DOMAIN = Entity(Kind.DOMAIN, "c7a5fdbd-edaf-9466-926a-d65c16db1809")  # QEMUGuest2's <uuid>


def _parse(report: dict[str, Any]) -> list[Link]:
    return host_agent.parse(json.dumps(report), "host-agent hv-01")


def test_a_report_places_the_vm_under_its_vf_its_pf_under_the_leaf_and_all_under_the_host() -> None:
    assert set(_parse(REPORT)) == {
        Link(Entity(Kind.VF, "hv-01/0000:06:12.4"), PF),
        Link(VF, PF),
        Link(PF, HOST),
        Link(NODE, HOST),
        Link(NODE, VF),  # a plain <hostdev>: a VF because sysfs lists it under a PF
        Link(DOMAIN, HOST),
        Link(DOMAIN, VF),
        Link(PF, Entity(Kind.LEAF, "ns-2.example.com")),
    }


def test_parts_left_out_give_what_the_rest_says() -> None:
    report = {
        "version": 1,
        "host": "hv-01",
        "domains": REPORT["domains"],
        "errors": {"lldp": "not installed"},
    }
    gpu = Entity(Kind.GPU, "hv-01/0000:06:12.5")
    assert _parse(report) == [Link(NODE, HOST), Link(NODE, gpu), Link(DOMAIN, HOST), Link(DOMAIN, gpu)]
    assert _parse({"version": 1, "host": "hv-01"}) == []


def test_host_agent_is_a_format_stored_as_the_host_agent_source() -> None:
    assert parser_of("host-agent") == (host_agent.parse, Source.HOST_AGENT)


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict], None]:
    def change(report: dict) -> None:
        holder = report
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "where", "what"),
    [
        (_set(("version",), "1"), "$.version", "version 1"),
        (_set(("version",), True), "$.version", "version 1"),
        (_set(("host",), 7), "$.host", "text"),
        (_set(("host",), "hv-01\nFORGED"), "$.host", "control"),
        (_set(("host",), "h" * 100_000), "$.host", "over"),
        (_set(("extra",), 1), "$", "unknown key 'extra'"),
        (_set(("pfs",), {"eth0": []}), "$.pfs", "not list"),
        (_set(("pfs", 0, "name"), "eth/0"), "$.pfs[0].name", "not a network interface name"),
        (_set(("pfs", 0, "name"), "enp59s0f0np0v123"), "$.pfs[0].name", "not a network interface name"),
        (_set(("pfs", 0, "pci"), "06:00.0"), "$.pfs[0].pci", "not a PCI address"),
        (_set(("pfs", 0, "vfs", 1), "0000:06:12.4"), "$.pfs[0].vfs[1]", "given twice"),
        (_set(("pfs", 0, "vfs", 0), ["0000:06:12.4"]), "$.pfs[0].vfs[0]", "not a PCI address"),
        (_set(("domains", 0, "name"), "QEMUGuest3"), "$.domains[0].xml", "names domain 'QEMUGuest2'"),
        (_set(("domains", 0, "xml"), None), "$.domains[0].xml", "not str"),
        (
            _set(("domains", 0, "xml"), '<!DOCTYPE d [<!ENTITY x "y">]><domain><name>&x;</name></domain>'),
            "$.domains[0].xml line 1",
            "DOCTYPE",
        ),
        (_set(("lldp",), {"lldp": []}), "$.lldp", "not str"),
        (
            _set(("lldp",), '{"lldp": [{"interface": [{"name": 7}]}]}'),
            "$.lldp $.lldp[0].interface[0].name",
            "text",
        ),
        (_set(("errors",), {"kernel": "x"}), "$.errors", "not a part"),
        (_set(("errors",), {"lldp": "a\nb"}), "$.errors.lldp", "one-line reason"),
    ],
)
def test_a_hostile_report_is_refused_whole_naming_its_json_path(
    change: Callable[[dict], None], where: str, what: str
) -> None:
    report = copy.deepcopy(REPORT)
    change(report)
    with pytest.raises(TopologyError) as refused:
        _parse(report)
    assert refused.value.source == "host-agent hv-01"
    assert refused.value.where == where
    assert what in refused.value.what


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
FIELDS = [
    ("version",),
    ("host",),
    ("pfs",),
    ("pfs", 0),
    ("pfs", 0, "name"),
    ("pfs", 0, "vfs"),
    ("domains", 0),
    ("domains", 0, "xml"),
    ("lldp",),
    ("errors",),
]


@given(field=st.sampled_from(FIELDS), value=JSON_VALUES)
def test_any_json_in_any_field_is_read_or_refused_with_a_topology_error(field: tuple, value: Any) -> None:
    report = copy.deepcopy(REPORT)
    _set(field, value)(report)
    try:
        links = _parse(report)
    except TopologyError as refused:
        assert refused.where.startswith("$")
    else:
        assert all(isinstance(link, Link) for link in links)

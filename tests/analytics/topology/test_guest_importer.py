"""A guest's own report as Links, joined through its DMI product_uuid to the host agent's report of the
libvirt domain (libvirt's own hostdev test XML) although the domain is named otherwise; hostile reports
refused whole, naming the JSON path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics.errors import TopologyError
from analytics.store import Store
from analytics.topology.importers import guest, imported, parser_of
from analytics.topology.model import Entity, Kind, Link, Source
from analytics.topology.view import node_views
from collectors.guestreport import guest_report
from tests.analytics.topology.test_host_agent_importer import REPORT as HOST_REPORT
from tests.analytics.topology.test_host_agent_importer import _set as set_at
from tests.collectors.test_guestreport import DOMAIN_UUID, captured_guest, with_vf, write

NODE = Entity(Kind.NODE, "vela-001")
REPORT = {
    "version": 1,
    "node": "vela-001",
    "product_uuid": DOMAIN_UUID,  # QEMUGuest2's <uuid> in libvirt's hostdev test XML
    "nics": [{"rdma": "mlx5_0", "pci": "0000:00:07.0", "netdev": "ens7", "mac": "02:fc:00:00:00:02"}],
    "gpus": [{"pci": "0000:00:06.0", "device": "0x2335"}],
    "errors": {"class/net/ens8/address": "'zz' is not what the kernel writes there"},
}


def _parse(report: dict[str, Any]) -> list[Link]:
    return guest.parse(json.dumps(report), "guest vela-001")


def test_the_collectors_report_gives_the_node_its_vf_gpu_and_domain(tmp_path: Path) -> None:
    root = with_vf(captured_guest(tmp_path))
    write(root / "sys" / "class" / "dmi" / "id" / "product_uuid", DOMAIN_UUID + "\n")
    nic = Entity(Kind.VF, "vela-001/mlx5_0")  # the name a per-node anomaly's "mlx5_0:1" points at
    assert _parse(guest_report(root, "vela-001")) == [
        Link(nic, NODE),  # a device of the node, as the inventory's NICs are
        Link(nic, Entity(Kind.VF, "mac:02:fc:00:00:00:02")),  # what the host's libvirt names it by
        Link(NODE, Entity(Kind.GPU, "vela-001/0000:00:06.0")),
        Link(Entity(Kind.DOMAIN, DOMAIN_UUID), NODE),
    ]
    assert _parse(guest_report(captured_guest(tmp_path / "bare"), "vela-001")) == [
        Link(NODE, Entity(Kind.GPU, "vela-001/0000:00:06.0"))
    ]  # the captured microVM: no DMI, so nothing joins it to a host, and that is no error


def test_guest_is_a_format_stored_as_the_guest_source() -> None:
    assert parser_of("guest") == (guest.parse, Source.GUEST)


def test_the_guest_finds_its_host_and_leaf_through_its_domain_uuid(store: Store) -> None:
    """The host agent reports domain QEMUGuest2 on hv-01, its VF under PF eth0 behind leaf
    ns-2.example.com; the guest calls itself vela-001 and reads the domain's UUID from DMI."""
    host_links = parser_of("host-agent")[0](json.dumps(HOST_REPORT), "hv-01")
    store.replace_links(Source.HOST_AGENT, host_links, 1_767_000_000.0, reporter="hv-01")
    store.replace_links(Source.GUEST, _parse(REPORT), 1_767_000_001.0, reporter="vela-001")
    views = {view["node"]: view for view in node_views(store.topology_at(1_767_000_002.0))}
    assert views["vela-001"] == {"node": "vela-001", "host": "hv-01", "leaf": "ns-2.example.com"}
    assert views["QEMUGuest2"] == {"node": "QEMUGuest2", "host": "hv-01", "leaf": "ns-2.example.com"}


def test_a_uuid_the_guest_could_not_read_this_time_keeps_its_host(store: Store) -> None:
    """product_uuid is readable by root only: a report run without it must not unplace the node."""
    host_links = parser_of("host-agent")[0](json.dumps(HOST_REPORT), "hv-01")
    store.replace_links(Source.HOST_AGENT, host_links, 1_767_000_000.0, reporter="hv-01")

    def report_at(ts: float, report: dict[str, Any]) -> dict:
        said = imported("guest", json.dumps(report), "guest vela-001")
        store.replace_links(said.source, said.links, ts, reporter="vela-001", unsaid=said.unsaid)
        return {view["node"]: view for view in node_views(store.topology_at(ts + 1))}["vela-001"]

    placed = {"node": "vela-001", "host": "hv-01", "leaf": "ns-2.example.com"}
    assert report_at(1_767_000_001.0, REPORT) == placed
    unread = {key: value for key, value in REPORT.items() if key != "product_uuid"}
    denied = {**unread, "errors": {"class/dmi/id/product_uuid": "not readable: Permission denied"}}
    assert report_at(1_767_000_010.0, denied) == placed
    assert report_at(1_767_000_020.0, {**unread, "errors": {}}) == {"node": "vela-001"}


def _changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    report = copy.deepcopy(REPORT)
    set_at(path, value)(report)
    return report


@pytest.mark.parametrize(
    ("path", "value", "where"),
    [
        (("version",), 2, "$.version"),
        (("node",), "vela\n001", "$.node"),
        (("product_uuid",), DOMAIN_UUID.upper(), "$.product_uuid"),
        (("product_uuid",), 7, "$.product_uuid"),
        (("nics", 0, "rdma"), "../mlx5_0", "$.nics[0].rdma"),
        (("nics", 0, "pci"), "00:07.0", "$.nics[0].pci"),
        (("nics", 0, "netdev"), "eth0:1", "$.nics[0].netdev"),
        (("nics", 0, "mac"), "03:fc:00:00:00:02", "$.nics[0].mac"),  # multicast: never a NIC's own
        (("nics", 0, "vlan"), 7, "$.nics[0]"),
        (("nics",), [REPORT["nics"][0], REPORT["nics"][0]], "$.nics[1]"),
        (("gpus", 0, "device"), "0x2335\x1b", "$.gpus[0].device"),
        (("gpus",), {"pci": "0000:00:06.0"}, "$.gpus"),
        (("errors", "class/net/x"), "two\nlines", "$.errors.class/net/x"),
        (("errors", "a\x00b"), "reason", "$.errors"),
        (("extra",), 1, "$"),
    ],
)
def test_a_hostile_report_is_refused_whole_naming_the_json_path(path: tuple, value: Any, where: str) -> None:
    with pytest.raises(TopologyError) as refused:
        _parse(_changed(path, value))
    assert refused.value.where == where


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@given(key=st.sampled_from(sorted(REPORT)), value=_JSON)
def test_any_value_of_any_field_gives_links_or_a_topology_error(key: str, value: Any) -> None:
    try:
        links = _parse({**REPORT, key: value})
    except TopologyError as exc:
        assert exc.where.startswith("$")
    else:
        assert all(isinstance(link, Link) for link in links)

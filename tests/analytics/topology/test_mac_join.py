"""A guest's NIC joined to its host's VF by MAC, end to end through the store: libvirt's own
net-hostdev test domain sets MAC 00:11:22:33:44:55 on host VF 2424:21:1c.6; the guest reports a NIC
with that MAC, so that NIC (not only its node) sits under the VF's PF and the PF's leaf. Hostile MACs
refused, naming where."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics.errors import TopologyError
from analytics.store import Store
from analytics.topology.importers import guest, imported, libvirt
from analytics.topology.model import Kind
from analytics.topology.view import members, node_views

FIXTURES = Path(__file__).parents[2] / "fixtures" / "topology"
DOMAIN_XML = (FIXTURES / "libvirt-net-hostdev-multidomain.xml").read_text()
LLDP_JSON0 = (FIXTURES / "lldp-lldpd-json0-neighbors.json").read_text()  # eth0 -> ns-2.example.com
MAC = "00:11:22:33:44:55"  # the <mac> of the domain's <interface type='hostdev'>
HOST_REPORT = {
    "version": 1,
    "host": "hv-01",
    "pfs": [{"name": "eth0", "pci": "2424:21:00.0", "vfs": ["2424:21:1c.6", "2424:21:1c.7"]}],
    "domains": [{"name": "QEMUGuest1", "xml": DOMAIN_XML}],
    "lldp": LLDP_JSON0,
}
NIC = {"rdma": "mlx5_0", "pci": "0000:00:07.0", "netdev": "ens7", "mac": MAC}
UNKNOWN_NIC = {"rdma": "mlx5_1", "pci": "0000:00:08.0", "netdev": "ens8", "mac": "02:fc:00:00:00:03"}
GUEST_REPORT = {"version": 1, "node": "vela-001", "nics": [NIC, UNKNOWN_NIC]}  # no DMI: the MAC alone
PF = "hv-01/eth0"


def _report(store: Store, format_name: str, report: dict[str, Any], reporter: str, ts: float) -> None:
    """Store `report` as the hub does: its links, replacing what `reporter` said before."""
    said = imported(format_name, json.dumps(report), reporter)
    store.replace_links(said.source, said.links, ts, reporter=reporter, unsaid=said.unsaid)


def _placed(store: Store, ts: float) -> tuple[dict[str, Any], set[str]]:
    """vela-001's view at `ts`, and the units under its host's PF."""
    edges = store.topology_at(ts)
    views = {view["node"]: view for view in node_views(edges)}
    return views.get("vela-001", {}), members(edges)[Kind.PF].get(PF, set())


def test_a_guest_nic_sits_under_the_pf_and_leaf_of_the_host_vf_with_its_mac(store: Store) -> None:
    _report(store, "host-agent", HOST_REPORT, "hv-01", 1_767_000_000.0)
    _report(store, "guest", GUEST_REPORT, "vela-001", 1_767_000_001.0)
    view, under_pf = _placed(store, 1_767_000_002.0)
    assert view == {"node": "vela-001", "host": "hv-01", "leaf": "ns-2.example.com"}
    # NIC granularity: mlx5_0 is on that PF; mlx5_1, whose MAC no host sets, is not
    assert {unit for unit in under_pf if unit.startswith("vela-001/")} == {"vela-001/mlx5_0"}


def test_a_nic_of_a_vm_named_as_its_domain_counts_once_under_the_pf(store: Store) -> None:
    """The host names the VM's VF by its host PCI address (node -> VF: the VM sits on it), the guest names
    its NIC as its anomalies do (VF "vela-001/mlx5_0" -> node: a device of the node): only the latter is
    a unit, so the PF holds the one NIC once, by the name a NIC anomaly hits."""
    same_name = DOMAIN_XML.replace("<name>QEMUGuest1</name>", "<name>vela-001</name>")
    host_report = {**HOST_REPORT, "domains": [{"name": "vela-001", "xml": same_name}]}
    _report(store, "host-agent", host_report, "hv-01", 1_767_000_000.0)
    _report(store, "guest", GUEST_REPORT, "vela-001", 1_767_000_001.0)
    view, under_pf = _placed(store, 1_767_000_002.0)
    assert view == {"node": "vela-001", "host": "hv-01", "leaf": "ns-2.example.com"}
    assert under_pf == {"vela-001/mlx5_0"}


def test_a_mac_the_guest_could_not_read_this_time_keeps_the_nic_placed(store: Store) -> None:
    _report(store, "host-agent", HOST_REPORT, "hv-01", 1_767_000_000.0)
    _report(store, "guest", GUEST_REPORT, "vela-001", 1_767_000_001.0)
    unread = {key: value for key, value in NIC.items() if key != "mac"}
    refused = {**GUEST_REPORT, "nics": [unread], "errors": {"class/net/ens7/address": "'zz' is not a MAC"}}
    _report(store, "guest", refused, "vela-001", 1_767_000_010.0)
    assert "vela-001/mlx5_0" in _placed(store, 1_767_000_011.0)[1]
    _report(store, "guest", {**GUEST_REPORT, "nics": [unread]}, "vela-001", 1_767_000_020.0)
    assert _placed(store, 1_767_000_021.0) == ({"node": "vela-001"}, set())  # the join ended


def test_a_failed_virsh_keeps_the_mac_join_and_a_domain_gone_ends_it(store: Store) -> None:
    _report(store, "host-agent", HOST_REPORT, "hv-01", 1_767_000_000.0)
    _report(store, "guest", GUEST_REPORT, "vela-001", 1_767_000_001.0)
    failed = {**HOST_REPORT, "domains": [], "errors": {"domains": "virsh: cannot connect"}}
    _report(store, "host-agent", failed, "hv-01", 1_767_000_010.0)
    assert "vela-001/mlx5_0" in _placed(store, 1_767_000_011.0)[1]
    _report(store, "host-agent", {**HOST_REPORT, "domains": []}, "hv-01", 1_767_000_020.0)
    assert _placed(store, 1_767_000_021.0)[0] == {"node": "vela-001"}


def test_either_case_names_one_vf() -> None:
    assert libvirt.mac_vf("52:54:00:6D:90:02", "x", "y") == "mac:52:54:00:6d:90:02"
    upper = {**GUEST_REPORT, "nics": [{**UNKNOWN_NIC, "mac": "02:FC:00:00:00:03"}]}
    lower = {**GUEST_REPORT, "nics": [UNKNOWN_NIC]}
    assert guest.parse(json.dumps(upper), "g") == guest.parse(json.dumps(lower), "g")


def test_an_ipoib_address_is_accepted_and_joins_nothing() -> None:
    ipoib = ":".join(["80", "00", "02", "08", "fe", "80"] + ["00"] * 14)
    links = guest.parse(json.dumps({**GUEST_REPORT, "nics": [{**NIC, "mac": ipoib}]}), "g")
    assert [link.parent.kind for link in links] == [Kind.NODE]


HOSTILE_MACS = [
    "00:11:22:33:44",  # five octets
    "00:11:22:33:44:55:66",
    "00-11-22-33-44-55",
    "0011.2233.4455",
    "01:00:5e:00:00:01",  # multicast
    "ff:ff:ff:ff:ff:ff",  # broadcast
    "00:00:00:00:00:00",
    "00:11:22:33:44:5\x1b",
    "00:11:22:33:44:55\n",
    "００:11:22:33:44:55",  # fullwidth digits
    "",
]


@pytest.mark.parametrize("mac", HOSTILE_MACS)
def test_a_hostile_mac_in_the_guest_report_is_refused_naming_the_json_path(mac: str) -> None:
    with pytest.raises(TopologyError) as refused:
        guest.parse(json.dumps({**GUEST_REPORT, "nics": [{**NIC, "mac": mac}]}), "guest vela-001")
    assert refused.value.where == "$.nics[0].mac"


@pytest.mark.parametrize("mac", HOSTILE_MACS)
def test_a_hostile_mac_in_the_domain_xml_is_refused_naming_the_element(mac: str) -> None:
    escaped = mac.replace("\x1b", "&#x1b;").replace("\n", "&#10;")
    xml = DOMAIN_XML.replace(MAC, escaped)
    with pytest.raises(TopologyError) as refused:
        libvirt.parse(xml, "QEMUGuest1.xml", host="hv-01")
    assert refused.value.where.startswith(("/domain/devices/interface[1]/mac", "line "))


def test_a_mac_element_without_its_address_is_refused() -> None:
    with pytest.raises(TopologyError) as refused:
        libvirt.parse(DOMAIN_XML.replace(f"<mac address='{MAC}'/>", "<mac/>"), "QEMUGuest1.xml")
    assert refused.value.where == "/domain/devices/interface[1]/mac"


_OCTETS = st.lists(st.integers(0, 255), min_size=6, max_size=6).filter(lambda o: not o[0] & 1 and any(o))


@given(octets=_OCTETS, upper=st.lists(st.booleans(), min_size=6, max_size=6))
def test_host_and_guest_name_any_unicast_mac_alike_in_any_case(octets: list[int], upper: list[bool]) -> None:
    lower = ":".join(f"{octet:02x}" for octet in octets)
    written = ":".join(part.upper() if up else part for part, up in zip(lower.split(":"), upper, strict=True))
    host_links = libvirt.parse(DOMAIN_XML.replace(MAC, written), "hv-01.xml")
    guest_links = guest.parse(json.dumps({**GUEST_REPORT, "nics": [{**NIC, "mac": lower}]}), "g")
    (host_side,) = [link.child for link in host_links if link.child.kind is Kind.VF]
    (guest_side,) = [link.parent for link in guest_links if link.parent.kind is Kind.VF]
    assert host_side == guest_side
    assert host_side.name == f"mac:{lower}"


@given(text=st.text(max_size=24))
def test_any_text_is_a_normalized_mac_or_a_topology_error(text: str) -> None:
    try:
        name = libvirt.mac_vf(text, "x", "$.mac")
    except TopologyError as exc:
        assert exc.where == "$.mac"
    else:
        assert name == f"mac:{text.lower()}" and name.isascii() and len(name) == len("mac:") + 17

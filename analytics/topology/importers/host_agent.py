"""A host agent's report (`fleetlens host-agent`, collectors/hostagent.py) as Links: what one hypervisor
sees of its PFs, VFs, VMs and leaves.

The report is one JSON object (docs/topology.md, "The host agent"):
`{"version": 1, "host": "hv-01", "pfs": [{"name": "ens1f0", "pci": "0000:3b:00.0", "vfs": ["0000:3b:02.0"]}],
"domains": [{"name": "vm-1", "xml": "<domain>..."}], "lldp": "<lldpcli -f json0 show neighbors>",
"errors": {"lldp": "lldpcli is not installed"}}`; each of pfs, domains, lldp and errors may be absent.

Links: VF -> PF and PF -> host from `pfs` (a PF named "<host>/<interface>" as the lldp importer names it,
a VF "<host>/<pci address>" as the libvirt importer does); from each domain's XML, by the libvirt
importer with `host=` and `vfs=` every VF of `pfs`, node -> host, node -> each VF and GPU it holds and
VF "mac:<mac>" -> the VF a hostdev interface sets that MAC on;
from `lldp`, by the lldp importer with `host=`, PF -> leaf and PF -> host.

A part the agent reports as failed (a key of `errors`) leaves that part's links as the store held them
(read): when lldpcli or virsh fails once, the host's PF -> leaf or VM -> host links stay in force until
a report that has the part says otherwise. A part with some domains read and others failed keeps every
domain link it no longer gives, until a report without that error.

Hostile input, refused whole with a TopologyError naming the JSON path: unknown keys, wrong types, a
version other than 1, names the allowlist refuses (names.checked_name), an interface name Linux would
refuse, a PCI address not written as sysfs writes one, a PF or VF given twice, a domain whose XML names
another domain, and whatever the libvirt and lldp importers refuse in their parts (their where prefixed
with the part's path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from analytics.errors import TopologyError
from analytics.topology.importers import libvirt, lldp
from analytics.topology.importers._input import (
    agent_report,
    expect,
    interface_name,
    object_keys,
    pci_address,
    reasons,
)
from analytics.topology.model import Kind, Link
from analytics.topology.names import checked_link, checked_name, host_scoped, shown

REPORT_VERSION = 1
_REPORT_KEYS = frozenset({"version", "host", "pfs", "domains", "lldp", "errors"})
_PF_KEYS = frozenset({"name", "pci", "vfs"})
_DOMAIN_KEYS = frozenset({"name", "xml"})
PARTS = ("pfs", "domains", "lldp")
T = TypeVar("T")


def _nested(parse: Callable[[], T], source: str, path: str) -> T:
    """What `parse` returns; its TopologyError re-raised with `path` (the part's JSON path) before where."""
    try:
        return parse()
    except TopologyError as exc:
        raise TopologyError(source, f"{path} {exc.where}", exc.what) from None


def _pf_links(pfs: Any, host: str, source: str) -> tuple[list[Link], set[str]]:
    """VF -> PF and PF -> host Links of the report's `pfs`, and every VF's address."""
    links: list[Link] = []
    interfaces: set[str] = set()
    vfs: set[str] = set()
    for i, item in enumerate(expect(pfs, list, source, "$.pfs")):
        path = f"$.pfs[{i}]"
        pf = object_keys(item, _PF_KEYS, _PF_KEYS, source, path)
        name = interface_name(pf["name"], source, f"{path}.name")
        pci_address(pf["pci"], source, f"{path}.pci")
        if name in interfaces:
            raise TopologyError(source, f"{path}.name", f"PF {shown(name)} is given twice")
        interfaces.add(name)
        pf_entity = (Kind.PF, host_scoped(host, name))
        links.append(checked_link(pf_entity, (Kind.HOST, host), source=source, where=f"{path}.name"))
        for j, raw in enumerate(expect(pf["vfs"], list, source, f"{path}.vfs")):
            address = pci_address(raw, source, f"{path}.vfs[{j}]")
            if address in vfs:
                raise TopologyError(source, f"{path}.vfs[{j}]", f"VF {address} is given twice")
            vfs.add(address)
            vf = (Kind.VF, host_scoped(host, address))
            links.append(checked_link(vf, pf_entity, source=source, where=f"{path}.vfs[{j}]"))
    return links, vfs


def _domain_links(domains: Any, host: str, vfs: set[str], source: str) -> list[Link]:
    """node -> host and node -> device Links of each domain's XML (the libvirt importer's)."""
    links = []
    for i, item in enumerate(expect(domains, list, source, "$.domains")):
        path = f"$.domains[{i}]"
        domain = object_keys(item, _DOMAIN_KEYS, _DOMAIN_KEYS, source, path)
        name = checked_name(domain["name"], source=source, where=f"{path}.name")
        xml = expect(domain["xml"], str, source, f"{path}.xml")
        said = _nested(lambda: libvirt.read_domain(xml, source), source, f"{path}.xml").name  # noqa: B023
        if said != name:
            raise TopologyError(source, f"{path}.xml", f"names domain {shown(said)}, not {shown(name)}")
        links += _nested(lambda: libvirt.parse(xml, source, host=host, vfs=vfs), source, f"{path}.xml")  # noqa: B023
    return links


def parse(text: str, source_name: str) -> list[Link]:
    """Every Link a host agent's report `text` gives (module docstring), without repeats."""
    return read(text, source_name)[0]


def read(text: str, source_name: str) -> tuple[list[Link], Callable[[Link], bool]]:
    """The Links of report `text` (parse), and which links it does not speak for: those a part the agent
    reported as failed (`errors`) would give, which the store keeps in force as they were (a transient
    lldpcli or virsh failure must not end the host's PF -> leaf or VM -> host links)."""
    report = agent_report(text, source_name, _REPORT_KEYS, "host", REPORT_VERSION)
    host = checked_name(report["host"], source=source_name, where="$.host")
    reasons(report.get("errors", {}), source_name, PARTS)
    links, vfs = _pf_links(report.get("pfs", []), host, source_name)
    links += _domain_links(report.get("domains", []), host, vfs, source_name)
    if "lldp" in report:
        lldp_text = expect(report["lldp"], str, source_name, "$.lldp")
        links += _nested(lambda: lldp.parse(lldp_text, source_name, host=host), source_name, "$.lldp")
    failed = frozenset(report.get("errors", {}))
    return list(dict.fromkeys(links)), lambda link: not failed.isdisjoint(_parts_saying(link))


def _parts_saying(link: Link) -> frozenset[str]:
    """The parts of a report that give a link of `link`'s shape: a VM's (or its domain UUID's) links
    and a MAC's VF come from `domains`, a PF's leaf from `lldp`, a VF's PF from `pfs`, a PF's host from
    both."""
    if link.child.kind in (Kind.NODE, Kind.DOMAIN) or link.parent.kind is Kind.VF:
        return frozenset({"domains"})
    if link.parent.kind is Kind.LEAF:
        return frozenset({"lldp"})
    return frozenset({"pfs", "lldp"}) if link.child.kind is Kind.PF else frozenset({"pfs"})

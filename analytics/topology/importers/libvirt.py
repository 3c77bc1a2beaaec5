"""A libvirt domain's XML (`virsh dumpxml DOMAIN`, run on its hypervisor) as Links: the VM on its host,
and under the PCI devices passed through to it.

Read: the domain's <name> and <uuid> (the UUID a guest reads as its DMI product_uuid, how the guest's
own report is matched to it), each `<hostdev mode='subsystem' type='pci'>` and each
`<interface type='hostdev'>`, by their <source><address domain= bus= slot= function=/></source>. Other
hostdevs (USB, SCSI, mdev) are not PCI functions of the host and are skipped.

The XML does not name the host, so the caller does (names.caller_host): the `host` argument, else the
file's name without its suffix. A device is named "<host>/<dddd:bb:ss.f>" (names.host_scoped), the
address as sysfs writes it. It is a VF when it is an <interface type='hostdev'> or its address is in
`vfs` (the host agent knows them from /sys/class/net/<pf>/device/virtfn*); any other PCI hostdev is
taken for a GPU, as the XML does not say what a device is. Links: node (the domain's name) -> host, and
node -> each device it holds (the VM sits below the VF and GPU it uses, as the VF sits below its PF).
A domain with a <uuid> gets the same links once more from its `domain` entity (Kind.DOMAIN, the UUID):
the guest's own report puts that entity under the guest's node (importers.guest), so a guest whose node
name is not the domain's name still reaches its host, VFs, PFs and leaf (view.layers_above walks a kind
once, and a node's own kind is taken, so the join cannot go through the domain's node).

Refused whole, naming the element: not XML, any DOCTYPE (entities are never declared, expanded or
fetched), a root other than <domain>, no <name>, a <uuid> that is not a UUID, an address field missing
or out of range.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from xml.etree.ElementTree import Element

from analytics.errors import TopologyError
from analytics.topology.importers._input import load_xml
from analytics.topology.model import Kind, Link
from analytics.topology.names import caller_host, checked_link, checked_name, host_scoped, shown

_ADDRESS_FIELDS = (("domain", 0xFFFF, 4), ("bus", 0xFF, 2), ("slot", 0x1F, 2), ("function", 0x7, 1))


@dataclass(frozen=True)
class Domain:
    """What a domain's XML says of its place: `name`, `uuid` (None when absent), and the PCI addresses it
    holds, `network` ones (<interface type='hostdev'>, a VF) apart from `other` hostdevs."""

    name: str
    uuid: str | None
    network: tuple[str, ...]
    other: tuple[str, ...]


def _pci_address(address: Element, source: str, where: str) -> str:
    """A libvirt <address domain='0x0000' bus='0x06' slot='0x12' function='0x5'/> as "0000:06:12.5"."""
    parts = []
    for field, highest, width in _ADDRESS_FIELDS:
        raw = address.get(field, "0x0" if field == "domain" else None)
        if raw is None:
            raise TopologyError(source, where, f"the address has no {field}")
        try:
            value = int(raw, 0)
        except ValueError:
            raise TopologyError(source, where, f"{field}={shown(raw)} is not a number") from None
        if not 0 <= value <= highest:
            raise TopologyError(source, where, f"{field}={shown(raw)} is out of range")
        parts.append(f"{value:0{width}x}")
    return f"{parts[0]}:{parts[1]}:{parts[2]}.{parts[3]}"


def _sources(devices: Element | None, tag: str, kind: str, source: str) -> tuple[str, ...]:
    """The PCI source addresses of `devices`' <tag type=`kind`> elements, in document order."""
    found = []
    for i, device in enumerate(devices.findall(tag) if devices is not None else [], start=1):
        if device.get("type") != kind:
            continue
        where = f"/domain/devices/{tag}[{i}]/source/address"
        address = device.find("source/address")
        if address is None:
            raise TopologyError(source, where, "a PCI device without its source address")
        found.append(_pci_address(address, source, where))
    return tuple(found)


def read_domain(text: str, source_name: str) -> Domain:
    """The Domain `virsh dumpxml` output `text` describes (module docstring)."""
    root = load_xml(text, source_name)
    if root.tag != "domain":
        raise TopologyError(source_name, f"/{root.tag}", "the root element is not <domain>")
    name = checked_name((root.findtext("name") or "").strip(), source=source_name, where="/domain/name")
    raw_uuid = root.findtext("uuid")
    try:
        domain_uuid = str(uuid.UUID(raw_uuid.strip())) if raw_uuid is not None else None
    except ValueError:
        raise TopologyError(source_name, "/domain/uuid", f"{shown(raw_uuid)} is not a UUID") from None
    devices = root.find("devices")
    return Domain(
        name,
        domain_uuid,
        network=_sources(devices, "interface", "hostdev", source_name),
        other=_sources(devices, "hostdev", "pci", source_name),
    )


def parse(text: str, source_name: str, *, host: str | None = None, vfs: Collection[str] = ()) -> list[Link]:
    """node -> host and node -> device Links of one domain on `host` (module docstring); `vfs` are the
    host's VF addresses ("0000:06:12.5") that a plain <hostdev> may hold."""
    host = caller_host(source_name, host)
    domain = read_domain(text, source_name)
    children = [(Kind.NODE, domain.name)]
    if domain.uuid is not None:
        children.append((Kind.DOMAIN, domain.uuid))
    parents = [(Kind.HOST, host)]
    for address in (*domain.network, *domain.other):
        kind = Kind.VF if address in domain.network or address in vfs else Kind.GPU
        parents.append((kind, host_scoped(host, address)))
    links = [
        checked_link(child, parent, source=source_name, where="/domain")
        for child in children
        for parent in parents
    ]
    return list(dict.fromkeys(links))

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
An <interface type='hostdev'> with a <mac address=/> (libvirt sets that MAC on the VF) also gives VF
"mac:<mac>" (mac_vf) -> the host VF: the guest's report names its NIC by the same MAC (importers.guest),
which puts that NIC, not only its node, under the host VF, its PF and the PF's leaf.
A domain with a <uuid> gets the same links once more from its `domain` entity (Kind.DOMAIN, the UUID):
the guest's own report puts that entity under the guest's node (importers.guest), so a guest whose node
name is not the domain's name still reaches its host, VFs, PFs and leaf (view.layers_above walks a kind
once, and a node's own kind is taken, so the join cannot go through the domain's node).

Refused whole, naming the element: not XML, any DOCTYPE (entities are never declared, expanded or
fetched), a root other than <domain>, no <name>, a <uuid> that is not a UUID, an address field missing
or out of range, a <mac> that is not a unicast Ethernet MAC.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from xml.etree.ElementTree import Element

from analytics.errors import TopologyError
from analytics.topology.importers._input import load_xml
from analytics.topology.model import Kind, Link
from analytics.topology.names import caller_host, checked_link, checked_name, host_scoped, shown

# An Ethernet MAC, either case: what libvirt accepts in <mac address=> and a guest's kernel writes.
_ETHERNET_MAC = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}")
MAC_PREFIX = "mac:"  # a VF named by its MAC, the one name both its host and its guest give it
_ADDRESS_FIELDS = (("domain", 0xFFFF, 4), ("bus", 0xFF, 2), ("slot", 0x1F, 2), ("function", 0x7, 1))


@dataclass(frozen=True)
class Domain:
    """What a domain's XML says of its place: `name`, `uuid` (None when absent), and the PCI addresses it
    holds, `network` ones (<interface type='hostdev'>, a VF) apart from `other` hostdevs, and `macs`:
    (the VF name mac_vf gives, its PCI address) of each network one with a <mac>."""

    name: str
    uuid: str | None
    network: tuple[str, ...]
    other: tuple[str, ...]
    macs: tuple[tuple[str, str], ...] = ()


def mac_vf(value: object, source: str, where: str) -> str:
    """The VF name "mac:<mac>" of MAC `value` ("52:54:00:6D:90:02" -> "mac:52:54:00:6d:90:02"), or a
    TopologyError naming `where` if it is not a unicast Ethernet MAC (6 octets, not all zero, the
    group bit of the first octet clear: libvirt and the kernel refuse others on a NIC)."""
    if not isinstance(value, str) or not _ETHERNET_MAC.fullmatch(value):
        raise TopologyError(source, where, f"{shown(value)} is not a MAC address like '52:54:00:6d:90:02'")
    octets = bytes.fromhex(value.replace(":", ""))
    if octets[0] & 1 or not any(octets):
        raise TopologyError(source, where, f"{shown(value)} is not a unicast MAC address")
    return f"{MAC_PREFIX}{value.lower()}"


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


def _sources(devices: Element | None, tag: str, kind: str, source: str) -> list[tuple[str, str | None]]:
    """The PCI source address of each of `devices`' <tag type=`kind`> elements, in document order, with
    the VF name of its <mac address=> (mac_vf), None where it has none."""
    found = []
    for i, device in enumerate(devices.findall(tag) if devices is not None else [], start=1):
        if device.get("type") != kind:
            continue
        where = f"/domain/devices/{tag}[{i}]"
        address = device.find("source/address")
        if address is None:
            raise TopologyError(source, f"{where}/source/address", "a PCI device without its source address")
        mac = device.find("mac")
        vf = None if mac is None else mac_vf(mac.get("address"), source, f"{where}/mac")
        found.append((_pci_address(address, source, f"{where}/source/address"), vf))
    return found


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
    network = _sources(devices, "interface", "hostdev", source_name)
    return Domain(
        name,
        domain_uuid,
        network=tuple(address for address, _ in network),
        other=tuple(address for address, _ in _sources(devices, "hostdev", "pci", source_name)),
        macs=tuple((vf, address) for address, vf in network if vf is not None),
    )


def parse(text: str, source_name: str, *, host: str | None = None, vfs: Collection[str] = ()) -> list[Link]:
    """node -> host, node -> device and MAC VF -> host VF Links of one domain on `host` (module
    docstring); `vfs` are the
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
    links += [
        checked_link(
            (Kind.VF, vf), (Kind.VF, host_scoped(host, address)), source=source_name, where="/domain"
        )
        for vf, address in domain.macs
    ]
    return list(dict.fromkeys(links))

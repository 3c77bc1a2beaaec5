"""A guest's own report (`fleetlens guest-report`, collectors/guestreport.py) as Links: what a VM sees of
its NICs and GPUs, and the UUID that joins it to what its host reports.

The report is one JSON object (docs/topology.md, "The guest report"):
`{"version": 1, "node": "vela-001", "product_uuid": "c7a5fdbd-...", "nics": [{"rdma": "mlx5_0",
"pci": "0000:00:07.0", "netdev": "ens7", "mac": "02:fc:00:00:00:02"}], "gpus": [{"pci": "0000:00:06.0",
"device": "0x2335"}], "errors": {"<sysfs path>": "<reason>"}}`; product_uuid, nics, gpus, errors and a
NIC's netdev and mac may be absent.

Links: VF "<node>/<rdma device>" -> node for each NIC (the name per-node anomalies' component carries,
"mlx5_0:1"; a device of the node, as the inventory's `nics` are), node -> GPU "<node>/<pci address>",
and, given a product_uuid, domain (Kind.DOMAIN, the UUID) -> node. A libvirt guest's DMI product_uuid
is its domain's UUID, and the libvirt importer puts the same domain entity under the host and the
devices the domain holds, so the node reaches its host, its host-side VFs, their PFs and leaf
(view.layers_above) even where the domain is named otherwise. A NIC with an Ethernet MAC also gets
VF "<node>/<rdma>" -> VF "mac:<mac>" (libvirt.mac_vf, lowercased): the libvirt importer puts that
entity under the host VF the domain's <interface type='hostdev'> holds with that MAC, so each NIC, not
only its node, reaches its own PF and that PF's leaf (view.members: unit "<node>/mlx5_0"). An IPoIB
NIC's 20-octet address names no host VF and joins nothing.

A device or UUID the guest refused this time (`errors` under the sysfs path it read it from) keeps the
links it gave before in force (read), as a host agent's failed part does; a NIC whose netdev or MAC
was refused keeps its MAC's link.

Hostile input, refused whole with a TopologyError naming the JSON path: unknown keys, wrong types, a
version other than 1, names the allowlist refuses, an RDMA device name the kernel would not give, a
PCI address, device ID or UUID not written as the kernel writes one, a MAC that is neither a unicast
Ethernet MAC nor an IPoIB address (either case), a NIC or GPU given twice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from analytics.errors import TopologyError
from analytics.topology.importers import libvirt
from analytics.topology.importers._input import (
    agent_report,
    expect,
    interface_name,
    object_keys,
    pci_address,
    reasons,
)
from analytics.topology.model import Kind, Link
from analytics.topology.names import MAX_NAME_CHARS, checked_link, checked_name, host_scoped, shown

REPORT_VERSION = 1
_REPORT_KEYS = frozenset({"version", "node", "product_uuid", "nics", "gpus", "errors"})
_NIC_KEYS = frozenset({"rdma", "pci", "netdev", "mac"})
_GPU_KEYS = frozenset({"pci", "device"})
_PCI_ONLY = frozenset({"pci"})
_RDMA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # IB_DEVICE_NAME_MAX is 64
_IPOIB_ADDRESS = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){19}")  # 20 octets: QPN and port GID
_DEVICE_ID = re.compile(r"0x[0-9a-f]{4}")
_UUID = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}")  # lowercase, as read_domain writes it


def _matching(value: Any, pattern: re.Pattern[str], what: str, source: str, path: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise TopologyError(source, path, f"{shown(value)} is not {what}")
    return value


def _nic_links(nics: Any, node: str, source: str) -> tuple[list[Link], dict[str, str]]:
    """VF "<node>/<rdma>" -> node and -> VF "mac:<mac>" of each NIC, its other fields checked; and each
    NIC's netdev by its RDMA device."""
    links, seen, netdevs = [], set(), {}
    for i, item in enumerate(expect(nics, list, source, "$.nics")):
        path = f"$.nics[{i}]"
        nic = object_keys(item, _NIC_KEYS, frozenset({"rdma", "pci"}), source, path)
        rdma = _matching(nic["rdma"], _RDMA_NAME, "an RDMA device name", source, f"{path}.rdma")
        pci = pci_address(nic["pci"], source, f"{path}.pci")
        if "netdev" in nic:
            netdevs[rdma] = interface_name(nic["netdev"], source, f"{path}.netdev")
        if rdma in seen or pci in seen:
            raise TopologyError(source, path, f"NIC {shown(rdma)} at {pci} is given twice")
        seen.update((rdma, pci))
        vf = (Kind.VF, host_scoped(node, rdma))
        links.append(checked_link(vf, (Kind.NODE, node), source=source, where=path))
        ipoib = isinstance(nic.get("mac"), str) and _IPOIB_ADDRESS.fullmatch(nic["mac"])
        if "mac" in nic and not ipoib:  # an IPoIB address names no host VF
            mac_vf = libvirt.mac_vf(nic["mac"], source, f"{path}.mac")
            links.append(checked_link(vf, (Kind.VF, mac_vf), source=source, where=f"{path}.mac"))
    return links, netdevs


def _gpu_links(gpus: Any, node: str, source: str) -> list[Link]:
    """node -> GPU "<node>/<pci>" of each GPU."""
    links, seen = [], set()
    for i, item in enumerate(expect(gpus, list, source, "$.gpus")):
        path = f"$.gpus[{i}]"
        gpu = object_keys(item, _GPU_KEYS, _PCI_ONLY, source, path)
        pci = pci_address(gpu["pci"], source, f"{path}.pci")
        if "device" in gpu:
            _matching(gpu["device"], _DEVICE_ID, "a PCI device ID like '0x2335'", source, f"{path}.device")
        if pci in seen:
            raise TopologyError(source, path, f"GPU {pci} is given twice")
        seen.add(pci)
        links.append(
            checked_link((Kind.NODE, node), (Kind.GPU, host_scoped(node, pci)), source=source, where=path)
        )
    return links


def _a_sysfs_path(part: object) -> bool:
    """Whether an `errors` key can be the (escaped) sysfs path the guest names a refused value by."""
    return isinstance(part, str) and 0 < len(part) <= MAX_NAME_CHARS and part.isprintable()


def parse(text: str, source_name: str) -> list[Link]:
    """Every Link a guest's report `text` gives (module docstring), without repeats."""
    return read(text, source_name)[0]


def read(text: str, source_name: str) -> tuple[list[Link], Callable[[Link], bool]]:
    """The Links of report `text` (parse), and which links it does not speak for: those of a device or
    DMI UUID the guest refused this time (`errors` under its sysfs path), which the store keeps in force
    as they were."""
    report = agent_report(text, source_name, _REPORT_KEYS, "node", REPORT_VERSION)
    node = checked_name(report["node"], source=source_name, where="$.node")
    refused = frozenset(reasons(report.get("errors", {}), source_name, _a_sysfs_path))
    links, netdevs = _nic_links(report.get("nics", []), node, source_name)
    links += _gpu_links(report.get("gpus", []), node, source_name)
    if "product_uuid" in report:
        domain = _matching(report["product_uuid"], _UUID, "a lowercase UUID", source_name, "$.product_uuid")
        links.append(checked_link((Kind.DOMAIN, domain), (Kind.NODE, node), source=source_name, where="$"))
    return list(dict.fromkeys(links)), lambda link: _unread(link, node, netdevs, refused)


def _unread(link: Link, node: str, netdevs: Mapping[str, str], refused: frozenset[str]) -> bool:
    """Whether the guest could not read what `link` says this time: `errors` names the sysfs path it
    reads it from (a NIC's MAC: its RDMA device, that device's netdev, or the netdev's address)."""
    if link.child.kind is Kind.DOMAIN:
        return "class/dmi/id/product_uuid" in refused
    if link.parent.kind is Kind.GPU:
        return f"bus/pci/devices/{link.parent.name.removeprefix(f'{node}/')}" in refused
    if link.child.kind is not Kind.VF:
        return False
    rdma = link.child.name.removeprefix(f"{node}/")
    entry = f"class/infiniband/{rdma}"
    if entry in refused:
        return True
    if link.parent.kind is not Kind.VF:
        return False
    netdev_refused = any(path.startswith(f"{entry}/device/net/") for path in refused)
    return netdev_refused or (rdma in netdevs and f"class/net/{netdevs[rdma]}/address" in refused)

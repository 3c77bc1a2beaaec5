"""A guest's own report (`fleetlens guest-report`, collectors/guestreport.py) as Links: what a VM sees of
its NICs and GPUs, and the UUID that joins it to what its host reports.

The report is one JSON object (docs/topology.md, "The guest report"):
`{"version": 1, "node": "vela-001", "product_uuid": "c7a5fdbd-...", "nics": [{"rdma": "mlx5_0",
"pci": "0000:00:07.0", "netdev": "ens7", "mac": "02:fc:00:00:00:02"}], "gpus": [{"pci": "0000:00:06.0",
"device": "0x2335"}], "errors": {"<sysfs path>": "<reason>"}}`; product_uuid, nics, gpus, errors and a
NIC's netdev and mac may be absent.

Links: node -> VF "<node>/<rdma device>" for each NIC (the name per-node anomalies' component carries,
"mlx5_0:1"), node -> GPU "<node>/<pci address>", and, given a product_uuid, domain (Kind.DOMAIN, the
UUID) -> node. A libvirt guest's DMI product_uuid is its domain's UUID, and the libvirt importer puts
the same domain entity under the host and the devices the domain holds, so the node reaches its host,
its host-side VFs, their PFs and leaf (view.layers_above) even where the domain is named otherwise.

A device or UUID the guest refused this time (`errors` under the sysfs path it read it from) keeps the
links it gave before in force (read), as a host agent's failed part does.

Hostile input, refused whole with a TopologyError naming the JSON path: unknown keys, wrong types, a
version other than 1, names the allowlist refuses, an RDMA device name the kernel would not give, a
PCI address, MAC, device ID or UUID not written as the kernel writes one, a NIC or GPU given twice.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from analytics.errors import TopologyError
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
_MAC = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}|[0-9a-f]{2}(?::[0-9a-f]{2}){19}")
_DEVICE_ID = re.compile(r"0x[0-9a-f]{4}")
_UUID = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}")  # lowercase, as read_domain writes it


def _matching(value: Any, pattern: re.Pattern[str], what: str, source: str, path: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise TopologyError(source, path, f"{shown(value)} is not {what}")
    return value


def _nic_links(nics: Any, node: str, source: str) -> list[Link]:
    """node -> VF "<node>/<rdma>" of each NIC, its other fields checked."""
    links, seen = [], set()
    for i, item in enumerate(expect(nics, list, source, "$.nics")):
        path = f"$.nics[{i}]"
        nic = object_keys(item, _NIC_KEYS, frozenset({"rdma", "pci"}), source, path)
        rdma = _matching(nic["rdma"], _RDMA_NAME, "an RDMA device name", source, f"{path}.rdma")
        pci = pci_address(nic["pci"], source, f"{path}.pci")
        if "netdev" in nic:
            interface_name(nic["netdev"], source, f"{path}.netdev")
        if "mac" in nic:
            _matching(nic["mac"], _MAC, "a MAC address like '02:fc:00:00:00:02'", source, f"{path}.mac")
        if rdma in seen or pci in seen:
            raise TopologyError(source, path, f"NIC {shown(rdma)} at {pci} is given twice")
        seen.update((rdma, pci))
        links.append(
            checked_link((Kind.NODE, node), (Kind.VF, host_scoped(node, rdma)), source=source, where=path)
        )
    return links


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
    links = _nic_links(report.get("nics", []), node, source_name)
    links += _gpu_links(report.get("gpus", []), node, source_name)
    if "product_uuid" in report:
        domain = _matching(report["product_uuid"], _UUID, "a lowercase UUID", source_name, "$.product_uuid")
        links.append(checked_link((Kind.DOMAIN, domain), (Kind.NODE, node), source=source_name, where="$"))
    return list(dict.fromkeys(links)), lambda link: _sysfs_path(link, node) in refused


def _sysfs_path(link: Link, node: str) -> str | None:
    """Where in sysfs the guest read what `link` says (the key its `errors` would name it by)."""
    if link.child.kind is Kind.DOMAIN:
        return "class/dmi/id/product_uuid"
    local = link.parent.name.removeprefix(f"{node}/")
    return {Kind.VF: f"class/infiniband/{local}", Kind.GPU: f"bus/pci/devices/{local}"}.get(link.parent.kind)

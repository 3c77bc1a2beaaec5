"""A host agent's report (`fleetlens host-agent`, collectors/hostagent.py) as Links: what one hypervisor
sees of its PFs, VFs, VMs and leaves.

The report is one JSON object (docs/topology.md, "The host agent"):
`{"version": 1, "host": "hv-01", "pfs": [{"name": "ens1f0", "pci": "0000:3b:00.0", "vfs": ["0000:3b:02.0"]}],
"domains": [{"name": "vm-1", "xml": "<domain>..."}], "lldp": "<lldpcli -f json0 show neighbors>",
"errors": {"lldp": "lldpcli is not installed"}}`; each of pfs, domains, lldp and errors may be absent.

Links: VF -> PF and PF -> host from `pfs` (a PF named "<host>/<interface>" as the lldp importer names it,
a VF "<host>/<pci address>" as the libvirt importer does); from each domain's XML, by the libvirt
importer with `host=` and `vfs=` every VF of `pfs`, node -> host and node -> each VF and GPU it holds;
from `lldp`, by the lldp importer with `host=`, PF -> leaf and PF -> host.

Hostile input, refused whole with a TopologyError naming the JSON path: unknown keys, wrong types, a
version other than 1, names the allowlist refuses (names.checked_name), an interface name Linux would
refuse, a PCI address not written as sysfs writes one, a PF or VF given twice, a domain whose XML names
another domain, and whatever the libvirt and lldp importers refuse in their parts (their where prefixed
with the part's path).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

from analytics.errors import TopologyError
from analytics.topology.importers import libvirt, lldp
from analytics.topology.importers._input import expect, load_json
from analytics.topology.model import Kind, Link
from analytics.topology.names import checked_link, checked_name, host_scoped, shown

REPORT_VERSION = 1
_REPORT_KEYS = frozenset({"version", "host", "pfs", "domains", "lldp", "errors"})
_PF_KEYS = frozenset({"name", "pci", "vfs"})
_DOMAIN_KEYS = frozenset({"name", "xml"})
# A PCI function as sysfs names it: domain (4 hex digits, more under VMD), bus, device (< 0x20), function.
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]")
MAX_REASON_CHARS = 4096  # the agent's reason for a part left out (it keeps 2,000)
_IFNAMSIZ = 16  # Linux's interface name buffer, NUL included
T = TypeVar("T")


def _keys(value: Any, allowed: frozenset[str], required: frozenset[str], source: str, path: str) -> dict:
    """`value` as an object whose keys are all `allowed` and include `required`."""
    found = expect(value, dict, source, path)
    if unknown := sorted(set(found) - allowed):
        raise TopologyError(
            source, path, f"unknown key {shown(unknown[0])}; known: {', '.join(sorted(allowed))}"
        )
    if missing := sorted(required - set(found)):
        raise TopologyError(source, path, f"no {missing[0]!r}")
    return found


def _pci(value: Any, source: str, path: str) -> str:
    if not isinstance(value, str) or not _PCI_ADDRESS.fullmatch(value):
        raise TopologyError(source, path, f"{shown(value)} is not a PCI address like '0000:3b:02.0'")
    return value


def _interface(value: Any, source: str, path: str) -> str:
    """An interface name Linux accepts (dev_valid_name): under 16 bytes, no '/', ':' or whitespace."""
    name = checked_name(value, source=source, where=path)
    if len(name.encode()) >= _IFNAMSIZ or name in (".", "..") or any(c in "/:" or c.isspace() for c in name):
        raise TopologyError(source, path, f"{shown(name)} is not a network interface name")
    return name


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
        pf = _keys(item, _PF_KEYS, _PF_KEYS, source, path)
        name = _interface(pf["name"], source, f"{path}.name")
        _pci(pf["pci"], source, f"{path}.pci")
        if name in interfaces:
            raise TopologyError(source, f"{path}.name", f"PF {shown(name)} is given twice")
        interfaces.add(name)
        pf_entity = (Kind.PF, host_scoped(host, name))
        links.append(checked_link(pf_entity, (Kind.HOST, host), source=source, where=f"{path}.name"))
        for j, raw in enumerate(expect(pf["vfs"], list, source, f"{path}.vfs")):
            address = _pci(raw, source, f"{path}.vfs[{j}]")
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
        domain = _keys(item, _DOMAIN_KEYS, _DOMAIN_KEYS, source, path)
        name = checked_name(domain["name"], source=source, where=f"{path}.name")
        xml = expect(domain["xml"], str, source, f"{path}.xml")
        said = _nested(lambda: libvirt.read_domain(xml, source), source, f"{path}.xml").name  # noqa: B023
        if said != name:
            raise TopologyError(source, f"{path}.xml", f"names domain {shown(said)}, not {shown(name)}")
        links += _nested(lambda: libvirt.parse(xml, source, host=host, vfs=vfs), source, f"{path}.xml")  # noqa: B023
    return links


def _errors(errors: Any, source: str) -> None:
    """The agent's reasons for parts left out: checked, kept for nothing else (the agent logs them)."""
    for part, reason in expect(errors, dict, source, "$.errors").items():
        if part not in ("pfs", "domains", "lldp"):
            raise TopologyError(source, "$.errors", f"{shown(part)} is not a part of the report")
        if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS or not reason.isprintable():
            raise TopologyError(source, f"$.errors.{part}", f"{shown(reason)} is not a one-line reason")


def parse(text: str, source_name: str) -> list[Link]:
    """Every Link a host agent's report `text` gives (module docstring), without repeats."""
    report = _keys(
        load_json(text, source_name), _REPORT_KEYS, frozenset({"version", "host"}), source_name, "$"
    )
    if type(report["version"]) is not int or report["version"] != REPORT_VERSION:
        raise TopologyError(source_name, "$.version", f"{shown(report['version'])}: this hub reads version 1")
    host = checked_name(report["host"], source=source_name, where="$.host")
    _errors(report.get("errors", {}), source_name)
    links, vfs = _pf_links(report.get("pfs", []), host, source_name)
    links += _domain_links(report.get("domains", []), host, vfs, source_name)
    if "lldp" in report:
        lldp_text = expect(report["lldp"], str, source_name, "$.lldp")
        links += _nested(lambda: lldp.parse(lldp_text, source_name, host=host), source_name, "$.lldp")
    return list(dict.fromkeys(links))

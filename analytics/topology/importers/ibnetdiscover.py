"""InfiniBand `ibnetdiscover` output (infiniband-diags) as Links: hosts under leaves, leaves under spines.

The output is blocks separated by blank lines, one per device: `key=value` lines (vendid, switchguid, ...),
a header (`Switch 65 "S-<guid>" # "<description>" ...`, `Ca 1 "H-<guid>" # "<description>"`, `Rt ...`),
then one line per cabled port (`[3] "H-<guid>"[1](<port guid>) # "<remote description>" lid 674 4xNDR`).

Names, as NVIDIA Topograph reads them:
- a host is the first word of its HCA's description when the description is exactly two words
  ("node001 HCA-1", "a08-p1-dgx-04-c01 mlx5_5": the node description the host's rdma stack sets). An
  HCA with any other description (a switch's SHARP "Mellanox Technologies Aggregation Node", or an HCA
  whose node description was never set: "MT4129 ConnectX7   Mellanox Technologies") names no host, and
  its cable yields no link.
- a switch is the name inside a "MF0;<name>:<model>" description, else the description itself when it
  has no space, ';' or ':', else its GUID ("S-2c5eab0300b87b40"). Two switches with one name are refused.

Links: each host under every switch one of its HCAs is cabled to, which makes that switch a leaf (a host
with one HCA a rail sits under one leaf a rail); each leaf under every other switch it is cabled to, which
is a spine. Switches cabled only to spines (cores) yield no link: the model has no layer above spine.

Refused whole, naming the line: a line of no known shape, a port line outside a device block, an
unacceptable name, output that holds no switch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from analytics.errors import TopologyError
from analytics.topology.model import Kind, Link
from analytics.topology.names import checked_input, checked_link, shown

_HEADER = re.compile(r'(Switch|Ca|Rt)\s+\d+\s+"([SHR]-[0-9a-fA-F]+)"\s*#\s*"([^"]*)".*')
_PORT = re.compile(
    r'\[\d+\](?:\[ext \d+\])?(?:\([0-9a-fA-F]+\))?\s+"([SHR]-[0-9a-fA-F]+)"\[\d+\](?:\([0-9a-fA-F]+\))?'
    r'\s*#[^"]*"([^"]*)"[^"]*'  # the comment: lid, width, and the remote's description, whole
)
_KEY_VALUE = re.compile(r"[a-z]+=\S+")
_SWITCH_NAME = re.compile(r"[^;:]+;([^;:]+):[^;:]+")
_HOST_NAME = re.compile(r"(\S+)\s\S+")


@dataclass
class _Switch:
    name: str
    where: str
    switches: set[str] = field(default_factory=set)  # GUIDs of switches cabled to it
    hosts: dict[str, str] = field(default_factory=dict)  # host -> line of the cable


def switch_name(guid: str, description: str) -> str:
    """A switch's name from its description (module docstring), else its GUID."""
    match = _SWITCH_NAME.fullmatch(description)
    if match:
        return match.group(1)
    return guid if not description or any(c in description for c in " ;:") else description


def host_name(description: str) -> str | None:
    """The host an HCA's description names (module docstring), or None."""
    match = _HOST_NAME.fullmatch(description)
    return match.group(1) if match else None


def _read_switches(text: str, source: str) -> dict[str, _Switch]:
    """Every switch block of `text` by GUID, with the switches and hosts its ports are cabled to."""
    switches: dict[str, _Switch] = {}
    in_device = False  # inside a device block, after its header
    switch: _Switch | None = None  # the block's switch; None in a Ca or Rt block
    for number, raw in enumerate(text.split("\n"), start=1):
        where = f"line {number}"
        line = raw.strip(" \t\r")
        if not line:
            in_device, switch = False, None
        elif line.startswith("#") or (not in_device and _KEY_VALUE.fullmatch(line)):
            continue
        elif header := _HEADER.fullmatch(line):
            kind, guid, description = header.groups()
            in_device, switch = True, None
            if kind == "Switch":
                switch = switches[guid] = _Switch(switch_name(guid, description), where)
        elif port := _PORT.fullmatch(line):
            if not in_device:
                raise TopologyError(source, where, "a port line outside a device block")
            remote, description = port.groups()
            if switch is None:
                continue
            if remote.startswith("S-"):
                switch.switches.add(remote)
            elif remote.startswith("H-") and (host := host_name(description)) is not None:
                switch.hosts.setdefault(host, where)
        else:
            raise TopologyError(source, where, f"{shown(line)} is no ibnetdiscover line")
    return switches


def parse(text: str, source_name: str) -> list[Link]:
    """The Links ibnetdiscover output `text` states (module docstring): hosts under leaves first, then
    leaves under spines, each in file order."""
    switches = _read_switches(checked_input(text, source_name), source_name)
    if not switches:
        raise TopologyError(source_name, "input", "no Switch block: not the output of a fabric sweep")
    by_name: dict[str, str] = {}
    for guid, switch in switches.items():
        if by_name.setdefault(switch.name, guid) != guid:
            raise TopologyError(source_name, switch.where, f"two switches are named {shown(switch.name)}")
    leaves = {guid for guid, switch in switches.items() if switch.hosts}
    links = [
        checked_link((Kind.NODE, host), (Kind.LEAF, switch.name), source=source_name, where=where)
        for switch in switches.values()
        for host, where in switch.hosts.items()
    ]
    for guid, leaf in switches.items():
        if guid not in leaves:
            continue
        for other in sorted(leaf.switches - leaves):
            spine = switches.get(other)
            if spine is not None:
                links.append(
                    checked_link(
                        (Kind.LEAF, leaf.name),
                        (Kind.SPINE, spine.name),
                        source=source_name,
                        where=spine.where,
                    )
                )
    return list(dict.fromkeys(links))

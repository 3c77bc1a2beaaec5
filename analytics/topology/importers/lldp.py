"""lldpd's `lldpcli -f json0 show neighbors` (run on a hypervisor) as Links: each PF under its leaf.

json0 is lldpd's JSON output whose shape never depends on the number of items: every value is a list,
`{"lldp": [{"interface": [{"name": "eth0", "chassis": [{"name": [{"value": "leaf-07"}], "id": [...]}],
"port": [{"id": [...], "descr": [...]}]}]}]}`.

The output does not name the host it was taken on, so the caller does (names.caller_host): the `host`
argument, else the file's name without its suffix. Each local interface is a PF named "<host>/<interface>"
(names.host_scoped); the neighbor chassis is the leaf, named by its SysName, else its chassis ID. Links:
PF -> leaf and PF -> host. The switch port (neighbors() returns it) is not a Link: the model has no port
layer; it is what an operator checks ("leaf-07 port swp12").

Refused whole, naming the JSON path: not JSON, a shape other than json0's, an interface without a name,
a neighbor without a chassis name or ID, an unacceptable name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analytics.errors import TopologyError
from analytics.topology.importers._input import expect, load_json
from analytics.topology.model import Kind, Link
from analytics.topology.names import caller_host, checked_link, checked_name, host_scoped


@dataclass(frozen=True)
class Neighbor:
    """One LLDP neighbor as the host sees it: its `interface`, the neighbor `chassis` and its `port`
    (None where the neighbor sent no port ID)."""

    interface: str
    chassis: str
    port: str | None


def _first_value(holder: dict[str, Any], key: str, source: str, path: str) -> str | None:
    """json0's `key: [{"value": "..."}]` as its first value, or None when `key` is absent."""
    if key not in holder:
        return None
    entries = expect(holder[key], list, source, f"{path}.{key}")
    if not entries:
        return None
    entry = expect(entries[0], dict, source, f"{path}.{key}[0]")
    return checked_name(entry.get("value"), source=source, where=f"{path}.{key}[0].value")


def _only(holder: dict[str, Any], key: str, source: str, path: str) -> dict[str, Any]:
    """json0's one-element list `key: [{...}]` as its element; an empty object when `key` is absent."""
    entries = expect(holder.get(key, [{}]), list, source, f"{path}.{key}")
    return expect(entries[0] if entries else {}, dict, source, f"{path}.{key}[0]")


def neighbors(text: str, source_name: str) -> list[Neighbor]:
    """Every neighbor `lldpcli -f json0 show neighbors` output `text` lists, in its order."""
    document = expect(load_json(text, source_name), dict, source_name, "$")
    found = []
    for i, agent in enumerate(expect(document.get("lldp"), list, source_name, "$.lldp")):
        agent_path = f"$.lldp[{i}]"
        interfaces = expect(
            expect(agent, dict, source_name, agent_path).get("interface", []),
            list,
            source_name,
            f"{agent_path}.interface",
        )
        for j, item in enumerate(interfaces):
            path = f"{agent_path}.interface[{j}]"
            interface = expect(item, dict, source_name, path)
            name = checked_name(interface.get("name"), source=source_name, where=f"{path}.name")
            chassis_path = f"{path}.chassis[0]"
            chassis = _only(interface, "chassis", source_name, path)
            leaf = _first_value(chassis, "name", source_name, chassis_path) or _first_value(
                chassis, "id", source_name, chassis_path
            )
            if leaf is None:
                raise TopologyError(
                    source_name, chassis_path, "the neighbor has neither a name nor a chassis ID"
                )
            port = _first_value(
                _only(interface, "port", source_name, path), "id", source_name, f"{path}.port[0]"
            )
            found.append(Neighbor(name, leaf, port))
    return found


def parse(text: str, source_name: str, *, host: str | None = None) -> list[Link]:
    """PF -> leaf and PF -> host Links of `host`'s LLDP neighbors (module docstring), without repeats."""
    host = caller_host(source_name, host)
    links = []
    for neighbor in neighbors(text, source_name):
        pf = (Kind.PF, host_scoped(host, neighbor.interface))
        links.append(
            checked_link(pf, (Kind.LEAF, neighbor.chassis), source=source_name, where=neighbor.interface)
        )
        links.append(checked_link(pf, (Kind.HOST, host), source=source_name, where=neighbor.interface))
    return list(dict.fromkeys(links))

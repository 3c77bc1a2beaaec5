"""The operator's inventory file: where each node, host, leaf and rack sits, written by hand
(docs/topology.md).

    nodes:
      vela-001: {host: host-000, rails: [rail-0, rail-1]}         # on two rails, by no NIC named
      vela-002: {host: host-000, leaf: leaf-01, rack: rack-00}    # a node's own leaf or rack, when known
      vela-003:
        host: host-001
        nics:                                                     # per RDMA device, what it is cabled to
          mlx5_0: {rail: rail-0}
          mlx5_1: {rail: rail-1, leaf: leaf-02, pf: host-001/eth1}
    hosts:
      host-000: {leaf: leaf-00, rack: rack-00}
    leaves:
      leaf-00: {spine: spine-0}
    racks:
      rack-00: {pdu: pdu-0}

YAML or JSON (JSON is YAML). Each section names children, each child its parents by layer (SECTIONS):
one parent per layer, and only layers above the child's, so an inventory cannot hold a loop. A node's
`nics` name its NICs by RDMA device (as its anomalies' components do: "mlx5_1:1" is port 1 of mlx5_1),
each with its rail, leaf and PF (NIC_PARENTS): NIC mlx5_1 of vela-003 becomes the VF entity
"vela-003/mlx5_1" under the node and those parents, so a rail fault is localized to the NICs it shows
on (analytics.topology.view.members). `rails: [...]` puts the whole node on rails, no NIC named. Everything
is optional but a parent's name; an empty file is refused (a file caught half-written). The whole file is
checked before any of it is used: an unknown section or key, a value of the wrong type, a name that is
not one (analytics.topology.checks), a child or key written twice, a YAML alias (which could expand
without bound) or tag, each raise TopologyError naming the file, its line and the key path
(`nodes.vela-001.host`), and nothing of the file is imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from analytics.errors import TopologyError
from analytics.topology.checks import check_links
from analytics.topology.model import Entity, Kind, Link
from analytics.topology.names import checked_name
from analytics.topology.view import UNIT_SEPARATOR, unit

MAX_BYTES = 16 << 20  # an inventory of 100,000 nodes is a few MB
MAX_DEPTH = 8  # collections within collections: an inventory has 5 (sections, children, keys, nics, keys)


@dataclass(frozen=True)
class Section:
    """A section of the file: its children's kind, and per key the kind of parent it names (one name),
    or for `lists` the kind of the parents it lists."""

    kind: Kind
    parents: dict[str, Kind]
    lists: dict[str, Kind]


SECTIONS = {
    "nodes": Section(
        Kind.NODE,
        {"host": Kind.HOST, "leaf": Kind.LEAF, "spine": Kind.SPINE, "rack": Kind.RACK},
        {"rails": Kind.RAIL},
    ),
    "hosts": Section(Kind.HOST, {"leaf": Kind.LEAF, "rack": Kind.RACK}, {"rails": Kind.RAIL}),
    "leaves": Section(Kind.LEAF, {"spine": Kind.SPINE, "rack": Kind.RACK}, {}),
    "racks": Section(Kind.RACK, {"pdu": Kind.PDU}, {}),
}
NIC_PARENTS = {"rail": Kind.RAIL, "leaf": Kind.LEAF, "pf": Kind.PF}  # the keys of one of a node's `nics`
NICS = "nics"
_STR = "tag:yaml.org,2002:str"


def parse(text: str, source_name: str) -> list[Link]:
    """The links an inventory's `text` says, from the file `source_name` (named in errors); TopologyError
    naming the file, line and key path of the first thing wrong, and no links, if anything is."""
    if len(text.encode(errors="replace")) > MAX_BYTES:
        raise TopologyError(source_name, "input", f"larger than {MAX_BYTES} bytes")
    root = _compose(text, source_name)
    if root is None:  # half-written, most likely: taking it would end every link of the inventory
        raise TopologyError(source_name, "input", "empty; an inventory of nothing is written `nodes: {}`")
    links = list(_links(root, source_name))
    return check_links(links, source_name)


def read(path: Path | str) -> list[Link]:
    """parse() of the inventory file at `path`; TopologyError naming it when it cannot be read either."""
    return parse(read_text(path), f"inventory file {path}")


def read_text(path: Path | str) -> str:
    """A topology file's text (UTF-8, at most MAX_BYTES); TopologyError naming it if it cannot be read."""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise TopologyError(str(path), "input", f"larger than {MAX_BYTES} bytes")
        return data.decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(str(path), "input", str(exc)) from None


def _compose(text: str, source_name: str) -> yaml.Node | None:
    """The YAML node tree of `text`, refused when it uses an alias or nests deeper than an inventory does
    (MAX_DEPTH: YAML's composer recurses once per level); TopologyError naming the line."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise TopologyError(source_name, _line(event), "YAML aliases (*name) are not accepted")
            depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
            if depth > MAX_DEPTH:
                raise TopologyError(source_name, _line(event), "nested deeper than an inventory is")
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise TopologyError(source_name, "input", f"not YAML or JSON: {exc}") from None


def _links(root: yaml.Node, file: str) -> Iterator[Link]:
    for section_name, body in _mapping(root, file, "", f"the sections {', '.join(SECTIONS)}"):
        section = SECTIONS.get(section_name)
        if section is None:
            raise TopologyError(
                file, _line(body), f"unknown section {section_name!r}; known: {', '.join(SECTIONS)}"
            )
        keys = ", ".join([*section.parents, *section.lists, *([NICS] if section.kind is Kind.NODE else [])])
        for child_name, parents in _mapping(body, file, section_name, f"{section.kind} names"):
            path = f"{section_name}.{child_name}"
            child = Entity(section.kind, child_name)
            if _is_null(parents):
                continue  # a child named with nothing above it yet
            for key, value in _mapping(parents, file, path, f"keys among {keys}"):
                if key in section.parents:
                    yield Link(child, Entity(section.parents[key], _name(value, file, f"{path}.{key}")))
                elif key in section.lists:
                    yield from (
                        Link(child, Entity(section.lists[key], name))
                        for name in _names(value, file, f"{path}.{key}")
                    )
                elif key == NICS and section.kind is Kind.NODE:
                    yield from _nic_links(child, value, file, f"{path}.{key}")
                else:
                    raise TopologyError(file, _line(value), f"{path}: unknown key {key!r}; known: {keys}")


def _nic_links(node: Entity, nics: yaml.Node, file: str, path: str) -> Iterator[Link]:
    """The links of a node's `nics`: each NIC a VF "<node>/<device>" under the node and its parents."""
    keys = ", ".join(NIC_PARENTS)
    for device, parents in _mapping(nics, file, path, "RDMA device names"):
        if UNIT_SEPARATOR in device:
            raise TopologyError(
                file, _line(parents), f"{path}: a device name {device!r} holds {UNIT_SEPARATOR!r}"
            )
        nic = Entity(Kind.VF, unit(node.name, device))
        yield Link(nic, node)
        if _is_null(parents):
            continue  # a NIC named with nothing above it yet
        for key, value in _mapping(parents, file, f"{path}.{device}", f"keys among {keys}"):
            if key not in NIC_PARENTS:
                raise TopologyError(
                    file, _line(value), f"{path}.{device}: unknown key {key!r}; known: {keys}"
                )
            yield Link(nic, Entity(NIC_PARENTS[key], _name(value, file, f"{path}.{device}.{key}")))


def _mapping(node: yaml.Node, file: str, path: str, wanted: str) -> Iterator[tuple[str, yaml.Node]]:
    """The (key, value node) pairs of a mapping node whose keys are names, each key once."""
    if not isinstance(node, yaml.MappingNode):
        raise TopologyError(file, _line(node), f"{path or 'the file'}: expected a mapping of {wanted}")
    seen: set[str] = set()
    for key_node, value in node.value:
        key = _name(key_node, file, f"{path}: a key" if path else "a section")
        if key in seen:
            raise TopologyError(file, _line(key_node), f"{_join(path, key)}: written twice")
        seen.add(key)
        yield key, value


def _names(node: yaml.Node, file: str, path: str) -> list[str]:
    if not isinstance(node, yaml.SequenceNode):
        raise TopologyError(file, _line(node), f"{path}: expected a list of names")
    names = [_name(item, file, f"{path}[{i}]") for i, item in enumerate(node.value)]
    if len(set(names)) != len(names):
        raise TopologyError(file, _line(node), f"{path}: a name listed twice")
    return names


def _name(node: yaml.Node, file: str, path: str) -> str:
    """The name a scalar node holds; a number, boolean, date or null (which YAML reads unquoted text such
    as 001, yes or 2024-01-01 as) is refused with a hint to quote it."""
    if not isinstance(node, yaml.ScalarNode):
        raise TopologyError(file, _line(node), f"{path}: expected a name, got a {node.id}")
    if node.tag != _STR:
        kind = node.tag.rsplit(":", 1)[-1]
        raise TopologyError(file, _line(node), f"{path}: YAML reads {node.value!r} as {kind}; quote the name")
    return checked_name(node.value, source=file, where=f"{_line(node)}: {path}")


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _line(node: yaml.Node | yaml.Event) -> str:
    return f"line {node.start_mark.line + 1}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key

"""Importers: each turns one tool's output into Links, as `parse(text, source_name) -> list[Link]`.

PARSERS maps a `--format` name to its parser; SOURCE_OF_FORMAT says which Source (and so which
precedence) the links of each format are stored under. A parser refuses bad input whole with a
TopologyError naming `source_name` (the file or command), where in it (line, key path, JSON path, XML
element) and what is wrong. lldp and libvirt show one hypervisor's view: their host is the file's name
without its suffix ("host-005.json"), or bind `host=` with functools.partial.

`imported` is what the hub and `fleetlens topology import` store: the links, and which of the reporter's
links held before the input does not speak for (a host agent's part that failed this time: READERS),
for Store.replace_links to keep in force.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from analytics.errors import TopologyError
from analytics.topology import inventory
from analytics.topology.importers import guest, host_agent, ibnetdiscover, k8s_nodes, libvirt, lldp, slurm
from analytics.topology.model import Link, Source

Parser = Callable[[str, str], list[Link]]
Reader = Callable[[str, str], tuple[list[Link], Callable[[Link], bool]]]

PARSERS: dict[str, Parser] = {
    "inventory": inventory.parse,
    "slurm": slurm.parse,
    "k8s-nodes": k8s_nodes.parse,
    "ibnetdiscover": ibnetdiscover.parse,
    "lldp": lldp.parse,
    "libvirt": libvirt.parse,
    "host-agent": host_agent.parse,
    "guest": guest.parse,
}
SOURCE_OF_FORMAT: dict[str, Source] = {
    "inventory": Source.INVENTORY,
    "slurm": Source.SLURM,
    "k8s-nodes": Source.KUBERNETES,
    "ibnetdiscover": Source.IBNETDISCOVER,
    "lldp": Source.HOST_AGENT,
    "libvirt": Source.HOST_AGENT,
    "host-agent": Source.HOST_AGENT,
    "guest": Source.GUEST,
}
# Formats whose input may say that part of it failed: their links and what they do not speak for.
READERS: dict[str, Reader] = {"host-agent": host_agent.read, "guest": guest.read}


def _speaks_for_all(_: Link) -> bool:
    return False


@dataclass(frozen=True)
class Imported:
    """What one input says: its `links`, and `unsaid`: whether a link its reporter said before is one this
    input does not speak for (so the store keeps it in force as it was)."""

    links: list[Link]
    source: Source
    unsaid: Callable[[Link], bool] = _speaks_for_all


def imported(format_name: str, text: str, source_name: str) -> Imported:
    """`text` in `format_name` read (parser_of, READERS): what the store takes; TopologyError as the
    format's parser raises it."""
    parse, source = parser_of(format_name)
    if format_name in READERS:
        links, unsaid = READERS[format_name](text, source_name)
        return Imported(links, source, unsaid)
    return Imported(parse(text, source_name), source)


def parser_of(format_name: str) -> tuple[Parser, Source]:
    """The parser of `format_name` and the Source its links are stored under; TopologyError naming the
    formats there are if it is none of them."""
    if format_name not in PARSERS:
        known = ", ".join(sorted(PARSERS))
        raise TopologyError("format", repr(format_name[:64]), f"not a topology format; known: {known}")
    return PARSERS[format_name], SOURCE_OF_FORMAT[format_name]

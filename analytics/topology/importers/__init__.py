"""Importers: each turns one tool's output into Links, as `parse(text, source_name) -> list[Link]`.

PARSERS maps a `--format` name to its parser; SOURCE_OF_FORMAT says which Source (and so which
precedence) the links of each format are stored under. A parser refuses bad input whole with a
TopologyError naming `source_name` (the file or command), where in it (line, key path, JSON path, XML
element) and what is wrong. lldp and libvirt show one hypervisor's view: their host is the file's name
without its suffix ("host-005.json"), or bind `host=` with functools.partial.
"""

from __future__ import annotations

from collections.abc import Callable

from analytics.errors import TopologyError
from analytics.topology import inventory
from analytics.topology.importers import guest, host_agent, ibnetdiscover, k8s_nodes, libvirt, lldp, slurm
from analytics.topology.model import Link, Source

Parser = Callable[[str, str], list[Link]]

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


def parser_of(format_name: str) -> tuple[Parser, Source]:
    """The parser of `format_name` and the Source its links are stored under; TopologyError naming the
    formats there are if it is none of them."""
    if format_name not in PARSERS:
        known = ", ".join(sorted(PARSERS))
        raise TopologyError("format", repr(format_name[:64]), f"not a topology format; known: {known}")
    return PARSERS[format_name], SOURCE_OF_FORMAT[format_name]

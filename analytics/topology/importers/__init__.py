"""Importers: each turns one tool's output into Links, as `parse(text, source_name) -> list[Link]`.

PARSERS maps a `--format` name to its parser; SOURCE_OF_FORMAT says which Source (and so which
precedence) the links of each format are stored under. A parser raises TopologyError naming
`source_name` (the file), the line or key and what is wrong, and returns nothing of a bad input.
"""

from __future__ import annotations

from collections.abc import Callable

from analytics.errors import TopologyError
from analytics.topology import inventory
from analytics.topology.model import Link, Source

Parser = Callable[[str, str], list[Link]]

PARSERS: dict[str, Parser] = {
    "inventory": inventory.parse,
}
SOURCE_OF_FORMAT: dict[str, Source] = {
    "inventory": Source.INVENTORY,
    "slurm": Source.SLURM,
    "k8s-nodes": Source.KUBERNETES,
    "ibnetdiscover": Source.IBNETDISCOVER,
    "lldp": Source.HOST_AGENT,
    "libvirt": Source.HOST_AGENT,
}


def parser_of(format_name: str) -> tuple[Parser, Source]:
    """The parser of `format_name` and the Source its links are stored under; TopologyError naming the
    formats there are if it is none of them."""
    if format_name not in PARSERS:
        raise TopologyError(
            f"unknown topology format {format_name[:64]!r}; known: {', '.join(sorted(PARSERS))}"
        )
    return PARSERS[format_name], SOURCE_OF_FORMAT[format_name]

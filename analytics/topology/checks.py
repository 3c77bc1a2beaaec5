"""Checks every set of links passes before the store takes it, whatever importer made it: every name
passes analytics.topology.names' allowlist, and the links do not loop (a child that is its own ancestor:
the walk up from a node would have no top). Both raise TopologyError naming `where` (the file or request)
and the entity.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from analytics.errors import TopologyError
from analytics.topology.model import Entity, Link
from analytics.topology.names import checked_name


def check_links(links: Iterable[Link], where: str) -> list[Link]:
    """`links` sorted and without repeats, once every name is checked and none loops; TopologyError naming
    `where` and the first bad entity (for a loop, the entities around it)."""
    unique = sorted(set(links))
    parents: dict[Entity, list[Entity]] = defaultdict(list)
    for link in unique:
        for entity in (link.child, link.parent):
            checked_name(entity.name, source=where, where=str(entity.kind))
        parents[link.child].append(link.parent)
    _check_acyclic(parents, where)
    return unique


def _check_acyclic(parents: dict[Entity, list[Entity]], where: str) -> None:
    """TopologyError naming the loop if walking up from some child comes back to it."""
    done: set[Entity] = set()
    for start in sorted(parents):
        path: list[Entity] = []
        on_path: set[Entity] = set()
        stack: list[tuple[Entity, int]] = [(start, 0)]
        while stack:
            entity, index = stack.pop()
            if index == 0:
                if entity in on_path:
                    loop = [*path[path.index(entity) :], entity]
                    raise TopologyError(where, "links", f"a loop: {' -> '.join(map(str, loop))}")
                if entity in done:
                    continue
                path.append(entity)
                on_path.add(entity)
            above = parents.get(entity, [])
            if index < len(above):
                stack.append((entity, index + 1))
                stack.append((above[index], 0))
            else:
                done.add(entity)
                on_path.discard(entity)
                path.pop()

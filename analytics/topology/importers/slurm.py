"""Slurm's topology.conf (the topology/tree plugin) as Links.

One line a switch: `SwitchName=s0 Nodes=tux[0-3]` or `SwitchName=s3 Switches=s[0-2]`, with an optional
`LinkSpeed=N` (read and ignored, as Slurm itself does); parameter names in any case, `#` starts a comment.
Node and switch lists are Slurm hostlist expressions (expand_hostlist).

How the tree maps onto the model's layers: a switch with Nodes= is a leaf, and each of its nodes sits under
it; a switch that lists a leaf in Switches= is a spine, and that leaf sits under it. A switch above the
spines (a core, one that lists only spines) yields no link, as the model has no layer above spine: a fault
there shows as faults of all its spines. A leaf listed by several switches sits under each.

Refused whole, naming the line: an unknown or repeated parameter, a line without SwitchName, a switch
with both Nodes= and Switches=, a switch defined twice, Switches= naming a switch the file does not
define, topology/block or topology/ring lines (BlockName, RingName: no switch tree), a bad hostlist.
"""

from __future__ import annotations

import itertools
import re

from analytics.errors import TopologyError
from analytics.topology.model import Kind, Link
from analytics.topology.names import checked_input, checked_link, checked_name, shown

MAX_HOSTLIST_NAMES = 100_000  # names one expression may expand to; a fleet's largest leaf holds ~100

_PARAMETERS = ("switchname", "switches", "nodes", "linkspeed")
_OTHER_PLUGINS = ("blockname", "blocksizes", "ringname")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def _split_top_level(expr: str) -> list[str]:
    """`expr` split at the commas outside brackets; unbalanced brackets raise ValueError."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(expr):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError("a bracket inside a bracket")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("a ']' without its '['")
        elif char == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise ValueError("a '[' without its ']'")
    parts.append(expr[start:])
    return parts


def _bracket_values(body: str) -> list[str]:
    """The numbers a bracket's body `0-3,12` names, each as wide as its range's first bound."""
    values: list[str] = []
    for item in body.split(","):
        match = _RANGE.fullmatch(item)
        if match is None:
            raise ValueError(f"range {item!r} is not N or N-M")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"range {item!r} runs backwards")
        if int(high) - int(low) + 1 > MAX_HOSTLIST_NAMES:
            raise ValueError(f"range {item!r} names more than {MAX_HOSTLIST_NAMES} hosts")
        values.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return values


def _expand_one(item: str) -> list[str]:
    """One hostlist item ("rack[1-2]-n[01-04]"): the product of its brackets, in order."""
    pieces = re.split(r"\[([^\]]*)\]", item)  # text, bracket body, text, ...
    choices = [[piece] if i % 2 == 0 else _bracket_values(piece) for i, piece in enumerate(pieces)]
    count = 1
    for options in choices:
        count *= len(options)
    if count > MAX_HOSTLIST_NAMES:
        raise ValueError(f"{item!r} names {count} hosts, over {MAX_HOSTLIST_NAMES}")
    return ["".join(combination) for combination in itertools.product(*choices)]


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's hostlist expression `expr` ("tux[0-3,12],login1") as the names it stands for, in order,
    without repeats; ValueError says what is wrong with a malformed one."""
    names: list[str] = []
    for item in _split_top_level(expr):
        if not item:
            raise ValueError("an empty name between commas")
        names.extend(_expand_one(item))
        if len(names) > MAX_HOSTLIST_NAMES:
            raise ValueError(f"names more than {MAX_HOSTLIST_NAMES} hosts")
    return list(dict.fromkeys(names))


def _parameters(line: str, source: str, where: str) -> dict[str, str]:
    """A line's `Key=Value` pairs, keys lower-cased; unknown, repeated or other plugins' keys refused."""
    pairs: dict[str, str] = {}
    for token in re.split(r"[ \t]+", line):
        key, sep, value = token.partition("=")
        key = key.lower()
        if key in _OTHER_PLUGINS:
            raise TopologyError(
                source, where, f"{token.partition('=')[0]} is topology/block or ring, not a tree"
            )
        if not sep or key not in _PARAMETERS:
            raise TopologyError(
                source, where, f"{shown(token)} is not one of SwitchName, Switches, Nodes, LinkSpeed"
            )
        if key in pairs:
            raise TopologyError(source, where, f"{key} given twice")
        if not value:
            raise TopologyError(source, where, f"{key} has no value")
        pairs[key] = value
    return pairs


def _names(pairs: dict[str, str], key: str, source: str, where: str) -> list[str]:
    try:
        return expand_hostlist(pairs[key])
    except ValueError as exc:
        raise TopologyError(source, f"{where}, {key.capitalize()}", str(exc)) from None


def parse(text: str, source_name: str) -> list[Link]:
    """The Links topology.conf `text` states (module docstring): nodes under leaves, then leaves under
    spines, each in file order; TopologyError names `source_name`, the line and the fault of anything
    refused."""
    text = checked_input(text, source_name)
    nodes: dict[str, tuple[str, list[str]]] = {}  # leaf -> (where, its nodes)
    switches: dict[str, tuple[str, list[str]]] = {}  # switch -> (where, its child switches)
    defined: set[str] = set()
    for number, raw in enumerate(text.split("\n"), start=1):
        where = f"line {number}"
        line = raw.partition("#")[0].strip(" \t\r")
        if not line:
            continue
        pairs = _parameters(line, source_name, where)
        if "switchname" not in pairs:
            raise TopologyError(source_name, where, "no SwitchName")
        name = checked_name(pairs["switchname"], source=source_name, where=f"{where}, SwitchName")
        if name in defined:
            raise TopologyError(source_name, where, f"switch {shown(name)} is defined twice")
        defined.add(name)
        if "linkspeed" in pairs and not pairs["linkspeed"].isdigit():
            raise TopologyError(
                source_name, f"{where}, LinkSpeed", f"{shown(pairs['linkspeed'])} is not a number"
            )
        if "nodes" in pairs and "switches" in pairs:
            raise TopologyError(source_name, where, f"switch {shown(name)} has both Nodes and Switches")
        if "nodes" in pairs:
            nodes[name] = (where, _names(pairs, "nodes", source_name, where))
        elif "switches" in pairs:
            switches[name] = (where, _names(pairs, "switches", source_name, where))
    links = [
        checked_link((Kind.NODE, node), (Kind.LEAF, leaf), source=source_name, where=where)
        for leaf, (where, children) in nodes.items()
        for node in children
    ]
    for spine, (where, children) in switches.items():
        for child in children:
            if child not in defined:
                raise TopologyError(
                    source_name, where, f"Switches names {shown(child)}, which no line defines"
                )
            if child in nodes:
                links.append(
                    checked_link((Kind.LEAF, child), (Kind.SPINE, spine), source=source_name, where=where)
                )
    return list(dict.fromkeys(links))

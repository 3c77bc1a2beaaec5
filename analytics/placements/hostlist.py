"""Slurm's compact lists, expanded strictly: hostlists ("vela-[001-004,007],gpu-a") and index ranges
("0-3,5", as in a gres detail's IDX).

Only what Slurm writes is accepted: host names of letters, digits, '.', '_' and '-', at most one bracket
per host with a prefix and an optional suffix, ranges `lo-hi` with lo <= hi, zero padding taken from lo's
width. Anything else (nested or unclosed brackets, an empty item, a reversed range, a list that expands
to more than MAX_EXPANDED names) raises ValueError saying what; callers wrap it with where it came from.
"""

from __future__ import annotations

import re

MAX_EXPANDED = 100_000  # names one list may expand to: more is a hostile or broken input, not a fleet
_NAME = re.compile(r"[A-Za-z0-9._-]+\Z")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?\Z")
_HOST = re.compile(r"([A-Za-z0-9._-]*)\[([^\[\]]*)\]([A-Za-z0-9._-]*)\Z")


def expand_ranges(text: str) -> list[str]:
    """The numbers of "0-3,5" (each as written, zero padded to its range's lo width), in order."""
    numbers: list[str] = []
    for item in text.split(","):
        match = _RANGE.match(item)
        if match is None:
            raise ValueError(f"{item!r} is not a number or a range lo-hi")
        lo, hi = match.group(1), match.group(2) or match.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"range {item!r} ends before it starts")
        if len(numbers) + int(hi) - int(lo) + 1 > MAX_EXPANDED:
            raise ValueError(f"expands to more than {MAX_EXPANDED} items")
        numbers += [str(number).zfill(len(lo)) for number in range(int(lo), int(hi) + 1)]
    return numbers


def expand_hostlist(text: str) -> list[str]:
    """The host names of a Slurm hostlist, in the order written; [] for ""."""
    hosts: list[str] = []
    for item in _top_level_items(text) if text else []:
        if _NAME.match(item):
            hosts.append(item)
            continue
        match = _HOST.match(item)
        if match is None:
            raise ValueError(f"{item!r} is not a host name or prefix[ranges]suffix")
        prefix, ranges, suffix = match.groups()
        numbers = expand_ranges(ranges)
        if len(hosts) + len(numbers) > MAX_EXPANDED:
            raise ValueError(f"expands to more than {MAX_EXPANDED} hosts")
        hosts += [f"{prefix}{number}{suffix}" for number in numbers]
    return hosts


def _top_level_items(text: str) -> list[str]:
    """`text` split at the commas outside brackets; ValueError on an unbalanced bracket or an empty item."""
    items, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth not in (0, 1):
            raise ValueError(f"unbalanced or nested bracket at character {index}")
        if char == "," and depth == 0:
            items.append(text[start:index])
            start = index + 1
    if depth:
        raise ValueError("a bracket is not closed")
    items.append(text[start:])
    if "" in items:
        raise ValueError("an empty item")
    return items

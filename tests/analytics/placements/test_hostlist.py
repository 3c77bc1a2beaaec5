"""Slurm hostlists and index ranges expanded strictly: what Slurm writes reads back, the rest is refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics.placements.hostlist import MAX_EXPANDED, expand_hostlist, expand_ranges

NAME = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)


@st.composite
def hostlists(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A hostlist as Slurm writes it (items of names and prefix[ranges]suffix) and the hosts it names."""
    items, hosts = [], []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            name = draw(NAME)
            items.append(name)
            hosts.append(name)
            continue
        prefix, suffix = draw(NAME), draw(st.sampled_from(["", "-ib", ".vela"]))
        width = draw(st.integers(1, 4))
        ranges = []
        for _ in range(draw(st.integers(1, 3))):
            lo = draw(st.integers(0, 10**width - 1))
            hi = draw(st.integers(lo, min(lo + 20, 10**width - 1)))
            ranges.append(f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}")
            hosts += [f"{prefix}{number:0{width}d}{suffix}" for number in range(lo, hi + 1)]
        items.append(f"{prefix}[{','.join(ranges)}]{suffix}")
    return ",".join(items), hosts


@given(hostlists())
def test_every_hostlist_slurm_writes_expands_to_the_hosts_it_names(case: tuple[str, list[str]]) -> None:
    text, hosts = case
    assert expand_hostlist(text) == hosts


def test_the_examples_from_a_fleet_expand_with_their_zero_padding() -> None:
    assert expand_hostlist("vela-[001-004,007]") == [
        "vela-001",
        "vela-002",
        "vela-003",
        "vela-004",
        "vela-007",
    ]
    assert expand_hostlist("gpu[8-10]-ib,login") == ["gpu8-ib", "gpu9-ib", "gpu10-ib", "login"]
    assert expand_hostlist("") == []
    assert expand_ranges("0-1,3") == ["0", "1", "3"]


@pytest.mark.parametrize(
    "text",
    [
        "vela-[001-004",  # unclosed
        "vela-[[1-2]]",  # nested
        "vela-]1[",
        "a,,b",  # empty item
        "vela-[4-1]",  # reversed
        "vela-[1-2][3-4]",  # two brackets
        "vela-[1;2]",
        "vela 001",
        "vela-[]",
        f"n[0-{MAX_EXPANDED}]",  # a bomb
    ],
)
def test_anything_slurm_does_not_write_is_refused_saying_what(text: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        expand_hostlist(text)

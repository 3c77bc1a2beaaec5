"""Slurm topology.conf: the man page's example, Topograph's 3-tier tree, hostlists, hostile lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics.errors import TopologyError
from analytics.topology.importers import slurm
from analytics.topology.model import Entity, Kind, Link

FIXTURES = Path(__file__).parents[2] / "fixtures" / "topology"


def _read(name: str) -> list[Link]:
    return slurm.parse((FIXTURES / name).read_text(), name)


def _under(links: list[Link], parent: Entity) -> list[str]:
    return [link.child.name for link in links if link.parent == parent]


def test_the_man_page_example_puts_dev_nodes_under_three_leaves_under_one_spine() -> None:
    links = _read("slurm-manpage-example.conf")
    assert _under(links, Entity(Kind.LEAF, "s0")) == [f"dev{i}" for i in range(6)]
    assert _under(links, Entity(Kind.LEAF, "s2")) == [f"dev{i}" for i in range(12, 18)]
    assert _under(links, Entity(Kind.SPINE, "s3")) == ["s0", "s1", "s2"]
    assert len(links) == 18 + 3


def test_topographs_three_tier_tree_maps_leaves_and_spines_and_drops_the_core() -> None:
    links = _read("slurm-topograph-oci-sim-tree.conf")
    assert _under(links, Entity(Kind.LEAF, "switch.1.10")) == [f"srv{n}" for n in range(5201, 5209)]
    assert _under(links, Entity(Kind.SPINE, "switch.2.5")) == ["switch.1.9", "switch.1.10"]
    assert not [link for link in links if "switch.3.1" in (link.child.name, link.parent.name)]
    assert len(links) == 12 * 8 + 12


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("tux[0-3,12,18-20]", ["tux0", "tux1", "tux2", "tux3", "tux12", "tux18", "tux19", "tux20"]),
        ("s[0-2,4-5]", ["s0", "s1", "s2", "s4", "s5"]),
        ("node[01-03],login1", ["node01", "node02", "node03", "login1"]),
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
        ("a,a[1-1]", ["a", "a1"]),
    ],
)
def test_hostlists_expand_as_slurm_does(expr: str, names: list[str]) -> None:
    assert slurm.expand_hostlist(expr) == names


@given(
    prefix=st.from_regex(r"[a-z][a-z.-]{0,6}", fullmatch=True),
    ranges=st.lists(st.tuples(st.integers(0, 500), st.integers(0, 20)), min_size=1, max_size=4),
    width=st.integers(1, 4),
)
def test_a_bracket_expands_like_a_plain_loop(prefix: str, ranges: list[tuple[int, int]], width: int) -> None:
    body = ",".join(f"{low:0{width}d}-{low + extra:0{width}d}" for low, extra in ranges)
    expected = [f"{prefix}{n:0{width}d}" for low, extra in ranges for n in range(low, low + extra + 1)]
    assert slurm.expand_hostlist(f"{prefix}[{body}]") == list(dict.fromkeys(expected))


@st.composite
def _trees(draw: st.DrawFn) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Leaves holding contiguous runs of nodes, spines holding some of the leaves."""
    sizes = draw(st.lists(st.integers(1, 12), min_size=1, max_size=8))
    leaves, first = {}, 0
    for i, size in enumerate(sizes):
        leaves[f"leaf{i:02d}"] = [f"gpu{n:04d}" for n in range(first, first + size)]
        first += size
    spines = {
        f"spine{j}": draw(st.lists(st.sampled_from(sorted(leaves)), min_size=1, unique=True))
        for j in range(draw(st.integers(0, 3)))
    }
    return leaves, spines


def _compressed(names: list[str]) -> str:
    """A run of gpuNNNN names as one hostlist range."""
    return f"gpu[{names[0].removeprefix('gpu')}-{names[-1].removeprefix('gpu')}]"


@given(_trees(), st.booleans())
def test_a_generated_topology_conf_round_trips(
    tree: tuple[dict[str, list[str]], dict[str, list[str]]], compress: bool
) -> None:
    leaves, spines = tree
    lines = [
        "# generated",
        *(
            f"SwitchName={leaf} Nodes={_compressed(nodes) if compress else ','.join(nodes)} LinkSpeed=1"
            for leaf, nodes in leaves.items()
        ),
    ]
    lines += [
        f"switchname={spine} switches={','.join(children)}  # a spine" for spine, children in spines.items()
    ]
    expected = {
        Link(Entity(Kind.NODE, n), Entity(Kind.LEAF, leaf)) for leaf, nodes in leaves.items() for n in nodes
    }
    expected |= {
        Link(Entity(Kind.LEAF, c), Entity(Kind.SPINE, s)) for s, children in spines.items() for c in children
    }
    assert set(slurm.parse("\n".join(lines), "gen.conf")) == expected


@pytest.mark.parametrize(
    ("text", "where", "fault"),
    [
        ("SwitchName=s0 Nodes=dev[0-5]\nSwitchName=s1 Nodes=dev[6-", "line 2, Nodes", "without its ']'"),
        ("SwitchName=s0 Nodes=dev[5-0]", "line 1, Nodes", "backwards"),
        ("SwitchName=s0 Nodes=dev[a-b]", "line 1, Nodes", "not N or N-M"),
        ("SwitchName=s0 Nodes=n[0-99999999]", "line 1, Nodes", "more than"),
        ("SwitchName=s0 Nodes=a[0-999],b[0-999],c[0-999]x[0-999]", "line 1, Nodes", "over"),
        ("SwitchName=s0 LinkSpeed=fast Nodes=a", "line 1, LinkSpeed", "not a number"),
        ("SwitchName=s0 Nodes=a Frobs=2", "line 1", "not one of"),
        ("SwitchName=s0 Nodes=a SwitchName=s1", "line 1", "twice"),
        ("Nodes=a", "line 1", "no SwitchName"),
        ("SwitchName=s0 Nodes=a Switches=s1", "line 1", "both"),
        ("SwitchName=s0 Nodes=a\nSwitchName=s0 Nodes=b", "line 2", "defined twice"),
        ("SwitchName=s3 Switches=s[0-2]\nSwitchName=s0 Nodes=a", "line 1", "'s1', which no line defines"),
        ("BlockName=block1 Nodes=node[1-32]", "line 1", "topology/block"),
        ("SwitchName=s\x1b[2J0 Nodes=a", "line 1, SwitchName", "control"),
        ("SwitchName=s0 Nodes=good,ba\x07d", "line 1", "control"),
        ("SwitchName=s0 Nodes=", "line 1", "no value"),
    ],
)
def test_hostile_lines_are_refused_naming_the_line(text: str, where: str, fault: str) -> None:
    with pytest.raises(TopologyError, match=fault) as caught:
        slurm.parse(text, "topology.conf")
    assert caught.value.source == "topology.conf"
    assert caught.value.where == where

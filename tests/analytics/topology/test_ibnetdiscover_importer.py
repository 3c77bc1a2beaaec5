"""ibnetdiscover: Topograph's real NDR fabric sweep (whole blocks of it), generated fabrics, hostile lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics.errors import TopologyError
from analytics.topology.importers import ibnetdiscover
from analytics.topology.model import Entity, Kind, Link

FIXTURES = Path(__file__).parents[2] / "fixtures" / "topology"
EXAMPLE = (FIXTURES / "ibnetdiscover-topograph-example.out").read_text()
LEAF_0404 = Entity(Kind.LEAF, "A09-P1-IBLEAF-04-04")
LEAF_0402 = Entity(Kind.LEAF, "A09-P1-IBLEAF-04-02")


def _under(links: list[Link], parent: Entity) -> list[str]:
    return [link.child.name for link in links if link.parent == parent]


def test_hosts_sit_under_the_leaf_their_hca_is_cabled_to() -> None:
    links = ibnetdiscover.parse(EXAMPLE, "example.out")
    assert _under(links, LEAF_0404) == [f"a08-p1-dgx-04-c{i:02d}" for i in range(1, 18)]
    named = [
        1,
        2,
        3,
        4,
        7,
        10,
        11,
        12,
        14,
        16,
        18,
    ]  # ports 6, 8, 9, 13, 17 hold HCAs with no node description
    assert _under(links, LEAF_0402) == [f"a06-p1-dgx-02-c{i:02d}" for i in named]
    assert _under(links, Entity(Kind.SPINE, "A10-P1-IBSPINE-02")) == [LEAF_0404.name, LEAF_0402.name]
    assert not [link for link in links if "Mellanox" in link.child.name or "MT4129" in link.child.name]


def test_a_sweep_without_a_switch_is_refused() -> None:
    bad = (FIXTURES / "ibnetdiscover-topograph-example-bad.out").read_text()
    with pytest.raises(TopologyError, match="no Switch block"):
        ibnetdiscover.parse(bad, "example-bad.out")


@pytest.mark.parametrize(
    ("description", "host"),
    [
        ("node001 HCA-1", "node001"),
        ("a08-p1-dgx-04-c01 mlx5_5", "a08-p1-dgx-04-c01"),
        ("MT4129 ConnectX7   Mellanox Technologies", None),
        ("Mellanox Technologies Aggregation Node", None),
        ("node001", None),
    ],
)
def test_the_host_name_rule(description: str, host: str | None) -> None:
    assert ibnetdiscover.host_name(description) == host


def _render(leaves: dict[str, list[str]], spines: list[str]) -> str:
    """ibnetdiscover's layout for leaves of hosts, every leaf cabled to every spine."""
    guid = {name: f"{i + 1:016x}" for i, name in enumerate([*leaves, *spines])}
    blocks = ["#\n# Topology file: generated\n#"]
    for leaf, hosts in leaves.items():
        lines = [
            f"switchguid=0x{guid[leaf]}({guid[leaf]})",
            f'Switch\t65 "S-{guid[leaf]}"\t\t# "MF0;{leaf}:MQM9700/U1" enhanced port 0 lid 1 lmc 0',
        ]
        lines += [
            f'[{p}]\t"H-{p:04x}{guid[leaf][4:]}"[1]({p:04x}{guid[leaf][4:]}) \t\t# "{h} mlx5_0" lid 9 4xNDR'
            for p, h in enumerate(hosts, 1)
        ]
        lines += [
            f'[{40 + s}]\t"S-{guid[spine]}"[{s}]\t\t# "MF0;{spine}:MQM9700/U1" lid 2 4xNDR'
            for s, spine in enumerate(spines, 1)
        ]
        blocks.append("\n".join(lines))
    for spine in spines:
        lines = [f'Switch\t65 "S-{guid[spine]}"\t\t# "MF0;{spine}:MQM9700/U1" enhanced port 0 lid 2 lmc 0']
        lines += [
            f'[{p}]\t"S-{guid[leaf]}"[40]\t\t# "MF0;{leaf}:MQM9700/U1" lid 1 4xNDR'
            for p, leaf in enumerate(leaves, 1)
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    spine_count=st.integers(0, 3),
)
def test_a_generated_fabric_reads_back(sizes: list[int], spine_count: int) -> None:
    leaves = {f"LEAF-{i}": [f"gpu-{i}-{h}" for h in range(size)] for i, size in enumerate(sizes)}
    spines = [f"SPINE-{s}" for s in range(spine_count)]
    expected = {
        Link(Entity(Kind.NODE, h), Entity(Kind.LEAF, leaf)) for leaf, hosts in leaves.items() for h in hosts
    }
    expected |= {Link(Entity(Kind.LEAF, leaf), Entity(Kind.SPINE, s)) for leaf in leaves for s in spines}
    assert set(ibnetdiscover.parse(_render(leaves, spines), "gen.out")) == expected


PORT_LINE = EXAMPLE.split("\n").index(
    next(line for line in EXAMPLE.split("\n") if '"a08-p1-dgx-04-c05 mlx5_5"' in line)
)


@pytest.mark.parametrize(
    ("text", "where", "fault"),
    [
        (EXAMPLE[: EXAMPLE.index("c05 mlx5_5")], f"line {PORT_LINE + 1}", "no ibnetdiscover line"),
        ('[1]\t"H-e09d7303007a4bd8"[1]\t\t# "n1 mlx5_0" lid 6 4xNDR', "line 1", "outside a device block"),
        (
            EXAMPLE.replace("a08-p1-dgx-04-c05 mlx5_5", "a08-p1\x1b[1mdgx mlx5_5"),
            f"line {PORT_LINE + 1}",
            "control",
        ),
        (EXAMPLE.replace("IBLEAF-04-02:", "IBLEAF-04-04:"), "line ", "two switches are named"),
        ("Switch 65 S-2c5e # no quotes", "line 1", "no ibnetdiscover line"),
    ],
)
def test_hostile_sweeps_are_refused_naming_the_line(text: str, where: str, fault: str) -> None:
    with pytest.raises(TopologyError, match=fault) as caught:
        ibnetdiscover.parse(text, "sweep.out")
    assert caught.value.where.startswith(where)

"""The operator's inventory file: what it says becomes each node's view, and a bad file is refused whole,
the error naming the file, line and key."""

from __future__ import annotations

import json
import string

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from analytics.errors import TopologyError
from analytics.topology import inventory
from analytics.topology.model import Edge, Kind, Source
from analytics.topology.view import members, node_views

FILE = "/etc/fleetlens/topology.yaml"
EXAMPLE = """\
nodes:
  vela-001: {host: host-000, rails: [rail-0, rail-1]}
  vela-002: {host: host-000, leaf: leaf-01}
hosts:
  host-000: {leaf: leaf-00, rack: rack-00}
leaves:
  leaf-00: {spine: spine-0}
  leaf-01: {spine: spine-1}
racks:
  rack-00: {pdu: pdu-0}
"""


def views(text: str) -> list[dict]:
    return node_views([Edge(link, Source.INVENTORY, 0.0) for link in inventory.parse(text, FILE)])


def test_each_node_gets_its_host_leaf_spine_rails_and_rack_and_its_own_leaf_overrides_its_hosts() -> None:
    assert views(EXAMPLE) == [
        {"node": "vela-001", "host": "host-000", "leaf": "leaf-00", "spine": "spine-0", "rack": "rack-00",
         "rail": ["rail-0", "rail-1"]},
        {"node": "vela-002", "host": "host-000", "leaf": "leaf-01", "spine": "spine-1", "rack": "rack-00"},
    ]  # fmt: skip


def test_a_nodes_nics_put_each_nic_on_its_own_rail_leaf_and_pf() -> None:
    text = """
nodes:
  vela-001:
    host: host-000
    nics:
      mlx5_0: {rail: rail-0}
      mlx5_1: {rail: rail-1, leaf: leaf-02, pf: host-000/eth1}
      mlx5_2:
  vela-002: {host: host-000, rails: [rail-0]}
"""
    edges = [Edge(link, Source.INVENTORY, 0.0) for link in inventory.parse(text, FILE)]
    assert [view.get("rail") for view in node_views(edges)] == [["rail-0", "rail-1"], ["rail-0"]]
    groups = members(edges)
    assert groups[Kind.RAIL] == {"rail-0": {"vela-001/mlx5_0", "vela-002/"}, "rail-1": {"vela-001/mlx5_1"}}
    assert groups[Kind.PF] == {"host-000/eth1": {"vela-001/mlx5_1"}}
    assert groups[Kind.LEAF] == {"leaf-02": {"vela-001"}}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("nodes: {vela-001: {hots: host-000}}", "line 1: nodes.vela-001: unknown key 'hots'"),
        ("switches: {}", "line 1: unknown section 'switches'"),
        ("nodes: {vela-001: {host: [host-000]}}", "nodes.vela-001.host: expected a name, got a sequence"),
        ("nodes: {vela-001: {rails: rail-0}}", "nodes.vela-001.rails: expected a list of names"),
        ("nodes: {vela-001: {host: 001}}", "nodes.vela-001.host: YAML reads '001' as int; quote the name"),
        ('nodes: {"vela\\x07": {host: h}}', r"nodes: a key: name 'vela\x07' holds a control"),
        ('nodes: {vela-001: {host: " h"}}', "nodes.vela-001.host: name ' h' begins or ends with whitespace"),
        ("nodes:\n  vela-001: {host: h1}\n  vela-001: {host: h2}", "line 3: nodes.vela-001: written twice"),
        ("nodes: {vela-001: {host: h1, host: h2}}", "nodes.vela-001.host: written twice"),
        ("nodes: {vela-001: {rails: [r, r]}}", "nodes.vela-001.rails: a name listed twice"),
        ("hosts: &h {a: {leaf: l}}\nracks: *h", "line 2: YAML aliases (*name) are not accepted"),
        ("[]", "line 1: the file: expected a mapping of the sections"),
        ("- " * 5000 + "x", "line 1: nested deeper than an inventory is"),
        ("", "empty"),
        ("nodes: {a\ud800: {host: b}}", "not YAML or JSON"),
        ("nodes: {a: {host: b}", "not YAML or JSON"),
        (
            "nodes: {a: {nics: {mlx5_0: {rial: r}}}}",
            "nodes.a.nics.mlx5_0: unknown key 'rial'; known: rail, leaf, pf",
        ),
        ("nodes: {a: {nics: [mlx5_0]}}", "nodes.a.nics: expected a mapping of RDMA device names"),
        ("nodes: {a: {nics: {mlx5/0: {rail: r}}}}", "nodes.a.nics: a device name 'mlx5/0' holds '/'"),
        ("nodes: {a: {nics: {mlx5_0: {rail: 0}}}}", "nodes.a.nics.mlx5_0.rail: YAML reads '0' as int"),
        ("hosts: {h: {nics: {mlx5_0: {rail: r}}}}", "hosts.h: unknown key 'nics'; known: leaf, rack, rails"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_line_and_key(text: str, error: str) -> None:
    with pytest.raises(TopologyError) as refused:
        inventory.parse(text, FILE)
    assert str(refused.value).startswith(FILE)
    assert error in str(refused.value)


NAMES = st.text(string.ascii_lowercase + string.digits + "-.:", min_size=1, max_size=8).map(lambda s: "n" + s)


def parents(keys: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional=keys)


INVENTORIES = st.fixed_dictionaries(
    {},
    optional={
        "nodes": st.dictionaries(
            NAMES,
            parents({"host": NAMES, "leaf": NAMES, "spine": NAMES, "rack": NAMES,
                     "rails": st.lists(NAMES, unique=True, max_size=3),
                     "nics": st.dictionaries(st.sampled_from(["mlx5_0", "mlx5_1", "ib0"]),
                                             st.none() | parents({"rail": NAMES, "leaf": NAMES, "pf": NAMES}),
                                             max_size=3)}),
            max_size=6,
        ),
        "hosts": st.dictionaries(NAMES, parents({"leaf": NAMES, "rack": NAMES}), max_size=4),
        "leaves": st.dictionaries(NAMES, parents({"spine": NAMES, "rack": NAMES}), max_size=4),
    },
)  # fmt: skip


def expected_views(written: dict) -> list[dict]:
    """The views docs/topology.md promises, layer by layer: the nearest parent that the file names, the
    lowest name of those as near; a node's NICs' leaves and rails as near as its own."""
    nodes, hosts, leaves = (written.get(s, {}) for s in ("nodes", "hosts", "leaves"))
    found = []
    for node, entry in sorted(nodes.items()):
        host = hosts.get(entry.get("host"), {})
        nics = [parents for parents in (entry.get("nics") or {}).values() if parents]
        # the node's own leaves (its NICs' too) override its host's, and the walk goes on from them
        own = {entry["leaf"]} if "leaf" in entry else set()
        own |= {nic["leaf"] for nic in nics if "leaf" in nic}
        leaf_level, leaf_names = (1, own) if own else (2, {host.get("leaf")} - {None})
        above_leaves = [leaves.get(leaf, {}) for leaf in leaf_names]
        paths = {
            "host": [(1, entry.get("host"))],
            "leaf": [(leaf_level, leaf) for leaf in leaf_names],
            "spine": [
                (1, entry.get("spine")),
                *((leaf_level + 1, above.get("spine")) for above in above_leaves),
            ],
            "rack": [
                (1, entry.get("rack")),
                (2, host.get("rack")),
                *((leaf_level + 1, above.get("rack")) for above in above_leaves),
            ],
        }
        view: dict = {"node": node}
        for layer, candidates in paths.items():
            if named := sorted((depth, name) for depth, name in candidates if name):
                view[layer] = min(name for depth, name in named if depth == named[0][0])
        if rails := {*entry.get("rails", ()), *(nic["rail"] for nic in nics if "rail" in nic)}:
            view["rail"] = sorted(rails)
        if len(view) > 1 or entry.get("nics"):  # a node with NICs is linked to them: it is there
            found.append(view)
    return found


def expected_rails(written: dict) -> dict[str, set[str]]:
    """Each rail's NICs "<node>/<device>", and "<node>/" for a node on it by `rails` with no NIC there."""
    rails: dict[str, set[str]] = {}
    for node, entry in written.get("nodes", {}).items():
        nics = {f"{node}/{device}": parents for device, parents in (entry.get("nics") or {}).items()}
        on_nic = {(nic, parents["rail"]) for nic, parents in nics.items() if parents and "rail" in parents}
        for nic, rail in on_nic:
            rails.setdefault(rail, set()).add(nic)
        for rail in set(entry.get("rails", ())) - {rail for _, rail in on_nic}:
            rails.setdefault(rail, set()).add(f"{node}/")
    return rails


@given(INVENTORIES)
def test_any_inventory_as_yaml_or_json_gives_the_views_it_says(written: dict) -> None:
    text = yaml.safe_dump(written) if written else "{}"
    assert views(text) == views(json.dumps(written)) == expected_views(written)
    links = [Edge(link, Source.INVENTORY, 0.0) for link in inventory.parse(text, FILE)]
    assert members(links)[Kind.RAIL] == expected_rails(written)

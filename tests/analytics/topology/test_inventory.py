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
from analytics.topology.model import Edge, Source
from analytics.topology.view import node_views

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
                     "rails": st.lists(NAMES, unique=True, max_size=3)}),
            max_size=6,
        ),
        "hosts": st.dictionaries(NAMES, parents({"leaf": NAMES, "rack": NAMES}), max_size=4),
        "leaves": st.dictionaries(NAMES, parents({"spine": NAMES, "rack": NAMES}), max_size=4),
    },
)  # fmt: skip


def expected_views(written: dict) -> list[dict]:
    """The views docs/topology.md promises, layer by layer: the nearest parent that the file names, the
    lowest name of those as near."""
    nodes, hosts, leaves = (written.get(s, {}) for s in ("nodes", "hosts", "leaves"))
    found = []
    for node, entry in sorted(nodes.items()):
        host = hosts.get(entry.get("host"), {})
        # the node's own leaf overrides its host's, and the walk goes on from the leaf that counts
        leaf_level, leaf = (1, entry["leaf"]) if "leaf" in entry else (2, host.get("leaf"))
        above_leaf = leaves.get(leaf, {})
        paths = {
            "host": [(1, entry.get("host"))],
            "leaf": [(leaf_level, leaf)],
            "spine": [(1, entry.get("spine")), (leaf_level + 1, above_leaf.get("spine"))],
            "rack": [(1, entry.get("rack")), (2, host.get("rack")), (leaf_level + 1, above_leaf.get("rack"))],
        }
        view: dict = {"node": node}
        for layer, candidates in paths.items():
            if named := sorted((depth, name) for depth, name in candidates if name):
                view[layer] = min(name for depth, name in named if depth == named[0][0])
        if entry.get("rails"):
            view["rail"] = sorted(entry["rails"])
        if len(view) > 1:
            found.append(view)
    return found


@given(INVENTORIES)
def test_any_inventory_as_yaml_or_json_gives_the_views_it_says(written: dict) -> None:
    text = yaml.safe_dump(written) if written else "{}"
    assert views(text) == views(json.dumps(written)) == expected_views(written)

"""kubectl's node list with Topograph's labels, both families, and hostile documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analytics.errors import TopologyError
from analytics.topology.importers import k8s_nodes
from analytics.topology.model import Entity, Kind, Link

FIXTURES = Path(__file__).parents[2] / "fixtures" / "topology"
TIERS = (FIXTURES / "k8s-nodes-topograph-tiers.json").read_text()


def test_topographs_tier_labels_put_each_node_under_its_leaf_spine_and_accelerator_domain() -> None:
    links = k8s_nodes.parse(TIERS, "nodes.json")
    assert Link(Entity(Kind.NODE, "Node104"), Entity(Kind.LEAF, "S2")) in links
    assert Link(Entity(Kind.LEAF, "S2"), Entity(Kind.SPINE, "S1")) in links
    assert Link(Entity(Kind.NODE, "Node104"), Entity(Kind.RACK, "B1")) in links
    assert Link(Entity(Kind.NODE, "Node401"), Entity(Kind.LEAF, "S6")) in links
    assert Link(Entity(Kind.LEAF, "S6"), Entity(Kind.SPINE, "S4")) in links
    assert {link.child.name for link in links if link.parent == Entity(Kind.LEAF, "S2")} == {
        "Node104",
        "Node105",
        "Node106",
    }
    assert not [link for link in links if link.parent.name in ("IB1", "IB2")]  # the core tier has no layer
    assert len([link for link in links if link.child.kind == Kind.NODE]) == 12 * 2


def test_the_legacy_labels_give_the_same_links() -> None:
    legacy = (FIXTURES / "k8s-nodes-topograph-legacy.json").read_text()
    assert k8s_nodes.parse(legacy, "old.json") == k8s_nodes.parse(TIERS, "new.json")


def _node_list(*labels: dict[str, object]) -> str:
    items = [{"metadata": {"name": f"n{i}", "labels": item}} for i, item in enumerate(labels)]
    return json.dumps({"kind": "NodeList", "apiVersion": "v1", "items": items})


def test_an_api_node_list_without_item_kinds_and_partial_labels() -> None:
    text = _node_list(
        {"network.topology.nvidia.com/spine": "sp1"},
        {"nvidia.com/gpu.clique": "c1d2.3"},
        {"topology.kubernetes.io/zone": "z1"},
    )
    assert k8s_nodes.parse(text, "api") == [
        Link(Entity(Kind.NODE, "n0"), Entity(Kind.SPINE, "sp1")),
        Link(Entity(Kind.NODE, "n1"), Entity(Kind.RACK, "c1d2.3")),
    ]


@pytest.mark.parametrize(
    ("text", "where", "fault"),
    [
        (TIERS[: len(TIERS) // 2], "line ", "not JSON"),
        ("[" * 200_000, "input", "too deep"),
        ("[]", "$", "not dict"),
        ('{"kind": "PodList", "items": []}', "$.kind", "not List"),
        ('{"kind": "List", "items": {}}', "$.items", "not list"),
        ('{"kind": "List", "items": [{"kind": "Pod", "metadata": {}}]}', "$.items[0].kind", "not Node"),
        ('{"kind": "List", "items": [{"metadata": {"labels": {}}}]}', "$.items[0].metadata.name", "text"),
        (
            '{"kind": "List", "items": [{"metadata": {"name": "a", "labels": []}}]}',
            "$.items[0].metadata.labels",
            "list",
        ),
        (
            _node_list({"fabric.topograph.run/tier-0": 7}),
            "$.items[0].metadata.labels['fabric.topograph.run/tier-0']",
            "text",
        ),
        (
            _node_list({"fabric.topograph.run/tier-0": "leaf\u001b]0;pwned\u0007"}),
            "$.items[0].metadata.labels",
            "control",
        ),
        (_node_list({"fabric.topograph.run/tier-1": "s" * 300}), "$.items[0].metadata.labels", "over"),
    ],
)
def test_hostile_documents_are_refused_naming_the_json_path(text: str, where: str, fault: str) -> None:
    with pytest.raises(TopologyError, match=fault) as caught:
        k8s_nodes.parse(text, "nodes.json")
    assert caught.value.where.startswith(where)

"""`kubectl get nodes -o json` (a v1 List or NodeList of Nodes) as Links, from NVIDIA Topograph's labels.

Topograph labels each node with its place in the fabric. Both label families it has written are read;
where a node carries both, the current one wins:

    layer        current labels (Topograph 1.0 on)         legacy labels (before 1.0)
    leaf         fabric.topograph.run/tier-0               network.topology.nvidia.com/leaf
    spine        fabric.topograph.run/tier-1               network.topology.nvidia.com/spine
    (core)       fabric.topograph.run/tier-2 ...           network.topology.nvidia.com/core
    accelerator  accelerator.topograph.run/domain          network.topology.nvidia.com/accelerator,
                                                           then the GPU Operator's nvidia.com/gpu.clique

Links: node -> leaf, leaf -> spine (node -> spine where a node has a spine but no leaf), and node ->
rack for the accelerator (NVLink) domain: an NVL72 domain is one rack, sharing its NVSwitch trays and power
(a domain spanning racks, as NVL576 does, still becomes one "rack" entity named as the label names it).
Core tiers yield no link, as the model has no layer above spine. topology.kubernetes.io/region and /zone
yield none either: the model has no zone or region layer.

Refused whole, naming the JSON path: input that is not JSON or nests too deep, a document that is not a
List or NodeList of Nodes, a node without a name, labels that are not text, an unacceptable name.
"""

from __future__ import annotations

from typing import Any

from analytics.errors import TopologyError
from analytics.topology.importers._input import expect, load_json
from analytics.topology.model import Kind, Link
from analytics.topology.names import checked_link, checked_name, shown

LEAF_LABELS = ("fabric.topograph.run/tier-0", "network.topology.nvidia.com/leaf")
SPINE_LABELS = ("fabric.topograph.run/tier-1", "network.topology.nvidia.com/spine")
ACCELERATOR_LABELS = (
    "accelerator.topograph.run/domain",
    "network.topology.nvidia.com/accelerator",
    "nvidia.com/gpu.clique",
)


def _label(labels: dict[str, Any], keys: tuple[str, ...], source: str, path: str) -> str | None:
    """The value of the first of `keys` that `labels` holds, checked as a name; None if none."""
    for key in keys:
        if key in labels:
            return checked_name(labels[key], source=source, where=f"{path}[{key!r}]")
    return None


def _node_links(item: Any, source: str, path: str) -> list[Link]:
    node = expect(item, dict, source, path)
    if node.get("kind", "Node") != "Node":
        raise TopologyError(source, f"{path}.kind", f"{shown(node['kind'])}, not Node")
    metadata = expect(node.get("metadata"), dict, source, f"{path}.metadata")
    name = checked_name(metadata.get("name"), source=source, where=f"{path}.metadata.name")
    labels_path = f"{path}.metadata.labels"
    labels = expect(metadata.get("labels", {}), dict, source, labels_path)
    leaf = _label(labels, LEAF_LABELS, source, labels_path)
    spine = _label(labels, SPINE_LABELS, source, labels_path)
    domain = _label(labels, ACCELERATOR_LABELS, source, labels_path)
    links = []
    if leaf is not None:
        links.append(checked_link((Kind.NODE, name), (Kind.LEAF, leaf), source=source, where=labels_path))
    if spine is not None:
        below = (Kind.LEAF, leaf) if leaf is not None else (Kind.NODE, name)
        links.append(checked_link(below, (Kind.SPINE, spine), source=source, where=labels_path))
    if domain is not None:
        links.append(checked_link((Kind.NODE, name), (Kind.RACK, domain), source=source, where=labels_path))
    return links


def parse(text: str, source_name: str) -> list[Link]:
    """The Links kubectl's node list `text` states (module docstring), in node order, without repeats."""
    document = expect(load_json(text, source_name), dict, source_name, "$")
    if document.get("kind") not in ("List", "NodeList"):
        raise TopologyError(source_name, "$.kind", f"{shown(document.get('kind'))}, not List or NodeList")
    items = expect(document.get("items"), list, source_name, "$.items")
    links = [link for i, item in enumerate(items) for link in _node_links(item, source_name, f"$.items[{i}]")]
    return list(dict.fromkeys(links))

"""Where each simulated VM sits: hosts, leaves, spines, racks and rails, laid out in node order.

A scenario's `topology` section (sim.scenario) gives the fan-out of each layer; names follow from it:
node i (0-based, in fleet order) runs on host i // vms_per_host; host h hangs under leaf
h // hosts_per_leaf and sits in rack h // hosts_per_rack; leaf l under spine l // leaves_per_spine; NIC j
of every node is on rail j. The last parent of a layer may have fewer children than the others. The
layout speaks analytics.topology.model's vocabulary, so the simulated fleet reports its shape as a real
one's importers would (`links`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

from analytics.topology import inventory
from analytics.topology.model import Kind, Link

DEFAULT_VMS_PER_HOST = 1  # one VM holding all of a host's GPUs, as on Vela
DEFAULT_HOSTS_PER_LEAF = 8
DEFAULT_LEAVES_PER_SPINE = 4
DEFAULT_HOSTS_PER_RACK = 4


@dataclass(frozen=True)
class Topology:
    """The fan-out of each layer (validated by sim.scenario) and the fleet's node names, in order."""

    nodes: tuple[str, ...]
    vms_per_host: int = DEFAULT_VMS_PER_HOST
    hosts_per_leaf: int = DEFAULT_HOSTS_PER_LEAF
    leaves_per_spine: int = DEFAULT_LEAVES_PER_SPINE
    rails: int = 4  # one per NIC: sim.scenario makes it the fleet's nics_per_node
    hosts_per_rack: int = DEFAULT_HOSTS_PER_RACK

    def parent(self, node: str, layer: Kind) -> str:
        """The name of `node`'s parent in `layer` (host, leaf, spine or rack; not rail: a node has one per
        NIC)."""
        host = self._position[node] // self.vms_per_host
        match layer:
            case Kind.HOST:
                return f"host-{host:03d}"
            case Kind.LEAF:
                return f"leaf-{host // self.hosts_per_leaf:02d}"
            case Kind.SPINE:
                return f"spine-{host // self.hosts_per_leaf // self.leaves_per_spine}"
            case Kind.RACK:
                return f"rack-{host // self.hosts_per_rack:02d}"
        raise ValueError(f"a node has no single parent in layer {layer}")

    @cached_property
    def _position(self) -> dict[str, int]:
        return {node: index for index, node in enumerate(self.nodes)}

    def names(self, layer: Kind) -> tuple[str, ...]:
        """Every parent of `layer`, in order (the rails too)."""
        if layer == Kind.RAIL:
            return tuple(rail_name(nic) for nic in range(self.rails))
        return tuple(dict.fromkeys(self.parent(node, layer) for node in self.nodes))

    def nodes_under(self, layer: Kind, name: str) -> tuple[str, ...]:
        """The VMs below parent `name` of `layer`, in fleet order (every node for a rail)."""
        if layer == Kind.RAIL:
            return self.nodes if name in self.names(Kind.RAIL) else ()
        return tuple(node for node in self.nodes if self.parent(node, layer) == name)

    def links(self) -> list[Link]:
        """The layout as child -> parent links (node -> host, each NIC -> its node and its rail, host ->
        leaf and rack, leaf -> spine): the inventory() as the operator's importer reads it, so the two
        cannot disagree."""
        return inventory.parse(self.inventory(), "the scenario's topology")

    def inventory(self) -> str:
        """The layout as the operator's inventory file (analytics.topology.inventory, JSON): each node's
        host and NICs, NIC mlx5_j on rail j (sim.sysfs names them), each host's leaf and rack, each
        leaf's spine; what `links` returns."""
        nodes, hosts, leaves = {}, {}, {}
        nics = {f"mlx5_{nic}": {"rail": rail_name(nic)} for nic in range(self.rails)}
        for node in self.nodes:
            host, leaf = self.parent(node, Kind.HOST), self.parent(node, Kind.LEAF)
            nodes[node] = {"host": host, "nics": nics}
            hosts[host] = {"leaf": leaf, "rack": self.parent(node, Kind.RACK)}
            leaves[leaf] = {"spine": self.parent(node, Kind.SPINE)}
        return json.dumps({"nodes": nodes, "hosts": hosts, "leaves": leaves}, indent=1)


def rail_name(nic: int) -> str:
    """The rail NIC `nic` of every node is on."""
    return f"rail-{nic}"

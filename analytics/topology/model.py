"""The topology's vocabulary: what an entity is, what an edge between two says, and which source wins.

A VM sees nothing above itself, so the fleet's shape is assembled from what others see. Every importer
(an inventory file, a host agent's report, Kubernetes node labels, Slurm topology.conf, ibnetdiscover
output, the guest's own view) turns its input into Links: "child sits under parent", nothing more. The
store gives each link its source and validity interval (Edge), so a postmortem reads the topology as it
was at the time. Where two sources disagree about a child's parent of one kind, the source earlier in
SOURCES wins: an operator's inventory over everything, then what a hypervisor sees of its own VMs, then
what schedulers and the fabric say, then what a guest says of itself.

Standard library only: the host agent and the CLI read this without pandas.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """What an entity is. `node` is a VM (or bare-metal node) as the rest of fleetlens names it."""

    NODE = "node"
    HOST = "host"  # the hypervisor a VM runs on
    GPU = "gpu"
    VF = "vf"  # an SR-IOV virtual function passed to a VM
    PF = "pf"  # the physical NIC function its VFs share
    LEAF = "leaf"
    SPINE = "spine"
    RAIL = "rail"
    RACK = "rack"
    PDU = "pdu"
    # A libvirt domain by its UUID: the one name both its host (the domain XML) and the guest itself (DMI
    # product_uuid) give it, where the domain's name and the guest's node name may differ.
    DOMAIN = "domain"


class Source(StrEnum):
    """Where an edge came from, highest precedence first (SOURCES)."""

    INVENTORY = "inventory"
    HOST_AGENT = "host_agent"
    KUBERNETES = "k8s"
    SLURM = "slurm"
    IBNETDISCOVER = "ibnetdiscover"
    GUEST = "guest"


SOURCES: tuple[Source, ...] = tuple(Source)  # precedence: a source earlier here wins over a later one


@dataclass(frozen=True, order=True)
class Entity:
    """One thing in the fleet, named as its own source names it ("vela-007", "leaf-02", "0000:3b:00.2")."""

    kind: Kind
    name: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True, order=True)
class Link:
    """`child` sits under `parent`, which means a fault of the parent reaches the child: a VM under its
    host and under the host's VFs and GPUs it is passed; a VF under its PF; a PF and a host under their
    leaf; a leaf under its spine. What an importer reports, before the store dates it.

    A NIC as the node itself names it (the inventory's `nics`, the guest's report: VF "<node>/mlx5_0",
    the name a NIC anomaly carries) sits under its node instead, as the node's device. The two
    directions say different things and both are needed: only a NIC below its node is a unit the
    localization counts (a host VF "<host>/<pci>" no anomaly names would count one NIC twice under its
    PF), and source precedence, taken per child and parent kind, would let one source's devices of a
    node erase another's if both were links from the node."""

    child: Entity
    parent: Entity


@dataclass(frozen=True, order=True)
class Edge:
    """A link as the store holds it: who said so, and from when until when (unix seconds; `valid_to`
    None while it holds)."""

    link: Link
    source: Source
    valid_from: float
    valid_to: float | None = None

    def holds_at(self, ts: float) -> bool:
        """Whether this edge was in force at `ts`."""
        return self.valid_from <= ts and (self.valid_to is None or ts < self.valid_to)

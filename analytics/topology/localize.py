"""Shared-fault localization: which leaf, spine, rail, host or rack explains its children's per-node
anomalies better than chance, so that one fault above many nodes is reported once, as itself.

Each window, for every parent with n active children of which k have a per-node anomaly, the question is
whether k is unlikely under the fleet's base rate: of the topology's N active children K are anomalous,
and a parent's n children drawn at random would hold X of them, X hypergeometric. Children are nodes, but
NICs ("<node>/<device>", the component "mlx5_2:1" names) in the NIC layers (rail, PF), where a fault shows
on one NIC of each node; N and K are of the layer's granularity (docs/detectors.md, "Shared faults"). The
caller builds the Topology of the window's active nodes alone. A parent is a candidate when

    k >= min_anomalous,  k / n >= min_fraction,  and  min(1, P(X >= k) x m) <= alpha

where m, the Bonferroni factor, is the number of parents of every layer with at least `min_anomalous`
children, fixed by the topology. A candidate is confirmed after `persistence` consecutive windows; the
caller passes the streaks (Localization.streaks) back to the next call, so the localizer keeps no state.

Confirmed parents explain top-down, widest first (most nodes below; for the same nodes, the earlier in
`layers`), compared across granularities by the nodes below them: a parent whose anomalous nodes, but for
fewer than `min_anomalous`, lie under one narrower confirmed parent leaves them to it (a rack holding one
flapping leaf is the leaf); else it explains its children's anomalies no wider parent explained, and is
reported where at least `min_anomalous` such children remain. No anomaly is explained twice; a lone
anomalous child under a healthy parent stays a node fault. The evidence's `children` are the nodes below
the parent; `n`, `k` and `anomalous_children` are at its granularity (a rail names its NICs).

Only anomalies of `shared_kinds` count (a GPU's own Xids or loss are the node's whatever its neighbours
show); nodes the topology does not hold are out of N and K. What it cannot tell apart: docs/detectors.md.
The score (`score`) is -log10 of the corrected p-value: higher = more anomalous, 0 at a p-value of 1.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from scipy.stats import hypergeom

from analytics.errors import DetectorError, SettingError
from analytics.evidence import SharedFaultEvidence
from analytics.topology.model import Kind
from analytics.topology.view import LAYERS, NIC_LAYERS, unit, unit_node

Parent = tuple[str, str]  # (layer, name)

# the per-node anomaly kinds a shared layer can cause; a GPU's own fault (its Xids, a lost GPU, DBEs)
# and the application's errors are the node's whatever its neighbours show, never counted nor explained
SHARED_KINDS: tuple[str, ...] = (
    "link_flap",
    "link_down",
    "congestion",
    "port_errors",
    "dma_degraded",
    "slow_node",
    "gpu_throttle",
    "peer_outlier",
)

KIND_WORDS = {
    "link_flap": "link flaps",
    "link_down": "links down",
    "congestion": "congestion",
    "port_errors": "port errors",
    "dma_degraded": "degraded DMA",
    "slow_node": "slow steps",
    "gpu_throttle": "GPU throttling",
    "gpu_fault": "GPU faults",
    "gpu_app_error": "application GPU errors",
    "peer_outlier": "outlying metrics",
}
CHECK = {  # what to check, per layer
    Kind.LEAF: "check optics and switch logs",
    Kind.SPINE: "check the spine's links to its leaves and its switch logs",
    Kind.RAIL: "check the rail's switches and its congestion control (ECN, PFC)",
    Kind.HOST: "check the host's PCIe root complex and physical NIC (PF)",
    Kind.RACK: "check the rack's power, cooling and top-of-rack switch",
    Kind.PDU: "check the PDU and its feeds",
}
CHECK_BY_KIND = {  # what to check where the dominant kind says more than the layer
    (Kind.LEAF, "congestion"): "check the switch's buffers, ECN and PFC settings and uplink load",
    (Kind.SPINE, "congestion"): "check the spine's buffers, ECN and PFC settings and its load",
    (Kind.HOST, "gpu_throttle"): "check the host's power supply and cooling",
    (Kind.HOST, "dma_degraded"): "check the host's PCIe links, root complex and IOMMU settings",
    (Kind.RACK, "gpu_throttle"): "check the rack's power capping and cooling",
}


@dataclass(frozen=True)
class NodeAnomaly:
    """A per-node anomaly of the window: the node (a VM), its kind, its id in the anomalies table and
    the component it names ("mlx5_2:1" a NIC's port, "gpu:3" a GPU, "" the whole node)."""

    node: str
    kind: str
    id: str
    component: str = ""

    def units(self) -> tuple[str, ...]:
        """The units it counts for: its node in the node layers, the node with no NIC named in the NIC
        layers ("<node>/"), and its NIC ("<node>/<device>") where it names one."""
        device, colon, _ = self.component.partition(":")
        whole = (self.node, unit(self.node, ""))
        return (*whole, unit(self.node, device)) if colon and device and device != "gpu" else whole


@dataclass(frozen=True)
class Topology:
    """The active units under each parent, per layer: nodes, and in NIC_LAYERS NICs "<node>/<device>"
    (analytics.topology.view.members). Read every window; `of` builds it from layer -> parent -> child
    units, Membership.topology from a membership built once per change of the topology."""

    children: Mapping[Parent, frozenset[str]]
    nodes: Mapping[Parent, frozenset[str]]  # the nodes each parent's children are or belong to
    fleet: frozenset[str]  # every active node under some parent
    units: Mapping[bool, frozenset[str]]  # per granularity (True: NIC) every active unit: its N

    @classmethod
    def of(
        cls, layers: Mapping[str, Mapping[str, Iterable[str]]], active: Collection[str] | None = None
    ) -> Topology:
        """The topology of `layers` (layer -> parent -> child units), of the nodes in `active` alone
        where given (a dead or removed VM counts nowhere); a parent with no active child is left out,
        as it can hold no anomaly."""
        return Membership.of(layers).topology(active)


@dataclass(frozen=True)
class Membership:
    """The topology of every node, and each node's NIC-layer units once a window first lacks a node:
    what a Topology derives from the layers, built once per change of the topology, so that a window's
    active nodes (`topology`) cost the parents of the nodes that are not active, not every membership
    of the fleet again."""

    whole: Topology  # of every node

    @classmethod
    def of(cls, layers: Mapping[str, Mapping[str, Iterable[str]]]) -> Membership:
        """The membership of `layers` (layer -> parent -> child units); a parent with no child is left out."""
        children, nodes = {}, {}
        for layer, parents in layers.items():
            node_of = unit_node if layer in NIC_LAYERS else str
            for parent, units in parents.items():
                if kept := {unit_name: node_of(unit_name) for unit_name in units}:
                    children[(layer, parent)] = frozenset(kept)
                    nodes[(layer, parent)] = frozenset(kept.values())
        units = {
            nic: frozenset().union(*(c for (layer, _), c in children.items() if (layer in NIC_LAYERS) is nic))
            for nic in (False, True)
        }
        return cls(Topology(children, nodes, frozenset().union(*nodes.values()), units))

    @cached_property
    def nic_units_of(self) -> Mapping[str, list[str]]:
        """Each node's units in NIC_LAYERS ("<node>/<device>"); a node with none is absent."""
        held: dict[str, list[str]] = defaultdict(list)
        for unit_name in self.whole.units[True]:
            held[unit_node(unit_name)].append(unit_name)
        return dict(held)

    def topology(self, active: Collection[str] | None = None) -> Topology:
        """The topology of the nodes in `active` alone (every node where None), the same as
        Topology.of(layers, active): a parent of no inactive node keeps its sets as built, the others
        lose the inactive nodes and their units, in the order the layers gave the parents."""
        whole = self.whole
        gone = frozenset() if active is None else whole.fleet.difference(active)
        if not gone:
            return whole
        gone_nics = frozenset().union(*(self.nic_units_of.get(node, ()) for node in gone))
        children, nodes = {}, {}
        for parent, units in whole.children.items():
            if whole.nodes[parent].isdisjoint(gone):
                children[parent], nodes[parent] = units, whole.nodes[parent]
            elif kept := units.difference(gone_nics if parent[0] in NIC_LAYERS else gone):
                children[parent], nodes[parent] = kept, whole.nodes[parent].difference(gone)
        units = {False: whole.units[False].difference(gone), True: whole.units[True].difference(gone_nics)}
        return Topology(children, nodes, whole.fleet.difference(gone), units)


@dataclass(frozen=True)
class Candidate:
    """A parent whose anomalous children are too many for chance in this window: them (`hit`, units),
    their nodes, log10 of its raw p-value, the N and K it was tested against and its granularity."""

    hit: frozenset[str]
    hit_nodes: frozenset[str]
    log10_p: float
    fleet: int  # N: the active units of its granularity
    anomalous: int  # K: of them anomalous
    nic: bool


@dataclass(frozen=True)
class Localization:
    """One window's answer: the shared faults reported, widest first, and every candidate parent with
    its count of consecutive candidate windows, to pass to the next window's call."""

    faults: tuple[SharedFaultEvidence, ...]
    streaks: Mapping[Parent, int] = field(default_factory=dict)

    def explained_by(self) -> dict[str, Parent]:
        """Each explained anomaly id -> the (layer, parent) that explains it."""
        return {id_: (fault.layer, fault.parent) for fault in self.faults for id_ in fault.explains}


def log10_upper_tail(fleet: int, anomalous: int, n: np.ndarray, k: np.ndarray) -> np.ndarray:
    """log10 P(X >= k) for X hypergeometric: `n` drawn from `fleet` nodes of which `anomalous` are
    anomalous; exact, finite where the probability underflows, 0 (a probability of 1) for k <= 0."""
    return hypergeom.logsf(np.asarray(k) - 1, fleet, anomalous, np.asarray(n)) / math.log(10)


def score(fault: SharedFaultEvidence) -> float:
    """-log10 of the corrected p-value: higher = more anomalous, 0 at a corrected p-value of 1."""
    return max(0.0, -(fault.log10_p_value + math.log10(fault.tested)))


class SharedFaultLocalizer:
    """Parents whose children's anomalies are too many for chance (see the module's docstring). Every
    parameter is an `__init__` keyword stored under its own name; it learns nothing and keeps no state."""

    def __init__(
        self,
        alpha: float = 0.01,
        min_anomalous: int = 2,
        min_fraction: float = 0.5,
        persistence: int = 2,
        layers: tuple[str, ...] = LAYERS,
        shared_kinds: tuple[str, ...] = SHARED_KINDS,
    ) -> None:
        if not 0 < alpha < 1:
            raise SettingError(f"alpha {alpha!r} is not in (0, 1)")
        if min_anomalous < 2:
            raise SettingError(f"min_anomalous {min_anomalous!r} is under 2: one child is a node fault")
        if not 0 < min_fraction <= 1:
            raise SettingError(f"min_fraction {min_fraction!r} is not in (0, 1]")
        if persistence < 1:
            raise SettingError(f"persistence {persistence!r} is under 1 window")
        self.alpha = alpha
        self.min_anomalous = min_anomalous
        self.min_fraction = min_fraction
        self.persistence = persistence
        self.layers = layers
        self.shared_kinds = shared_kinds

    def get_params(self) -> dict[str, Any]:
        """The `__init__` parameters: `SharedFaultLocalizer(**l.get_params())` is an identical one."""
        return {
            "alpha": self.alpha,
            "min_anomalous": self.min_anomalous,
            "min_fraction": self.min_fraction,
            "persistence": self.persistence,
            "layers": self.layers,
            "shared_kinds": self.shared_kinds,
        }

    def localize(
        self,
        topology: Topology,
        anomalies: Iterable[NodeAnomaly],
        streaks: Mapping[Parent, int] | None = None,
    ) -> Localization:
        """The shared faults of one window, from its per-node `anomalies` and the previous window's
        `streaks` (None or empty on the first); DetectorError for a layer not in `layers`."""
        unknown = sorted({layer for layer, _ in topology.children} - set(self.layers))
        if unknown:
            raise DetectorError(f"topology layer(s) {', '.join(unknown)} unknown; known: {self.layers}")
        shared = set(self.shared_kinds)
        by_unit: dict[str, list[NodeAnomaly]] = defaultdict(list)
        for anomaly in anomalies:
            if anomaly.kind in shared and anomaly.node in topology.fleet:
                for unit_name in anomaly.units():
                    by_unit[unit_name].append(anomaly)
        tested = max(1, sum(len(units) >= self.min_anomalous for units in topology.children.values()))
        candidates = self._candidates(topology, set(by_unit), tested)
        previous = streaks or {}
        counted = {parent: previous.get(parent, 0) + 1 for parent in candidates}
        confirmed = {parent: counted[parent] for parent in candidates if counted[parent] >= self.persistence}
        faults = self._explain(topology, by_unit, candidates, confirmed, tested)
        return Localization(tuple(faults), counted)

    def _candidates(self, topology: Topology, anomalous: set[str], tested: int) -> dict[Parent, Candidate]:
        """Each candidate parent, tested against the N and K of its granularity (nodes, or NICs)."""
        passing: dict[bool, list[tuple[Parent, frozenset[str], frozenset[str]]]] = defaultdict(list)
        for parent, units in topology.children.items():
            hit = frozenset(anomalous.intersection(units))
            if len(hit) >= self.min_anomalous and len(hit) >= self.min_fraction * len(units):
                passing[parent[0] in NIC_LAYERS].append((parent, units, hit))
        bar = math.log10(self.alpha / tested)
        found = {}
        for nic, tests in passing.items():
            fleet = topology.units[nic]
            fleet_anomalous = len(anomalous & fleet)
            log10_p = log10_upper_tail(
                len(fleet),
                fleet_anomalous,
                np.array([len(units) for _, units, _ in tests]),
                np.array([len(hit) for _, _, hit in tests]),
            )
            for (parent, _, hit), value in zip(tests, log10_p.tolist(), strict=True):
                if value <= bar:
                    node_of = unit_node if nic else str
                    found[parent] = Candidate(
                        hit, frozenset(map(node_of, hit)), float(value), len(fleet), fleet_anomalous, nic
                    )
        return found

    def _explain(
        self,
        topology: Topology,
        by_unit: Mapping[str, list[NodeAnomaly]],
        candidates: Mapping[Parent, Candidate],
        confirmed: Mapping[Parent, int],
        tested: int,
    ) -> list[SharedFaultEvidence]:
        """The confirmed parents that explain, top-down (see the module's docstring)."""
        rank = {layer: at for at, layer in enumerate(self.layers)}
        order = sorted(confirmed, key=lambda parent: (-len(topology.nodes[parent]), rank[parent[0]], parent))
        explained: set[str] = set()  # ids of the anomalies a reported fault explains
        faults = []
        for parent in order:
            nodes, found = topology.nodes[parent], candidates[parent]
            if any(
                topology.nodes[narrower] < nodes
                and len(found.hit_nodes - candidates[narrower].hit_nodes) < self.min_anomalous
                for narrower in confirmed
            ):
                continue
            fresh = {u: ids for u in found.hit if (ids := {a.id for a in by_unit[u]} - explained)}
            if len(fresh) < self.min_anomalous:
                continue
            explains = set().union(*fresh.values())
            explained |= explains
            layer, name = parent
            kinds = Counter(kind for u in found.hit for kind in {anomaly.kind for anomaly in by_unit[u]})
            dominant, on = min(kinds.items(), key=lambda item: (-item[1], item[0]))
            n = len(topology.children[parent])
            faults.append(
                SharedFaultEvidence(
                    windows=confirmed[parent],
                    layer=layer,
                    parent=name,
                    n=n,
                    k=len(found.hit),
                    fleet_nodes=found.fleet,
                    fleet_anomalous=found.anomalous,
                    p_value=10.0**found.log10_p,
                    log10_p_value=found.log10_p,
                    tested=tested,
                    p_corrected=min(1.0, 10.0**found.log10_p * tested),
                    children=tuple(sorted(nodes)),
                    anomalous_children=tuple(sorted(found.hit)),
                    explains=tuple(sorted(explains)),
                    kinds=dict(sorted(kinds.items())),
                    dominant_kind=dominant,
                    check=what_to_check(layer, name, dominant, on, n, "NICs" if found.nic else "nodes"),
                )
            )
        return faults


def what_to_check(
    layer: str, parent: str, kind: str, anomalous: int, children: int, units: str = "nodes"
) -> str:
    """One sentence: the parent, its dominant anomaly on how many of its children (`units`: "nodes", or
    "NICs" in a NIC layer), and what to check there."""
    words = KIND_WORDS.get(kind, kind.replace("_", " "))
    check = CHECK_BY_KIND.get((layer, kind)) or CHECK.get(layer, "check what its nodes share")
    return f"{parent}: {words} on {anomalous} of {children} {units}; {check}"

"""Shared-fault localization: which leaf, spine, rail, host or rack explains its children's per-node
anomalies better than chance, so that one fault above many nodes is reported once, as itself.

Each window, for every parent with n active children of which k have a per-node anomaly, the question is
whether k is unlikely under the fleet's base rate: of the topology's N active nodes K are anomalous, and a
parent's n children drawn at random would hold X of them, X hypergeometric. A parent is a candidate when

    k >= min_anomalous,  k / n >= min_fraction,  and  min(1, P(X >= k) x m) <= alpha

where m, the Bonferroni factor, is the number of parents tested: every parent, of every layer, with at
least `min_anomalous` children (the ones that could qualify), fixed by the topology and not by the
window's anomalies. A candidate is confirmed once it has been one in `persistence` consecutive windows;
the caller keeps the candidates' streaks between windows (Localization.streaks, passed back to the next
call), so the localizer holds no state of its own.

Confirmed parents explain top-down, widest first (most children; for the same children, the earlier in
`layers`):
- a parent whose anomalies, but for fewer than `min_anomalous`, lie under one narrower confirmed parent
  leaves them to it: a rack holding one flapping leaf and a stray anomaly elsewhere is the leaf;
- else it explains the anomalies of its anomalous children that no wider parent explained, and is
  reported where at least `min_anomalous` such children remain: a spine explains its leaves' and their
  hosts' anomalies (they are not reported apart), a host its VMs'. No anomaly is explained twice.
A lone anomalous child under a healthy parent explains nothing and stays a node fault.

Only anomalies of `shared_kinds` count (a GPU's own Xids or loss are the node's whatever its neighbours
show); those of nodes the topology does not hold are left out of N and K. What it cannot tell apart
(parents with the same VMs, a job alone on a leaf, a fault of most of the fleet): docs/detectors.md.

The score of a shared fault (`score`) is -log10 of its corrected p-value: higher = more anomalous, 0 at a
corrected p-value of 1.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import hypergeom

from analytics.errors import DetectorError, SettingError
from analytics.evidence import SharedFaultEvidence
from analytics.topology.model import Kind

# for two parents with the same active children, the one named: the more specific device first
LAYERS: tuple[str, ...] = (Kind.HOST, Kind.LEAF, Kind.RACK, Kind.PDU, Kind.SPINE, Kind.RAIL)

Parent = tuple[str, str]  # (layer, name)

# the per-node anomaly kinds a shared layer can cause; a GPU's own fault (its Xids, a lost GPU, DBEs)
# and the application's errors are the node's whatever its neighbours show, never counted nor explained
SHARED_KINDS: tuple[str, ...] = (
    "link_flap",
    "link_down",
    "congestion",
    "dma_degraded",
    "slow_node",
    "gpu_throttle",
    "peer_outlier",
)

KIND_WORDS = {
    "link_flap": "link flaps",
    "link_down": "links down",
    "congestion": "congestion",
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
    """A per-node anomaly of the window: the node (a VM), its kind and its id in the anomalies table."""

    node: str
    kind: str
    id: str


@dataclass(frozen=True)
class Topology:
    """The active nodes under each parent, per layer: built once per change of the topology, read every
    window. `of` builds it from layer -> parent -> child nodes."""

    children: Mapping[Parent, frozenset[str]]
    fleet: frozenset[str]  # every active node under some parent

    @classmethod
    def of(cls, layers: Mapping[str, Mapping[str, Iterable[str]]]) -> Topology:
        """The topology of `layers` (layer -> parent -> active child nodes); a parent without an active
        child is left out, as it can hold no anomaly."""
        children = {
            (layer, parent): frozenset(nodes)
            for layer, parents in layers.items()
            for parent, nodes in parents.items()
        }
        children = {key: nodes for key, nodes in children.items() if nodes}
        return cls(children, frozenset().union(*children.values()))


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
        by_node: dict[str, list[NodeAnomaly]] = {}
        for anomaly in anomalies:
            if anomaly.kind in shared and anomaly.node in topology.fleet:
                by_node.setdefault(anomaly.node, []).append(anomaly)
        tested = max(1, sum(len(nodes) >= self.min_anomalous for nodes in topology.children.values()))
        candidates = self._candidates(topology, set(by_node), tested)
        previous = streaks or {}
        counted = {parent: previous.get(parent, 0) + 1 for parent in candidates}
        confirmed = {parent: counted[parent] for parent in candidates if counted[parent] >= self.persistence}
        faults = self._explain(topology, by_node, candidates, confirmed, tested)
        return Localization(tuple(faults), counted)

    def _candidates(
        self, topology: Topology, anomalous: set[str], tested: int
    ) -> dict[Parent, tuple[frozenset[str], float]]:
        """Each candidate parent -> its anomalous children and log10 of its raw p-value."""
        if len(anomalous) < self.min_anomalous:
            return {}
        counted = {
            parent: (nodes, frozenset(anomalous.intersection(nodes)))
            for parent, nodes in topology.children.items()
        }
        passing = [
            (parent, nodes, hit)
            for parent, (nodes, hit) in counted.items()
            if len(hit) >= self.min_anomalous and len(hit) >= self.min_fraction * len(nodes)
        ]
        if not passing:
            return {}
        log10_p = log10_upper_tail(
            len(topology.fleet),
            len(anomalous),
            np.array([len(nodes) for _, nodes, _ in passing]),
            np.array([len(hit) for _, _, hit in passing]),
        )
        bar = math.log10(self.alpha / tested)
        return {
            parent: (hit, float(value))
            for (parent, _, hit), value in zip(passing, log10_p.tolist(), strict=True)
            if value <= bar
        }

    def _explain(
        self,
        topology: Topology,
        by_node: Mapping[str, list[NodeAnomaly]],
        candidates: Mapping[Parent, tuple[frozenset[str], float]],
        confirmed: Mapping[Parent, int],
        tested: int,
    ) -> list[SharedFaultEvidence]:
        """The confirmed parents that explain, top-down (see the module's docstring)."""
        rank = {layer: at for at, layer in enumerate(self.layers)}
        order = sorted(
            confirmed, key=lambda parent: (-len(topology.children[parent]), rank[parent[0]], parent)
        )
        explained: set[str] = set()  # nodes whose anomalies a reported fault explains
        faults = []
        for parent in order:
            nodes, (hit, log10_p) = topology.children[parent], candidates[parent]
            if any(
                topology.children[narrower] < nodes
                and len(hit - candidates[narrower][0]) < self.min_anomalous
                for narrower in confirmed
            ):
                continue
            fresh = hit - explained
            if len(fresh) < self.min_anomalous:
                continue
            explained |= fresh
            layer, name = parent
            kinds = Counter(kind for node in hit for kind in {anomaly.kind for anomaly in by_node[node]})
            dominant, on = min(kinds.items(), key=lambda item: (-item[1], item[0]))
            faults.append(
                SharedFaultEvidence(
                    windows=confirmed[parent],
                    layer=layer,
                    parent=name,
                    n=len(nodes),
                    k=len(hit),
                    fleet_nodes=len(topology.fleet),
                    fleet_anomalous=len(by_node),
                    p_value=10.0**log10_p,
                    log10_p_value=log10_p,
                    tested=tested,
                    p_corrected=min(1.0, 10.0**log10_p * tested),
                    children=tuple(sorted(nodes)),
                    anomalous_children=tuple(sorted(hit)),
                    explains=tuple(sorted(anomaly.id for node in fresh for anomaly in by_node[node])),
                    kinds=dict(sorted(kinds.items())),
                    dominant_kind=dominant,
                    check=what_to_check(layer, name, dominant, on, len(nodes)),
                )
            )
        return faults


def what_to_check(layer: str, parent: str, kind: str, anomalous: int, children: int) -> str:
    """One sentence: the parent, its dominant anomaly on how many of its nodes, and what to check there."""
    words = KIND_WORDS.get(kind, kind.replace("_", " "))
    check = CHECK_BY_KIND.get((layer, kind)) or CHECK.get(layer, "check what its nodes share")
    return f"{parent}: {words} on {anomalous} of {children} nodes; {check}"

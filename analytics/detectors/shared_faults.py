"""Shared faults as anomalies: the localizer (analytics.topology.localize) run after the per-node
detectors each window, its findings opened, updated and closed like any anomaly.

Each window the runner (analytics.detectors.runner.DetectionRunner, given a SharedFaults) reads the
topology in force at the window's end (TopologyReads: one small query, the edges again only when they
changed) and the nodes active in the window (ACTIVE_SQL: any sample or step in it; a dead or removed VM
counts in no parent's n nor the fleet's N), advances its per-node anomalies, then hands the ones open to
`step`, which localizes them with the streaks of the previous window and returns:

- the `shared_fault` anomalies that opened (the localizer reported the parent: it was a candidate in
  `persistence` windows in a row), changed (what it explains, or its score up by SCORE_STEP) or closed
  (the parent no longer qualifies; it ends with the last window that reported it);
- per explained per-node anomaly id, the id of the shared fault explaining it: the runner writes it into
  the anomaly's `explained_by` (an update row), and keeps it until the anomaly closes, though the
  shared fault closed first: a symptom outlasting its parent's fault (a leaf's last flaps as it
  recovers) is still that fault's, not a node's own fault to drain on.

A shared_fault anomaly is about a parent, never a node a drain could act on: `node` holds the parent's
name ("leaf-07") and `component` its layer ("leaf"), so the anomaly list and pages show where it is, and
its evidence is analytics.evidence.SharedFaultEvidence. Alerts label it `layer` and `parent`, with no
`node` label (alerts.rules), and the drain controller never drains on it (alerts.policy.NEVER_DRAINED).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from analytics.detectors.base import Window
from analytics.evidence import SharedFaultEvidence
from analytics.store.protocols import Reader
from analytics.store.records import Anomaly
from analytics.store.topology import Snapshot, TopologyReads
from analytics.topology.localize import (
    Membership,
    NodeAnomaly,
    Parent,
    SharedFaultLocalizer,
    Topology,
    score,
)

SHARED_FAULT = SharedFaultEvidence.KIND  # the anomaly kind: "shared_fault"
DETECTOR = "shared_fault"  # the detector name its anomalies carry
VERSION = "1"
SEVERITY = "warning"
NAMESPACE = uuid.UUID("a3e1c0d2-7b5f-4e38-9c61-2f8d4b7a9e15")
IN_WINDOW = "ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}"
# the nodes that reported in the window: a scrape of one of their exporters that succeeded, or a step
# from their ranks (the targets table, not samples: one row per scrape instead of one per series, in
# rows ordered by target and time, so a window's are found without reading the day's)
ACTIVE_SQL = (
    f"SELECT DISTINCT node FROM targets WHERE {IN_WINDOW} AND up = 1 "
    f"UNION DISTINCT SELECT DISTINCT node FROM steps WHERE {IN_WINDOW}"
)
MAX_ACTIVE_NODES = 1_000_000


@dataclass(frozen=True)
class Step:
    """One window's outcome: the shared_fault anomalies that opened, changed or closed, and per explained
    per-node anomaly id the id of the open shared fault that explains it."""

    changed: list[Anomaly]
    explained_by: Mapping[str, str]


class SharedFaults:
    """Localizes each window's open per-node anomalies and keeps the shared faults open between windows.
    Reads the topology through `reads` (TopologyReads over the store, built on first use when None)."""

    def __init__(
        self,
        localizer: SharedFaultLocalizer | None = None,
        reads: TopologyReads | None = None,
        score_step: float = 0.1,
    ) -> None:
        self.localizer = localizer or SharedFaultLocalizer()
        self.reads = reads
        self.score_step = score_step
        self.streaks_: Mapping[Parent, int] = {}
        self.open_: dict[Parent, Anomaly] = {}  # the open shared faults, as last written
        self.last_seen_: dict[Parent, float] = {}  # the end of the last window that reported each
        self._snapshot: Snapshot | None = None
        self._membership = Membership.of({})

    def topology(self, source: Reader, window: Window) -> Topology:
        """The topology in force at the window's end, of the nodes active in it (ACTIVE_SQL); every node
        of it where the store holds nothing for the window, or more nodes than MAX_ACTIVE_NODES (what
        is dead cannot be told then). The membership (Membership) is built again only when the edges
        changed; the window's active nodes, which churn from one window to the next, only take the
        inactive ones' units out of it. Raises what the store raises (StoreUnavailable), before any
        state moved."""
        if self.reads is None:
            self.reads = TopologyReads(source)
        snapshot = self.reads.at(window.end)
        result = source.query(ACTIVE_SQL, parameters=window.parameters, max_rows=MAX_ACTIVE_NODES)
        active = None if result.truncated or not result.rows else frozenset(row[0] for row in result.rows)
        if snapshot is not self._snapshot:
            self._membership = Membership.of(
                {str(kind): parents for kind, parents in snapshot.members.items()}
            )
            self._snapshot = snapshot
        return self._membership.topology(active)

    def step(self, topology: Topology, window: Window, open_anomalies: Iterable[Anomaly]) -> Step:
        """Localize `open_anomalies` (the per-node anomalies open at the window's end) on `topology`."""
        found = self.localizer.localize(
            topology,
            [
                NodeAnomaly(a.node, a.kind, a.id, a.component)
                for a in open_anomalies
                if a.kind != SHARED_FAULT
            ],
            self.streaks_,
        )
        self.streaks_ = found.streaks
        changed: list[Anomaly] = []
        reported = set()
        for evidence in found.faults:
            parent = (evidence.layer, evidence.parent)
            reported.add(parent)
            self.last_seen_[parent] = window.end
            if (anomaly := self._advance(parent, evidence, window)) is not None:
                changed.append(anomaly)
        for parent in sorted(set(self.open_) - reported):
            changed.append(replace(self.open_.pop(parent), end=self.last_seen_.pop(parent)))
        explained = {
            explained_id: self.open_[(fault.layer, fault.parent)].id
            for fault in found.faults
            for explained_id in fault.explains
        }
        return Step(changed, explained)

    def _advance(self, parent: Parent, evidence: SharedFaultEvidence, window: Window) -> Anomaly | None:
        """Open or update the anomaly of `parent`; returns it when it opened or changed enough to write."""
        before = self.open_.get(parent)
        start = before.start if before else window.end - evidence.windows * (window.end - window.start)
        layer, name = parent
        anomaly = Anomaly(
            id=str(uuid.uuid5(NAMESPACE, f"{SHARED_FAULT}/{layer}/{name}/{start:.3f}")),
            start=start,
            end=None,
            kind=SHARED_FAULT,
            node=name,
            component=layer,
            job="",
            severity=SEVERITY,
            score=score(evidence),
            evidence=evidence,
            detector=DETECTOR,
            detector_version=VERSION,
        )
        self.open_[parent] = anomaly
        if before is None or _explains(before) != evidence.explains:
            return anomaly
        if anomaly.score > before.score + self.score_step * abs(before.score):
            return anomaly
        self.open_[parent] = before  # nothing worth a row: keep what the store holds
        return None


def _explains(anomaly: Anomaly) -> tuple[str, ...]:
    evidence = anomaly.evidence
    return evidence.explains if isinstance(evidence, SharedFaultEvidence) else ()

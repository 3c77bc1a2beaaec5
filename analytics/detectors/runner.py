"""Runs detectors window after window and turns their persistent findings into anomalies.

A detector says what it sees in one window (base.Finding); the runner remembers, per detector and per
(kind, node, component, job), which of the last windows had a finding, and applies the detector class's
persistence: `min_windows` findings among the last `of_windows` windows open an anomaly, `clear_windows`
windows in a row without one close it. This is what keeps a one-window blip from paging anyone.

    runner = DetectionRunner(build())
    for window in windows(start, end):
        changed = runner.step(store, window)    # opened, stronger or closed in this window
    store_anomalies(store, runner.flush())

An anomaly's id is a uuid5 over what it is about and when it started, so a rerun over the same data
gives the same ids, and writing it again when it ends replaces its open row in the store.
"""

from __future__ import annotations

import hashlib
import logging
import math
import traceback
import uuid
from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from analytics.detectors import build
from analytics.detectors.base import SEVERITIES, Computed, Detector, Finding, Judgement, Window
from analytics.detectors.shared_faults import SharedFaults
from analytics.detectors.steptape import StepTape
from analytics.detectors.tape import Tape, TapeView
from analytics.errors import DetectorError, StoreUnavailable
from analytics.evidence import to_json
from analytics.store.protocols import Reader
from analytics.store.records import Anomaly, QueryResult
from analytics.topology.localize import Topology

if TYPE_CHECKING:
    from analytics.store import Store

log = logging.getLogger(__name__)

ANOMALY_NAMESPACE = uuid.UUID("5f6c3a8e-2d1b-4c67-9a0e-7b4d2f1e8c90")
STORE_RESOLUTION_S = 0.001  # the store keeps milliseconds: a range ends this much after its last row

SCORE_STEP = 0.1  # an open anomaly is reported again when its score passes the last reported one by 10%

TrackKey = tuple[str, str, str, str]  # kind, node, component, job (within one detector)


def windows(start: float, end: float, window_s: float = 10.0) -> list[Window]:
    """Consecutive windows of `window_s` covering [start, end), aligned to multiples of `window_s`, so that
    every run over the same data sees the same windows."""
    if not window_s > 0 or not math.isfinite(window_s):
        raise DetectorError(f"window_s must be a positive number of seconds, got {window_s}")
    if end <= start:
        return []
    first = math.floor(start / window_s)
    return [Window(i * window_s, (i + 1) * window_s) for i in range(first, math.ceil(end / window_s))]


class _SharedQueries:
    """A source that runs each distinct query once: detectors that read the same rows in one window
    share one query, and what they compute alike (base.computed_once) is computed once; and that reads
    the runner's tapes, which carry the samples detectors read there (link_flap, link_down, congestion)
    and the step rows (slow_node, peer_outlier, gpu_fault, dma_degraded) from window to window. Lives for
    one window."""

    def __init__(self, source: Reader, tape: Tape, steps: StepTape) -> None:
        self._source = source
        self._tape = tape
        self._steps = steps
        self._results: dict[str, QueryResult] = {}
        self._computed: dict[Hashable, Any] = {}

    def query(
        self, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = 10_000
    ) -> QueryResult:
        key = repr((sql, sorted((parameters or {}).items()), max_rows))
        if key not in self._results:
            self._results[key] = self._source.query(sql, parameters=parameters, max_rows=max_rows)
        return self._results[key]

    def tape_view(
        self, metrics: Sequence[str], window: Window, lookback_s: float, *, points_only: bool = False
    ) -> TapeView:
        return self._tape.view(self._source, metrics, window, lookback_s, points_only=points_only)

    def step_tape(self) -> tuple[StepTape, Reader]:
        return self._steps, self._source

    def once(self, key: Hashable, compute: Callable[[], Computed]) -> Computed:
        if key not in self._computed:
            self._computed[key] = compute()
        return self._computed[key]


@dataclass
class _Track:
    """What the runner remembers of one (kind, node, component, job) of one detector."""

    recent: deque[tuple[Window, Finding | None]]  # while closed: the last `of_windows` windows, oldest first
    last_judged: float  # the end of the last window that judged it
    anomaly: Anomaly | None = None  # the open anomaly, as it stands
    strongest: Finding | None = None  # the open anomaly's highest-scoring finding
    severity: str = SEVERITIES[0]  # the open anomaly's highest severity
    last_found: Window | None = None  # the open anomaly's last window with a finding
    found_windows: int = 0
    quiet_windows: int = 0  # windows in a row without a finding since the last one

    @property
    def idle(self) -> bool:
        """Nothing open and nothing pending: the track can be forgotten."""
        return self.anomaly is None and all(finding is None for _, finding in self.recent)

    def absorb(self, window: Window, finding: Finding) -> None:
        """Count a window with a finding."""
        if self.strongest is None or finding.score > self.strongest.score:
            self.strongest = finding
        if SEVERITIES.index(finding.severity) > SEVERITIES.index(self.severity):
            self.severity = finding.severity
        self.last_found = window
        self.found_windows += 1
        self.quiet_windows = 0

    def close(self) -> Anomaly:
        """The open anomaly, ended with its last window with a finding; the track starts over after."""
        assert self.anomaly is not None and self.last_found is not None
        closed = replace(self.anomaly, end=self.last_found.end)
        self.recent.clear()
        self.anomaly, self.strongest, self.severity, self.last_found = None, None, SEVERITIES[0], None
        self.found_windows = self.quiet_windows = 0
        return closed


class DetectionRunner:
    """Steps detectors through consecutive windows and keeps the state of every anomaly between them.
    With `shared_faults`, each window then localizes the open per-node anomalies on the topology in force
    at its end (analytics.detectors.shared_faults): shared_fault anomalies, and `explained_by` on the
    per-node anomalies they explain."""

    def __init__(
        self,
        detectors: Sequence[Detector],
        window_s: float = 10.0,
        shared_faults: SharedFaults | None = None,
    ) -> None:
        self.detectors = list(detectors)
        self.window_s = window_s
        self.shared_faults = shared_faults
        self.failures: Counter[str] = Counter()  # windows each detector failed, by detector name
        self._tracks: dict[str, dict[TrackKey, _Track]] = {detector.name: {} for detector in self.detectors}
        self._causes_logged: set[tuple[str, str, str]] = set()
        self._tape = Tape()
        self._steps = StepTape()
        for detector in self.detectors:
            self._tape.register(detector.tape_needs())

    def step(self, source: Reader, window: Window) -> list[Anomaly]:
        """Run every detector on `window`; returns the anomalies that opened, grew stronger (severity up,
        or score up by SCORE_STEP) or closed in it. A detector that raises is logged and skipped for this
        window: its anomalies stay as they were. StoreUnavailable fails the whole window before any state
        moves, so that no anomaly closes for want of data (the topology is read first, for that reason)."""
        topology = self.shared_faults.topology(source, window) if self.shared_faults else None
        found: dict[str, Judgement] = {}
        shared = _SharedQueries(source, self._tape, self._steps)
        for detector in self.detectors:
            try:
                found[detector.name] = detector.judge(shared, window)
            except StoreUnavailable:
                raise
            except Exception as error:  # one broken detector must not silence the others
                self._failed(detector, window, error)
        changed = []
        for detector in self.detectors:
            if detector.name in found:
                changed.extend(self._advance(detector, window, found[detector.name]))
        if self.shared_faults is not None and topology is not None:
            changed.extend(self._localize(topology, window, changed))
        return changed

    def _localize(self, topology: Topology, window: Window, changed: list[Anomaly]) -> list[Anomaly]:
        """The window's shared faults, and the open per-node anomalies whose `explained_by` they change
        (a per-node anomaly already in `changed` is replaced there, not written twice)."""
        assert self.shared_faults is not None
        tracks = self._open_tracks()
        step = self.shared_faults.step(topology, window, [track.anomaly for track in tracks if track.anomaly])
        rewritten: dict[str, Anomaly] = {}
        for track in tracks:
            assert track.anomaly is not None
            # kept once set: a symptom that outlasts its parent's fault (a leaf's last flaps as it
            # recovers) is still that fault's, not a node fault to drain on
            explained_by = step.explained_by.get(track.anomaly.id, track.anomaly.explained_by)
            if track.anomaly.explained_by != explained_by:
                track.anomaly = replace(track.anomaly, explained_by=explained_by)
                rewritten[track.anomaly.id] = track.anomaly
        changed[:] = [rewritten.pop(anomaly.id, anomaly) for anomaly in changed]
        return [*step.changed, *rewritten.values()]

    def _failed(self, detector: Detector, window: Window, error: Exception) -> None:
        """Count a detector's failed window; log it with its traceback once per distinct cause (the
        exception's type and where it was raised), since a cause that fails one window fails them all."""
        self.failures[detector.name] += 1
        cause = (detector.name, type(error).__name__, _raised_at(error))
        if cause in self._causes_logged:
            return
        self._causes_logged.add(cause)
        log.error(
            "detector %s failed on window [%s, %s) (%s at %s; logged once, counted in failures)",
            detector.name,
            window.start,
            window.end,
            cause[1],
            cause[2],
            exc_info=error,
        )

    def run(self, source: Reader, start: float, end: float) -> list[Anomaly]:
        """Step through every window of [start, end); returns the final state of each anomaly seen (the
        ones still open with end None)."""
        latest: dict[str, Anomaly] = {}
        for window in windows(start, end, self.window_s):
            latest.update((anomaly.id, anomaly) for anomaly in self.step(source, window))
        latest.update((track.anomaly.id, track.anomaly) for track in self._open_tracks())
        return list(latest.values())

    def flush(self) -> list[Anomaly]:
        """Close every open anomaly at the end of its last window with a finding and forget all state: what
        an offline evaluation does when its data ends."""
        closed = [track.close() for track in self._open_tracks()]
        for tracks in self._tracks.values():
            tracks.clear()
        return closed

    def _open_tracks(self) -> list[_Track]:
        return [track for tracks in self._tracks.values() for track in tracks.values() if track.anomaly]

    def _advance(self, detector: Detector, window: Window, judgement: Judgement) -> list[Anomaly]:
        """Apply one window of `detector`'s findings to its tracks. A track the window did not judge stays
        as it is, unless it went unjudged for longer than the detector's limit: then it counts as clear."""
        tracks = self._tracks[detector.name]
        strongest: dict[TrackKey, Finding] = {}
        for finding in judgement.findings:
            key = (finding.kind, finding.node, finding.component, finding.job)
            if key not in strongest or finding.score > strongest[key].score:
                strongest[key] = finding
        changed = []
        for key in sorted(set(strongest) | set(tracks)):
            track = tracks.get(key) or _Track(deque(maxlen=type(detector).of_windows), last_judged=window.end)
            if judgement.judged is None or key[1:] in judgement.judged:
                track.last_judged = window.end
            elif window.end - track.last_judged <= type(detector).unjudged_limit_s:
                continue
            if (anomaly := _update(detector, track, window, strongest.get(key))) is not None:
                changed.append(anomaly)
            if track.idle:
                tracks.pop(key, None)
            else:
                tracks[key] = track
        return changed


def _update(detector: Detector, track: _Track, window: Window, finding: Finding | None) -> Anomaly | None:
    """Move one track past `window` under `detector`'s persistence; returns its anomaly when it opened,
    grew stronger or closed."""
    persistence = type(detector)
    if track.anomaly is None:
        track.recent.append((window, finding))
        hits = [(seen, hit) for seen, hit in track.recent if hit is not None]
        if len(hits) < persistence.min_windows:
            return None
        for seen, hit in hits:
            track.absorb(seen, hit)
        track.recent.clear()
        track.anomaly = _anomaly(detector, track, start=hits[0][0].start)
        return track.anomaly
    if finding is None:
        track.quiet_windows += 1
        return track.close() if track.quiet_windows >= persistence.clear_windows else None
    reported = track.anomaly
    track.absorb(window, finding)
    track.anomaly = replace(
        _anomaly(detector, track, start=reported.start), explained_by=reported.explained_by
    )
    stronger = SEVERITIES.index(track.severity) > SEVERITIES.index(reported.severity) or (
        track.anomaly.score > reported.score + SCORE_STEP * abs(reported.score)
    )
    return track.anomaly if stronger else None


def _anomaly(detector: Detector, track: _Track, start: float) -> Anomaly:
    """The open anomaly of `track` as it stands."""
    finding = track.strongest
    assert finding is not None
    identity = f"{detector.name}/{finding.kind}/{finding.node}/{finding.component}/{finding.job}/{start:.3f}"
    assert track.last_found is not None
    evidence = replace(
        detector.so_far(finding.evidence, track.last_found.end - start), windows=track.found_windows
    )
    return Anomaly(
        id=str(uuid.uuid5(ANOMALY_NAMESPACE, identity)),
        start=start,
        end=None,
        kind=finding.kind,
        node=finding.node,
        component=finding.component,
        job=finding.job,
        severity=track.severity,
        score=float(finding.score),
        evidence=evidence,
        detector=detector.name,
        detector_version=detector.version,
    )


def detect(
    source: Reader,
    start: float | None = None,
    end: float | None = None,
    names: Sequence[str] | None = None,
    window_s: float = 10.0,
) -> list[Anomaly]:
    """Run the named detectors (all when None) once over [start, end), by default over all the data in the
    store; returns every anomaly found, sorted by start and node (`fleetlens detect`)."""
    detectors = build(names)
    if start is None or end is None:
        span = data_span(source)
        if span is None:
            return []
        start = span[0] if start is None else start
        end = span[1] if end is None else end
    anomalies = DetectionRunner(detectors, window_s).run(source, start, end)
    return sorted(anomalies, key=lambda a: (a.start, a.node, a.kind, a.component, a.job, a.detector))


def data_span(source: Reader) -> tuple[float, float] | None:
    """[first, last] unix seconds of the samples and steps in the store, with `last` moved past the last
    row so that a range ending there includes it; None when both are empty."""
    result = source.query(
        "SELECT count(), min(toUnixTimestamp64Milli(ts)), max(toUnixTimestamp64Milli(ts)) FROM samples"
        " UNION ALL"
        " SELECT count(), min(toUnixTimestamp64Milli(ts)), max(toUnixTimestamp64Milli(ts)) FROM steps"
    )
    spans = [(first / 1000, last / 1000) for count, first, last in result.rows if count]
    if not spans:
        return None
    return min(first for first, _ in spans), max(last for _, last in spans) + STORE_RESOLUTION_S


def store_anomalies(store: Store, anomalies: Sequence[Anomaly]) -> None:
    """Write `anomalies`, their evidence as analytics.evidence.to_json's text (the one place anomalies
    are written); the insert token is derived from the rows themselves, so writing the same states again
    (a rerun, a retry) stores nothing twice."""
    if not anomalies:
        return
    rows = [replace(anomaly, evidence=to_json(anomaly.evidence)) for anomaly in anomalies]
    token = "anomalies/" + hashlib.sha256("\n".join(sorted(map(repr, rows))).encode()).hexdigest()
    store.insert_anomalies(rows, token=token)


def _raised_at(error: BaseException) -> str:
    """Where `error` was raised: the file and line of its innermost frame."""
    frames = traceback.extract_tb(error.__traceback__)
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"

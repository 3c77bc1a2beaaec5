"""The detection runner on a real store: windows, persistence, what each step reports, ids stable across
reruns, a failing detector, and anomalies written to the store."""

from __future__ import annotations

import logging

import pandas as pd
import pytest

from analytics.detectors.base import Detector, Window, frame
from analytics.detectors.runner import DetectionRunner, detect, store_anomalies, windows
from analytics.detectors.slow_node import SlowNode
from analytics.errors import DetectorError
from analytics.evidence import from_json
from analytics.store import Store
from analytics.store.protocols import Reader
from analytics.store.records import Anomaly
from tests.analytics.detectors import T0, SyncJob, window


def slow_in(windows_slow: set[int], factor: float | dict[int, float] = 1.15, node: str = "vela-003"):
    """A slowdown of `node` in the windows given (a factor per window, or one for all): of its steps that
    end in them (a step starting at t ends about a step later)."""

    def slowdown(name: str, stage: int, t: float) -> float:
        index = int((t + SyncJob.step_s - T0) // 10)
        if name != node or index not in windows_slow:
            return 1.0
        return factor[index] if isinstance(factor, dict) else factor

    return slowdown


def steps_with(store: Store, slowdown, seconds: float = 200) -> None:
    store.insert_steps(SyncJob(slowdown=slowdown).steps(T0, seconds), token="steps")


def reports(store: Store, count: int) -> dict[int, list]:
    """What each of the first `count` windows reported, by window index (quiet ones left out)."""
    runner = DetectionRunner([SlowNode()])
    return {index: found for index in range(count) if (found := runner.step(store, window(index)))}


# --- windows --------------------------------------------------------------------------------------------


def test_windows_are_aligned_to_their_length_and_cover_the_range() -> None:
    assert windows(T0 + 3, T0 + 25) == [window(0), window(1), window(2)]
    assert windows(T0 + 10, T0 + 20) == [window(1)]
    assert windows(T0 + 7, T0 + 7) == [] and windows(T0 + 20, T0) == []
    assert windows(T0, T0 + 60, 30) == [Window(T0, T0 + 30), Window(T0 + 30, T0 + 60)]


@pytest.mark.parametrize("window_s", [0, -10, float("nan")])
def test_a_window_that_is_not_a_positive_length_is_refused(window_s: float) -> None:
    with pytest.raises(DetectorError, match="window_s"):
        windows(T0, T0 + 60, window_s)


# --- persistence ----------------------------------------------------------------------------------------


def test_one_window_of_findings_opens_nothing(store: Store) -> None:
    steps_with(store, slow_in({5}))
    assert reports(store, 15) == {}


def test_two_findings_in_three_windows_open_an_anomaly_from_the_first(store: Store) -> None:
    steps_with(store, slow_in({5, 7}))
    reported = reports(store, 15)
    assert min(reported) == 7
    opened = reported[7][0]
    assert (opened.node, opened.start, opened.end) == ("vela-003", window(5).start, None)
    assert opened.evidence.windows == 2


def test_a_step_reports_what_opened_grew_stronger_or_closed(store: Store) -> None:
    factors = {5: 1.1, 6: 1.1, 7: 1.1, 8: 1.3, 9: 1.3, 10: 1.3}
    steps_with(store, slow_in(set(factors), factors))
    reported = reports(store, 16)
    opened, stronger, closed = (reported[index][0] for index in sorted(reported))
    assert sorted(reported)[:2] == [6, 8]  # window 7 is no stronger than 5 and 6: nothing to say
    assert (opened.severity, stronger.severity, closed.severity) == ("warning", "critical", "critical")
    assert opened.id == stronger.id == closed.id
    assert stronger.score > opened.score and stronger.end is None
    assert closed.end == window(10).end  # the last window with a finding, found clear_windows later
    assert closed.evidence.windows == 6


def test_a_rerun_over_the_same_data_gives_the_same_anomalies(store: Store) -> None:
    steps_with(store, slow_in(set(range(5, 20))))
    first = detect(store, names=["slow_node"])
    assert first and detect(store, names=["slow_node"]) == first


def test_flush_closes_what_is_open_at_its_last_window_with_a_finding(store: Store) -> None:
    steps_with(store, slow_in(set(range(5, 20))), seconds=120)
    runner = DetectionRunner([SlowNode()])
    (still_open,) = runner.run(store, T0, T0 + 120)
    (closed,) = runner.flush()
    assert still_open.end is None and closed.id == still_open.id
    assert closed.end == window(11).end
    assert runner.flush() == []


# --- failures and the store -----------------------------------------------------------------------------


class MissingTable(Detector):
    """A detector whose query fails, as one written for a newer schema would."""

    name = "missing_table"
    version = "0"
    kinds = ("nothing",)

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        return frame(source.query("SELECT node FROM no_such_table"))

    def score(self, features: pd.DataFrame):
        raise AssertionError("never reached")

    def findings(self, features, scores):
        raise AssertionError("never reached")


def test_a_failing_detector_is_counted_logged_once_per_cause_and_the_others_still_run(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    steps_with(store, slow_in(set(range(5, 20))))
    runner = DetectionRunner([MissingTable(), SlowNode()])
    with caplog.at_level(logging.ERROR, logger="analytics.detectors.runner"):
        (anomaly,) = runner.run(store, T0, T0 + 150)
    assert anomaly.detector == "slow_node"
    assert runner.failures == {"missing_table": 15}
    failures = [record for record in caplog.records if "missing_table" in record.getMessage()]
    assert len(failures) == 1 and "no_such_table" in str(failures[0].exc_info[1])


def test_detect_covers_everything_in_the_store_by_default(store: Store) -> None:
    assert detect(store) == []
    steps_with(store, slow_in({16, 17, 18}), seconds=190)  # slow in the last windows of the data
    (anomaly,) = detect(store, names=["slow_node"])
    assert anomaly.start == window(16).start
    assert detect(store, T0, window(16).start, names=["slow_node"]) == []


def test_anomalies_are_stored_once_each_and_closing_replaces_the_open_row(store: Store) -> None:
    steps_with(store, slow_in(set(range(5, 10))))

    def run_and_store() -> list[Anomaly]:
        """Step through the data as the hub does, writing what each window reports."""
        runner, reported = DetectionRunner([SlowNode()]), []
        for index in range(15):
            changed = runner.step(store, window(index))
            store_anomalies(store, changed)
            reported += changed
        return reported

    opened, closed = run_and_store()
    rows = store.query(
        "SELECT id, toUnixTimestamp64Milli(start), toUnixTimestamp64Milli(end), evidence FROM anomalies FINAL"
    ).rows
    ((stored_id, start_ms, end_ms, evidence),) = rows
    assert stored_id == opened.id == closed.id
    assert (start_ms, end_ms) == (window(5).start * 1000, window(9).end * 1000)
    assert from_json(closed.kind, evidence) == closed.evidence
    assert run_and_store() == [opened, closed]  # a rerun writes the same rows: the store keeps one of each
    assert store.query("SELECT count() FROM anomalies").rows == [(2,)]

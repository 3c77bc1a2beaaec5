"""The hub's detection loop: anomalies open and close in the store as windows close, and a failing
cycle costs only that window."""

from __future__ import annotations

from pathlib import Path

from analytics.detectors import build
from analytics.detectors.runner import DetectionRunner
from analytics.errors import StoreUnavailable
from collectors.textformat import render
from hub.detect import DetectionLoop
from tests.analytics.detectors.test_runner import MissingTable
from tests.support.exposition import key, parse_samples
from tests.support.fleetdata import SimulatedFleet


class FlakyStore:
    """A store that is unreachable while `down` is set."""

    def __init__(self, store: object) -> None:
        self.store = store
        self.down = False

    def __getattr__(self, name: str) -> object:
        if self.down:
            raise StoreUnavailable("store down for the test")
        return getattr(self.store, name)


def exposition(loop: DetectionLoop) -> dict:
    return parse_samples(render(loop.collect()).decode())


def test_a_port_that_goes_down_opens_an_anomaly_and_closes_it_when_back(store, tmp_path: Path) -> None:
    loop = DetectionLoop(DetectionRunner(build(["link_down"])), store, window_s=10, lag_s=11)
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        for _ in range(3):
            loop.cycle(fleet.tick())
        fleet["vela-002"].sysfs.set_link(1, up=False)
        for _ in range(7):  # link_down needs a minute down
            loop.cycle(fleet.tick())
        opened = store.query("SELECT node, component, isNull(end) FROM anomalies FINAL").rows
        fleet["vela-002"].sysfs.set_link(1, up=True)
        for _ in range(5):
            loop.cycle(fleet.tick())
        closed = store.query("SELECT node, component, isNull(end) FROM anomalies FINAL").rows

    assert opened == [("vela-002", "mlx5_1:1", 1)]
    assert closed == [("vela-002", "mlx5_1:1", 0)]
    samples = exposition(loop)
    assert samples[key("fleetlens_hub_detection_cycles_total")] == 15
    assert samples[key("fleetlens_hub_anomaly_updates_total")] >= 2, "at least the opening and the closing"


def test_a_store_outage_costs_its_windows_and_detection_goes_on(store, tmp_path: Path) -> None:
    flaky = FlakyStore(store)
    loop = DetectionLoop(DetectionRunner(build(["link_down"])), flaky, window_s=10, lag_s=11)
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet["vela-003"].sysfs.set_link(0, up=False)
        flaky.down = True
        for _ in range(2):
            loop.cycle(fleet.tick())
        flaky.down = False
        for _ in range(6):
            loop.cycle(fleet.tick())

    assert (loop.failures, loop.cycles) == (2, 8)
    assert store.query("SELECT node, component FROM anomalies FINAL").rows == [("vela-003", "mlx5_0:1")]
    assert exposition(loop)[key("fleetlens_hub_detection_failures_total")] == 2


def test_what_runs_after_each_window_gets_its_anomalies_and_its_failures_stop_nothing(
    store, tmp_path: Path
) -> None:
    calls: list[tuple[int, float]] = []

    class Alerting:
        def cycle(self, changed: list, now: float) -> None:
            calls.append((len(changed), now))
            if len(calls) == 1:
                raise RuntimeError("receiver config broken")

    loop = DetectionLoop(
        DetectionRunner(build(["link_down"])), store, window_s=10, lag_s=11, alerting=Alerting()
    )
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet["vela-001"].sysfs.set_link(0, up=False)
        windows = [fleet.tick() for _ in range(7)]
        for window in windows:
            loop.cycle(window)

    assert [end for _, end in calls] == [window.end for window in windows]
    assert [count for count, _ in calls][-1] == 1  # the window where link_down opened
    assert (loop.alerting_failures, loop.failures) == (1, 0)
    assert exposition(loop)[key("fleetlens_hub_alerting_failures_total")] == 1


def test_a_detector_that_fails_is_counted_per_window_and_the_others_run_on(store, tmp_path: Path) -> None:
    loop = DetectionLoop(
        DetectionRunner([MissingTable(), *build(["link_down"])]), store, window_s=10, lag_s=11
    )
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet["vela-003"].sysfs.set_link(0, up=False)
        for _ in range(8):
            loop.cycle(fleet.tick())
    assert loop.failures == 0  # the window itself went through
    assert store.query("SELECT node FROM anomalies FINAL").rows == [("vela-003",)]
    samples = exposition(loop)
    assert samples[key("fleetlens_hub_detector_failures_total", detector="missing_table")] == 8
    assert samples[key("fleetlens_hub_detector_failures_total", detector="link_down")] == 0

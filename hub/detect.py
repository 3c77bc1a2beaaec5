"""The hub's detection loop: every detector on each window as it closes, anomalies into the store.

A window [t - window_s, t) is run `lag_s` after t, once the scrape round that ended it has been
inserted (the lag is the scrape interval plus its timeout). The runner carries each detector's
persistence from window to window, so an anomaly opens, is updated and closes as a batch run over the
same range would; a runner given a SharedFaults (the hub's is) then localizes the window's open per-node
anomalies on the topology in force (analytics.detectors.shared_faults). Each window's anomalies (those
that opened, changed or closed) then go to the `alerting` step (an Alerting:
alerts.service.AlertService), named so that a reader can follow them there.
A failing cycle (store down, a detector that raises) is logged and counted, as is a failing alerting
step; neither stops the loop, and the next window runs as usual.

    loop = DetectionLoop(DetectionRunner(build()), store, window_s=10, lag_s=11, alerting=alert_service)
    loop.run(stop_event)          # in a thread of its own; `collect()` gives its metrics
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from analytics.detectors.base import Window
from analytics.detectors.runner import DetectionRunner, store_anomalies
from analytics.errors import AnalyticsError
from analytics.store.records import Anomaly

log = logging.getLogger("fleetlens.hub.detect")


class Alerting(Protocol):
    """Where each window's anomalies go after they are stored (alerts.service.AlertService)."""

    def cycle(self, changed: list[Anomaly], now: float) -> None:
        """Advance alerts to `now` (the window's end), given the anomalies that opened, changed or closed."""
        ...


class DetectionLoop:
    """Runs `runner` on `store` for each closed window of `window_s` seconds, `lag_s` after it closes."""

    def __init__(
        self,
        runner: DetectionRunner,
        store: object,
        *,
        window_s: float,
        lag_s: float,
        clock: Callable[[], float] = time.time,
        alerting: Alerting | None = None,
    ) -> None:
        self.runner = runner
        self.alerting = alerting
        self.store = store
        self.window_s = window_s
        self.lag_s = lag_s
        self._clock = clock
        self.cycles = 0
        self.failures = 0
        self.written = 0
        self.alerting_failures = 0
        self.last_duration_s = 0.0

    def run(self, stop: threading.Event) -> None:
        """Cycle until `stop` is set; the first window is the one closing next."""
        end = (self._clock() // self.window_s + 1) * self.window_s
        while not stop.wait(max(0.0, end + self.lag_s - self._clock())):
            self.cycle(Window(end - self.window_s, end))
            end += self.window_s
            behind = self._clock() - self.lag_s - end
            if behind > self.window_s:  # a long outage: skip to the present instead of catching up forever
                log.warning("detection fell %.0f s behind; skipping to the current window", behind)
                end += (behind // self.window_s) * self.window_s

    def cycle(self, window: Window) -> None:
        """Run every detector on `window` and store what opened, changed or closed."""
        started = time.perf_counter()
        try:
            anomalies = self.runner.step(self.store, window)
            store_anomalies(self.store, anomalies)
        except AnalyticsError as exc:
            self.failures += 1
            log.warning("detection over %s..%s failed: %s", window.start, window.end, exc)
            return
        finally:
            self.cycles += 1
            self.last_duration_s = time.perf_counter() - started
        self.written += len(anomalies)
        if self.alerting is not None:
            self._alert(anomalies, window.end)

    def _alert(self, anomalies: list[Anomaly], end: float) -> None:
        """Hand the window's anomalies to alerting; a failure is logged and counted, and the next window
        tries again: alerting must not stop detection."""
        try:
            self.alerting.cycle(anomalies, end)
        except Exception:
            self.alerting_failures += 1
            log.exception("alerting after the window ending %s failed", end)

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "fleetlens_hub_detection_cycles", "Detection windows run.", value=self.cycles
        )
        yield CounterMetricFamily(
            "fleetlens_hub_detection_failures",
            "Detection windows that failed (store unavailable, a query refused).",
            value=self.failures,
        )
        failed = CounterMetricFamily(
            "fleetlens_hub_detector_failures",
            "Windows a detector failed on (its others ran; each cause is logged once).",
            labels=["detector"],
        )
        for detector in self.runner.detectors:
            failed.add_metric([detector.name], self.runner.failures[detector.name])
        yield failed
        yield CounterMetricFamily(
            "fleetlens_hub_anomaly_updates",
            "Anomaly rows written: openings, updates and closings.",
            value=self.written,
        )
        yield CounterMetricFamily(
            "fleetlens_hub_alerting_failures",
            "Alerting cycles after a detection window that failed (logged with the reason).",
            value=self.alerting_failures,
        )
        yield GaugeMetricFamily(
            "fleetlens_hub_detection_duration_seconds",
            "Wall time of the last detection cycle.",
            value=self.last_duration_s,
        )

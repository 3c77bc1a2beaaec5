"""Congestion: a RoCE port whose congestion notifications run well above the fleet's (kind congestion).

Congestion is the fabric's doing, not the node's, so it is reported apart from faults, at severity
info. A port's notifications are the ECN-marked RoCE packets it received (as notification point) plus
the CNPs it handled (as reaction point, slowing its sends), per second, from mlx5's hw_counters under
node_exporter's names; reset steps are left out of the rates.

node_exporter reads those hw_counters only in versions newer than 1.5 (Debian's 1.5 reads none). A port
without them is judged by its transmit wait instead (port_xmit_wait, in node_exporter's every version:
ticks in which it had data to send and no credit to send it, as PFC pauses from a congested switch
cause), against the other ports judged by transmit wait: the two are different units and never mixed.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, frame, passing
from analytics.detectors.counters import (
    MAX_CANDIDATES,
    STEADY_RATE,
    STEADY_SECONDS,
    evidence_number,
    series_parameters,
    series_sql,
)
from analytics.store.protocols import Reader

ECN_MARKED = "node_infiniband_np_ecn_marked_roce_packets_received_total"
CNP_SENT = "node_infiniband_np_cnp_packets_sent_total"
CNP_HANDLED = "node_infiniband_rp_cnp_packets_handled_total"
TRANSMIT_WAIT = "node_infiniband_port_transmit_wait_total"
CONGESTION_METRICS = (ECN_MARKED, CNP_SENT, CNP_HANDLED, TRANSMIT_WAIT)
NOTIFICATIONS, WAIT = "notifications", "transmit_wait"  # the signal a port is judged by
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation
# Per port: its rates, the signal it is judged by and that signal's value (`per_s`); the median and MAD
# of `per_s` over the ports judged by the same signal.
CONGESTION_SQL = f"""
SELECT *, medianExact(abs(per_s - fleet_median_per_s)) OVER (PARTITION BY signal) AS fleet_mad_per_s
FROM (
    SELECT *, medianExact(per_s) OVER (PARTITION BY signal) AS fleet_median_per_s
    FROM (
        SELECT node, concat(labels['device'], ':', labels['port']) AS component, '' AS job,
            sumIf(rate, metric = '{ECN_MARKED}') AS ecn_marks_per_s,
            sumIf(rate, metric = '{CNP_SENT}') AS cnp_sent_per_s,
            sumIf(rate, metric = '{CNP_HANDLED}') AS cnp_handled_per_s,
            sumIf(rate, metric = '{TRANSMIT_WAIT}') AS transmit_wait_per_s,
            ecn_marks_per_s + cnp_handled_per_s AS notifications_per_s,
            countIf(metric IN ('{ECN_MARKED}', '{CNP_HANDLED}') AND steady_s > 0) > 0 AS notified,
            if(notified, '{NOTIFICATIONS}', '{WAIT}') AS signal,
            if(notified, notifications_per_s, transmit_wait_per_s) AS per_s
        FROM ({series_sql(f"{STEADY_RATE} AS rate", f"{STEADY_SECONDS} AS steady_s")})
        GROUP BY node, component
        HAVING max(steady_s) > 0
    )
)
ORDER BY node, component
"""


@register
class Congestion(Detector):
    """A port whose notification rate (or, without ECN and CNP counters, transmit wait) stands out from
    every port's judged alike in the window: a robust z-score, (rate - median) / (1.4826 x median
    absolute deviation), over those ports of the fleet.

    `floor_per_s` (`wait_floor_per_s` for transmit wait, in ticks per second) bounds the deviation from
    below, so that on a quiet fabric, where every port sees a handful of marks and the deviation is near
    zero, a few more marks do not make a large score: a port must exceed the median by `min_score` x the
    floor at the least. A fabric-wide congestion moves the median with it and reports nothing.
    """

    name: ClassVar[str] = "congestion"
    version: ClassVar[str] = "2"
    kinds: ClassVar[tuple[str, ...]] = ("congestion",)
    min_windows: ClassVar[int] = 2
    of_windows: ClassVar[int] = 3
    clear_windows: ClassVar[int] = 3

    def __init__(
        self, min_score: float = 5.0, floor_per_s: float = 100.0, wait_floor_per_s: float = 2e4
    ) -> None:
        self.min_score = min_score
        self.floor_per_s = floor_per_s
        self.wait_floor_per_s = wait_floor_per_s

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        parameters = series_parameters(CONGESTION_METRICS, window.start, window.end)
        return frame(source.query(CONGESTION_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))

    def score(self, features: pd.DataFrame) -> np.ndarray:
        floor = np.where(features["signal"] == NOTIFICATIONS, self.floor_per_s, self.wait_floor_per_s)
        spread = np.maximum(MAD_TO_SIGMA * features["fleet_mad_per_s"], floor)
        return ((features["per_s"] - features["fleet_median_per_s"]) / spread).to_numpy(float)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return [
            Finding.at(
                row,
                "congestion",
                score,
                "info",
                {
                    "ecn_marks_per_s": evidence_number(row.ecn_marks_per_s),
                    "cnp_sent_per_s": evidence_number(row.cnp_sent_per_s),
                    "cnp_handled_per_s": evidence_number(row.cnp_handled_per_s),
                    "transmit_wait_per_s": evidence_number(row.transmit_wait_per_s),
                    "signal": row.signal,
                    "fleet_median_per_s": evidence_number(row.fleet_median_per_s),
                    "fleet_mad_per_s": evidence_number(row.fleet_mad_per_s),
                    "robust_z": evidence_number(score),
                },
            )
            for row, score in passing(features, scores, self.min_score)
        ]

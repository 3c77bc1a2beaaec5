"""Congestion: a RoCE port whose congestion notifications run well above the fleet's (kind congestion).

Congestion is the fabric's doing, not the node's, so it is reported apart from faults, at severity
info. A port's notifications are the ECN-marked RoCE packets it received (as notification point) plus
the CNPs it handled (as reaction point, slowing its sends), per second, from mlx5's hw_counters under
node_exporter's names; reset steps are left out of the rates.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, frame
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
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation
CONGESTION_SQL = f"""
SELECT *, medianExact(abs(notifications_per_s - fleet_median_per_s)) OVER () AS fleet_mad_per_s
FROM (
    SELECT *, medianExact(notifications_per_s) OVER () AS fleet_median_per_s
    FROM (
        SELECT node, concat(labels['device'], ':', labels['port']) AS component, '' AS job,
            sumIf(rate, metric = '{ECN_MARKED}') AS ecn_marks_per_s,
            sumIf(rate, metric = '{CNP_SENT}') AS cnp_sent_per_s,
            sumIf(rate, metric = '{CNP_HANDLED}') AS cnp_handled_per_s,
            ecn_marks_per_s + cnp_handled_per_s AS notifications_per_s
        FROM ({series_sql(f"{STEADY_RATE} AS rate", f"{STEADY_SECONDS} AS steady_s")})
        GROUP BY node, component
        HAVING max(steady_s) > 0
    )
)
ORDER BY node, component
"""


@register
class Congestion(Detector):
    """A port whose notification rate stands out from every port's in the window: a robust z-score,
    (rate - median) / (1.4826 x median absolute deviation), over all ports of the fleet.

    `floor_per_s` bounds the deviation from below, so that on a quiet fabric, where every port sees a
    handful of marks and the deviation is near zero, a few more marks do not make a large score: a port
    must exceed the median by `min_score` x `floor_per_s` at the least. A fabric-wide congestion moves
    the median with it and reports nothing.
    """

    name: ClassVar[str] = "congestion"
    version: ClassVar[str] = "1"
    kinds: ClassVar[tuple[str, ...]] = ("congestion",)
    min_windows: ClassVar[int] = 2
    of_windows: ClassVar[int] = 3
    clear_windows: ClassVar[int] = 3

    def __init__(self, min_score: float = 5.0, floor_per_s: float = 100.0) -> None:
        self.min_score = min_score
        self.floor_per_s = floor_per_s

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        parameters = series_parameters((ECN_MARKED, CNP_SENT, CNP_HANDLED), window.start, window.end)
        return frame(source.query(CONGESTION_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))

    def score(self, features: pd.DataFrame) -> np.ndarray:
        spread = np.maximum(MAD_TO_SIGMA * features["fleet_mad_per_s"], self.floor_per_s)
        return ((features["notifications_per_s"] - features["fleet_median_per_s"]) / spread).to_numpy(float)

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
                    "fleet_median_per_s": evidence_number(row.fleet_median_per_s),
                    "fleet_mad_per_s": evidence_number(row.fleet_mad_per_s),
                    "robust_z": evidence_number(score),
                },
            )
            for row, score in zip(features.itertuples(), scores, strict=True)
            if score >= self.min_score
        ]

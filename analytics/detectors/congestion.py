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

from typing import Any, ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, passing_findings
from analytics.detectors.counters import LOOKBACK_S, evidence_number
from analytics.detectors.groups import columns_frame, group_sum, groups, median_exact
from analytics.detectors.tape import port_identity, tape_view
from analytics.evidence import CongestionEvidence
from analytics.store.protocols import Reader

ECN_MARKED = "node_infiniband_np_ecn_marked_roce_packets_received_total"
CNP_SENT = "node_infiniband_np_cnp_packets_sent_total"
CNP_HANDLED = "node_infiniband_rp_cnp_packets_handled_total"
TRANSMIT_WAIT = "node_infiniband_port_transmit_wait_total"
CONGESTION_METRICS = (ECN_MARKED, CNP_SENT, CNP_HANDLED, TRANSMIT_WAIT)
NOTIFICATIONS, WAIT = "notifications", "transmit_wait"  # the signal a port is judged by
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation
RATES = {
    "ecn_marks_per_s": ECN_MARKED,
    "cnp_sent_per_s": CNP_SENT,
    "cnp_handled_per_s": CNP_HANDLED,
    "transmit_wait_per_s": TRANSMIT_WAIT,
}


def ports(source: Reader, window: Window) -> pd.DataFrame:
    """Per port with a steady step in the window: its rates (reset steps left out), the signal it is
    judged by and that signal's value (`per_s`); the median and MAD of `per_s` over the ports judged
    by the same signal (`fleet_median_per_s`, `fleet_mad_per_s`)."""
    view = tape_view(source, CONGESTION_METRICS, window, LOOKBACK_S, points_only=True)  # summaries alone
    identity = view.derived(_port_identity)
    series = view.summaries()
    group, member = groups(identity["port"])
    count = len(member)
    rate, steady_s = series["steady_rate"].to_numpy(), series["steady_seconds"].to_numpy()
    rates = {name: group_sum(group, count, rate, identity[name]) for name in RATES}
    notifications = rates["ecn_marks_per_s"] + rates["cnp_handled_per_s"]
    notified = np.bincount(group[identity["notifying"] & (steady_s > 0)], minlength=count) > 0
    stepped = np.bincount(group[steady_s > 0], minlength=count) > 0  # max(steady_s) > 0
    per_s = np.where(notified, notifications, rates["transmit_wait_per_s"])[stepped]
    notified = notified[stepped]
    median, mad = np.zeros(len(per_s)), np.zeros(len(per_s))
    for judged_alike in (notified, ~notified):
        median[judged_alike] = median_exact(per_s[judged_alike])
        mad[judged_alike] = median_exact(np.abs(per_s[judged_alike] - median[judged_alike]))
    ported = member[stepped]
    return columns_frame(
        {
            "node": identity["node"][ported],
            "component": identity["component"][ported],
            "job": "",
            **{name: column[stepped] for name, column in rates.items()},
            "notifications_per_s": notifications[stepped],
            "notified": notified.astype(np.int64),
            "signal": np.where(notified, NOTIFICATIONS, WAIT).astype(object),
            "per_s": per_s,
            "fleet_median_per_s": median,
            "fleet_mad_per_s": mad,
        }
    )


def _port_identity(catalog: pd.DataFrame) -> pd.DataFrame:
    """Per series, its port's node and `component` ("mlx5_2:1"), `port` (a code ordering ports by node
    and component), which rate of RATES it is (a column each) and whether it is a `notifying` one."""
    identity = port_identity(catalog, RATES)
    identity["notifying"] = catalog["metric"].isin([ECN_MARKED, CNP_HANDLED]).to_numpy(bool)
    return identity


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
        return ports(source, window)

    def tape_needs(self) -> dict[str, float]:
        return dict.fromkeys(CONGESTION_METRICS, LOOKBACK_S)

    def score(self, features: pd.DataFrame) -> np.ndarray:
        floor = np.where(features["signal"] == NOTIFICATIONS, self.floor_per_s, self.wait_floor_per_s)
        spread = np.maximum(MAD_TO_SIGMA * features["fleet_mad_per_s"], floor)
        return ((features["per_s"] - features["fleet_median_per_s"]) / spread).to_numpy(float)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return passing_findings(features, scores, self.min_score, "congestion", "info", _evidence)


def _evidence(row: Any, score: float) -> CongestionEvidence:
    return CongestionEvidence(
        ecn_marks_per_s=evidence_number(row.ecn_marks_per_s),
        cnp_sent_per_s=evidence_number(row.cnp_sent_per_s),
        cnp_handled_per_s=evidence_number(row.cnp_handled_per_s),
        transmit_wait_per_s=evidence_number(row.transmit_wait_per_s),
        signal=row.signal,
        fleet_median_per_s=evidence_number(row.fleet_median_per_s),
        fleet_mad_per_s=evidence_number(row.fleet_mad_per_s),
        robust_z=evidence_number(score),
    )

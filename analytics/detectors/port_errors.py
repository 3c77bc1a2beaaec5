"""Port errors: a RoCE/InfiniBand port whose link corrupts what it carries (kind port_errors), as a failing
optic or cable, or a leaf switch's bad port, does. One candidate per port ("mlx5_2:1", node_exporter's
device and port labels).

A port's physical-layer errors are, per second, its symbol errors (minor errors the PHY saw on a lane),
its receive errors (packets that arrived damaged) and its link error recoveries (the link retrained
without going down), from the IB PMA counters node_exporter exports in every version. A healthy link
counts next to none: the real ports of ../shared/fixtures count zero over hundreds of millions of
packets. The rates leave counter reset steps out (a driver reload, a reboot: the value after a reset is
no new errors), and a scrape gap is bridged by the step from the last sample before it, as for every
counter detector (analytics.detectors.counters). A series rising in the window faster than any link can
count (IMPLAUSIBLE_PER_S: a corrupt sample, a counter read as garbage, a non-finite value) says nothing
of the link and is left out of that window. The PMA's error counters are 16 bits wide and stop at
65535: a port that saturated them long ago shows no rate until they are cleared.

The errors are weighed against the packets the port received in the same steps (port_rcv_packets, which
counts damaged packets too): an error rate is judged both absolutely and per received packet, as a bit
error rate is, so that neither a busy link's rare error nor a quiet link's single one reads as a fault.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, passing_findings
from analytics.detectors.counters import LOOKBACK_S, evidence_number
from analytics.detectors.groups import columns_frame, group_sum, groups
from analytics.detectors.tape import port_identity, tape_view
from analytics.evidence import PortErrorsEvidence
from analytics.store.protocols import Reader

SYMBOL_ERRORS = "node_infiniband_symbol_error_total"
RECEIVE_ERRORS = "node_infiniband_port_errors_received_total"
LINK_RECOVERIES = "node_infiniband_link_error_recovery_total"
RECEIVED_PACKETS = "node_infiniband_port_packets_received_total"
PORT_ERROR_METRICS = (SYMBOL_ERRORS, RECEIVE_ERRORS, LINK_RECOVERIES, RECEIVED_PACKETS)
ERROR_RATES = {  # the evidence's name of each error counter's rate
    "symbol_errors_per_s": SYMBOL_ERRORS,
    "receive_errors_per_s": RECEIVE_ERRORS,
    "link_recoveries_per_s": LINK_RECOVERIES,
}
RATES = {**ERROR_RATES, "received_packets_per_s": RECEIVED_PACKETS}
# A counter of these rising faster than this per second is no count of events: the fastest links move
# about 10^9 packets and 10^10 symbols a second. Such a step is left out as a reset is.
IMPLAUSIBLE_PER_S = 1e11
PER_MILLION = 1e6


def ports(source: Reader, window: Window) -> pd.DataFrame:
    """Per port with a steady step of an error counter in the window: the rate of each counter of RATES
    (reset steps and implausible steps left out; 0 where the port does not export it), `errors_per_s`
    (their sum over ERROR_RATES) and `errors_per_million` (errors per million packets received; where it
    received fewer packets than errors, per error: every packet it got was damaged, 10^6)."""
    view = tape_view(source, PORT_ERROR_METRICS, window, LOOKBACK_S, points_only=True)
    identity = view.derived(_port_identity)
    series = view.summaries()
    rate = series["steady_rate"].to_numpy(float)
    plausible = np.isfinite(rate) & (rate <= IMPLAUSIBLE_PER_S) & (series["steady_seconds"].to_numpy() > 0)
    rate = np.where(plausible, rate, 0.0)
    group, member = groups(identity["port"])
    count = len(member)
    rates = {name: group_sum(group, count, rate, identity[name] & plausible) for name in RATES}
    errors = sum(rates[name] for name in ERROR_RATES)
    counted = np.bincount(group[identity["error_counter"] & plausible], minlength=count) > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        per_packet = np.where(errors > 0, errors / np.maximum(rates["received_packets_per_s"], errors), 0.0)
    ported = member[counted]
    return columns_frame(
        {
            "node": identity["node"][ported],
            "component": identity["component"][ported],
            "job": "",
            **{name: column[counted] for name, column in rates.items()},
            "errors_per_s": errors[counted],
            "errors_per_million": PER_MILLION * per_packet[counted],
        }
    )


def _port_identity(catalog: pd.DataFrame) -> pd.DataFrame:
    """Per series, its port's node and `component` ("mlx5_2:1"), `port` (a code ordering ports by node
    and component), which counter of RATES it is (a column each) and whether it is an `error_counter`."""
    identity = port_identity(catalog, RATES)
    identity["error_counter"] = catalog["metric"].isin(list(ERROR_RATES.values())).to_numpy(bool)
    return identity


@register
class PortErrors(Detector):
    """A port whose physical-layer errors pass both an absolute floor and a ratio to the packets it
    received, in two of three windows.

    Score (higher is more anomalous): the port's errors per million received packets, where its errors
    per second reach `floor_per_s`, else 0; a finding where the score reaches `min_per_million`.

    - `min_per_million` = 1: one error per million 4 KiB packets is a bit error rate near 3e-11, thirty
      times the 1e-12 InfiniBand's link specifications allow and far above a healthy link's none; a bad
      optic or cable counts hundreds per million.
    - `floor_per_s` = 0.05: three errors a minute. Below it a quiet port's lone error (a single cosmic
      ray, the flutter of a link coming up) would pass the ratio on its own for want of packets.

    Severity warning: errors on a port are the link's, and the link is often the switch's side (a leaf's
    optics), so they alert the network team and drain nothing (alerts.policy has no rule for them).
    """

    name: ClassVar[str] = "port_errors"
    version: ClassVar[str] = "1"
    kinds: ClassVar[tuple[str, ...]] = ("port_errors",)
    min_windows: ClassVar[int] = 2
    of_windows: ClassVar[int] = 3
    clear_windows: ClassVar[int] = 3

    def __init__(self, min_per_million: float = 1.0, floor_per_s: float = 0.05) -> None:
        self.min_per_million = min_per_million
        self.floor_per_s = floor_per_s

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        return ports(source, window)

    def tape_needs(self) -> dict[str, float]:
        return dict.fromkeys(PORT_ERROR_METRICS, LOOKBACK_S)

    def score(self, features: pd.DataFrame) -> np.ndarray:
        floored = features["errors_per_s"].to_numpy(float) >= self.floor_per_s
        return np.where(floored, features["errors_per_million"].to_numpy(float), 0.0)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return passing_findings(features, scores, self.min_per_million, "port_errors", "warning", _evidence)


def _evidence(row: Any, score: float) -> PortErrorsEvidence:
    counters = tuple(name for name in ERROR_RATES if getattr(row, name) > 0)
    return PortErrorsEvidence(
        counters=counters,
        **{name: evidence_number(getattr(row, name)) for name in RATES},
        errors_per_s=evidence_number(row.errors_per_s),
        errors_per_million=evidence_number(score),
    )

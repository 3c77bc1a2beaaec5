"""Link detectors: a link that went down and came back (link_flap), and one that stays down (link_down).
One candidate per RoCE/InfiniBand port ("mlx5_2:1", node_exporter's device and port labels), and on a
node without RDMA ports one per network interface ("eth1", its device label).

A port's link is read from its IB state (4: ACTIVE) and physical state (5: LinkUp), which mlx5 keeps in
step with the Ethernet link of a RoCE port; it is down when either says so. Going down is counted by
the port's link_downed counter, which catches a flap too short for any scrape to see, and by the falls
seen between scrapes. Counter resets (a driver reload, a reboot) count nothing, and a scrape gap is
bridged by the step from the last sample before it, so neither looks like a flap.

An interface's link is read from the netclass collector's carrier (1 up, 0 down) and counted by its
carrier_down_changes_total in the same way. Interfaces are judged only on nodes that report no RDMA
port (none of the port series above) in the query's range: on a RoCE node each port already covers
its netdev (mlx5 moves both together, and mapping one onto the other would cost a join per window),
and its other interfaces, such as the management eth0, carry no training traffic. The loopback and
container or VM bridges, which have no carrier while nothing is attached, are no links
(IGNORED_INTERFACES, a parameter of both detectors).

Both detectors look at the window and the lookback before it (a minute by default), in one query
that the runner shares between them: a link that was down for less than the lookback and is up again
flapped; one down for the lookback or longer is down, and its return is no flap.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, frame, passing
from analytics.detectors.counters import (
    LAST,
    LOOKBACK_S,
    MAX_CANDIDATES,
    evidence_number,
    series_parameters,
    series_sql,
    steady_increase,
)
from analytics.store.protocols import Reader

STATE = "node_infiniband_state_id"
PHYSICAL_STATE = "node_infiniband_physical_state_id"
LINK_DOWNED = "node_infiniband_link_downed_total"
CARRIER = "node_network_carrier"
CARRIER_DOWN = "node_network_carrier_down_changes_total"
LINK_METRICS = (STATE, PHYSICAL_STATE, LINK_DOWNED, CARRIER, CARRIER_DOWN)
ACTIVE, LINK_UP, CARRIER_UP = 4, 5, 1
# Interfaces that are no training link: the loopback, and container and VM bridges and tunnels, which
# have no carrier while nothing is attached (ClickHouse `match`, RE2, anchored here).
IGNORED_INTERFACES = r"^(lo|docker\d+|virbr\d+|br-\w+|cni\d+|flannel\.\d+|cali\w+|tunl\d+)$"
# the value a gauge (IB state, physical state, carrier) has while its link is up; `gauge` tells them
# from the counters that count the link going down (link_downed, carrier_down_changes_total)
UP = f"multiIf(metric = '{STATE}', {ACTIVE}, metric = '{PHYSICAL_STATE}', {LINK_UP}, {CARRIER_UP})"
# The steps between consecutive samples since the lookback: where the link went down in the last minute.
RECENT_STEPS = "arrayZip(arrayPopBack(recent), arrayPopFront(recent))"
LINK_SERIES = series_sql(
    f"{UP} AS up",
    f"metric NOT IN ('{LINK_DOWNED}', '{CARRIER_DOWN}') AS gauge",
    "length(inside) AS samples",
    f"{LAST} AS last",
    f"arrayCount(step -> step.1.2 = up AND step.2.2 != up, {RECENT_STEPS}) AS falls",
    "arrayAll(point -> point.2 != up, inside) AS down_inside",
    "points[-1].1 - if(last_up_t > 0, last_up_t, recent[1].1) AS down_s",
    f"{steady_increase(RECENT_STEPS)} AS increase",
    lookback_aggregates=(
        f"maxIf(t, value = {UP}) AS last_up_t",
        "arraySort(point -> point.1, groupArray((t, value))) AS recent",
    ),
)
# One row per link. `state` is an interface's carrier; an interface is a link only on a node with no
# port (QUALIFY, over the node's links), and not when its name matches {ignored:String}.
LINK_SQL = f"""
SELECT node, if(netdev, labels['device'], concat(labels['device'], ':', labels['port'])) AS component,
    '' AS job, startsWith(metric, 'node_network_') AS netdev,
    countIf(metric IN ('{STATE}', '{CARRIER}') AND samples > 0) > 0 AS reported,
    maxIf(last, metric IN ('{STATE}', '{CARRIER}') AND samples > 0) AS state,
    maxIf(last, metric = '{PHYSICAL_STATE}' AND samples > 0) AS physical_state,
    reported AND if(netdev, state = {CARRIER_UP}, state = {ACTIVE} AND physical_state = {LINK_UP}) AS up_now,
    reported AND maxIf(down_inside, gauge AND samples > 0) AS down_whole_window,
    maxIf(down_s, gauge AND samples > 0) AS down_s,
    maxIf(falls, gauge) AS state_falls,
    sumIf(increase, NOT gauge) AS link_downed,
    greatest(state_falls, link_downed) AS downs
FROM ({LINK_SERIES})
GROUP BY node, netdev, component
QUALIFY NOT netdev OR (NOT match(component, {{ignored:String}}) AND min(netdev) OVER (PARTITION BY node))
ORDER BY node, component
"""


def links(source: Reader, window: Window, lookback_s: float, ignored: str) -> pd.DataFrame:
    """Every link (a port, or an interface of a node without ports: `netdev`): whether it is up at its
    last sample in the window (`up_now`) and was down at every one (`down_whole_window`), for how long
    it has been down (`down_s`, as far back as the lookback reaches), and how often it went down in the
    window and the lookback before it (`downs`, the most any one signal counted). `link_downed` is the
    increase of a port's link_downed counter, or of an interface's carrier_down_changes_total.
    Interfaces whose name matches the regular expression `ignored` are left out."""
    parameters = series_parameters(LINK_METRICS, window.start, window.end, lookback_s) | {"ignored": ignored}
    return frame(source.query(LINK_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))


def _link_evidence(row: Any) -> dict[str, Any]:
    """The link's state as last seen: an interface's carrier, a port's IB state and physical state."""
    if row.netdev:
        return {"carrier": evidence_number(row.state)}
    return {"state": evidence_number(row.state), "physical_state": evidence_number(row.physical_state)}


@register
class LinkFlap(Detector):
    """A link (port or interface) that is up now and went down at least `min_flaps` times in the window
    or the `lookback_s` before it.

    The lookback lets a flap that a scrape caught down be reported when the link is back, one interval
    later; a link down for longer than the lookback is link_down's, and its return is no flap. Score:
    the number of times it went down while up now, else 0. Evidence: an interface's `carrier` where a
    port has `state` and `physical_state`, and under `link_downed` its carrier_down_changes_total's
    increase.
    """

    name: ClassVar[str] = "link_flap"
    version: ClassVar[str] = "3"
    kinds: ClassVar[tuple[str, ...]] = ("link_flap",)
    min_windows: ClassVar[int] = 1
    of_windows: ClassVar[int] = 1
    clear_windows: ClassVar[int] = 6

    def __init__(
        self, min_flaps: int = 1, lookback_s: float = LOOKBACK_S, ignored_interfaces: str = IGNORED_INTERFACES
    ) -> None:
        self.min_flaps = min_flaps
        self.lookback_s = lookback_s
        self.ignored_interfaces = ignored_interfaces

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        return links(source, window, self.lookback_s, self.ignored_interfaces)

    def score(self, features: pd.DataFrame) -> np.ndarray:
        return np.where(features["up_now"].astype(bool), features["downs"], 0.0).astype(float)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return [
            Finding.at(
                row,
                "link_flap",
                score,
                "warning",
                {
                    "downs": evidence_number(row.downs),
                    "link_downed": evidence_number(row.link_downed),
                    "state_falls": evidence_number(row.state_falls),
                    "lookback_s": self.lookback_s,
                    **_link_evidence(row),
                },
            )
            for row, score in passing(features, scores, self.min_flaps)
        ]


@register
class LinkDown(Detector):
    """A link (port or interface) that was down at every sample of the window, down for at least
    `min_down_s` seconds (by default the lookback: shorter is a flap, reported by link_flap when the link
    is back), on a node still reporting.

    Score: the seconds it has been seen down (up to the lookback) when down the whole window, else 0.
    """

    name: ClassVar[str] = "link_down"
    version: ClassVar[str] = "3"
    kinds: ClassVar[tuple[str, ...]] = ("link_down",)
    min_windows: ClassVar[int] = 1
    of_windows: ClassVar[int] = 1
    clear_windows: ClassVar[int] = 3

    def __init__(
        self,
        min_down_s: float = LOOKBACK_S,
        lookback_s: float = LOOKBACK_S,
        ignored_interfaces: str = IGNORED_INTERFACES,
    ) -> None:
        self.min_down_s = min_down_s
        self.lookback_s = lookback_s
        self.ignored_interfaces = ignored_interfaces

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        return links(source, window, self.lookback_s, self.ignored_interfaces)

    def score(self, features: pd.DataFrame) -> np.ndarray:
        return np.where(features["down_whole_window"].astype(bool), features["down_s"], 0.0).astype(float)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return [
            Finding.at(
                row,
                "link_down",
                score,
                "critical",
                {"down_s": evidence_number(score), **_link_evidence(row)},
            )
            for row, score in passing(features, scores, self.min_down_s)
        ]

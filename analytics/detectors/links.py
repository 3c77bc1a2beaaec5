"""Link detectors for RoCE/InfiniBand ports: a link that went down and came back (link_flap), and one that
stays down (link_down). One candidate per port ("mlx5_2:1", node_exporter's device and port labels).

A port's link is read from its IB state (4: ACTIVE) and physical state (5: LinkUp), which mlx5 keeps in
step with the Ethernet link of a RoCE port; it is down when either says so. Going down is counted by
the port's link_downed counter, which catches a flap too short for any scrape to see, and by the falls
seen between scrapes. Counter resets (a driver reload, a reboot) count nothing, and a scrape gap is
bridged by the step from the last sample before it, so neither looks like a flap. (The netdev's
carrier counters say the same for mlx5 and would cost a join per window to map onto the port.)

Both detectors look at the window and the lookback before it (a minute by default), in one query
that the runner shares between them: a link that was down for less than the lookback and is up again
flapped; one down for the lookback or longer is down, and its return is no flap.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, QuerySource, Window, frame
from analytics.detectors.counters import (
    LAST,
    LOOKBACK_S,
    MAX_CANDIDATES,
    evidence_number,
    series_parameters,
    series_sql,
    steady_increase,
)

STATE = "node_infiniband_state_id"
PHYSICAL_STATE = "node_infiniband_physical_state_id"
LINK_DOWNED = "node_infiniband_link_downed_total"
LINK_METRICS = (STATE, PHYSICAL_STATE, LINK_DOWNED)
ACTIVE, LINK_UP = 4, 5
UP = f"if(metric = '{STATE}', {ACTIVE}, {LINK_UP})"  # the state gauge's value while the link is up
# The steps between consecutive samples since the lookback: where the link went down in the last minute.
RECENT_STEPS = "arrayZip(arrayPopBack(recent), arrayPopFront(recent))"
LINK_SERIES = series_sql(
    "length(inside) AS samples",
    f"{LAST} AS last",
    f"arrayCount(step -> step.1.2 = {UP} AND step.2.2 != {UP}, {RECENT_STEPS}) AS falls",
    f"arrayAll(point -> point.2 != {UP}, inside) AS down_inside",
    "points[-1].1 - if(last_up_t > 0, last_up_t, recent[1].1) AS down_s",
    f"{steady_increase(RECENT_STEPS)} AS increase",
    lookback_aggregates=(
        f"maxIf(t, value = {UP}) AS last_up_t",
        "arraySort(point -> point.1, groupArray((t, value))) AS recent",
    ),
)
LINK_SQL = f"""
SELECT node, concat(labels['device'], ':', labels['port']) AS component, '' AS job,
    countIf(metric = '{STATE}' AND samples > 0) > 0 AS reported,
    maxIf(last, metric = '{STATE}' AND samples > 0) AS state,
    maxIf(last, metric = '{PHYSICAL_STATE}' AND samples > 0) AS physical_state,
    reported AND state = {ACTIVE} AND physical_state = {LINK_UP} AS up_now,
    reported AND maxIf(down_inside, metric != '{LINK_DOWNED}' AND samples > 0) AS down_whole_window,
    maxIf(down_s, metric != '{LINK_DOWNED}' AND samples > 0) AS down_s,
    maxIf(falls, metric != '{LINK_DOWNED}') AS state_falls,
    sumIf(increase, metric = '{LINK_DOWNED}') AS link_downed,
    greatest(state_falls, link_downed) AS downs
FROM ({LINK_SERIES})
GROUP BY node, component
ORDER BY node, component
"""


def port_links(source: QuerySource, window: Window, lookback_s: float) -> pd.DataFrame:
    """Every port's link: whether it is up at its last sample in the window (`up_now`) and was down at
    every one (`down_whole_window`), for how long it has been down (`down_s`, as far back as the
    lookback reaches), and how often it went down in the window and the lookback before it (`downs`,
    the most any one signal counted)."""
    parameters = series_parameters(LINK_METRICS, window.start, window.end, lookback_s)
    return frame(source.query(LINK_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))


def _link_evidence(row: Any) -> dict[str, Any]:
    """The port's link state as last seen."""
    return {"state": evidence_number(row.state), "physical_state": evidence_number(row.physical_state)}


@register
class LinkFlap(Detector):
    """A port that is up now and went down at least `min_flaps` times in the window or the `lookback_s`
    before it.

    The lookback lets a flap that a scrape caught down be reported when the link is back, one interval
    later; a link down for longer than the lookback is link_down's, and its return is no flap. Score:
    the number of times it went down while up now, else 0.
    """

    name: ClassVar[str] = "link_flap"
    version: ClassVar[str] = "2"
    kinds: ClassVar[tuple[str, ...]] = ("link_flap",)
    min_windows: ClassVar[int] = 1
    of_windows: ClassVar[int] = 1
    clear_windows: ClassVar[int] = 6

    def __init__(self, min_flaps: int = 1, lookback_s: float = LOOKBACK_S) -> None:
        self.min_flaps = min_flaps
        self.lookback_s = lookback_s

    def features(self, source: QuerySource, window: Window) -> pd.DataFrame:
        return port_links(source, window, self.lookback_s)

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
            for row, score in zip(features.itertuples(), scores, strict=True)
            if score >= self.min_flaps
        ]


@register
class LinkDown(Detector):
    """A port whose link was down at every sample of the window, down for at least `min_down_s`
    seconds (by default the lookback: shorter is a flap, reported by link_flap when the link is back),
    on a node still reporting.

    Score: the seconds it has been seen down (up to the lookback) when down the whole window, else 0.
    """

    name: ClassVar[str] = "link_down"
    version: ClassVar[str] = "2"
    kinds: ClassVar[tuple[str, ...]] = ("link_down",)
    min_windows: ClassVar[int] = 1
    of_windows: ClassVar[int] = 1
    clear_windows: ClassVar[int] = 3

    def __init__(self, min_down_s: float = LOOKBACK_S, lookback_s: float = LOOKBACK_S) -> None:
        self.min_down_s = min_down_s
        self.lookback_s = lookback_s

    def features(self, source: QuerySource, window: Window) -> pd.DataFrame:
        return port_links(source, window, self.lookback_s)

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
            for row, score in zip(features.itertuples(), scores, strict=True)
            if score >= self.min_down_s
        ]

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

Both detectors look at the window and the lookback before it (a minute by default), through the
tape (analytics.detectors.tape) that the runner shares between them: a link that was down for less
than the lookback and is up again flapped; one down for the lookback or longer is down, and its
return is no flap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import re2

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, computed_once, passing_findings
from analytics.detectors.counters import LOOKBACK_S, evidence_number
from analytics.detectors.groups import Columns, columns_frame, group_extreme, group_sum, groups
from analytics.detectors.tape import TapeView, label, tape_view
from analytics.evidence import LinkDownEvidence, LinkFlapEvidence
from analytics.store.protocols import Reader

STATE = "node_infiniband_state_id"
PHYSICAL_STATE = "node_infiniband_physical_state_id"
LINK_DOWNED = "node_infiniband_link_downed_total"
CARRIER = "node_network_carrier"
CARRIER_DOWN = "node_network_carrier_down_changes_total"
LINK_METRICS = (STATE, PHYSICAL_STATE, LINK_DOWNED, CARRIER, CARRIER_DOWN)
ACTIVE, LINK_UP, CARRIER_UP = 4, 5, 1
# Interfaces that are no training link: the loopback, and container and VM bridges and tunnels, which
# have no carrier while nothing is attached (a regular expression, searched, anchored here).
IGNORED_INTERFACES = r"^(lo|docker\d+|virbr\d+|br-\w+|cni\d+|flannel\.\d+|cali\w+|tunl\d+)$"
# the value a gauge (IB state, physical state, carrier) has while its link is up; the counters
# (link_downed, carrier_down_changes_total) count the link going down
UP = {STATE: ACTIVE, PHYSICAL_STATE: LINK_UP, CARRIER: CARRIER_UP}
COUNTERS = (LINK_DOWNED, CARRIER_DOWN)


def links(source: Reader, window: Window, lookback_s: float, ignored: str) -> pd.DataFrame:
    """Every link (a port, or an interface of a node without ports: `netdev`): whether it is up at its
    last sample in the window (`up_now`) and was down at every one (`down_whole_window`), for how long
    it has been down (`down_s`, as far back as the lookback reaches), and how often it went down in the
    window and the lookback before it (`downs`, the most any one signal counted). `link_downed` is the
    increase of a port's link_downed counter, or of an interface's carrier_down_changes_total.
    Interfaces whose name matches the regular expression `ignored` are left out. Computed once a window
    for link_flap and link_down alike (a copy each: what one adds to its frame the other does not see)."""
    key = ("links", window, lookback_s, ignored)
    return computed_once(source, key, lambda: _links(source, window, lookback_s, ignored)).copy(deep=False)


def _links(source: Reader, window: Window, lookback_s: float, ignored: str) -> pd.DataFrame:
    view = tape_view(source, LINK_METRICS, window, lookback_s)
    identity = view.derived(_link_identity)
    series = _link_series(view, identity)
    group, member = groups(identity["link"])
    count = len(member)
    sampled, gauge = series["samples"] > 0, identity["gauge"]
    state_metric = identity["state_metric"]

    def largest(column: str, where: np.ndarray) -> np.ndarray:
        return group_extreme(np.fmax, group, count, series[column].astype(np.float64), where)

    netdev = identity["netdev"][member]
    reported = np.bincount(group[state_metric & sampled], minlength=count) > 0
    state = largest("last", state_metric & sampled)
    physical_state = largest("last", identity["physical"] & sampled)
    up_now = reported & np.where(netdev, state == CARRIER_UP, (state == ACTIVE) & (physical_state == LINK_UP))
    state_falls = largest("falls", gauge).astype(np.int64)
    link_downed = group_sum(group, count, series["increase"], ~gauge)
    component = identity["component"][member]
    node = identity["node_code"][member]
    interfaces_only = ~np.isin(node, node[~netdev])
    is_ignored = matcher(ignored)
    judged = ~netdev
    for link in np.flatnonzero(netdev & interfaces_only):  # the interfaces of nodes without ports: few
        judged[link] = not is_ignored(component[link])
    # in the links' order (node, netdev, component), which is by node and component: a node's judged
    # links are all ports or all interfaces
    columns = {
        "node": identity["node"][member],
        "component": component,
        "job": "",
        "netdev": netdev.astype(np.int64),
        "reported": reported.astype(np.int64),
        "state": state,
        "physical_state": physical_state,
        "up_now": up_now.astype(np.int64),
        "down_whole_window": (reported & (largest("down_inside", gauge & sampled) > 0)).astype(np.int64),
        "down_s": largest("down_s", gauge & sampled),
        "state_falls": state_falls,
        "link_downed": link_downed,
        "downs": np.maximum(state_falls, link_downed),
    }
    return columns_frame(
        {name: column if isinstance(column, str) else column[judged] for name, column in columns.items()}
    )


def matcher(pattern: str) -> Callable[[str], bool]:
    """Whether a name matches `pattern` as ClickHouse's `match` reads it (RE2: searched, UTF-8, `.` taking
    a newline too): in time linear in the name whatever a user configures, where Python's re can
    backtrack for ever on a hostile pattern or name."""
    options = re2.Options()
    options.dot_nl = True
    options.log_errors = False
    search = re2.compile(pattern, options).search
    return lambda name: search(name) is not None


def _link_identity(catalog: pd.DataFrame) -> pd.DataFrame:
    """Per series, what its identity says of its link: the link's node, `netdev` (an interface, else a
    port), `component` and `link` (a code ordering links by node, netdev and component), `node_code`;
    whether the series is a `gauge` (else a counter), its value while `up`, and whether it is the link's
    state (IB state or carrier: `state_metric`) or `physical` state."""
    metric = catalog["metric"]
    device, port = label(catalog, "device"), label(catalog, "port")
    netdev = metric.str.startswith("node_network_").to_numpy(bool)
    identity = pd.DataFrame(
        {
            "node": catalog["node"],
            "netdev": netdev,
            "component": device.where(netdev, device + ":" + port),
            "gauge": ~metric.isin(COUNTERS).to_numpy(bool),
            "up": metric.map(UP).fillna(CARRIER_UP).to_numpy(np.float64),
            "state_metric": metric.isin([STATE, CARRIER]).to_numpy(bool),
            "physical": (metric == PHYSICAL_STATE).to_numpy(bool),
        }
    )
    identity["link"] = identity.groupby(["node", "netdev", "component"], sort=True).ngroup()
    identity["node_code"] = identity.groupby("node", sort=True).ngroup()
    return identity


def _link_series(view: TapeView, identity: Columns) -> dict[str, np.ndarray]:
    """Per series of LINK_METRICS: its `samples` in the window and `last` value (as TapeView.summaries
    gives them, without the rates links do not read), how often it went from up to down between samples
    since the lookback (`falls`), whether it was down at every sample of the window (`down_inside`), for
    how long it has been down at its last sample (`down_s`: since it was last up, else since its first
    sample), and its steady `increase` since the lookback."""
    up = identity["up"][view.group]
    last_up_t = view.max(view.t, view.value == up)
    first_t, last_t = view.t[view.first], view.t[view.last]
    return {
        "samples": view.count(view.inside),
        "last": view.value[view.last],
        "falls": view.count(view.recent_step & (view.previous_value == up) & (view.value != up)),
        "down_inside": view.count(view.inside & (view.value == up)) == 0,
        "down_s": last_t - np.where(last_up_t > 0, last_up_t, first_t),
        "increase": view.steady_increase(view.recent_step),
    }


def _link_state(row: Any) -> dict[str, float | None]:
    """The link's state as last seen (analytics.evidence.LinkState): an interface's carrier, a port's IB
    state and physical state."""
    if row.netdev:
        return {"carrier": evidence_number(row.state)}
    return {"state": evidence_number(row.state), "physical_state": evidence_number(row.physical_state)}


class _LinkDetector(Detector):
    """What link_flap and link_down share: the window's links (one frame for both in a runner's window)."""

    lookback_s: float
    ignored_interfaces: str

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        return links(source, window, self.lookback_s, self.ignored_interfaces)

    def tape_needs(self) -> dict[str, float]:
        return dict.fromkeys(LINK_METRICS, self.lookback_s)


@register
class LinkFlap(_LinkDetector):
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

    def score(self, features: pd.DataFrame) -> np.ndarray:
        return np.where(features["up_now"].astype(bool), features["downs"], 0.0).astype(float)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return passing_findings(features, scores, self.min_flaps, "link_flap", "warning", self._evidence)

    def _evidence(self, row: Any, score: float) -> LinkFlapEvidence:
        return LinkFlapEvidence(
            downs=evidence_number(row.downs),
            link_downed=evidence_number(row.link_downed),
            state_falls=evidence_number(row.state_falls),
            lookback_s=self.lookback_s,
            **_link_state(row),
        )


@register
class LinkDown(_LinkDetector):
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

    def score(self, features: pd.DataFrame) -> np.ndarray:
        return np.where(features["down_whole_window"].astype(bool), features["down_s"], 0.0).astype(float)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return passing_findings(features, scores, self.min_down_s, "link_down", "critical", _down_evidence)


def _down_evidence(row: Any, score: float) -> LinkDownEvidence:
    return LinkDownEvidence(down_s=evidence_number(score), **_link_state(row))

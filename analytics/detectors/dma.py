"""dma_degraded: a GPU-NIC data path that fell off its fast lane, in any of three ways.

- `pcie`: a GPU whose PCIe link trained below its maximum generation or width, with its replay
  counter rising (a link that merely idles at a low generation replays nothing); component gpu:N. The
  link is read from fleetlens's gauges or from DCGM's link fields (analytics.detectors.dcgm.PCIE_LINK),
  which dcgm-exporter's default counter set leaves out: without either, this signal is blind.
- `roce_bytes`: a RoCE port moving far fewer bytes per second than its peers while its node's job
  runs, with its link steady (up at every sample and never down since the lookback: the bytes of a
  port that just flapped say nothing about its data path) and its fabric not pushing back (ECN
  marks would make it congestion); component device:port. Peers are the ports of the nodes running
  the same job (the job of a node is its latest step row), or, for nodes without step rows, of all
  such nodes. In a synchronous job every port moves about the same bytes per step, so a port far
  below is staging its traffic through host memory or sitting on a narrowed link. The fabric's push
  back is read from the port's ECN marks (mlx5's hw_counters, which node_exporter 1.5 does not read);
  a port without them is judged by its transmit wait instead (port_xmit_wait: ticks it had data to
  send and no credit to send it, which PFC pauses and a congested switch port cause).
- `nccl`: NCCL logs saying a rank of the node runs without GPUDirect RDMA (status no or partial);
  component: the port its connections without GPUDirect RDMA go through, or "" when several. Only
  fleetlens's nccl_log collector reads NCCL's logs: without it a rank without GPUDirect RDMA shows as
  its port's `roce_bytes`, when it moves less than its peers.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window
from analytics.detectors.congestion import ECN_MARKED, TRANSMIT_WAIT
from analytics.detectors.counters import LOOKBACK_S, Evidence, evidence_number, signal_count, signal_findings
from analytics.detectors.dcgm import PCIE_LINK
from analytics.detectors.groups import (
    Columns,
    columns_frame,
    group_extreme,
    group_sum,
    groups,
    looked_up,
    median_exact,
    objects,
)
from analytics.detectors.peers import node_jobs
from analytics.detectors.tape import TapeView, label, tape_views
from analytics.evidence import DmaDegradedEvidence
from analytics.store.protocols import Reader

PCIE_REPLAYS = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
RECEIVED = "node_infiniband_port_data_received_bytes_total"
TRANSMITTED = "node_infiniband_port_data_transmitted_bytes_total"
STATE = "node_infiniband_state_id"
LINK_DOWNED = "node_infiniband_link_downed_total"
NCCL_GDR = "fleetlens_nccl_gpudirect_rdma_status"
NCCL_CONNECTIONS = "fleetlens_nccl_connections"
NCCL_NET_DEVICES = "fleetlens_nccl_net_device_info"
DMA_METRICS = (
    *(name for names in PCIE_LINK.values() for name in names),
    PCIE_REPLAYS,
    RECEIVED,
    TRANSMITTED,
    ECN_MARKED,
    TRANSMIT_WAIT,
    STATE,
    LINK_DOWNED,
    NCCL_GDR,
    NCCL_CONNECTIONS,
    NCCL_NET_DEVICES,
)
LINK_STATE_METRICS = (STATE, LINK_DOWNED)  # read over the lookback: was the link steady all along
ACTIVE = 4
# a connection `via NET/IB/1`, where GPUDirect RDMA adds `/GDRDMA` (a constant: never outside text)
NET_WITHOUT_GDR = re.compile("^NET/[^/]+/([0-9]+)$")
UINT32 = re.compile(r"\+?[0-9]+")  # what ClickHouse's toUInt32OrZero reads as a number
PORT_BYTES = (RECEIVED, TRANSMITTED)
NO_GDR = ("no", "partial")  # a rank's GPUDirect RDMA status that makes it a candidate
# Per series, which role it plays in a unit's figures (a boolean column each of _dma_identity)
ROLES = {
    **{f"pcie_{figure}": names for figure, names in PCIE_LINK.items()},
    "replays": (PCIE_REPLAYS,),
    "port_bytes": PORT_BYTES,
    "ecn": (ECN_MARKED,),
    "wait": (TRANSMIT_WAIT,),
    "state": (STATE,),
    "downed": (LINK_DOWNED,),
    "gdr": (NCCL_GDR,),
    "connections": (NCCL_CONNECTIONS,),
    "net_devices": (NCCL_NET_DEVICES,),
}
PCIE_FIGURES = [f"pcie_{figure}" for figure in PCIE_LINK]
COUNTER_ROLES = ("replays", "port_bytes", "ecn", "wait")  # the roles read by their steady increase or rate
FIGURES = [*PCIE_FIGURES, "pcie_replays", "roce_bytes_per_s", "ecn_marks_per_s", "transmit_wait_per_s"]
FLAGS = ["is_port", "has_ecn", "link_steady"]
CANDIDATE_COLUMNS = [
    "node", "component", *PCIE_FIGURES, "pcie_replays", "is_port", "roce_bytes_per_s", "ecn_marks_per_s",
    "has_ecn", "transmit_wait_per_s", "link_steady", "nccl_without_gdr", "job", "peers_roce_bytes_per_s",
]  # fmt: skip


def candidates(source: Reader, window: Window, lookback_s: float) -> pd.DataFrame:
    """Per node and component (a GPU, a port, or the port an NCCL rank without GPUDirect RDMA goes
    through): its PCIe link figures and replays, its RoCE bytes, ECN marks and transmit wait per second,
    whether it is a port (`is_port`: both byte counters stepped) with a link steady since the lookback,
    the ranks without GPUDirect RDMA on it, its node's job and the median bytes per second of that job's
    steady ports (`peers_roce_bytes_per_s`). Only ports, GPUs below their maximum link and components
    with such ranks are candidates, ordered by node and component."""
    # the window and the sample before it: the gauges (NCCL's, PCIe's, the links': four series in five)
    # are read by their last value, the counters by their steps; the links alone over the lookback
    views = tape_views(source)
    points = views(DMA_METRICS, window, lookback_s, points_only=True)
    links = views(LINK_STATE_METRICS, window, lookback_s)
    # the identity's columns once, as numpy arrays: a frame's column lookups cost more than the figures
    identity = points.derived(_dma_identity)
    found = _components(_units(points, links, identity))
    jobs = looked_up(node_jobs(source, window, lookback_s), found["node"], "")
    steady_ports = found["is_port"].astype(bool) & found["link_steady"].astype(bool)
    peers = np.full(len(jobs), np.nan)
    job_code, job_names = pd.factorize(jobs)  # not np.unique: its sort of Python strings is 10x dearer
    for code in range(len(job_names)):
        of_job = job_code == code
        peers[of_job] = median_exact(found["roce_bytes_per_s"][of_job & steady_ports])
    found |= {"job": jobs, "peers_roce_bytes_per_s": peers}
    kept = (
        found["is_port"].astype(bool)
        | (found["pcie_gen"] < found["pcie_max_gen"])
        | (found["pcie_width"] < found["pcie_max_width"])
        | found["has_entry"]
    )
    chosen = {name: found[name][kept] for name in CANDIDATE_COLUMNS}
    # each candidate's ranks as a list in order, as SQL's arraySort gives them: for the kept rows alone
    chosen["nccl_without_gdr"] = objects([sorted(entry) for entry in found["nccl_without_gdr"][kept]])
    return columns_frame(chosen)


def _dma_identity(catalog: pd.DataFrame) -> pd.DataFrame:
    """Per series, its node and `unit`: a port (device:port), an NCCL rank (log|pid|cuda_device,
    `is_rank`) or a GPU (gpu:N), and `unit_code` (a code ordering units by node and unit); its role
    (ROLES, a column each); and the labels an NCCL series is read by: its rank's `rank_text`, its GDR
    `status`, the NET index a connection without GPUDirect RDMA goes through (`net_without_gdr`, -1 for
    none) and a NET device's `net_index` and `net_port`."""
    metric = catalog["metric"]
    device, port = label(catalog, "device"), label(catalog, "port")
    is_port_metric = metric.str.startswith("node_infiniband_").to_numpy(bool)
    is_rank = metric.str.startswith("fleetlens_nccl_").to_numpy(bool)
    rank_unit = label(catalog, "log") + "|" + label(catalog, "pid") + "|" + label(catalog, "cuda_device")
    unit = np.where(
        is_port_metric, device + ":" + port, np.where(is_rank, rank_unit, "gpu:" + label(catalog, "gpu"))
    )
    identity = pd.DataFrame({"node": catalog["node"].to_numpy(), "unit": unit, "is_rank": is_rank})
    for role, names in ROLES.items():
        identity[role] = metric.isin(names).to_numpy(bool)
    identity["rank_text"] = ("rank " + label(catalog, "rank") + " in " + label(catalog, "log")).to_numpy()
    identity["status"] = label(catalog, "status").to_numpy()
    identity["net_without_gdr"] = label(catalog, "via").map(_net_without_gdr).to_numpy(np.int64)
    identity["net_index"] = label(catalog, "index").map(_uint32_or_zero).to_numpy(np.int64)
    identity["net_port"] = (device + ":" + port).to_numpy()
    identity["unit_code"] = identity.groupby(["node", "unit"], sort=True).ngroup()
    return identity


def _net_without_gdr(via: str) -> int:
    """The NET index of a connection `via` NET without GPUDirect RDMA (NET_WITHOUT_GDR, as ClickHouse's
    RE2 reads it: its `$` is the text's end, not before a last newline), as toUInt32OrZero reads it; -1
    when `via` is no such connection."""
    found = NET_WITHOUT_GDR.match(via)
    return _uint32_or_zero(found.group(1)) if found and found.end() == len(via) else -1


def _uint32_or_zero(text: str) -> int:
    """ClickHouse's toUInt32OrZero: the number `text` is, 0 for no number or one out of UInt32's range."""
    number = int(text) if UINT32.fullmatch(text) else 0
    return number if number < 1 << 32 else 0


def _units(points: TapeView, links: TapeView, identity: Columns) -> Columns:
    """Per unit of a node (a GPU, a port, an NCCL rank: `unit`), its figures (candidates' columns) and
    the `component` it is judged as, from the `points` of its series (identity's rows) and the `links`'
    lookback."""
    role = {name: identity[name] for name in ROLES}
    counters = np.logical_or.reduce([role[name] for name in COUNTER_ROLES])
    # only the counters' steps are summed: the eight summaries of every series cost twice these
    increase, seconds, rate = points.steady_figures(points.step & counters[points.group])
    group, member = groups(identity["unit_code"])
    count = len(member)
    sampled = points.count(points.inside) > 0
    last = points.value[points.last]
    low, high = np.zeros(len(points.rows)), np.zeros(len(points.rows))  # per series: its lookback's range
    on_link = np.ones(len(links.value), bool)
    at = np.searchsorted(points.rows, links.rows)  # both in the tape's order: links' series among all
    low[at] = group_extreme(np.fmin, links.group, len(links.rows), links.value, on_link)
    high[at] = links.max(links.value, on_link)
    with np.errstate(invalid="ignore"):  # an infinite counter's inf - inf is NaN, as in ClickHouse
        moved = high - low

    def total(values: np.ndarray, where: np.ndarray) -> np.ndarray:
        return group_sum(group, count, values, where)

    def counted(where: np.ndarray) -> np.ndarray:
        return np.bincount(group[where], minlength=count)

    units: Columns = {name: identity[name][member] for name in ("node", "unit", "is_rank")}
    for figure in PCIE_FIGURES:
        units[figure] = group_extreme(np.fmax, group, count, last, role[figure] & sampled)
    units["pcie_replays"] = total(increase, role["replays"])
    units["is_port"] = counted(role["port_bytes"] & (seconds > 0)) == 2
    units["roce_bytes_per_s"] = total(rate, role["port_bytes"])
    units["ecn_marks_per_s"] = total(rate, role["ecn"])
    units["has_ecn"] = counted(role["ecn"]) > 0
    units["transmit_wait_per_s"] = total(rate, role["wait"])
    active = group_extreme(np.fmin, group, count, low, role["state"] & sampled) == ACTIVE
    units["link_steady"] = active & (group_extreme(np.fmax, group, count, moved, role["downed"]) == 0)
    _place_ranks(units, group, identity, sampled & (last == 1), sampled)
    return units


def _place_ranks(
    units: Columns, group: np.ndarray, identity: Columns, status_now: np.ndarray, sampled: np.ndarray
) -> None:
    """Each unit's `component` (a NCCL rank's: the port its connections without GPUDirect RDMA go
    through, "" when none or several) and `nccl_without_gdr` (a rank's entry where its status is no or
    partial). Where a rank's series disagree (ClickHouse's any), the first in the tape's order is read."""
    count = len(units["unit"])
    nccl = identity["is_rank"]
    gdr = first_of(group, nccl & identity["gdr"] & status_now)
    ranks = first_of(group, nccl)
    named = np.zeros(count, np.int64)  # per unit: its first NCCL series, which names its rank
    named[group[ranks]] = ranks
    without = identity["net_without_gdr"]
    connections = np.flatnonzero(identity["connections"] & sampled & (without >= 0))
    pairs = np.unique(np.stack([group[connections], without[connections]]), axis=1)
    nets = np.bincount(pairs[0], minlength=count)
    single = np.full(count, -1)
    single[pairs[0][nets[pairs[0]] == 1]] = pairs[1][nets[pairs[0]] == 1]
    devices = identity["net_devices"] & sampled
    through = first_of(group, devices & (identity["net_index"] == single[group]))
    component = np.where(units["is_rank"], "", units["unit"]).astype(object)
    component[group[through]] = identity["net_port"][through]
    entries = objects([()] * count)
    status, rank_text = identity["status"], identity["rank_text"]
    without_gdr = gdr[np.isin(status[gdr], NO_GDR)]
    for series in without_gdr:
        entries[group[series]] = (f"{rank_text[named[group[series]]]}: {status[series]}",)
    has_entry = np.zeros(count, bool)  # the few units with an entry, without a look at every entry
    has_entry[group[without_gdr]] = True
    units |= {"component": component, "nccl_without_gdr": entries, "has_entry": has_entry}


def first_of(group: np.ndarray, where: np.ndarray) -> np.ndarray:
    """The first series (in the tape's order) of each group with one where `where`."""
    chosen = np.flatnonzero(where)
    _, first = np.unique(group[chosen], return_index=True)
    return chosen[first]


def _components(units: Columns) -> Columns:
    """The units merged by node and component (the largest of each figure, every rank's entry, in no
    order), ordered by node and component (code points: ClickHouse's byte order of UTF-8, which
    factorize's sort of Python strings follows, as np.unique's does at ten times the cost)."""
    node_code, _ = pd.factorize(units["node"], sort=True)
    component_code, components = pd.factorize(units["component"], sort=True)
    group, member = groups(node_code.astype(np.int64) * len(components) + component_code)
    count = len(member)
    found: Columns = {"node": units["node"][member], "component": units["component"][member]}
    everywhere = np.ones(len(group), bool)
    for figure in FIGURES:
        found[figure] = group_extreme(np.fmax, group, count, units[figure].astype(np.float64), everywhere)
    for flag in FLAGS:
        found[flag] = (np.bincount(group[units[flag].astype(bool)], minlength=count) > 0).astype(np.int64)
    found["nccl_without_gdr"] = objects([()] * count)
    for unit in np.flatnonzero(units["has_entry"]):
        found["nccl_without_gdr"][group[unit]] += units["nccl_without_gdr"][unit]
    found["has_entry"] = np.bincount(group[units["has_entry"]], minlength=count) > 0
    return found


@register
class DmaDegraded(Detector):
    """Reports each candidate on which at least one of the three signals (module doc) fired.

    Score: how many fired. `roce_bytes` needs the port at most `max_roce_ratio` of its peers' median,
    peers busy enough to tell (`min_peer_bytes_per_s`) and at most `max_ecn_marks_per_s` ECN marks, or,
    on a port without ECN counters, at most `max_transmit_wait_per_s` ticks of transmit wait per second.
    """

    name: ClassVar[str] = "dma_degraded"
    version: ClassVar[str] = "2"
    kinds: ClassVar[tuple[str, ...]] = ("dma_degraded",)
    min_windows: ClassVar[int] = 2
    of_windows: ClassVar[int] = 3
    clear_windows: ClassVar[int] = 3

    def __init__(
        self,
        max_roce_ratio: float = 0.75,
        min_peer_bytes_per_s: float = 1e9,
        max_ecn_marks_per_s: float = 100.0,
        lookback_s: float = LOOKBACK_S,
        max_transmit_wait_per_s: float = 1e5,
    ) -> None:
        self.max_roce_ratio = max_roce_ratio
        self.min_peer_bytes_per_s = min_peer_bytes_per_s
        self.max_ecn_marks_per_s = max_ecn_marks_per_s
        self.lookback_s = lookback_s
        self.max_transmit_wait_per_s = max_transmit_wait_per_s

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        return candidates(source, window, self.lookback_s)

    def tape_needs(self) -> dict[str, float]:
        return dict.fromkeys(DMA_METRICS, self.lookback_s)

    def score(self, features: pd.DataFrame) -> np.ndarray:
        return signal_count(self._signals(features))

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return signal_findings(
            "dma_degraded", "warning", features, scores, self._signals, EVIDENCE, DmaDegradedEvidence
        )

    def _signals(self, features: pd.DataFrame) -> dict[str, pd.Series]:
        """Each signal of a degraded DMA path, True per row where it fired (numpy on the columns: pandas's
        operators cost more than the rows)."""
        column = {
            name: features[name].to_numpy(np.float64) for name in [*FIGURES, *FLAGS, "peers_roce_bytes_per_s"]
        }
        below_max = (column["pcie_gen"] < column["pcie_max_gen"]) | (
            column["pcie_width"] < column["pcie_max_width"]
        )
        with np.errstate(divide="ignore", invalid="ignore"):  # x / 0 is inf or NaN, as pandas divides
            ratio = column["roce_bytes_per_s"] / column["peers_roce_bytes_per_s"]
        signals = {
            "pcie": below_max & (column["pcie_replays"] > 0),
            "roce_bytes": (column["is_port"] != 0)
            & (column["link_steady"] != 0)
            & (column["peers_roce_bytes_per_s"] >= self.min_peer_bytes_per_s)
            & (ratio <= self.max_roce_ratio)
            & self._fabric_quiet(column),
            "nccl": np.array([len(entry) > 0 for entry in features["nccl_without_gdr"]], bool),
        }
        return {name: pd.Series(signal, index=features.index, copy=False) for name, signal in signals.items()}

    def _fabric_quiet(self, column: Columns) -> np.ndarray:
        """Ports whose fabric does not push back (congestion moves fewer bytes too): few ECN marks where
        the port has ECN counters, else little transmit wait."""
        has_ecn = column["has_ecn"] != 0
        few_marks = column["ecn_marks_per_s"] <= self.max_ecn_marks_per_s
        little_wait = column["transmit_wait_per_s"] <= self.max_transmit_wait_per_s
        return (has_ecn & few_marks) | (~has_ecn & little_wait)


EVIDENCE: dict[str, Evidence] = {
    "pcie": lambda row: {
        "pcie_link": f"gen{row.pcie_gen:g} x{row.pcie_width:g}",
        "pcie_max_link": f"gen{row.pcie_max_gen:g} x{row.pcie_max_width:g}",
        "pcie_replays": evidence_number(row.pcie_replays),
    },
    "roce_bytes": lambda row: {
        "roce_bytes_per_s": evidence_number(row.roce_bytes_per_s),
        "peers_roce_bytes_per_s": evidence_number(row.peers_roce_bytes_per_s),
        "roce_ratio": evidence_number(row.roce_bytes_per_s / row.peers_roce_bytes_per_s),
        **_pushback_evidence(row),
        "peers": f"job {row.job}" if row.job else "nodes without a job",
    },
    "nccl": lambda row: {"nccl_ranks_without_gdr": tuple(row.nccl_without_gdr)},
}


def _pushback_evidence(row: Any) -> dict[str, Any]:
    """What ruled congestion out: the port's ECN marks, or its transmit wait where it has no ECN counters."""
    if row.has_ecn:
        return {"ecn_marks_per_s": evidence_number(row.ecn_marks_per_s)}
    return {"transmit_wait_per_s": evidence_number(row.transmit_wait_per_s)}

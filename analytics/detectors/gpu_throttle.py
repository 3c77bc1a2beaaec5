"""gpu_throttle: GPUs that slow themselves down, one at a time or a whole node at once.

A GPU is throttled when NVML reports a slowdown reason (fleetlens_gpu_clock_throttle_reason) and its SM
clock is well below what it should run at. What it should run at is the highest of three references,
each over GPUs as busy as it is (an idle GPU's clock is not a busy one's):
- its node's GPUs (one hot GPU among cool ones),
- GPUs of the same model on other nodes (a node whose every GPU is slowed: a chassis power brake, a
  cooling failure, invisible to the first),
- when no other node has its model, its own clock in the hour before the window. Only then: a GPU's
  clock moves with its job's phases, and peers seen at the same moment are the fairer yardstick.
A node whose every GPU is throttled is one finding on the node, naming the reasons all of them share,
instead of one per GPU: it has one cause and one fix.

The reasons come from fleetlens's exporter, or from dcgm-exporter's clocks-event bitmask where a user
enabled it (analytics.detectors.dcgm). dcgm-exporter's default counter set exports no reason at all,
nor the violation counters that would stand for them; for a GPU without any reason series the reason is
"unknown", and only what cannot be a choice is reported: a busy GPU (an idle GPU's clock is the driver's
to choose: gpud's power-braked H100s idle at 86 MHz, healthy ones at 345, and dcgm-exporter's README
sample reads 139) running at least `min_unknown_drop` below its references, well past the drop a power
cap makes under load. What is lost without reasons: idle GPUs are not judged, a drop smaller than
`min_unknown_drop` is not reported, and thermal, power brake and a silent straggler are told apart
only by the temperature and power in the evidence.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, as_tuples
from analytics.detectors.counters import MAX_CANDIDATES, evidence_number
from analytics.detectors.dcgm import CLOCK_EVENT_BITS, CLOCK_EVENT_MASKS, CLOCK_EVENT_REASONS, MASK_LIMIT
from analytics.detectors.groups import (
    Columns,
    Groups,
    columns_frame,
    group_bit_or,
    group_extreme,
    group_mean,
    groups,
    objects,
)
from analytics.detectors.tape import label, tape_view
from analytics.evidence import GpuThrottleEvidence
from analytics.store.protocols import Reader

# NVML's clocks-event reasons (fleetlens_gpu_clock_throttle_reason{reason}) that mean the GPU lowered its
# own clocks, as nvidia-smi -q names them, and what to look at. Idle, application clock settings and sync
# boost are choices, not trouble.
SLOWDOWN_REASONS = {
    "sw_power_cap": ("SW Power Cap", "the power limit: a low power cap, or the node's power budget"),
    "hw_slowdown": ("HW Slowdown", "a hardware slowdown signal: thermal or the power brake"),
    "sw_thermal_slowdown": ("SW Thermal Slowdown", "GPU or memory temperature over its limit: cooling"),
    "hw_thermal_slowdown": ("HW Thermal Slowdown", "the GPU overheating: cooling, fans, airflow"),
    "hw_power_brake_slowdown": (
        "HW Power Brake Slowdown",
        "the power brake asserted by the system: power supplies, the chassis or its BMC",
    ),
}
UNKNOWN = "unknown"  # the reason of a GPU whose exporter reports none
UNKNOWN_REASON = (
    "Unknown (no clock-event reasons exported)",
    "temperature and power in the evidence; enable DCGM_FI_DEV_CLOCKS_EVENT_REASONS in dcgm-exporter",
)
REASON_TEXTS = {**SLOWDOWN_REASONS, UNKNOWN: UNKNOWN_REASON}  # reason -> (its name, what to look at)
REASON_SERIES = (CLOCK_EVENT_REASONS, *CLOCK_EVENT_MASKS)
SM_CLOCK, UTIL, TEMP, POWER = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
)
THROTTLE_METRICS = (SM_CLOCK, UTIL, TEMP, POWER, *REASON_SERIES)
KINDS = {metric: kind for kind, metric in enumerate(THROTTLE_METRICS)}
ORDERED_REASONS = sorted(SLOWDOWN_REASONS)  # a GPU's reasons as bits, in this order: sorted when listed
REASON_BITS = {reason: 1 << position for position, reason in enumerate(ORDERED_REASONS)}
REASON_LISTS = [  # the reasons of each combination of bits
    tuple(reason for position, reason in enumerate(ORDERED_REASONS) if bits >> position & 1)
    for bits in range(1 << len(ORDERED_REASONS))
]
GPU_COLUMNS = [
    "node", "component", "job", "model", "sm_clock_mhz", "util_percent", "temp_c", "power_w",
    "reasons_known", "reasons",
]  # fmt: skip
# The candidates' own clocks before the window, busy and idle apart (util and clock of one scrape).
PAST_SQL = """
SELECT node, component,
    medianExactIf(sm_clock_mhz, util_percent >= {busy_util_percent:Float64}) AS past_busy_mhz,
    medianExactIf(sm_clock_mhz, util_percent < {busy_util_percent:Float64}) AS past_idle_mhz
FROM (
    SELECT node, concat('gpu:', labels['gpu']) AS component, ts,
        anyIf(value, metric = 'DCGM_FI_DEV_SM_CLOCK') AS sm_clock_mhz,
        anyIf(value, metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_percent
    FROM metrics
    WHERE metric IN ('DCGM_FI_DEV_SM_CLOCK', 'DCGM_FI_DEV_GPU_UTIL') AND node IN {nodes:Array(String)}
        AND ts >= {past_start:DateTime64(3)} AND ts < {start:DateTime64(3)} AND labels['gpu'] != ''
    GROUP BY node, component, ts
    HAVING countIf(metric = 'DCGM_FI_DEV_SM_CLOCK') > 0 AND countIf(metric = 'DCGM_FI_DEV_GPU_UTIL') > 0
)
GROUP BY node, component
"""
REFERENCES = ("node_peers_mhz", "fleet_peers_mhz", "past_mhz")


@register
class GpuThrottle(Detector):
    """GPUs that report a slowdown reason, or busy GPUs whose exporter reports no reasons at all, and run
    their SM clock below the best of their references (the module docstring says which). Score: the
    clock drop below that reference (0..1) while a slowdown reason is set or the reasons are unknown,
    else 0; a finding from `min_clock_drop` on, from `min_unknown_drop` on for unknown reasons. A node
    of at least `min_node_gpus` GPUs that are all throttled is one node finding (component "")."""

    name: ClassVar[str] = "gpu_throttle"
    version: ClassVar[str] = "4"
    kinds: ClassVar[tuple[str, ...]] = ("gpu_throttle",)
    min_windows: ClassVar[int] = 2
    of_windows: ClassVar[int] = 3
    clear_windows: ClassVar[int] = 3

    def __init__(
        self,
        min_clock_drop: float = 0.1,
        busy_util_percent: float = 20.0,
        past_s: float = 3600.0,
        min_node_gpus: int = 2,
        min_unknown_drop: float = 0.25,
    ) -> None:
        self.min_clock_drop = min_clock_drop
        self.busy_util_percent = busy_util_percent
        self.past_s = past_s
        self.min_node_gpus = min_node_gpus
        self.min_unknown_drop = min_unknown_drop

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        gpus = window_gpus(source, window)
        # numpy columns, strings as integer codes, and a frame for the candidates alone: pandas's column
        # operations on every GPU cost more than their figures, and a window has a few candidates at most
        codes = {name: pd.factorize(gpus[name].to_numpy())[0] for name in ("node", "model")}
        clocks = gpus["sm_clock_mhz"].to_numpy(np.float64)
        busy = gpus["util_percent"].to_numpy(np.float64) >= self.busy_util_percent
        # without reasons, only busy GPUs that some reference could put `min_unknown_drop` above
        could_drop = _below_ceiling(codes["model"], codes["node"], busy, clocks, self.min_unknown_drop)
        unknown = (gpus["reasons_known"].to_numpy() == 0) & busy & could_drop
        reasons = gpus["reasons"].to_numpy()
        throttling = unknown | np.array([len(named) > 0 for named in reasons], bool)
        # the per-node figures only for nodes with a candidate: most windows have none
        on_their_nodes = np.flatnonzero(np.isin(codes["node"], codes["node"][throttling]))
        hosts = Groups(codes["node"][on_their_nodes])
        alike = Groups(codes["node"][on_their_nodes], busy[on_their_nodes])
        chosen = throttling[on_their_nodes]
        rows = on_their_nodes[chosen]
        candidates = {name: gpus[name].to_numpy()[rows] for name in GPU_COLUMNS}
        candidates["reasons"] = objects(
            [
                [UNKNOWN] if unknown_now else list(named)
                for named, unknown_now in zip(reasons[rows], unknown[rows], strict=True)
            ]
        )
        candidates |= {
            "busy": busy[rows],
            "unknown": unknown[rows],
            "node_gpus": hosts.sizes[hosts.ids][chosen],
            "node_peers_mhz": alike.median(clocks[on_their_nodes])[alike.ids][chosen],
            "fleet_peers_mhz": _other_nodes_median(codes, busy, clocks, rows),
        }
        candidates["past_mhz"] = self._past(source, window, candidates)
        return columns_frame(candidates)

    def _past(self, source: Reader, window: Window, candidates: Columns) -> np.ndarray:
        """The own median clock, in the `past_s` before the window and for its busy state, of each
        candidate that has no GPU of its model on another node to compare with (NaN for the others)."""
        past = np.full(len(candidates["node"]), np.nan)
        alone = np.flatnonzero(np.isnan(candidates["fleet_peers_mhz"]))
        if not len(alone) or self.past_s <= 0:
            return past
        parameters = {
            **window.parameters,
            "past_start": Window(window.start - self.past_s, window.start).parameters["start"],
            "nodes": sorted(set(candidates["node"][alone].tolist())),
            "busy_util_percent": self.busy_util_percent,
        }
        clocks = source.query(PAST_SQL, parameters=parameters, max_rows=MAX_CANDIDATES).rows
        own = {(node, component): (busy_mhz, idle_mhz) for node, component, busy_mhz, idle_mhz in clocks}
        for row in alone:
            found = own.get((candidates["node"][row], candidates["component"][row]))
            if found is not None:
                past[row] = found[0] if candidates["busy"][row] else found[1]
        return past

    def tape_needs(self) -> dict[str, float]:
        return dict.fromkeys(THROTTLE_METRICS, 0.0)

    def score(self, features: pd.DataFrame) -> np.ndarray:
        if features.empty:
            return np.zeros(0)
        # numpy on the columns, as pandas's max(skipna), fillna(0) and clip would: a NaN reference is
        # one without any, a NaN drop none at all
        references = np.column_stack([features[name].to_numpy(np.float64) for name in REFERENCES])
        reference = np.fmax.reduce(references, axis=1)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # a huge clock drops -inf: 0
            drop = 1 - features["sm_clock_mhz"].to_numpy(np.float64) / reference
        drop = np.clip(np.where(np.isnan(drop), 0.0, drop), 0.0, 1.0)
        throttled = np.array([len(reasons) > 0 for reasons in features["reasons"]], bool)
        return np.where(throttled, drop, 0.0)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        minimum = np.where(features["unknown"].astype(bool), self.min_unknown_drop, self.min_clock_drop)
        throttled = features.assign(score=scores)[scores >= minimum]
        nodes = throttled["node"].to_numpy()
        found = []
        # node by node in order, as groupby(sort=True) gives them at a tenth of its cost on a few rows
        for node in sorted(set(nodes.tolist())):
            rows = throttled[nodes == node]
            if len(rows) >= max(self.min_node_gpus, int(rows["node_gpus"].iloc[0])):
                found.append(_node_finding(str(node), rows))
            else:
                found += [_gpu_finding(row) for row in as_tuples(rows)]
        return found


def window_gpus(source: Reader, window: Window) -> pd.DataFrame:
    """Every GPU with an SM clock in the window, by node and component ("gpu:3"), from the tape: its
    model, mean SM clock, utilisation and power, highest temperature (0 without one), whether it has any
    reason series (`reasons_known`), and the slowdown reasons set at any sample, named (fleetlens) or as
    bits of a mask (DCGM), sorted (`reasons`). NaN for a mean without samples, as SQL's avg."""
    view = tape_view(source, THROTTLE_METRICS, window, 0.0)
    # the identity's columns once, as numpy arrays: a frame's column lookups cost more than the figures
    identity = view.derived(_gpu_identity)
    code = identity["gpu"]
    on_gpu = code >= 0
    group, member = groups(code[on_gpu])
    count = len(member)
    series_gpu = np.full(len(code), count)  # a series of no GPU goes to an extra group, left out
    series_gpu[on_gpu] = group
    gpu, kind, value = series_gpu[view.group], identity["kind"][view.group], view.value

    def tally(where: np.ndarray) -> np.ndarray:
        return np.bincount(gpu[where], minlength=count + 1)[:count]

    def mean(metric: str) -> np.ndarray:
        of = kind == KINDS[metric]
        return group_mean(gpu[of], count + 1, value[of])[:count]

    named = (kind == KINDS[CLOCK_EVENT_REASONS]) & (value == 1)
    masked = kind > KINDS[CLOCK_EVENT_REASONS]
    bits = group_bit_or(gpu[named], count + 1, identity["reason_bit"][view.group][named])
    bits |= group_bit_or(gpu[masked], count + 1, _mask_bits(value[masked]))
    clocked = tally(kind == KINDS[SM_CLOCK]) > 0
    rows = np.flatnonzero(on_gpu)[member[clocked]]  # the series (rows of identity) naming each GPU
    found = {name: identity[name][rows] for name in ("node", "component", "model")}
    found |= {
        "job": "",
        "sm_clock_mhz": mean(SM_CLOCK)[clocked],
        "util_percent": mean(UTIL)[clocked],
        "temp_c": group_extreme(np.fmax, gpu, count + 1, value, kind == KINDS[TEMP])[:count][clocked],
        "power_w": mean(POWER)[clocked],
        "reasons_known": (tally(kind >= KINDS[CLOCK_EVENT_REASONS])[clocked] > 0).astype(np.int64),
        "reasons": objects([list(REASON_LISTS[mask]) for mask in bits[:count][clocked].tolist()]),
    }
    return columns_frame({name: found[name] for name in GPU_COLUMNS})


def _gpu_identity(catalog: pd.DataFrame) -> pd.DataFrame:
    """Per series: its GPU's node, `component` and `model`, `gpu` (a code ordering GPUs by node and
    component; -1 for a series without a gpu label), its metric's position in THROTTLE_METRICS (`kind`)
    and the bit of ORDERED_REASONS its reason label names (`reason_bit`, 0 for none of them)."""
    gpu = label(catalog, "gpu")
    identity = pd.DataFrame(
        {
            "node": catalog["node"],
            "component": "gpu:" + gpu,
            "model": label(catalog, "modelName"),
            "kind": catalog["metric"].map(KINDS).to_numpy(),
            "reason_bit": label(catalog, "reason").map(REASON_BITS).fillna(0).to_numpy(np.int64),
        }
    )
    code = identity.groupby(["node", "component"], sort=True).ngroup().to_numpy()
    identity["gpu"] = np.where(gpu.to_numpy() != "", code, -1)
    return identity


def _mask_bits(masks: np.ndarray) -> np.ndarray:
    """The bits of ORDERED_REASONS set in each NVML clocks-event mask (none for a value that is no mask,
    dcgm.MASK_LIMIT)."""
    valid = np.isfinite(masks) & (masks >= 0) & (masks < MASK_LIMIT)
    nvml = np.where(valid, masks, 0).astype(np.uint64)
    bits = np.zeros(len(masks), np.int64)
    for position, reason in enumerate(ORDERED_REASONS):
        if reason in CLOCK_EVENT_BITS:
            bits |= ((nvml & np.uint64(CLOCK_EVENT_BITS[reason])) != 0).astype(np.int64) << position
    return bits


def _below_ceiling(
    model: np.ndarray, node: np.ndarray, busy: np.ndarray, clocks: np.ndarray, drop: float
) -> np.ndarray:
    """Whether each GPU's clock is at least `drop` below the fastest GPU of its model and busy state in the
    fleet, which no reference exceeds: its node's and other nodes' medians are at most that; its own past
    is read only when no other node has its model (then every such GPU is kept). Models and nodes are
    integer codes."""
    kinds = Groups(model, busy)
    on_nodes = Groups(kinds.ids, node)  # each kind's nodes
    alone = (np.bincount(kinds.ids[on_nodes.first_rows()], minlength=kinds.count) <= 1)[kinds.ids]
    ceiling = np.where(alone, np.inf, kinds.max(clocks)[kinds.ids])
    return clocks <= (1 - drop) * ceiling


def _other_nodes_median(
    codes: dict[str, np.ndarray], busy: np.ndarray, clocks: np.ndarray, rows: np.ndarray
) -> np.ndarray:
    """Per candidate (GPU `rows`), the median SM clock of the GPUs of its model and busy state on other
    nodes (NaN when there are none); nodes and models as integer `codes`."""
    nodes, models = codes["node"], codes["model"]
    keys = list(zip(nodes[rows].tolist(), models[rows].tolist(), busy[rows].tolist(), strict=True))
    medians: dict[tuple[int, int, bool], float] = {}  # one per (node, model, busy) of candidates
    for node, model, is_busy in dict.fromkeys(keys):
        others = (models == model) & (busy == is_busy) & (nodes != node)
        medians[node, model, is_busy] = pd.Series(clocks[others]).median()
    return np.array([medians[key] for key in keys], dtype=np.float64)


def _reference(row: object) -> float:
    values = [getattr(row, name) for name in REFERENCES]
    return max((value for value in values if not pd.isna(value)), default=np.nan)


def _named(reasons: list[str]) -> dict[str, tuple[str, ...]]:
    return {
        "reasons": tuple(reasons),
        "reason_names": tuple(REASON_TEXTS[reason][0] for reason in reasons),
        "look_at": tuple(REASON_TEXTS[reason][1] for reason in reasons),
    }


def _gpu_finding(row: object) -> Finding:
    return Finding.at(
        row,
        "gpu_throttle",
        row.score,
        "warning",
        GpuThrottleEvidence(
            **_named(list(row.reasons)),
            sm_clock_mhz=evidence_number(row.sm_clock_mhz),
            peers_sm_clock_mhz=evidence_number(_reference(row)),
            node_peers_sm_clock_mhz=evidence_number(row.node_peers_mhz),
            fleet_peers_sm_clock_mhz=evidence_number(row.fleet_peers_mhz),
            past_sm_clock_mhz=evidence_number(row.past_mhz),
            clock_drop=evidence_number(row.score),
            gpu_temp_c=evidence_number(row.temp_c),
            gpu_power_w=evidence_number(row.power_w),
            gpu_util_percent=evidence_number(row.util_percent),
            peers="busy GPUs" if row.busy else "idle GPUs",
        ),
    )


def _node_finding(node: str, rows: pd.DataFrame) -> Finding:
    """Every GPU of `node` throttled: one finding naming the reasons they all share."""
    shared = sorted(set.intersection(*(set(reasons) for reasons in rows["reasons"])))
    references = rows[list(REFERENCES)].astype(float)
    return Finding(
        "gpu_throttle",
        node,
        "",
        "",
        float(rows["score"].median()),
        "warning",
        GpuThrottleEvidence(
            **_named(shared or sorted(set().union(*rows["reasons"]))),
            gpus_throttled=len(rows),
            components=tuple(sorted(rows["component"])),
            sm_clock_mhz=evidence_number(rows["sm_clock_mhz"].median()),
            fleet_peers_sm_clock_mhz=evidence_number(references["fleet_peers_mhz"].median()),
            past_sm_clock_mhz=evidence_number(references["past_mhz"].median()),
            clock_drop=evidence_number(rows["score"].median()),
            gpu_temp_c=evidence_number(rows["temp_c"].max()),
            gpu_power_w=evidence_number(rows["power_w"].median()),
            gpu_util_percent=evidence_number(rows["util_percent"].median()),
            peers="busy GPUs" if rows["busy"].all() else "idle GPUs",
        ),
    )

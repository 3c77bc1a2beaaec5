"""A GPU that failed (gpu_fault), told apart from a job that crashed on it (gpu_app_error), by what
NVIDIA's Xid catalog says of each code (analytics.xid_catalog).

Most Xids in a real fleet are the application's doing (13 graphics engine exception, 31 MMU fault, 43
a stopped channel) and come by the hundred from one crashing job: those alone are a `gpu_app_error`, at
info severity, with the job and "restart the job" as the action, never alerted or drained by default.
Anything else, an Xid caused by the hardware, the driver, power or heat or not in the catalog, a lost
GPU, a failed row remap or new double-bit ECC errors, is a `gpu_fault`, as severe as the worst of those
signals, with the most disruptive action any of them asks for (evidence `action`, which the drain policy
matches: analytics.reports.remedy).

Xids are counted per GPU and code in the window, from fleetlens_gpu_xid_errors_total (per `source`, nvml
or kernel_log: the same Xid usually reaches both, so a code counts the most any source saw, never the
sum) and from the times dcgm-exporter's last-Xid gauge (DCGM_FI_DEV_XID_ERRORS) turned to a code. A
series first sampled in the window counts from zero when its node was sampled before it (the xid
collector exports a code's counter only once that code happened); after a gap in the whole node's
samples longer than `lookback_s`, nothing can tell history from news, so it counts nothing.

Every signal has a reading from the series stock dcgm-exporter serves (docs/stock-exporters.md):
- Xids from the last-Xid gauge alone: two Xids between scrapes count as the last one, a repeat of the
  same code between scrapes is not seen, and an Xid repeating the gauge's value shows nothing.
- Lost: fleetlens_gpu_up says per scrape whether NVML answered. Without it, a GPU is lost when DCGM has
  not answered for it (analytics.detectors.dcgm.ANSWERS) in `lost_after_scrapes` scrapes in which its
  node's other GPUs answered: dcgm-exporter leaves out a field DCGM answers blank for (as it does for a
  while after its watches start), so one or two scrapes without a GPU are no loss, and a node whose
  every GPU went quiet (a scrape gap, an exporter restart) has no GPU to tell a loss by.
- DBEs: the volatile or aggregate ECC counters, else a new row remapped for an uncorrectable error
  (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, in the default counter set), which each DBE causes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pandas as pd

from analytics.detectors import peers, register
from analytics.detectors.base import SEVERITIES, Detector, Finding, Window, as_tuples
from analytics.detectors.counters import Evidence, evidence_number, signal_count
from analytics.detectors.dcgm import ANSWERS, GPU_UP
from analytics.detectors.groups import (
    Columns,
    columns_frame,
    group_extreme,
    group_sum,
    groups,
    looked_up,
    objects,
)
from analytics.detectors.tape import TapeView, label, tape_view
from analytics.evidence import GpuAppErrorEvidence, GpuFaultEvidence
from analytics.reports.remedy import ACTION_TEXT
from analytics.store.protocols import Reader
from analytics.xid_catalog import Action, lookup, worst_action

XID_COUNTER = "fleetlens_gpu_xid_errors_total"
LAST_XID = "DCGM_FI_DEV_XID_ERRORS"
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
# double-bit ECC errors: volatile (since the driver loaded) and aggregate (the GPU's life); each DBE counts
# in both, so the larger increase is the count. dcgm-exporter's default set has neither.
DBE_COUNTERS = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")
# rows remapped for uncorrectable (double-bit) errors, over the GPU's life: in the default set, and a new
# one is a new DBE where the ECC counters are not exported
REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
FAULT_METRICS = (XID_COUNTER, LAST_XID, GPU_UP, ROW_REMAP_FAILURE, *DBE_COUNTERS, REMAPPED_ROWS, *ANSWERS)
KINDS = {metric: kind for kind, metric in enumerate(FAULT_METRICS)}  # a series' metric as an integer
# a code as ClickHouse's toInt64OrNull reads an `xid` label: ASCII digits, a sign, in Int64's range
XID_LABEL = re.compile(r"[+-]?[0-9]+", re.ASCII)
INT64_RANGE = range(-(2**63), 2**63)
# a value of the last-Xid gauge that names an Xid: an integer in [1, 1e9)
LARGEST_GAUGE_CODE = 1e9
FAULT_COLUMNS = [
    "node", "known_gpu", "component", "pci_bus_id", "xid_counts", "has_up", "reported", "gpu_up",
    "first_seen", "row_remap_failure", "dbe_errors", "remapped_rows", "job", "node_reported",
    "silent_scrapes",
]  # fmt: skip
APP_ERROR_SCORE = 0.5  # a GPU with application Xids alone: less than any failure signal
# what each failure signal besides Xids asks for: NVIDIA's answer to a GPU off the bus (Xid 79) is a
# reboot; a row that could not be remapped needs the GPU inspected; a DBE needs a reset to retire its row
SIGNAL_ACTIONS = {
    "lost": Action.REBOOT_NODE,
    "row_remap_failure": Action.INSPECT,
    "ecc_dbe": Action.RESET_GPU,
}


@register
class GpuFault(Detector):
    """Per GPU and window, the failure signals (module doc): Xids of causes other than the application,
    lost (fleetlens_gpu_up 0, or its series gone while the node's other GPUs are still reported), a
    failed row remap, new double-bit ECC errors or uncorrectable remapped rows; and the application's
    Xids.

    Score: how many failure signals fired, or APP_ERROR_SCORE for a GPU with application Xids alone. A
    lost GPU or a failed remap stays in every window it lasts; an Xid or ECC burst shows in its own
    window, and `clear_windows` keeps the anomaly open a minute after it. `lookback_s` is how long a GPU
    whose series vanished is remembered as lost, and how far back a series' last sample is looked for;
    `lost_after_scrapes` how many scrapes of its node a GPU without fleetlens_gpu_up must miss to be lost.
    """

    name: ClassVar[str] = "gpu_fault"
    version: ClassVar[str] = "3"
    kinds: ClassVar[tuple[str, ...]] = ("gpu_fault", "gpu_app_error")
    min_windows: ClassVar[int] = 1
    of_windows: ClassVar[int] = 1
    clear_windows: ClassVar[int] = 6

    def __init__(self, lookback_s: float = 300.0, lost_after_scrapes: int = 3) -> None:
        self.lookback_s = lookback_s
        self.lost_after_scrapes = lost_after_scrapes

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        return gpu_faults(source, window, self.lookback_s)

    def tape_needs(self) -> dict[str, float]:
        return dict.fromkeys(FAULT_METRICS, self.lookback_s)

    def score(self, features: pd.DataFrame) -> np.ndarray:
        failures = signal_count(self._signals(features))
        app_only = (failures == 0) & _with_xids(features["xid_counts"])
        return np.where(app_only, APP_ERROR_SCORE, failures)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        signals = {name: signal.to_numpy(dtype=bool) for name, signal in self._signals(features).items()}
        # only the rows with something to report are visited: a fleet's GPUs are mostly quiet
        reported = np.flatnonzero(np.any(list(signals.values()), axis=0) | (scores > 0))
        if not len(reported):
            return []
        found = []
        for position, row in zip(reported, as_tuples(features.iloc[reported]), strict=True):
            fired = sorted(name for name, signal in signals.items() if signal[position])
            if fired:
                found.append(_gpu_fault(row, scores[position], fired))
            else:
                found.append(_gpu_app_error(row, scores[position]))
        return found

    def _signals(self, features: pd.DataFrame) -> dict[str, pd.Series]:
        """Each failure signal of gpu_fault, True per row where it fired."""
        flags = Flags(*(features[name].to_numpy(dtype=bool) for name in Flags._fields))
        signals = {
            "xid": _with_xids(features["xid_counts"], _not_by_application),
            "lost": _down(features, flags) | _vanished(flags) | self._silent(features, flags),
            "row_remap_failure": features["row_remap_failure"].to_numpy(dtype=float) > 0,
            "ecc_dbe": (features["dbe_errors"].to_numpy(dtype=float) > 0)
            | (features["remapped_rows"].to_numpy(dtype=float) > 0),
        }
        return {name: pd.Series(signal, index=features.index, copy=False) for name, signal in signals.items()}

    def _silent(self, features: pd.DataFrame, flags: Flags) -> np.ndarray:
        """GPUs without fleetlens_gpu_up that DCGM stopped answering for while their node's other GPUs
        answered, for `lost_after_scrapes` scrapes and up to this window."""
        silent_long = features["silent_scrapes"].to_numpy(dtype=float) >= self.lost_after_scrapes
        return flags.known_gpu & ~flags.has_up & ~flags.reported & flags.node_reported & silent_long


def gpu_faults(source: Reader, window: Window, lookback_s: float) -> pd.DataFrame:
    """One row per GPU (node, `gpu` and `pci_bus_id` labels) with a series of FAULT_METRICS sampled in
    the window or the `lookback_s` before it, ordered by node, component and pci_bus_id: `xid_counts`,
    its Xids in the window (code -> events: per code the most any series counted, where at least 1);
    `has_up`: fleetlens's exporter reports fleetlens_gpu_up for it, and `reported` is then whether that
    was sampled in the window, else whether DCGM answered for it (ANSWERS) in the window; `gpu_up` its
    lowest reading; `first_seen` its first sample; `row_remap_failure`, `dbe_errors` and
    `remapped_rows`; its node's `job`; `node_reported`: whether any GPU of its node was reported;
    `silent_scrapes`: the times its node's GPUs answered after its own last answer (after its first
    sample, when it never answered)."""
    view = tape_view(source, FAULT_METRICS, window, lookback_s)
    if not len(view.rows):
        return pd.DataFrame(columns=FAULT_COLUMNS)
    # the identity's columns once, as numpy arrays: a frame's column lookups cost more than the figures
    identity = view.derived(_fault_identity)
    series = _fault_series(view, identity)
    group, member = groups(identity["gpu_code"])
    count = len(member)
    sampled = series["samples"] > 0
    kind = identity["kind"]
    is_up, answers = kind == KINDS[GPU_UP], np.isin(kind, [KINDS[name] for name in ANSWERS])

    def any_of(where: np.ndarray) -> np.ndarray:
        return np.bincount(group[where], minlength=count) > 0

    def finite_sum(column: str, name: str) -> np.ndarray:
        values = series[column]
        return group_sum(group, count, values, (kind == KINDS[name]) & np.isfinite(values))

    has_up = any_of(is_up)
    reported = np.where(has_up, any_of(is_up & sampled), any_of(answers & sampled))
    answer_gpu, answer_ms = _answer_times(view, group, answers)
    first_seen = group_extreme(np.fmin, group, count, series["first_t"], np.ones(len(group), bool))
    # numpy columns and one frame at the end: a frame's assign of 17 columns cost more than their figures
    found = {name: identity[name][member] for name in ("node", "gpu", "pci_bus_id")}
    known_gpu = found["gpu"] != ""
    node = identity["node_code"][member]
    node_reported = np.bincount(node[reported], minlength=node.max() + 1) > 0
    jobs = peers.node_jobs(source, window, lookback_s)
    found |= {
        "known_gpu": known_gpu.astype(np.int64),
        "component": np.where(known_gpu, "gpu:" + found["gpu"], ""),
        "xid_counts": _xid_counts(view, identity, series, group, count),
        "has_up": has_up.astype(np.int64),
        "reported": reported.astype(np.int64),
        "gpu_up": group_extreme(np.fmin, group, count, series["low"], is_up & sampled),
        "first_seen": first_seen,
        "row_remap_failure": group_extreme(
            np.fmax, group, count, series["high"], (kind == KINDS[ROW_REMAP_FAILURE]) & sampled
        ),
        "dbe_errors": np.maximum(*(finite_sum("increase", name) for name in DBE_COUNTERS)),
        "remapped_rows": finite_sum("steady_increase", REMAPPED_ROWS),
        "job": looked_up(jobs, found["node"], ""),
        "node_reported": node_reported[node].astype(np.int64),
        "silent_scrapes": _silent_scrapes(node, answer_gpu, answer_ms, first_seen),
    }
    return columns_frame({name: found[name] for name in FAULT_COLUMNS})


def _fault_identity(catalog: pd.DataFrame) -> pd.DataFrame:
    """Per series, what its identity says: its node, GPU (`gpu`, `pci_bus_id` labels, "" where absent),
    its metric's position in FAULT_METRICS (`kind`, -1 for another tape metric), the Xid code its `xid`
    label names (`counted`, `counted_code`), `gpu_code` (a code ordering GPUs by node, gpu and
    pci_bus_id, as by node and component) and `node_code`."""
    codes = [_xid_code(text) for text in label(catalog, "xid")]
    identity = pd.DataFrame(
        {
            "node": catalog["node"],
            "gpu": label(catalog, "gpu"),
            "pci_bus_id": label(catalog, "pci_bus_id"),
            "kind": catalog["metric"].map(KINDS).fillna(-1).to_numpy(np.int64),
            "counted": np.array([code is not None for code in codes], bool),
            "counted_code": np.array([code or 0 for code in codes], np.int64),
        }
    )
    identity["gpu_code"] = identity.groupby(["node", "gpu", "pci_bus_id"], sort=True).ngroup()
    identity["node_code"] = identity.groupby("node", sort=True).ngroup()
    return identity


def _xid_code(text: str) -> int | None:
    """The Xid an `xid` label names, None where ClickHouse's toInt64OrNull reads none."""
    if XID_LABEL.fullmatch(text) is None or int(text) not in INT64_RANGE:
        return None
    return int(text)


def _fault_series(view: TapeView, identity: Columns) -> Columns:
    """Per series: `samples`, `increase`, `steady_increase`, lowest and highest value in the window
    (`low`, `high`), its `first_t` since the lookback, whether it is `born` (sampled in the window, not
    before it, on a node where some series was), its `first_value` in the window and its Xid `events`: its
    increase, and its first value too when it was born (the xid collector exports a code's counter only
    once the code happened). All but `first_t` are read from the window and the sample before it: the
    view's points, a tenth of its 300 s."""
    points = view.points_only
    summaries = points.summaries()
    seen_before = points.count(~points.inside) > 0  # a sample before the window: its last is a point
    node = identity["node_code"]
    node_seen_before = np.bincount(node[seen_before], minlength=node.max() + 1) > 0
    samples = summaries["samples"].to_numpy()
    born = (samples > 0) & ~seen_before & node_seen_before[node]
    first_inside = _first_inside(points)
    first_value = np.zeros(len(samples))
    first_value[points.group[first_inside]] = points.value[first_inside]
    increase = summaries["increase"].to_numpy()
    return {
        "samples": samples,
        "increase": increase,
        "steady_increase": summaries["steady_increase"].to_numpy(),
        "low": summaries["inside_min"].to_numpy(),
        "high": summaries["inside_max"].to_numpy(),
        "first_t": view.t_ms[view.first] / 1000,
        "born": born,
        "first_value": first_value,
        "events": increase + np.where(born, first_value, 0.0),
    }


def _first_inside(view: TapeView) -> np.ndarray:
    """Per sample: whether it is its series' first in the window."""
    before = np.ones(len(view.inside), bool)
    before[1:] = ~view.inside[:-1]
    return view.inside & (view.first | before)


def _xid_counts(
    view: TapeView, identity: Columns, series: Columns, group: np.ndarray, count: int
) -> np.ndarray:
    """Per GPU, a dict of its Xid codes in ascending order to the events of each, rounded, where at
    least 1: per code the most any of its series counted (maxMap); an Xid counter counts its `events`
    for the code its label names, the last-Xid gauge how often it turned to the code (its first value
    too, when born). A dict of integers is no garbage collector's work, as lists per GPU were."""
    kind, events = identity["kind"], series["events"]
    with np.errstate(invalid="ignore"):
        counted = (kind == KINDS[XID_COUNTER]) & identity["counted"] & np.isfinite(events) & (events > 0)
    gauge = kind == KINDS[LAST_XID]
    points = view.points_only  # the steps are between points
    turned = np.flatnonzero(gauge[points.group] & points.step & (points.value != points.previous_value))
    born = np.flatnonzero(gauge & series["born"])
    owner = np.concatenate([points.group[turned], born])
    values = np.concatenate([points.value[turned], series["first_value"][born]])
    with np.errstate(invalid="ignore"):
        named = (
            np.isfinite(values) & (values >= 1) & (values < LARGEST_GAUGE_CODE) & (values == np.floor(values))
        )
    # how often each gauge turned to each code, then per GPU and code the most of those and the counters'
    turn_series, turn_code, turns = _runs(owner[named], values[named].astype(np.int64))
    gpu, code, most = _runs(
        np.concatenate([group[counted], group[turn_series]]),
        np.concatenate([identity["counted_code"][counted], turn_code]),
        np.concatenate([events[counted], turns.astype(np.float64)]),
    )
    counts = objects([{} for _ in range(count)])
    for at in np.flatnonzero(most >= 1).tolist():  # the few GPUs with Xids
        counts[gpu[at]][int(code[at])] = round(float(most[at]))
    return counts


def _runs(
    first: np.ndarray, second: np.ndarray, values: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct pairs of (first, second), sorted by first and then second, with each pair's largest
    of `values` (finite numbers), or how many times it came without them."""
    order = np.lexsort((second, first))
    first, second = first[order], second[order]
    new = np.ones(len(order), bool)
    new[1:] = (first[1:] != first[:-1]) | (second[1:] != second[:-1])
    starts = np.flatnonzero(new)
    if values is None:
        found = np.diff(np.append(starts, len(order)))
    else:
        found = np.maximum.reduceat(values[order], starts) if len(starts) else values[:0]
    return first[starts], second[starts], found


def _answer_times(view: TapeView, group: np.ndarray, answers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (GPU, unix ms) pairs of DCGM's answers for a GPU (samples of ANSWERS) since the
    lookback, sorted by GPU and time: flat arrays, not an array per GPU (1,536 of them at 192 nodes)."""
    answered = answers[view.group]
    return _distinct_times(group[view.group[answered]], view.t_ms[answered])


def _distinct_times(owner: np.ndarray, ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (owner, ms) pairs, sorted by owner and then ms, of unix milliseconds `ms`: each pair
    one int64, owner x the span of milliseconds, sorted by a stable sort, which merges the runs already
    in order (each series' samples); a lexsort of the two was three times dearer on a window's 90,000
    DCGM samples."""
    if not len(ms):
        return owner[:0], ms[:0]
    base = int(ms.min())
    span = int(ms.max()) - base + 1
    key = np.sort(owner.astype(np.int64) * span + (ms - base), kind="stable")
    new = np.ones(len(key), bool)
    new[1:] = key[1:] != key[:-1]
    key = key[new]
    return key // span, key % span + base


def _silent_scrapes(
    node: np.ndarray, answer_gpu: np.ndarray, answer_ms: np.ndarray, first_seen: np.ndarray
) -> np.ndarray:
    """Per GPU (of `node`), how many of its node's distinct answer times (`answer_ms` of `answer_gpu`,
    sorted by GPU and time) are later than its own last answer, or than its first sample less a
    millisecond when it never answered; compared in seconds, as the SQL it replaced compared them."""
    node_of_time, ms = _distinct_times(node[answer_gpu], answer_ms)
    time = ms / 1000
    sizes = np.bincount(answer_gpu, minlength=len(node))
    answered = sizes > 0
    last = np.full(len(node), np.nan)
    last[answered] = answer_ms[np.cumsum(sizes)[answered] - 1] / 1000
    after = np.where(answered, last, first_seen - 0.001)
    # each GPU's bound placed among its node's times, after those equal to it: those later are counted
    keys = np.concatenate([node_of_time, node])
    at = np.concatenate([time, after])
    is_time = np.concatenate([np.ones(len(time), bool), np.zeros(len(node), bool)])
    order = np.lexsort((~is_time, at, keys))
    times_up_to = np.cumsum(is_time[order])
    position = np.empty(len(order), np.int64)
    position[order] = np.arange(len(order))
    per_node = np.bincount(node_of_time, minlength=node.max() + 1)
    node_start = np.concatenate([[0], np.cumsum(per_node)])
    earlier = times_up_to[position[len(time) :]] - node_start[node]
    return per_node[node] - earlier


class Flags(NamedTuple):
    """The yes/no columns of a GPU's features row, as boolean arrays."""

    known_gpu: np.ndarray  # its series name a GPU
    has_up: np.ndarray  # fleetlens's exporter reports fleetlens_gpu_up for it
    reported: np.ndarray  # sampled in the window
    node_reported: np.ndarray  # some GPU of its node was


def _down(features: pd.DataFrame, flags: Flags) -> np.ndarray:
    """GPUs whose fleetlens_gpu_up said 0 in the window."""
    return flags.has_up & flags.reported & (features["gpu_up"].to_numpy(dtype=float) == 0)


def _vanished(flags: Flags) -> np.ndarray:
    """GPUs whose fleetlens_gpu_up was not sampled in the window while their node's other GPUs' were:
    fleetlens's exporter reads every GPU in every scrape, so one scrape without it is a GPU gone."""
    return flags.known_gpu & flags.has_up & ~flags.reported & flags.node_reported


def _not_by_application(code: int) -> bool:
    return not lookup(code).by_application


def _with_xids(xid_counts: pd.Series, counted: Callable[[int], bool] = bool) -> np.ndarray:
    """Per GPU, whether any of its Xid codes is `counted` (any code at all by default); only the few GPUs
    with Xids are looked into (a look into each of 1,536 GPUs' dicts, three a window, cost 1 ms of it)."""
    counts = xid_counts.to_numpy()
    found = np.fromiter(map(bool, counts), bool, len(counts))
    with_xids = np.flatnonzero(found)
    found[with_xids] = [any(map(counted, counts[at])) for at in with_xids]
    return found


# the numbers behind each failure signal but Xids (whose evidence is _xid_evidence's, for every code)
FAULT_EVIDENCE: dict[str, Evidence] = {
    "lost": lambda row: _lost_evidence(row),
    "row_remap_failure": lambda row: {"row_remap_failure": evidence_number(row.row_remap_failure)},
    "ecc_dbe": lambda row: {
        "ecc_dbe_errors": evidence_number(row.dbe_errors),
        "uncorrectable_remapped_rows": evidence_number(row.remapped_rows),
    },
}


def _lost_evidence(row: Any) -> dict[str, Any]:
    """How the GPU was found lost: fleetlens_gpu_up, or the scrapes DCGM had no reading of it."""
    if not row.has_up:
        return {
            "lost": "no DCGM readings while the node's other GPUs answer",
            "silent_scrapes": row.silent_scrapes,
        }
    return {"lost": "fleetlens_gpu_up 0" if row.reported else "no series while the node reports"}


def _gpu_fault(row: Any, score: float, fired: list[str]) -> Finding:
    """A failed GPU: as severe as the catalog says its worst non-application Xid is, critical for the
    other signals; its action the most disruptive of what its Xids (all of them) and signals ask for."""
    others = [name for name in fired if name != "xid"]
    severities = [lookup(code).severity for code in row.xid_counts if _not_by_application(code)]
    severity = max([*severities, *(["critical"] if others else [])], key=SEVERITIES.index)
    action = max(
        [worst_action(row.xid_counts), *(SIGNAL_ACTIONS[name] for name in others)], key=lambda a: a.rank
    )
    details: dict[str, Any] = {}
    for name in others:
        details.update(FAULT_EVIDENCE[name](row))
    evidence = GpuFaultEvidence(signals=tuple(fired), **details, **_xid_evidence(row, action))
    return Finding("gpu_fault", row.node, row.component, "", float(score), severity, evidence)


def _gpu_app_error(row: Any, score: float) -> Finding:
    """Application Xids alone: the job's fault, reported with the job, at info severity."""
    evidence = GpuAppErrorEvidence(**_xid_evidence(row, worst_action(row.xid_counts)))
    return Finding.at(row, "gpu_app_error", score, "info", evidence)


def _xid_evidence(row: Any, action: Action) -> dict[str, Any]:
    """The fields of analytics.evidence.XidEvidence: the Xids of the window per code (keyed by the code as
    text, as JSON keys are), how many, what the catalog calls them and who likely caused them; the
    recommended action; the GPU's PCI address when its labels had one."""
    counts: Mapping[int, int] = row.xid_counts
    codes = sorted(counts)
    evidence: dict[str, Any] = {"action": action, "action_text": ACTION_TEXT[action]}
    if codes:
        evidence.update(
            xid_codes=tuple(codes),
            xid_counts={str(code): counts[code] for code in codes},
            xid_causes={str(code): lookup(code).cause.value for code in codes},
            xid_mnemonics={str(code): lookup(code).mnemonic for code in codes},
        )
    if row.pci_bus_id:
        evidence["pci_bus_id"] = row.pci_bus_id
    return evidence

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

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import SEVERITIES, Detector, Finding, Window, frame
from analytics.detectors.counters import (
    INCREASE,
    INSIDE_MAX,
    INSIDE_MIN,
    MAX_CANDIDATES,
    STEADY_INCREASE,
    Evidence,
    evidence_number,
    series_parameters,
    series_sql,
    signal_count,
)
from analytics.detectors.dcgm import ANSWERS, GPU_UP, metric_in
from analytics.detectors.peers import NODE_JOBS
from analytics.reports.remedy import ACTION, ACTION_TEXT, ACTION_TEXT_KEY
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
FAULT_SERIES = series_sql(
    f"{INCREASE} AS increase",
    f"{STEADY_INCREASE} AS steady_increase",
    "length(inside) AS samples",
    f"{INSIDE_MIN} AS low",
    f"{INSIDE_MAX} AS high",
    "arrayMap(step -> step.2.2, arrayFilter(step -> step.2.2 != step.1.2, steps)) AS turned_to",
    "before_t > 0 AS seen_before",
    "if(length(inside) > 0, inside[1].2, 0) AS first_value",
    "first_t",
    "sampled_at",
    # when DCGM answered for the GPU: only its readings' times are kept
    lookback_aggregates=("min(t) AS first_t", f"groupUniqArrayIf(t, {metric_in(ANSWERS)}) AS sampled_at"),
)
# Per series: the Xid codes it saw in the range and how many times each (`codes`, `counts`).
XID_EVENTS = f"""
SELECT node, labels['gpu'] AS gpu, labels['pci_bus_id'] AS pci_bus_id, metric, samples, low, high, increase,
    steady_increase, first_t, sampled_at,
    toInt64OrNull(labels['xid']) AS counted_code,
    increase + if(born, first_value, 0) AS events,
    arrayMap(value -> toInt64(value), arrayFilter(
        value -> isFinite(value) AND value >= 1 AND value < 1e9 AND value = floor(value),
        if(born, arrayPushFront(turned_to, first_value), turned_to)
    )) AS gauge_codes,
    multiIf(
        metric = '{XID_COUNTER}' AND isNotNull(counted_code) AND isFinite(events) AND events > 0,
            [assumeNotNull(counted_code)],
        metric = '{LAST_XID}', arrayDistinct(gauge_codes),
        CAST([], 'Array(Int64)')
    ) AS codes,
    multiIf(
        metric = '{XID_COUNTER}', arrayMap(code -> events, codes),
        arrayMap(code -> toFloat64(countEqual(gauge_codes, code)), codes)
    ) AS counts
FROM (
    SELECT *, samples > 0 AND NOT seen_before AND max(seen_before) OVER (PARTITION BY node) AS born
    FROM ({FAULT_SERIES})
)
"""
ANSWERED = metric_in(ANSWERS)
DBE_INCREASES = ", ".join(
    f"sumIf(increase, metric = '{name}' AND isFinite(increase))" for name in DBE_COUNTERS
)
# A GPU is a candidate if any of its series was sampled since the lookback. `has_up`: fleetlens's exporter
# reports it (fleetlens_gpu_up), and `reported` is then whether that was sampled in the window; else
# whether DCGM answered for it (ANSWERS) in the window. `node_reported`: whether any GPU of its node was.
# `answered_at`: the times DCGM answered for it since the lookback; `silent_scrapes`: the times its node's
# other GPUs answered after its own last answer (after its first series, when it never answered).
FAULT_SQL = f"""
SELECT gpus.*, jobs.job AS job, max(reported) OVER (PARTITION BY gpus.node) AS node_reported,
    arrayCount(
        t -> t > if(notEmpty(answered_at), arrayMax(answered_at), first_seen - 0.001),
        groupUniqArrayArray(answered_at) OVER (PARTITION BY gpus.node)
    ) AS silent_scrapes
FROM (
    SELECT node, gpu != '' AS known_gpu, if(known_gpu, concat('gpu:', gpu), '') AS component, pci_bus_id,
        maxMap(codes, counts) AS xids, xids.1 AS xid_codes, xids.2 AS xid_events,
        countIf(metric = '{GPU_UP}') > 0 AS has_up,
        if(
            has_up, countIf(metric = '{GPU_UP}' AND samples > 0), countIf({ANSWERED} AND samples > 0)
        ) > 0 AS reported,
        minIf(low, metric = '{GPU_UP}' AND samples > 0) AS gpu_up,
        arraySort(groupUniqArrayArray(sampled_at)) AS answered_at,
        min(first_t) AS first_seen,
        maxIf(high, metric = '{ROW_REMAP_FAILURE}' AND samples > 0) AS row_remap_failure,
        greatest({DBE_INCREASES}) AS dbe_errors,
        sumIf(steady_increase, metric = '{REMAPPED_ROWS}' AND isFinite(steady_increase)) AS remapped_rows
    FROM ({XID_EVENTS})
    GROUP BY node, gpu, pci_bus_id
) AS gpus
LEFT JOIN ({NODE_JOBS}) AS jobs ON gpus.node = jobs.node
ORDER BY node, component, pci_bus_id
"""
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
        parameters = series_parameters(FAULT_METRICS, window.start, window.end, self.lookback_s)
        features = frame(source.query(FAULT_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))
        if features.empty:
            return features
        # a dict per row, but only the few rows with Xids count them
        counts = [
            _xid_counts(codes, counted) if len(codes) else {}
            for codes, counted in zip(features["xid_codes"], features["xid_events"], strict=True)
        ]
        return features.assign(xid_counts=counts)

    def score(self, features: pd.DataFrame) -> np.ndarray:
        failures = signal_count(self._signals(features))
        app_only = (failures == 0) & np.array([bool(counts) for counts in features["xid_counts"]], dtype=bool)
        return np.where(app_only, APP_ERROR_SCORE, failures)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        signals = {name: signal.to_numpy(dtype=bool) for name, signal in self._signals(features).items()}
        # only the rows with something to report are visited: a fleet's GPUs are mostly quiet
        reported = np.flatnonzero(np.any(list(signals.values()), axis=0) | (scores > 0))
        if not len(reported):
            return []
        found = []
        for position, row in zip(reported, features.iloc[reported].itertuples(), strict=True):
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
            "xid": np.array(
                [any(map(_not_by_application, counts)) for counts in features["xid_counts"]], bool
            ),
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


def _xid_counts(codes: Sequence[int], counted: Sequence[float]) -> dict[int, int]:
    """A GPU's Xids in the window: how many of each code (those seen at least once)."""
    return {int(code): round(events) for code, events in zip(codes, counted, strict=True) if events >= 1}


def _not_by_application(code: int) -> bool:
    return not lookup(code).by_application


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
    evidence: dict[str, Any] = {"signals": fired}
    for name in others:
        evidence.update(FAULT_EVIDENCE[name](row))
    evidence.update(_xid_evidence(row, action))
    return Finding("gpu_fault", row.node, row.component, "", float(score), severity, evidence)


def _gpu_app_error(row: Any, score: float) -> Finding:
    """Application Xids alone: the job's fault, reported with the job, at info severity."""
    evidence = _xid_evidence(row, worst_action(row.xid_counts))
    return Finding.at(row, "gpu_app_error", score, "info", evidence)


def _xid_evidence(row: Any, action: Action) -> dict[str, Any]:
    """The Xids of the window per code (JSON keys are strings): how many, what the catalog calls them
    and who likely caused them; the recommended action; the GPU's PCI address when its labels had one."""
    counts: Mapping[int, int] = row.xid_counts
    codes = sorted(counts)
    evidence: dict[str, Any] = {
        ACTION: action.value,
        ACTION_TEXT_KEY: ACTION_TEXT[action],
    }
    if codes:
        evidence.update(
            xid_codes=codes,
            xid_counts={str(code): counts[code] for code in codes},
            xid_causes={str(code): lookup(code).cause.value for code in codes},
            xid_mnemonics={str(code): lookup(code).mnemonic for code in codes},
        )
    if row.pci_bus_id:
        evidence["pci_bus_id"] = row.pci_bus_id
    return evidence

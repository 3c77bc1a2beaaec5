"""GPU detectors: a GPU that slows itself down (gpu_throttle) and a GPU that failed (gpu_fault).

Both read dcgm-exporter's names and labels as the fleetlens exporter serves them, one candidate per
GPU ("gpu:N", from the `gpu` label).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, frame
from analytics.detectors.counters import (
    INCREASE,
    INSIDE_MAX,
    INSIDE_MIN,
    MAX_CANDIDATES,
    Evidence,
    evidence_number,
    series_parameters,
    series_sql,
    signal_count,
    signal_findings,
)
from analytics.store.protocols import Reader

# NVML's clocks-event reasons (fleetlens_gpu_clock_throttle_reason{reason}) that mean the GPU lowered its
# own clocks: power capping, thermal limits and the hardware slowdown signals. Idle, application clock
# settings and sync boost are choices, not trouble.
SLOWDOWN_REASONS = (
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
THROTTLE_METRICS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "fleetlens_gpu_clock_throttle_reason",
)
# Candidates: GPUs reporting a slowdown reason; their peers are every GPU as busy as they are.
THROTTLE_SQL = """
SELECT * FROM (
SELECT node, component, '' AS job, reasons, sm_clock_mhz, util_percent, temp_c, busy,
    greatest(
        medianExact(sm_clock_mhz) OVER (PARTITION BY node, busy),
        medianExact(sm_clock_mhz) OVER (PARTITION BY model, busy)
    ) AS peers_sm_clock_mhz
FROM (
    SELECT node, concat('gpu:', labels['gpu']) AS component, any(labels['modelName']) AS model,
        avgIf(value, metric = 'DCGM_FI_DEV_SM_CLOCK') AS sm_clock_mhz,
        avgIf(value, metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_percent,
        maxIf(value, metric = 'DCGM_FI_DEV_GPU_TEMP') AS temp_c,
        arraySort(groupUniqArrayIf(
            labels['reason'],
            metric = 'fleetlens_gpu_clock_throttle_reason' AND value = 1
                AND has({slowdown_reasons:Array(String)}, labels['reason'])
        )) AS reasons,
        util_percent >= {busy_util_percent:Float64} AS busy
    FROM metrics
    WHERE metric IN {metrics:Array(String)} AND ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}
        AND labels['gpu'] != ''
    GROUP BY node, component
    HAVING countIf(metric = 'DCGM_FI_DEV_SM_CLOCK') > 0
)
)
WHERE notEmpty(reasons)
ORDER BY node, component
"""


@register
class GpuThrottle(Detector):
    """A GPU that reports a slowdown reason and runs its SM clock well below its peers'.

    Peers are the GPUs as busy as it is (at least `busy_util_percent`, or idle: an idle GPU's clock is
    not a busy one's) on the same node and, so that a node whose every GPU throttles (a cooling
    failure) still stands out, of the same model fleet-wide: the reference clock is the higher of the
    two medians. So a thermal fault on an idle node is seen too. Score: the clock drop below that
    reference (0..1) while a slowdown reason is set, else 0.
    """

    name: ClassVar[str] = "gpu_throttle"
    version: ClassVar[str] = "2"
    kinds: ClassVar[tuple[str, ...]] = ("gpu_throttle",)
    min_windows: ClassVar[int] = 2
    of_windows: ClassVar[int] = 3
    clear_windows: ClassVar[int] = 3

    def __init__(self, min_clock_drop: float = 0.1, busy_util_percent: float = 20.0) -> None:
        self.min_clock_drop = min_clock_drop
        self.busy_util_percent = busy_util_percent

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        parameters = {
            **window.parameters,
            "metrics": list(THROTTLE_METRICS),
            "slowdown_reasons": list(SLOWDOWN_REASONS),
            "busy_util_percent": self.busy_util_percent,
        }
        return frame(source.query(THROTTLE_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))

    def score(self, features: pd.DataFrame) -> np.ndarray:
        throttled = features["reasons"].map(len) > 0
        drop = 1 - features["sm_clock_mhz"] / features["peers_sm_clock_mhz"]
        return np.where(throttled, drop.fillna(0).clip(lower=0), 0.0).astype(float)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return [
            Finding.at(
                row,
                "gpu_throttle",
                score,
                "warning",
                {
                    "reasons": list(row.reasons),
                    "sm_clock_mhz": evidence_number(row.sm_clock_mhz),
                    "peers_sm_clock_mhz": evidence_number(row.peers_sm_clock_mhz),
                    "clock_drop": evidence_number(score),
                    "gpu_temp_c": evidence_number(row.temp_c),
                    "gpu_util_percent": evidence_number(row.util_percent),
                    "peers": "busy GPUs" if row.busy else "idle GPUs",
                },
            )
            for row, score in zip(features.itertuples(), scores, strict=True)
            if score >= self.min_clock_drop
        ]


FAULT_METRICS = (
    "fleetlens_gpu_xid_errors_total",
    "DCGM_FI_DEV_XID_ERRORS",
    "fleetlens_gpu_up",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
)
FAULT_SERIES = series_sql(
    f"{INCREASE} AS increase",
    "length(inside) AS samples",
    f"{INSIDE_MIN} AS low",
    f"{INSIDE_MAX} AS high",
    "arrayMap(step -> step.2.2, arrayFilter(step -> step.2.2 != step.1.2 AND step.2.2 != 0, steps)) AS news",
)
# A GPU is a candidate if any of its series was sampled since the lookback; `reported` says whether its
# fleetlens_gpu_up was sampled in the window, `node_reported` whether any GPU of its node was.
FAULT_SQL = f"""
SELECT node, component, '' AS job, xid_codes, reported, gpu_up, row_remap_failure, dbe_errors,
    max(reported) OVER (PARTITION BY node) AS node_reported
FROM (
    SELECT node, if(labels['gpu'] = '', '', concat('gpu:', labels['gpu'])) AS component,
        arraySort(arrayDistinct(arrayConcat(
            groupArrayIf(labels['xid'], metric = 'fleetlens_gpu_xid_errors_total' AND increase > 0),
            arrayMap(
                code -> toString(toInt64(code)), groupArrayArrayIf(news, metric = 'DCGM_FI_DEV_XID_ERRORS')
            )
        ))) AS xid_codes,
        countIf(metric = 'fleetlens_gpu_up' AND samples > 0) > 0 AS reported,
        minIf(low, metric = 'fleetlens_gpu_up' AND samples > 0) AS gpu_up,
        maxIf(high, metric = 'DCGM_FI_DEV_ROW_REMAP_FAILURE' AND samples > 0) AS row_remap_failure,
        sumIf(increase, metric = 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL') AS dbe_errors
    FROM ({FAULT_SERIES})
    GROUP BY node, component
)
ORDER BY node, component
"""


@register
class GpuFault(Detector):
    """A GPU that failed: Xid errors in the window (their codes, from the Xid counter and from
    dcgm-exporter's last-Xid gauge changing), lost (fleetlens_gpu_up 0, or its series gone while the
    node's other GPUs are still reported), a failed row remap, or new double-bit ECC errors.

    Score: how many of those four signals fired. A lost GPU or a failed remap stays in every window it
    lasts; an Xid or ECC burst shows in its own window, and `clear_windows` keeps the anomaly open a
    minute after it. `lookback_s` is how long a GPU whose series vanished is remembered as lost.
    """

    name: ClassVar[str] = "gpu_fault"
    version: ClassVar[str] = "1"
    kinds: ClassVar[tuple[str, ...]] = ("gpu_fault",)
    min_windows: ClassVar[int] = 1
    of_windows: ClassVar[int] = 1
    clear_windows: ClassVar[int] = 6

    def __init__(self, lookback_s: float = 300.0) -> None:
        self.lookback_s = lookback_s

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        parameters = series_parameters(FAULT_METRICS, window.start, window.end, self.lookback_s)
        return frame(source.query(FAULT_SQL, parameters=parameters, max_rows=MAX_CANDIDATES))

    def score(self, features: pd.DataFrame) -> np.ndarray:
        return signal_count(_fault_signals(features))

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        return signal_findings("gpu_fault", "critical", features, scores, _fault_signals, FAULT_EVIDENCE)


def _fault_signals(features: pd.DataFrame) -> dict[str, pd.Series]:
    """Each failure signal of gpu_fault, True per row where it fired."""
    vanished = ~features["reported"].astype(bool) & features["node_reported"].astype(bool)
    return {
        "xid": features["xid_codes"].map(len) > 0,
        "lost": (features["reported"].astype(bool) & (features["gpu_up"] == 0)) | vanished,
        "row_remap_failure": features["row_remap_failure"] > 0,
        "ecc_dbe": features["dbe_errors"] > 0,
    }


FAULT_EVIDENCE: dict[str, Evidence] = {
    "xid": lambda row: {"xid_codes": [int(code) for code in row.xid_codes]},
    "lost": lambda row: {
        "lost": "fleetlens_gpu_up 0" if row.reported else "no series while the node reports"
    },
    "row_remap_failure": lambda row: {"row_remap_failure": evidence_number(row.row_remap_failure)},
    "ecc_dbe": lambda row: {"ecc_dbe_errors": evidence_number(row.dbe_errors)},
}

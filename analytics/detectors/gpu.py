"""GPU detectors: a GPU that slows itself down (gpu_throttle); a GPU that failed is gpu_fault's
(analytics.detectors.gpu_fault).

It reads dcgm-exporter's names and labels as the fleetlens exporter serves them, one candidate per
GPU ("gpu:N", from the `gpu` label).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pandas as pd

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window, frame
from analytics.detectors.counters import (
    MAX_CANDIDATES,
    evidence_number,
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

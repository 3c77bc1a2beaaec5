"""peer_outlier: the catch-all for what the rules miss, a node whose mix of GPU, NIC and step signals sets
it apart from the other nodes of its job. Reported at info severity, for a human to look at.

Per window, SQL reduces each node to one feature vector (FEATURES: medians of GPU gauges over the node's
GPUs, per-second rates of RoCE counters summed over its ports, the median compute time of its ranks).
Each feature is standardized against the node's peers in the same job and pipeline stage (robust z:
median and MAD, with floors, as slow_node does), so that a stage slower by design is no outlier; a
feature a node lacks (a scrape gap, a counter reset) counts as the peer median. An Isolation Forest
fitted on these vectors then scores each node:

    score = -IsolationForest.score_samples   in (0, 1]; about 0.5 for the crowd, towards 1 when isolated

A finding needs score >= threshold, at least `min_peers` nodes in the job, and one feature at least
`min_feature_z` robust standard deviations from its peers: the forest says how isolated a node is, the z
says whether the difference is big enough to matter. The evidence names the features that drove it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import sklearn
from sklearn.ensemble import IsolationForest

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window
from analytics.detectors.groups import Groups
from analytics.detectors.peers import node_values, peer_baseline, step_aggregates
from analytics.store.protocols import Reader


@dataclass(frozen=True)
class Feature:
    """One per-node feature: `metric` in the store, reduced to a median (gauge) or a per-second rate
    summed over the node's series (counter); `min_spread` is the smallest peer spread assumed, in the
    feature's unit, so that identical peers do not make any difference look huge."""

    name: str
    metric: str
    counter: bool
    min_spread: float


FEATURES = (
    Feature("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK", False, 20.0),
    Feature("gpu_util_percent", "DCGM_FI_DEV_GPU_UTIL", False, 5.0),
    Feature("power_w", "DCGM_FI_DEV_POWER_USAGE", False, 20.0),
    Feature("gpu_temp_c", "DCGM_FI_DEV_GPU_TEMP", False, 3.0),
    Feature("pcie_tx_bytes_per_s", "DCGM_FI_PROF_PCIE_TX_BYTES", False, 1e6),
    Feature("pcie_rx_bytes_per_s", "DCGM_FI_PROF_PCIE_RX_BYTES", False, 1e6),
    Feature("roce_rx_bytes_per_s", "node_infiniband_port_data_received_bytes_total", True, 1e6),
    Feature("roce_tx_bytes_per_s", "node_infiniband_port_data_transmitted_bytes_total", True, 1e6),
    Feature("cnp_sent_per_s", "node_infiniband_np_cnp_packets_sent_total", True, 1.0),
    Feature("compute_s", "", False, 0.0),  # from the steps table
)
NAMES = [feature.name for feature in FEATURES]
MIN_SPREADS = np.array([feature.min_spread for feature in FEATURES])
SAMPLED = [feature for feature in FEATURES if feature.metric]

# per series: the median (gauges) and the rate over the span (counters; NULL across a reset or with one
# sample); then per node: the median of its series' medians, or the sum of their rates
NODE_FEATURES = """
SELECT node, metric, if(has({counters:Array(String)}, metric), sum(rate), median(level)) AS value
FROM (
    SELECT node, CAST(metric, 'String') AS metric, quantileExact(0.5)(value) AS level,
        argMax(value, ts) - argMin(value, ts) AS growth,
        dateDiff('millisecond', min(ts), max(ts)) / 1000 AS seconds,
        if(seconds > 0 AND growth >= 0, growth / seconds, NULL) AS rate
    FROM samples
    WHERE metric IN {metrics:Array(String)} AND node IN {nodes:Array(String)}
        AND ts >= {since:DateTime64(3)} AND ts < {end:DateTime64(3)}
    GROUP BY node, metric, series_id
)
GROUP BY node, metric
"""


@register
class PeerOutlier(Detector):
    """A node isolated from its job's other nodes by an Isolation Forest, persistently (3 of 4 windows)."""

    name = "peer_outlier"
    version = "1"
    kinds = ("peer_outlier",)
    min_windows = 3
    of_windows = 4
    clear_windows = 2

    def __init__(
        self,
        threshold: float = 0.6,
        min_peers: int = 8,
        min_feature_z: float = 4.0,
        relative_floor: float = 0.02,
        lookback_s: float = 10.0,
        n_estimators: int = 16,
        random_state: int = 0,
        top_features: int = 3,
    ) -> None:
        self.threshold = threshold
        self.min_peers = min_peers
        self.min_feature_z = min_feature_z
        self.relative_floor = relative_floor
        self.lookback_s = lookback_s
        self.n_estimators = n_estimators
        self.random_state = random_state
        self.top_features = top_features

    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        """Per node of a job: the raw features, their peer medians (`median_<name>`) and robust z
        (`z_<name>`), and how many nodes the job has in this window (`peers`)."""
        steps = step_aggregates(source, window)
        if steps.empty:
            return pd.DataFrame(columns=["node", "component", "job", "peers", *NAMES])
        hosts = Groups(steps["job"].to_numpy(), steps["node"].to_numpy())
        first = hosts.first_rows()
        job, node = steps["job"].to_numpy()[first], steps["node"].to_numpy()[first]
        stage = hosts.min(steps["stage"].to_numpy())
        values = np.column_stack(
            [self._sampled(source, window, node), hosts.median(steps["compute_s"].to_numpy(dtype=float))]
        )
        jobs = Groups(job)
        medians, spreads = peer_baseline(values, Groups(job, stage), self.relative_floor, MIN_SPREADS)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (values - medians) / spreads
        return pd.DataFrame(
            {
                "job": job,
                "node": node,
                "stage": stage,
                "compute_s": values[:, NAMES.index("compute_s")],
                **{name: values[:, i] for i, name in enumerate(NAMES) if name != "compute_s"},
                "component": "",
                "peers": jobs.sizes[jobs.ids],
                **{f"median_{name}": medians[:, i] for i, name in enumerate(NAMES)},
                **{f"z_{name}": np.where(np.isnan(z[:, i]), 0.0, z[:, i]) for i, name in enumerate(NAMES)},
            }
        )

    def score(self, features: pd.DataFrame) -> np.ndarray:
        """-score_samples of one Isolation Forest fitted on every node's z vector; higher = more isolated.
        Each z is relative to the node's own job and stage, so one forest keeps jobs apart and costs one
        fit per window however many jobs run. sklearn's checks are skipped: it would validate the
        parameters of each of its trees and check each one's sample weights finite, a fourth of the fit's
        CPU; the detector's parameters are valid, and the forest takes infinite z (its fit and
        score_samples check with ensure_all_finite=False), so the scores are the same."""
        vectors = features[[f"z_{name}" for name in NAMES]].to_numpy(dtype=float)
        if len(vectors) < 2:
            return np.zeros(len(vectors))  # nothing to be isolated from
        forest = IsolationForest(n_estimators=self.n_estimators, random_state=self.random_state)
        with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
            return -forest.fit(vectors).score_samples(vectors)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        z = features[[f"z_{name}" for name in NAMES]].to_numpy(dtype=float)
        passed = (
            (scores >= self.threshold)
            & (features["peers"].to_numpy() >= self.min_peers)
            & (np.abs(z).max(axis=1) >= self.min_feature_z)
        )
        return [
            Finding(
                kind="peer_outlier",
                node=features["node"].iat[row],
                component="",
                job=features["job"].iat[row],
                score=float(scores[row]),
                severity="info",
                evidence=self._evidence(features.iloc[row], z[row]),
            )
            for row in np.flatnonzero(passed)
        ]

    def _sampled(self, source: Reader, window: Window, nodes: np.ndarray) -> np.ndarray:
        """The sample-based features (a column each, in SAMPLED's order) of each of `nodes`, over the
        window and `lookback_s` before it (counters need two samples for a rate)."""
        parameters = {
            **window.parameters,
            "since": datetime.fromtimestamp(window.start - self.lookback_s, UTC),
            "metrics": [feature.metric for feature in SAMPLED],
            "counters": [feature.metric for feature in SAMPLED if feature.counter],
            "nodes": list(pd.unique(nodes)),
        }
        result = source.query(NODE_FEATURES, parameters=parameters)
        return node_values(result, [feature.metric for feature in SAMPLED], nodes)

    def _evidence(self, row: pd.Series, z: np.ndarray) -> dict[str, object]:
        """Up to `top_features` features farthest from their peers: value, peer median and z of each."""
        drivers = [i for i in np.argsort(-np.abs(z), kind="stable")[: self.top_features] if z[i]]
        return {
            "peers": int(row["peers"]),
            "stage": int(row["stage"]),
            "features": [
                {
                    "feature": NAMES[i],
                    "value": _number(row[NAMES[i]]),
                    "peer_median": _number(row[f"median_{NAMES[i]}"]),
                    "z": round(float(z[i]), 2),
                }
                for i in drivers
            ],
        }


def _number(value: float) -> float | None:
    """A JSON-able number: None for a feature the node lacked."""
    return None if pd.isna(value) else float(value)

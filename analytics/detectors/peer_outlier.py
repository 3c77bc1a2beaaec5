"""peer_outlier: the catch-all for what the rules miss, a node whose mix of GPU, NIC and step signals sets
it apart from the other nodes of its job. Reported at info severity, for a human to look at.

Per window, each node is reduced to one feature vector (FEATURES: medians of GPU gauges over the node's
GPUs, per-second rates of RoCE counters summed over its ports, from the runner's tape; the median compute
time of its ranks, from SQL).
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

import numpy as np
import pandas as pd
import sklearn
from sklearn.tree import ExtraTreeRegressor
from sklearn.utils.random import sample_without_replacement

from analytics.detectors import register
from analytics.detectors.base import Detector, Finding, Window
from analytics.detectors.groups import (
    Columns,
    Groups,
    columns_frame,
    group_median,
    group_quantile_exact,
    group_sum,
    groups,
)
from analytics.detectors.peers import peer_baseline, step_aggregates
from analytics.detectors.tape import TapeView, tape_view
from analytics.evidence import FeatureDeviation, PeerOutlierEvidence
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

SAMPLED_METRICS = [feature.metric for feature in SAMPLED]
COUNTERS = np.array([feature.counter for feature in SAMPLED])
MAX_SAMPLES = 256  # rows an isolation tree is grown on (IsolationForest's max_samples="auto")
MAX_INT = np.iinfo(np.int32).max  # the bound of the seeds bagging draws


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
            [
                sampled_features(source, window, node, self.lookback_s),
                hosts.median(steps["compute_s"].to_numpy(dtype=float)),
            ]
        )
        jobs = Groups(job)
        medians, spreads = peer_baseline(values, Groups(job, stage), self.relative_floor, MIN_SPREADS)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (values - medians) / spreads
        return columns_frame(
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
        fit per window however many jobs run."""
        vectors = _z_vectors(features)
        if len(vectors) < 2:
            return np.zeros(len(vectors))  # nothing to be isolated from
        return isolation_scores(vectors, self.n_estimators, self.random_state)

    def tape_needs(self) -> dict[str, float]:
        return dict.fromkeys(SAMPLED_METRICS, self.lookback_s)

    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        z = _z_vectors(features)
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

    def _evidence(self, row: pd.Series, z: np.ndarray) -> PeerOutlierEvidence:
        """Up to `top_features` features farthest from their peers: value, peer median and z of each."""
        drivers = [i for i in np.argsort(-np.abs(z), kind="stable")[: self.top_features] if z[i]]
        return PeerOutlierEvidence(
            peers=int(row["peers"]),
            stage=int(row["stage"]),
            features=tuple(
                FeatureDeviation(
                    feature=NAMES[i],
                    value=_number(row[NAMES[i]]),
                    peer_median=_number(row[f"median_{NAMES[i]}"]),
                    z=round(float(z[i]), 2),
                )
                for i in drivers
            ),
        )


def sampled_features(source: Reader, window: Window, nodes: np.ndarray, lookback_s: float) -> np.ndarray:
    """The sample-based features (a column each, in SAMPLED's order) of each of `nodes`, over the window
    and `lookback_s` before it (counters need two samples for a rate), from the tape: per series the median
    (gauges) or the rate over its span (counters); per node the median of its series' medians or the sum of
    their rates, added in ascending order. NaN where a node has none. As the SQL it replaced computed them
    (the tape test keeps it, its sums in that order), and as that SQL's rows were placed: a node listed
    twice (two jobs in one window) has them on its last row alone."""
    view = tape_view(source, SAMPLED_METRICS, window, lookback_s)
    identity = view.derived(_series_identity)
    feature = identity["feature"]
    counter = COUNTERS[feature]
    rows = _rows_of(identity, nodes)
    cell = rows * len(SAMPLED) + feature  # per series: its (node row, feature) in the matrix, flattened
    cells = len(nodes) * len(SAMPLED)
    on_gauge = ~counter[view.group]
    level = group_quantile_exact(view.group[on_gauge], len(view.rows), view.value[on_gauge])
    gauges = (rows >= 0) & ~counter
    medians = group_median(cell[gauges], cells, level[gauges])
    sums = _ascending_sums(cell, cells, _rates(view), (rows >= 0) & counter)
    return np.where(COUNTERS, sums.reshape(-1, len(SAMPLED)), medians.reshape(-1, len(SAMPLED)))


def isolation_scores(vectors: np.ndarray, n_estimators: int, random_state: int) -> np.ndarray:
    """-IsolationForest(n_estimators=, random_state=).fit(vectors).score_samples(vectors), bit for bit: the
    same draws, trees and sums, without what sklearn spends beside the trees, most of its CPU on a few
    hundred rows: a clone of the tree and its parameters looked up by signature per tree, a joblib batch,
    and a RandomState made per draw (three per tree), which seeds itself from the OS before it is seeded;
    here one RandomState is seeded again for each. sklearn's checks are skipped too: they validate each
    tree's parameters and check its sample weights finite; the parameters are valid, and the forest takes
    infinite z (its fit and score_samples check with ensure_all_finite=False). Each tree is grown on its
    drawn rows alone, in row order, which is what its builder keeps of rows weighted 1 among rows weighted
    0 (the forest's bagging), without the check of a weight per row (a quarter of the forest's CPU)."""
    rows = np.ascontiguousarray(vectors, dtype=np.float32)  # as the forest's fit and scoring take them
    draws = np.random.RandomState(random_state)
    targets = draws.uniform(size=len(rows))  # the trees' random y: an isolation tree splits at random
    max_samples = min(MAX_SAMPLES, len(rows))
    max_depth = int(np.ceil(np.log2(max(max_samples, 2))))
    draws.seed(random_state)
    depths = np.zeros(len(rows))
    with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
        for seed in draws.randint(MAX_INT, size=n_estimators):
            drawn, tree_seed = _bagged(draws, seed, rows.shape, max_samples)
            draws.seed(tree_seed)
            tree = ExtraTreeRegressor(
                max_features=1, splitter="random", max_depth=max_depth, random_state=draws
            )
            tree.fit(rows[drawn], targets[drawn], check_input=False)
            leaves = tree.apply(rows, check_input=False)
            lengths = tree.tree_.compute_node_depths()[leaves]
            depths += lengths + average_path_length(tree.tree_.n_node_samples)[leaves] - 1.0
    denominator = n_estimators * average_path_length(np.array([max_samples]))
    return 2 ** -np.divide(depths, denominator, out=np.ones_like(depths), where=denominator != 0)


def _z_vectors(features: pd.DataFrame) -> np.ndarray:
    """Per row of `features`, its z of each feature (NAMES' order): stacked from the columns, where a
    frame of the selected columns cost 4 times as much."""
    return np.column_stack([features[f"z_{name}"].to_numpy(float) for name in NAMES])


def _bagged(
    draws: np.random.RandomState, seed: int, shape: tuple[int, int], max_samples: int
) -> tuple[np.ndarray, int]:
    """What bagging draws for one tree from its `seed`: the `max_samples` rows drawn, in row order, and the
    tree's own seed; each drawn as from a RandomState of `seed` alone. The draw of every feature before the
    rows' is kept, though the forest uses every feature, for its numbers."""
    draws.seed(seed)
    tree_seed = int(draws.randint(MAX_INT))
    draws.seed(seed)
    sample_without_replacement(shape[1], shape[1], random_state=draws)
    return np.sort(sample_without_replacement(shape[0], max_samples, random_state=draws)), tree_seed


def average_path_length(samples: np.ndarray) -> np.ndarray:
    """sklearn's _average_path_length of integer leaf sizes, in its arithmetic (the average depth an
    unsuccessful search reaches in a binary search tree of that many values), without its input check,
    which made it eight times as dear (168 against 20 µs for a tree's 40 nodes)."""
    length = np.zeros(len(samples))
    length[samples == 2] = 1.0
    more = samples > 2
    n = samples[more]
    length[more] = 2.0 * (np.log(n - 1.0) + np.euler_gamma) - 2.0 * (n - 1.0) / n
    return length


def _series_identity(catalog: pd.DataFrame) -> pd.DataFrame:
    """Per series: its node, a code per node (`node_code`, from 0), and its metric's position in SAMPLED
    (`feature`; -1 for another metric's)."""
    features = {metric: i for i, metric in enumerate(SAMPLED_METRICS)}
    feature = catalog["metric"].map(features).fillna(-1).to_numpy(np.int64)
    node_code = pd.factorize(catalog["node"])[0]
    return pd.DataFrame({"node": catalog["node"], "node_code": node_code, "feature": feature})


def _rows_of(identity: Columns, nodes: np.ndarray) -> np.ndarray:
    """Per series of `identity`, the row of `nodes` its node has (the last, for a node listed twice); -1
    for none. Looked up once per node: a hash of every series' node name cost more than the features."""
    series_node, member = groups(identity["node_code"])  # a series of each node names it
    last = {node: row for row, node in enumerate(nodes)}
    names = identity["node"][member]
    return np.array([last.get(name, -1) for name in names], np.int64)[series_node]


def _ascending_sums(cells: np.ndarray, count: int, rates: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per cell, the sum of the `rates` of its series where `where`, NaN ones (SQL's NULL) left out, added
    in ascending order: an order of their own, so that a node's sum does not depend on the order the tape
    or ClickHouse came to hold its series in (three rates or more may add to another last bit in
    another order); NaN for a cell without any, as SQL's sum of none."""
    summed = np.flatnonzero(where & ~np.isnan(rates))
    summed = summed[np.lexsort((rates[summed], cells[summed]))]
    found = group_sum(cells[summed], count, rates[summed], np.ones(len(summed), bool))
    return np.where(np.bincount(cells[summed], minlength=count) > 0, found, np.nan)


def _rates(view: TapeView) -> np.ndarray:
    """Per series, its growth per second from its first sample to its last: NaN (SQL's NULL) with one
    sample, or across a reset (growth below 0 or NaN). Seconds are whole milliseconds over 1000, as
    ClickHouse's dateDiff('millisecond', ...) / 1000."""
    seconds = (view.t_ms[view.last] - view.t_ms[view.first]) / 1000
    with np.errstate(invalid="ignore", divide="ignore"):  # inf - inf is NaN, as in ClickHouse
        growth = view.value[view.last] - view.value[view.first]
        return np.where((seconds > 0) & (growth >= 0), growth / seconds, np.nan)


def _number(value: float) -> float | None:
    """A JSON-able number: None for a feature the node lacked."""
    return None if pd.isna(value) else float(value)

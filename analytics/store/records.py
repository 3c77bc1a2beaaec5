"""What the hub hands to the store: plain rows, independent of ClickHouse and of the collectors.

These are the contract between hub.app (scraper, receivers, spool) and analytics.store.clickhouse.
"""

from __future__ import annotations

from dataclasses import dataclass

from analytics.evidence import Evidence
from analytics.topology.model import Source


@dataclass(frozen=True, slots=True)
class ScrapeBatch:
    """Every sample of one scrape of one target, columnar: sample i is (names[i], labels[i], values[i]).

    `node` is the fleet node the target belongs to (its file_sd `node` label); it is stored as a column,
    never inside `labels`. Times are unix seconds.
    """

    target: str
    node: str
    ts: float
    names: list[str]
    labels: list[dict[str, str]]
    values: list[float]

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True, slots=True)
class TargetStatus:
    """The outcome of one scrape of one target; error is "" when it succeeded."""

    ts: float
    target: str
    node: str
    up: bool
    duration_s: float
    samples: int
    error: str = ""


# A step row's columns: the hub hands the store collectors.steprecord.StepRecord objects, which have them
# as attributes (the record is defined once, beside the step SDK, for both to share).
STEP_COLUMNS = (
    "ts", "job", "rank", "node", "step", "duration_s", "compute_s", "comm_s", "data_s",
    "dp_rank", "pp_stage", "tp_rank", "steps", "source",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A detector's finding that persisted: one row of `anomalies`, written when it opens and written
    again with the same id when it ends (the table keeps the latest). Times are unix seconds.

    `evidence` is typed (analytics.evidence) everywhere but in the store: the rows a store's
    insert_anomalies takes carry it as analytics.evidence.to_json's text, which
    analytics.detectors.runner.store_anomalies writes, and readers of the table convert it back with
    analytics.evidence.from_json (or stored) where its rows come in."""

    id: str
    start: float
    end: float | None  # None while it lasts
    kind: str
    node: str
    component: str  # "gpu:3", "mlx5_2:1", or "" for the whole node
    job: str
    severity: str  # info | warning | critical
    score: float
    evidence: Evidence  # the numbers that triggered it
    detector: str
    detector_version: str
    # the id of the shared_fault anomaly that explains this one while it does (a leaf's fault behind its
    # nodes' link flaps: analytics.detectors.shared_faults), "" otherwise; written with the anomaly's next row
    explained_by: str = ""


@dataclass(frozen=True, slots=True)
class QueryResult:
    """Rows of a read-only query, with column names and types; `truncated` when the row limit cut it."""

    columns: list[str]
    types: list[str]
    rows: list[tuple]
    truncated: bool = False
    elapsed_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AlertChange:
    """One state change of one alert: a row of `alerts`. Times are unix seconds."""

    ts: float
    fingerprint: str
    alertname: str
    state: str  # pending | firing | resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: float
    ends_at: float | None


REQUESTS = ("approve", "deny", "undrain", "test")  # what people may ask of the hub (outcome `requested`)


@dataclass(frozen=True, slots=True)
class ActionRow:
    """One decision of the drain controller, refusals included: a row of `actions`."""

    ts: float
    action: str  # drain | undrain | approve | deny | breaker
    node: str
    job: str
    reason: str
    mode: str  # dry-run | approve | auto
    outcome: str  # done | dry-run | pending | refused | failed | approved | denied
    decision_id: str


@dataclass(frozen=True, slots=True)
class CheckRow:
    """One active check's verdict on one target of a node, as stored in `checks`: status is one of
    CHECK_STATUSES, evidence a JSON object's text, value and threshold None where the check has no number."""

    node: str
    check: str
    target: str  # "gpu:3", "nic:mlx5_2", "peer:vela-007", "" for the whole node
    status: str
    value: float | None
    unit: str
    threshold: float | None
    evidence: str
    started: float
    duration_s: float


CHECK_STATUSES = ("PASS", "WARN", "FAIL", "ERROR")  # collectors.checks.result.Status, as stored


@dataclass(frozen=True, slots=True)
class SilenceRow:
    """A silence as stored: `matchers` is a JSON list of [name, operator, value]; a silence expired
    early is written again with the same id and the new ends_at."""

    id: str
    matchers: str
    starts_at: float
    ends_at: float
    created_by: str
    comment: str
    updated_at: float


@dataclass(frozen=True, slots=True)
class NotificationRow:
    """One final delivery outcome to one receiver: a row of `notifications`."""

    ts: float
    receiver: str
    ok: bool
    attempts: int
    status: int | None
    error: str
    fingerprints: list[str]
    states: list[str]


@dataclass(frozen=True, slots=True)
class Placement:
    """One job (a Slurm job id, a Kubernetes pod) on one node, as its scheduler (`source`) says it:
    `user` where known (else ""), the GPU indices it holds there (() where the scheduler does not say),
    from `since` until `until` (unix seconds; None while it still runs)."""

    source: Source
    job: str
    user: str
    node: str
    gpus: tuple[int, ...]
    since: float
    until: float | None = None

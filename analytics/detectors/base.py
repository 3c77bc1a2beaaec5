"""The detector contract: what every detector is, so that the runner, the CLI and the conformance test
treat them all alike.

A detector looks at one window of the store at a time (default 10 s):

    features(source, window) -> DataFrame     one row per candidate (node, component, job + feature
                                              columns), aggregated in ClickHouse SQL, not in Python
    score(features) -> ndarray                one float per row; higher = more anomalous, always
    findings(features, scores) -> [Finding]   thresholding, apart from scoring: rows over `threshold`,
                                              each with the numbers that put it there (evidence)

scikit-learn conventions: every parameter is an `__init__` keyword stored unchanged under its own name
(get_params() reads them back, so `type(d)(**d.get_params())` is an identical detector); state learned
from data ends in `_` and exists only after fit(). Persistence across windows (k of n) and the start and
end of anomalies are the runner's job (analytics.detectors.runner), not the detector's.
"""

from __future__ import annotations

import collections
import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt
import pandas as pd

from analytics.evidence import Evidence
from analytics.store import native
from analytics.store.protocols import ColumnReader, FrameResult, NumbersReader, NumbersResult, Reader
from analytics.store.records import QueryResult

SEVERITIES = ("info", "warning", "critical")
KEY_COLUMNS = ("node", "component", "job")


@dataclass(frozen=True)
class Window:
    """[start, end) in unix seconds."""

    start: float
    end: float

    @property
    def parameters(self) -> dict[str, datetime]:
        """The bounds as query parameters: `ts >= {start:DateTime64(3)} AND ts < {end:DateTime64(3)}`."""
        return {
            "start": datetime.fromtimestamp(self.start, UTC),
            "end": datetime.fromtimestamp(self.end, UTC),
        }


@dataclass(frozen=True)
class Finding:
    """What a detector saw in one window; the runner turns persistent findings into anomalies."""

    kind: str
    node: str
    component: str  # "gpu:3", "mlx5_2:1", or "" for the whole node
    job: str  # "" when no job is involved
    score: float
    severity: str  # one of SEVERITIES
    evidence: Evidence  # the numbers that triggered it, typed per kind (analytics.evidence)

    @classmethod
    def at(cls, row: Any, kind: str, score: float, severity: str, evidence: Evidence) -> Finding:
        """A finding about one candidate row of a features frame: its node, component and job."""
        return cls(kind, row.node, row.component, row.job, float(score), severity, evidence)


class Detector(ABC):
    """Base of every detector; subclasses set the class attributes and implement the three steps."""

    name: ClassVar[str]
    version: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]  # anomaly kinds this detector reports
    # persistence the runner applies: a finding in `min_windows` of the last `of_windows` windows opens an
    # anomaly; `clear_windows` windows without one close it
    min_windows: ClassVar[int] = 1
    of_windows: ClassVar[int] = 1
    clear_windows: ClassVar[int] = 1
    # which candidates a window judged. "window": all of them (no finding counts as clear). "features":
    # only the rows of its features (a node that finished no step in the window was not looked at), so the
    # runner neither confirms nor clears the others until `unjudged_limit_s` has passed without judging them
    judged_by: ClassVar[str] = "window"
    unjudged_limit_s: ClassVar[float] = 900.0

    def get_params(self) -> dict[str, Any]:
        """The `__init__` parameters and their current values."""
        names = [
            p.name
            for p in inspect.signature(type(self).__init__).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        return {name: getattr(self, name) for name in names}

    def fit(self, source: Reader, windows: Sequence[Window]) -> Detector:
        """Learn from past windows (a no-op for rule detectors); returns self."""
        return self

    @abstractmethod
    def features(self, source: Reader, window: Window) -> pd.DataFrame:
        """One row per candidate in `window`: KEY_COLUMNS plus this detector's feature columns."""

    @abstractmethod
    def score(self, features: pd.DataFrame) -> np.ndarray:
        """One float per row of `features`; higher = more anomalous."""

    @abstractmethod
    def findings(self, features: pd.DataFrame, scores: np.ndarray) -> list[Finding]:
        """The rows whose score passes this detector's threshold, with their evidence."""

    def detect(self, source: Reader, window: Window) -> list[Finding]:
        """features -> score -> findings for one window."""
        return self.judge(source, window).findings

    def judge(self, source: Reader, window: Window) -> Judgement:
        """The window's findings, and (with judged_by "features") the candidates it judged."""
        features = self.features(source, window)
        judged = None
        if self.judged_by == "features":
            # zipped from the columns' lists: a frame of the three, then its tuples, cost 10 times as much
            judged = frozenset(zip(*(features[name].tolist() for name in KEY_COLUMNS), strict=True))
        if features.empty:
            return Judgement([], judged)
        return Judgement(self.findings(features, self.score(features)), judged)

    def tape_needs(self) -> Mapping[str, float]:
        """The metrics this detector reads from the runner's tape (analytics.detectors.tape), each with the
        lookback it reads them with: the runner reads them all in one read per window. None here."""
        return {}

    def so_far(self, evidence: Evidence, elapsed_s: float) -> Evidence:
        """An open anomaly's evidence after `elapsed_s`, for what accumulates (a cost so far); as is here."""
        return evidence


@dataclass(frozen=True)
class Judgement:
    """One window of one detector: its findings, and the (node, component, job) it judged (None: all)."""

    findings: list[Finding]
    judged: frozenset[tuple[str, str, str]] | None = None


def passing(features: pd.DataFrame, scores: np.ndarray, threshold: float) -> Iterator[tuple[Any, float]]:
    """The rows of `features` (as_tuples) whose score is at least `threshold`, each with its score: the
    others are never turned into tuples, as a fleet's candidates are mostly below it."""
    passed = np.flatnonzero(scores >= threshold)
    if not len(passed):  # the usual window: no frame of no rows to build
        return iter(())
    return zip(as_tuples(features.iloc[passed]), scores[passed], strict=True)


def passing_findings(
    features: pd.DataFrame,
    scores: np.ndarray,
    threshold: float,
    kind: str,
    severity: str,
    evidence: Callable[[Any, float], Evidence],
) -> list[Finding]:
    """A finding of `kind` at `severity` for each row whose score is at least `threshold`, with the
    evidence `evidence(row, score)` builds."""
    return [
        Finding.at(row, kind, score, severity, evidence(row, score))
        for row, score in passing(features, scores, threshold)
    ]


def as_tuples(rows: pd.DataFrame, *, index: bool = True) -> list[Any]:
    """rows.itertuples(index=index) as a list: the same named tuples of the same Python values, at a
    quarter of the cost for a few rows of a wide frame, where pandas reads each column apart and makes a
    tuple type per call (a window's findings made 4% of a steady cycle so). Column names must be text."""
    fields = ("Index", *rows.columns) if index else tuple(rows.columns)
    row = _tuple_type(fields)
    values = rows.to_numpy(object).tolist()
    if index:
        return [row(label, *record) for label, record in zip(rows.index.tolist(), values, strict=True)]
    return [row(*record) for record in values]


@functools.lru_cache(maxsize=256)
def _tuple_type(fields: tuple[str, ...]) -> type:
    return collections.namedtuple("Pandas", fields, rename=True)


Computed = TypeVar("Computed")


@runtime_checkable
class WindowReader(Reader, Protocol):
    """A Reader that lives for one window (the runner's source for its detectors): what several detectors
    compute alike from it (link_flap's and link_down's links) is computed once."""

    def once(self, key: Hashable, compute: Callable[[], Computed]) -> Computed: ...


def computed_once(source: Reader, key: Hashable, compute: Callable[[], Computed]) -> Computed:
    """`compute()`, once per window and `key` where `source` is the runner's (the first caller's result,
    which no caller may change), else each time (a detector run alone)."""
    if isinstance(source, WindowReader):
        return source.once(key, compute)
    return compute()


def frame(result: QueryResult) -> pd.DataFrame:
    """A query result as a DataFrame with the result's column names."""
    return pd.DataFrame.from_records(result.rows, columns=result.columns)


def read_frame(
    source: Reader, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = 10_000
) -> FrameResult:
    """A read's result as columns: a ColumnReader's (a Store's) own, else query()'s rows turned into
    columns (a HubClient, a test's fake), so that what reads columns runs on any Reader."""
    if isinstance(source, ColumnReader):
        return source.query_frame(sql, parameters=parameters, max_rows=max_rows)
    result = source.query(sql, parameters=parameters, max_rows=max_rows)
    return FrameResult(frame(result), result.truncated)


def read_numbers(
    source: Reader,
    sql: str,
    columns: Mapping[str, npt.DTypeLike],
    *,
    parameters: Mapping[str, Any] | None = None,
    max_rows: int = 10_000,
) -> NumbersResult:
    """A read's numeric `columns` (name -> numpy type, or native.TEXT for a LowCardinality(String) column,
    read as a native.Coded) as numpy arrays: a NumbersReader's (a Store's) own, else read_frame's columns
    converted (a HubClient, a test's fake)."""
    if isinstance(source, NumbersReader):
        return source.query_numbers(sql, columns, parameters=parameters, max_rows=max_rows)
    found = read_frame(source, sql, parameters=parameters, max_rows=max_rows)
    return NumbersResult(
        {
            name: _coded(found.frame[name]) if native.is_text(kind) else found.frame[name].to_numpy(kind)
            for name, kind in columns.items()
        },
        found.truncated,
    )


def _coded(texts: pd.Series) -> native.Coded:
    codes, distinct = pd.factorize(texts, sort=True)
    return native.Coded(codes.astype(np.int64), np.array(distinct.tolist(), dtype=object))

"""What the rest of fleetlens needs from a store, declared once.

A `Store` (embedded chDB or a ClickHouse server) and a `HubClient` (the same calls over a hub's HTTP API)
both satisfy these, so detectors, reports, the decision commands and the UI run against either. Each
caller asks for the narrowest one it uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from analytics.store.records import ActionRow, QueryResult, ScrapeBatch, SilenceRow, TargetStatus

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import pandas as pd

    from analytics.store.native import Coded


class Reader(Protocol):
    """Something to run a checked SELECT on: detectors, reports, dashboards."""

    def query(
        self, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = ...
    ) -> QueryResult: ...


class FrameResult(NamedTuple):
    """A read's rows as columns: at most the rows asked for, and whether more matched."""

    frame: pd.DataFrame
    truncated: bool


class NumbersResult(NamedTuple):
    """A read's numeric columns as numpy arrays (read-only), its LowCardinality(String) ones as
    native.Coded: at most the rows asked for, and whether more matched."""

    columns: dict[str, np.ndarray | Coded]
    truncated: bool


@runtime_checkable
class ColumnReader(Reader, Protocol):
    """A Reader that also returns a result as columns (a Store): what reads many rows into numpy uses,
    through analytics.detectors.base.read_frame, which falls back to `query` for any other Reader."""

    def query_frame(
        self, sql: str, *, parameters: Mapping[str, Any] | None = None, max_rows: int = ...
    ) -> FrameResult: ...


@runtime_checkable
class NumbersReader(Reader, Protocol):
    """A Reader that also returns numeric columns as numpy arrays and LowCardinality(String) ones as codes
    (a Store; `columns` as analytics.store.native.numbers takes them): what reads many numbers uses,
    through analytics.detectors.base.read_numbers, which falls back to read_frame for any other Reader."""

    def query_numbers(
        self,
        sql: str,
        columns: Mapping[str, npt.DTypeLike],
        *,
        parameters: Mapping[str, Any] | None = None,
        max_rows: int = ...,
    ) -> NumbersResult: ...


class IngestWriter(Protocol):
    """Where the hub's writer puts what it scraped and received.

    Each insert returns the rows it sent; a Store returns an analytics.store.retention.Inserted, an int
    that also says how many rows it refused as older than the table's retention (never sent, as the TTL
    would drop them at once) and how many it dropped as already stored (analytics.store.ledger).
    `keep_until` (unix seconds) keeps step rows until then, whatever their age."""

    def insert_samples(self, batches: Sequence[ScrapeBatch], *, token: str) -> int: ...

    def insert_targets(self, statuses: Sequence[TargetStatus], *, token: str) -> int: ...

    def insert_steps(self, rows: Sequence[Any], *, token: str, keep_until: float | None = None) -> int: ...

    def stored_scrapes(self, statuses: Sequence[TargetStatus]) -> set[tuple[str, int]]:
        """The (node, ts in ms) of those of `statuses` whose scrape has samples stored."""
        ...


class DecisionWriter(Protocol):
    """Where people's decisions go: silences and drain requests (approve, deny, undrain)."""

    def insert_silences(self, rows: Sequence[SilenceRow], *, token: str) -> int: ...

    def insert_actions(self, rows: Sequence[ActionRow], *, token: str) -> int: ...


class ReadWriter(Reader, DecisionWriter, Protocol):
    """What the decision commands and the UI use: read the state, then record a decision."""

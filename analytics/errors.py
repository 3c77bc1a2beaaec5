"""The errors of the analytics package, as one tree.

    AnalyticsError
    ├── StoreError
    │   ├── StoreUnavailable   the store cannot be reached or timed out: retry later (the hub spools)
    │   └── StoreRejected      the store refused the data or statement: retrying the same thing fails again
    │       └── RetentionRefused   rows older than their table's retention: refused, counted, not stored
    ├── QueryError             a read-only query was refused (a write, a syntax error, a limit exceeded)
    │   └── QueryLimitExceeded     it ran into one of its limits (memory, rows or bytes read, result, time)
    ├── NativeError            a Native result body that is not the numeric columns asked for (a QueryError
    │                          to the reader that asked)
    ├── SchemaError            migrations cannot be applied (a newer schema than this code knows, a bad DSN)
    │   └── AddressError       a store DSN or hub URL that is not understood (a bad flag or setting)
    ├── SettingError           a flag, setting or request parameter out of range; a ValueError too
    ├── DetectorError          an unknown detector name, or a detector that cannot run
    ├── EvidenceError          evidence that cannot cross the store: an unknown kind or version, a field
    │                          missing, extra, of the wrong type or not finite (analytics.evidence)
    ├── InputRefused           outside input refused whole: names the source, where in it and what is wrong
    │   ├── TopologyError      topology input (an inventory file, a Slurm topology.conf, kubectl's node
    │   │   │                  list, ibnetdiscover, lldpcli or virsh output, a set of links)
    │   │   └── _Refused       an XML document declares a DOCTYPE, stopped inside the parser and raised
    │   │                      again as TopologyError naming the line (topology.importers._input, private)
    │   └── PlacementError     what a scheduler says runs where (squeue --json, a hostlist, a gres
    │       │                  detail, the API server's pod list); nothing of it is stored
    │       └── _PodRefused    one pod not of the API's shape, skipped (placements.kubernetes, private)
    └── PostmortemError        a report's scope that cannot be reported on (no node and no job, both, a
                               window ending before it starts, a node or job the store does not know)

Messages name what was refused and why, in words an operator can act on.
"""

from __future__ import annotations


class AnalyticsError(Exception):
    """Base of every error raised by analytics."""


class StoreError(AnalyticsError):
    """Writing to or reading from the store failed."""


class StoreUnavailable(StoreError):
    """The store could not be reached, or did not answer in time; the same call may succeed later."""


class StoreRejected(StoreError):
    """The store refused the data or the statement; retrying it unchanged will not help."""


class RetentionRefused(StoreRejected):
    """An import was refused, whole, as some of its rows are older than their table's retention cutoff
    (the TTL would drop them at once): `records` sent, `stored` of them stored (0), `refused` not, and
    `reason`, which names the cutoff."""

    def __init__(self, message: str, *, records: int, stored: int, refused: int, reason: str) -> None:
        super().__init__(message)
        self.records = records
        self.stored = stored
        self.refused = refused
        self.reason = reason


class QueryError(AnalyticsError):
    """A read-only query was refused: a write statement, a syntax error, or a row or time limit."""


class QueryLimitExceeded(QueryError):
    """A query ran into one of its limits: `limit` names it as analytics.store.readonly.ReadLimits does
    (max_memory_bytes, ...), or max_seconds for its time."""

    def __init__(self, message: str, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class NativeError(AnalyticsError):
    """A Native body that is not the numeric columns asked for; the message says what and where."""


class SchemaError(AnalyticsError):
    """The schema cannot be brought to this code's version, or the DSN is not understood."""


class AddressError(SchemaError):
    """A store DSN or a hub URL that cannot be understood: a bad flag or setting, not a bad store."""


class SettingError(AnalyticsError, ValueError):
    """A value given by a flag, setting or request parameter is out of its range; the message names it."""


class DetectorError(AnalyticsError):
    """An unknown detector name, or a detector that cannot run; the message names which."""


class EvidenceError(AnalyticsError):
    """Evidence that cannot cross the store: an unknown kind or version, or a field that is missing, extra,
    of the wrong type or not finite; the message names the kind and the field."""


class InputRefused(AnalyticsError):
    """Outside input refused whole: `source` (a file name or command), `where` in it (a line, JSON path or
    XML element) and `what` is wrong, all three in the message."""

    def __init__(self, source: str, where: str, what: str) -> None:
        super().__init__(f"{source}: {where}: {what}")
        self.source = source
        self.where = where
        self.what = what


class TopologyError(InputRefused):
    """Topology input that cannot be imported (an inventory, a host agent's report, an imported file)."""


class PlacementError(InputRefused):
    """What a scheduler says runs where (squeue --json, a hostlist, a gres detail) that cannot be read;
    nothing of it is stored, so the placements already stored stay as they were."""


class PostmortemError(AnalyticsError):
    """The report's scope cannot be reported on: neither or both of node and job, a window that ends
    before it starts, or a node or job the store knows nothing of."""

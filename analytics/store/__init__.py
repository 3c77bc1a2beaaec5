"""The store: the only code that talks to ClickHouse, and the rows and reads that go through it.

clickhouse         Store: schema migrations, idempotent inserts, read-only queries, sessions
schema             every table and view as DDL, for one node or a cluster, and the migrations
retention          the cutoff past which a table's TTL would drop a row at once: such rows are refused
records            the plain rows the hub hands to the store (no ClickHouse in them)
protocols          what callers need of a store (Reader, IngestWriter, DecisionWriter, ReadWriter)
readonly, sqlpolicy  where SQL from outside runs, and what it may be
hubclient          the same reads and requests through a hub's HTTP API
clickhouse_errors  ClickHouse's errors as analytics.errors
redact             URLs and DSNs fit to print
"""

from analytics.store.clickhouse import DEFAULT_DATABASE, DEFAULT_DSN, Retention, Store, series_id

__all__ = ["DEFAULT_DATABASE", "DEFAULT_DSN", "Retention", "Store", "series_id"]

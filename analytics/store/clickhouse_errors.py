"""ClickHouse's errors in the words of analytics.errors: which are worth retrying, and a short message.

clickhouse-connect raises ClickHouseError for everything; the store must tell "not now" (StoreUnavailable:
the hub spools and retries) from "never" (StoreRejected: bad data), and operators need the error's name
and first sentence, not the echoed statement.
"""

from __future__ import annotations

import re

from clickhouse_connect.driver.exceptions import ClickHouseError, OperationalError

from analytics.errors import StoreRejected, StoreUnavailable

# ClickHouse error codes that mean "not now" rather than "this data, never": the store is busy, full,
# read-only for now, or refusing this client (a fixable setup problem, not bad rows) -- TIMEOUT_EXCEEDED,
# TOO_SLOW, UNKNOWN_TABLE, UNKNOWN_DATABASE, TOO_MANY_SIMULTANEOUS_QUERIES, READONLY, NO_FREE_CONNECTION,
# REQUIRED_PASSWORD, SOCKET_TIMEOUT, NETWORK_ERROR, NO_ZOOKEEPER, ABORTED, MEMORY_LIMIT_EXCEEDED,
# TABLE_IS_READ_ONLY, NOT_ENOUGH_SPACE, TOO_MANY_PARTS, ALL_CONNECTION_TRIES_FAILED, TOO_FEW_LIVE_REPLICAS,
# UNKNOWN_STATUS_OF_INSERT, ACCESS_DENIED, AUTHENTICATION_FAILED, KEEPER_EXCEPTION.
TRANSIENT_CODES = frozenset(
    {
        159,
        160,
        60,
        81,
        202,
        164,
        203,
        194,
        209,
        210,
        225,
        236,
        241,
        242,
        243,
        252,
        279,
        285,
        319,
        497,
        516,
        999,
    }
)


def unreachable(error: ClickHouseError) -> bool:
    """True when ClickHouse never answered (a transport failure carries no ClickHouse error code)."""
    return isinstance(error, OperationalError) and getattr(error, "code", None) is None


def store_error(what: str, error: ClickHouseError) -> StoreUnavailable | StoreRejected:
    """StoreUnavailable for transport failures and ClickHouse's transient codes, StoreRejected otherwise."""
    transient = unreachable(error) or getattr(error, "code", None) in TRANSIENT_CODES
    return (StoreUnavailable if transient else StoreRejected)(f"{what}: {short(error)}")


def short(error: Exception) -> str:
    """ClickHouse's message cut to what an operator needs: the error name and its first sentence, without
    the echoed statement, the list of expected tokens and the version trailer."""
    name = getattr(error, "name", None)
    text = str(error).split("DB::Exception: ")[-1]
    text = re.split(r"\n|\. In scope |: In scope |\. Expected one of|\s\(version ", text)[0].strip()
    text = re.sub(r"(\(line \d+, col \d+\)):.*", r"\1", text)  # drop the echo of the statement's rest
    text = re.sub(r"\s*\([A-Z_]+\)$", "", text)
    return f"{name}: {text}" if name else text

"""The read queries that took a hub's memory and CPU before its queries were bounded by the store, and a
query that runs until its time limit stops it: for the tests and bench/query_vs_ingest.py."""

from __future__ import annotations

HUGE_VALUE = "SELECT range(100000000)"  # one value of 10^8 numbers: ran 56 s, hub RSS 819 -> 7,152 MB
HUGE_STATE = "SELECT length(groupArray(number)) FROM numbers(80000000)"  # RSS +1.7 GB that stayed
BIG_VALUE = "SELECT range(15000000)"  # four at once: 3 scrape intervals lost, RSS 757 -> 3,704 MB
CONCURRENT_BIG_VALUES = 4

# 10^10 hashes over 2 x 10^5 rows read: within every read limit, it runs until its time limit stops it
LONG_QUERY = (
    "SELECT count() FROM numbers(100000) AS a CROSS JOIN numbers(100000) AS b "
    "WHERE sipHash64(a.number, b.number) % 7 = 3"
)

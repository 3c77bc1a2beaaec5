"""Waiting for an embedded store's background merges to end, so that what a bench times next is its own CPU:
the process's CPU counts chDB's merge threads, and the merges of what a bench just inserted are ingest's
cost (bench/ingest.py times them there), not the cost of what runs beside them."""

from __future__ import annotations

import time

import clickhouse_connect


def settle(path: str, poll_s: float = 0.5) -> float:
    """Wait until the embedded store at `path` runs no merge; returns the seconds waited."""
    started = time.perf_counter()
    client = clickhouse_connect.get_client(interface="chdb", path=path)
    try:
        while client.query("SELECT count() FROM system.merges").result_rows[0][0]:
            time.sleep(poll_s)
    finally:
        client.close()
    return time.perf_counter() - started

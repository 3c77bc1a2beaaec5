"""Ingest is idempotent through the hub's doors, on a real chDB store: one sample per (series, ts) however
remote write repeats it (within a request, in a retry split otherwise, after a restart), one step per (job,
rank, step) however close their times; a repeat with the stored value is dropped, one with another value
refused, the first kept (Prometheus's TSDB), and both are counted in fleetlens_hub_refused_rows."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from analytics.store import Store
from hub.app import Hub
from hub.otlp import OtlpStepReceiver
from hub.remote_write import RemoteWriteLimits, RemoteWriteReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.support.exposition import samples_of
from tests.support.hubserver import on_loopback
from tests.support.remote_write import encode, post, snappy

LIMITS = RemoteWriteLimits(max_series=100, max_samples=1000, max_label_length=256)


def hub_on(store: Store, spool: Path) -> Hub:
    writer = Writer(store, Spool(spool, 64 << 20))
    return Hub(store, writer, OtlpStepReceiver(), remote_write=RemoteWriteReceiver(LIMITS))


@pytest.fixture
def served(store: Store, tmp_path: Path) -> Iterator[tuple[Hub, str]]:
    hub = hub_on(store, tmp_path / "spool")
    with on_loopback(hub) as url:
        yield hub, url


def temperature(gpu: int, samples: list[tuple[int, float]]) -> tuple:
    labels = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": str(gpu), "Hostname": "vela-001", "job": "dcgm"}
    return {**labels, "instance": "10.0.0.1:9400"}, samples


def stored(store: Store, sql: str, **parameters: object) -> list[tuple]:
    return store.query(sql, parameters=parameters).rows


def refused(hub: Hub, kind: str, reason: str) -> float:
    return sum(
        sample.value
        for sample in samples_of(hub)["fleetlens_hub_refused_rows_total"]
        if sample.labels == {"kind": kind, "reason": reason}
    )


@pytest.mark.parametrize(("again", "reason"), [(41.0, "duplicate"), (99.0, "conflict")])
def test_two_samples_of_one_series_at_one_timestamp_are_one_row_and_the_second_is_counted(
    served, store, again, reason
):
    hub, url = served
    ts = int(time.time()) * 1000
    for request in range(3):  # each request alone holds the pair; later ones repeat the first
        body = encode([temperature(0, [(ts + request, 41.0)]), temperature(0, [(ts + request, again)])])
        assert post(url, snappy(body))[0] == 204
    rows = stored(
        store, "SELECT toUnixTimestamp64Milli(ts) - {ts:Int64}, value FROM samples ORDER BY ts", ts=ts
    )
    assert rows == [(0, 41.0), (1, 41.0), (2, 41.0)]  # the first of each pair stays
    assert refused(hub, "samples", reason) == 3
    assert refused(hub, "samples", "conflict" if reason == "duplicate" else "duplicate") == 0


def test_a_retried_request_split_otherwise_stores_no_sample_twice(served, store):
    hub, url = served
    ts = int(time.time()) * 1000
    series = [temperature(gpu, [(ts, 40.0 + gpu), (ts + 1000, 50.0 + gpu)]) for gpu in range(8)]
    assert post(url, snappy(encode(series)))[0] == 204
    # the sender lost the answer, and its resharded queues send the same samples in other requests
    for part in (series[5:], series[:2], [(labels, samples[1:]) for labels, samples in series[2:5]]):
        assert post(url, snappy(encode(part)))[0] == 204
    assert stored(store, "SELECT count(), uniqExact(series_id, ts) FROM samples") == [(16, 16)]
    assert refused(hub, "samples", "duplicate") == 3 * 2 + 2 * 2 + 3


def test_a_request_retried_after_a_restart_is_not_stored_again(store, chdb_dir, tmp_path):
    ts = int(time.time()) * 1000
    body = snappy(encode([temperature(gpu, [(ts, 40.0 + gpu)]) for gpu in range(8)]))
    for _ in range(2):  # the hub restarts between the request and its retry: its memory is gone
        with Store.open(f"chdb://{chdb_dir}", database=store.database) as opened:
            hub = hub_on(opened, tmp_path / "spool")
            with on_loopback(hub) as url:
                assert post(url, body)[0] == 204
    assert stored(store, "SELECT count() FROM samples") == [(8,)]
    assert refused(hub, "samples", "duplicate") == 8


def post_steps(url: str, records: list[dict]) -> int:
    body = "".join(json.dumps(record) + "\n" for record in records).encode()
    request = urllib.request.Request(
        f"{url}/api/v1/steps", data=body, headers={"Content-Type": "application/x-ndjson"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


def test_steps_of_one_rank_and_step_a_tenth_of_a_millisecond_apart_are_one_row(served, store):
    hub, url = served
    now = time.time()
    record = {"ts": now, "job": "job-a", "rank": 3, "node": "vela-001", "step": 7, "duration_s": 0.5}
    again = {**record, "ts": now + 0.0001}
    other = {**record, "ts": now + 0.0002, "duration_s": 0.9}
    assert post_steps(url, [record, again]) == 200
    assert post_steps(url, [other]) == 200
    assert stored(store, "SELECT step, duration_s FROM steps") == [(7, 0.5)]
    assert stored(store, "SELECT avg(duration_s), count() FROM steps WHERE job = 'job-a'") == [(0.5, 1)]
    assert (refused(hub, "steps", "duplicate"), refused(hub, "steps", "conflict")) == (1, 1)

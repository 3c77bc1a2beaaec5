"""The hub keeps or refuses history, never loses it: its doors (/api/v1/steps, /v1/metrics) refuse rows past
the store's retention and say so, ?keep_days keeps them, and rows that age past it in the spool are
refused by the store and counted, all on a real chDB store."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from analytics.errors import RetentionRefused
from analytics.store import Store
from analytics.store.hubclient import HubClient
from analytics.store.records import ScrapeBatch
from analytics.store.retention import DAY_S
from analytics.store.schema import Retention
from collectors.steprecord import StepRecord
from hub.app import Hub
from hub.auth import Tokens
from hub.otlp import PROTOBUF, OtlpStepReceiver
from hub.spool import HEADER, MAGIC, Entry, Spool, decode_entry, encode_entry
from hub.writer import Writer
from tests.hub.test_app import Outage
from tests.support.exposition import samples_of
from tests.support.hubserver import on_loopback
from tests.support.otlp import export, histogram, step_point

NOW = time.time() // 60 * 60
YEAR_AGO = NOW - 330 * DAY_S


@pytest.fixture
def served(store: Store, tmp_path: Path) -> Iterator[tuple[Hub, str, Outage]]:
    """A hub on loopback (no scraper) in front of a real store, whose writer's store can be switched off."""
    switch = Outage(store)
    writer = Writer(switch, Spool(tmp_path / "spool", 64 << 20))
    hub = Hub(store, writer, OtlpStepReceiver(), tokens=Tokens.load(None), retention=Retention(steps_days=30))
    with on_loopback(hub) as url:
        yield hub, url, switch


def lines(start: float, count: int, job: str = "old-job") -> bytes:
    """Step JSON lines: `count` steps of one rank, one a minute from `start`."""
    records = [
        {"ts": start + 60 * i, "job": job, "rank": 0, "node": "vela-001", "step": i, "duration_s": 46.0}
        for i in range(count)
    ]
    return "".join(json.dumps(record) + "\n" for record in records).encode()


def post(url: str, body: bytes, content_type: str = "application/x-ndjson") -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def steps_stored(hub: Hub) -> int:
    return hub.store.query("SELECT count() FROM steps").rows[0][0]


def refused_metric(hub: Hub, kind: str) -> float:
    (value,) = [
        s.value
        for s in samples_of(hub)["fleetlens_hub_refused_rows_total"]
        if s.labels == {"kind": kind, "reason": "retention"}
    ]
    return value


def test_old_step_records_are_refused_at_the_door_naming_the_cutoff(served) -> None:
    hub, url, _ = served
    status, answer = post(f"{url}/api/v1/steps", lines(YEAR_AGO, 704))
    assert status == 422
    assert (answer["records"], answer["stored"], answer["refused"], answer["older"]) == (704, 0, 704, 704)
    assert answer["cutoff"].endswith("Z") and answer["cutoff"] in answer["error"]
    assert "704 refused: older than the steps retention cutoff" in answer["error"]
    assert "(steps_days=30)" in answer["error"] and "keep_days=N" in answer["error"]
    hub.writer.close()  # nothing waits in the spool either: refused before it
    assert steps_stored(hub) == 0 and hub.writer.spool.pending_entries == 0
    assert refused_metric(hub, "steps") == 704


def test_a_request_with_some_old_records_is_refused_whole(served) -> None:
    hub, url, _ = served
    with pytest.raises(RetentionRefused) as refused:
        HubClient(url).import_steps(lines(NOW - 3600, 96, "recent") + lines(YEAR_AGO, 704))
    assert (refused.value.records, refused.value.stored, refused.value.refused) == (800, 0, 800)
    assert refused.value.reason.startswith("800 refused: 704 of them older than the steps retention cutoff")
    assert "422" in str(refused.value)
    assert steps_stored(hub) == 0


def test_keep_days_keeps_old_records_that_many_days(served) -> None:
    hub, url, _ = served
    assert HubClient(url).import_steps(lines(YEAR_AGO, 704), keep_days=365) == 704
    hub.writer.close()
    ((count, kept_until),) = hub.store.query(
        "SELECT count(), min(toUnixTimestamp(keep_until)) FROM steps"
    ).rows
    assert count == 704
    assert abs(kept_until - (time.time() + 365 * DAY_S)) < 120


def test_kept_records_keep_their_keep_until_through_the_spool(served) -> None:
    """The store is down when a kept import arrives: the batch waits in the spool with its keep_until."""
    hub, url, switch = served
    switch.down = True
    assert HubClient(url).import_steps(lines(YEAR_AGO, 5), keep_days=10) == 5
    assert hub.writer.spool.pending_entries == 1
    switch.down = False
    hub.writer.close()  # replays what is spooled
    rows = hub.store.query("SELECT count(), min(keep_until) > now() + INTERVAL 9 DAY FROM steps").rows
    assert rows == [(5, 1)]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("keep_days=0", "keep_days: a whole number of days from 1 to 3650, got 0"),
        ("keep_days=3651", "keep_days: a whole number of days from 1 to 3650, got 3651"),
        ("keep_days=ten", "keep_days: a whole number of days from 1 to 3650, got 'ten'"),
        ("keep_days=", "keep_days: a whole number of days from 1 to 3650, got ''"),
        ("keep_days=1&keep_days=2", "keep_days: given more than once"),
        ("keep=30", "unknown query parameter(s) keep: /api/v1/steps takes only keep_days"),
        ("keep_days", "query string 'keep_days': expected keep_days=N"),
    ],
)
def test_a_bad_keep_days_is_a_400_naming_the_parameter(served, query: str, named: str) -> None:
    hub, url, _ = served
    status, answer = post(f"{url}/api/v1/steps?{query}", lines(YEAR_AGO, 2))
    assert (status, answer["error"]) == (400, named)
    assert steps_stored(hub) == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.text(max_size=40))
def test_any_query_string_on_the_steps_endpoint_gets_no_5xx(served, query: str) -> None:
    _, url, _ = served
    body = lines(NOW, 1)
    status, _ = post(f"{url}/api/v1/steps?{urllib.parse.quote(query, safe='=&')}", body)
    assert status < 500


def test_otlp_points_past_the_cutoff_are_a_partial_success_and_the_rest_is_stored(served) -> None:
    hub, url, _ = served
    old_ns, fresh_ns = int(YEAR_AGO * 1e9), time.time_ns()  # fresh: began after the receiver did
    request = export(
        histogram(
            step_point(10, 20.0, start_ns=old_ns, rank=1),
            step_point(8, 16.0, start_ns=fresh_ns, rank=2),
        )
    )
    request = urllib.request.Request(
        f"{url}/v1/metrics",
        data=request.SerializeToString(),
        headers={"Content-Type": PROTOBUF},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        partial = ExportMetricsServiceResponse.FromString(response.read()).partial_success
    assert partial.rejected_data_points == 1
    assert "1 data points (the first resource_metrics[0].scope_metrics[0].metrics[0]" in partial.error_message
    assert "older than the steps retention cutoff" in partial.error_message
    assert "(steps_days=30), not stored" in partial.error_message
    hub.writer.close()
    assert hub.store.query("SELECT rank, steps FROM steps").rows == [(2, 8)]
    assert refused_metric(hub, "steps") == 1


def test_rows_that_age_past_the_cutoff_in_the_spool_are_refused_and_counted(served) -> None:
    """The scraper stamps samples with the scrape time, so only a batch that waited (here: one written
    with an old time while the store was down) can reach the store past its retention."""
    hub, _, switch = served
    old = NOW - 401 * DAY_S  # past rollup_days too: nothing of it would be kept
    batch = ScrapeBatch("vela-001:9400", "vela-001", old, ["DCGM_FI_DEV_GPU_TEMP"] * 3, [{}] * 3, [1, 2, 3])
    switch.down = True
    hub.writer.write("samples", [batch])
    hub.writer.write("steps", [StepRecord(YEAR_AGO, "job", 0, "vela-001", 1, 1.0)])
    switch.down = False
    hub.writer.close()
    assert hub.writer.spool.pending_entries == 0 and hub.writer.spool.rejected_total == 0
    assert refused_metric(hub, "samples") == 3
    assert refused_metric(hub, "steps") == 1
    assert refused_metric(hub, "targets") == 0
    assert hub.store.query("SELECT (SELECT count() FROM samples), (SELECT count() FROM steps)").rows == [
        (0, 0)
    ]


def test_a_spooled_batch_carries_its_keep_until_and_a_planted_one_is_unreadable() -> None:
    record = StepRecord(YEAR_AGO, "job", 0, "vela-001", 1, 1.0)
    assert decode_entry(encode_entry("steps", "t", [record], keep_until=NOW + DAY_S)) == Entry(
        "steps", "t", [record], NOW + DAY_S
    )
    assert decode_entry(encode_entry("steps", "t", [record])).keep_until is None
    document = {"v": 1, "kind": "steps", "token": "t", "rows": [], "keep_until": "forever"}
    payload = zlib.compress(json.dumps(document).encode())
    with pytest.raises(ValueError, match="keep_until 'forever' is not unix seconds"):
        decode_entry(HEADER.pack(MAGIC, len(payload)) + payload)

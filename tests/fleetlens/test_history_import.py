"""`fleetlens steps import` of old history, as an operator runs it (real CLI processes, a real chDB store):
kept with --keep-days and then queried, detected over and saved; refused, with the cutoff named and every
record counted, without it; the same through a hub."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from analytics.store.retention import DAY_S
from collectors.steprecord import CONTRACT_KEYS, StepRecord
from tests.analytics.detectors import SyncJob
from tests.support.hubserver import hub_process

YEAR_AGO = (time.time() - 330 * DAY_S) // 3600 * 3600  # "11 months ago", as in the issue
STEP_S = 5.0  # wall-clock seconds given to each iteration of the real trace, which carries none
SECONDS_PER_UNIT = 0.01  # the trace's batch times are normalized to 0-1000: 476 -> 4.76 s


def fleetlens(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("FLEETLENS_")}
    return subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, **(env or {})},
    )


def write_lines(path: Path, records: list[StepRecord]) -> Path:
    """Step JSON lines as the step SDK writes them (optional keys left out when unknown)."""
    with path.open("w") as out:
        for record in records:
            line = {key: getattr(record, key) for key in CONTRACT_KEYS if getattr(record, key) is not None}
            out.write(json.dumps(line) + "\n")
    return path


def alibaba_job_1(fixtures: Path, start: float) -> list[StepRecord]:
    """The real alibaba-pai job_1 trace as step records: one node and rank per worker, a worker's own
    mini-batch time as its compute_s, and every worker's step as long as the slowest worker's (a
    synchronous job), iteration i ending at start + i * STEP_S."""
    times: dict[int, dict[int, float]] = {}
    with (fixtures / "steps" / "alibaba-pai" / "job_1_norm.csv").open() as trace:
        for row in csv.DictReader(trace):
            times.setdefault(int(row["time"]), {})[int(row["worker"])] = float(row["batch_time_norm"])
    records = []
    for iteration, workers in sorted(times.items()):
        slowest = max(workers.values()) * SECONDS_PER_UNIT
        for worker, units in sorted(workers.items()):
            records.append(
                StepRecord(
                    ts=start + iteration * STEP_S,
                    job="pai-job-1",
                    rank=worker,
                    node=f"pai-{worker:02d}",
                    step=iteration,
                    duration_s=slowest,
                    compute_s=units * SECONDS_PER_UNIT,
                    dp_rank=worker,
                )
            )
    return records


def scalar(store: str, sql: str) -> list:
    result = fleetlens("query", sql, "--store", store, "--json")
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout)[0].values())


def test_a_year_old_real_job_is_kept_with_keep_days_then_queried_and_detected_over(
    fixtures: Path, tmp_path: Path
) -> None:
    records = alibaba_job_1(fixtures, YEAR_AGO)
    assert len(records) == 3000
    path = write_lines(tmp_path / "job_1.jsonl", records)
    store = f"chdb://{tmp_path / 'data'}"

    imported = fleetlens("steps", "import", str(path), "--store", store, "--keep-days", "400")
    assert imported.returncode == 0, imported.stderr
    assert (
        imported.stdout.strip()
        == f"imported 3000 step records from {path}, kept 400 days from now (--keep-days)"
    )

    first, last = records[0].ts, records[-1].ts
    assert scalar(store, "SELECT count(), uniqExact(node), toUnixTimestamp(min(ts)) FROM steps") == [
        3000,
        10,
        int(first),
    ]
    detected = fleetlens(
        "detect", "--store", store, "--from", str(first), "--to", str(last + 1), "--window-s", "300", "--json"
    )
    assert detected.returncode == 0, detected.stderr
    assert isinstance(json.loads(detected.stdout), list)


def test_without_keep_days_old_records_are_refused_naming_the_cutoff_and_none_is_lost(tmp_path: Path) -> None:
    old = SyncJob(nodes=4, ranks_per_node=2, name="old-job").steps(YEAR_AGO, 40)
    path = write_lines(tmp_path / "old.jsonl", old)
    store = f"chdb://{tmp_path / 'data'}"
    refused = fleetlens(
        "steps", "import", str(path), "--store", store, env={"FLEETLENS_HUB_STEPS_RETENTION_DAYS": "30"}
    )
    assert refused.returncode == 1
    message = refused.stderr.strip()
    assert message.startswith(
        f"imported 0 of {len(old)} step records from {path}; {len(old)} refused: older "
    )
    assert "than the steps retention cutoff 20" in message and "Z (steps_days=30)" in message
    assert message.endswith("use --keep-days N to keep imported history")
    assert refused.stdout == ""

    recent = SyncJob(nodes=4, ranks_per_node=2, name="recent-job").steps(time.time() - 3600, 40)
    mixed = write_lines(tmp_path / "mixed.jsonl", recent + old)
    refused = fleetlens("steps", "import", str(mixed), "--store", store)
    total = len(recent) + len(old)
    assert refused.returncode == 1
    assert f"imported 0 of {total} step records from {mixed}; {total} refused: {len(old)} of them older" in (
        refused.stderr
    )
    assert "(steps_days=90), and an import is stored whole or not at all" in refused.stderr
    assert scalar(store, "SELECT count() FROM steps") == [0]  # stored + refused = total: 0 + all

    fresh = fleetlens(
        "steps", "import", str(write_lines(tmp_path / "recent.jsonl", recent)), "--store", store
    )
    assert (fresh.returncode, fresh.stdout.strip()) == (
        0,
        f"imported {len(recent)} step records from {tmp_path / 'recent.jsonl'}",
    )


@pytest.mark.parametrize("days", ["0", "3651"])
def test_keep_days_out_of_bounds_is_a_usage_error(tmp_path: Path, days: str) -> None:
    path = write_lines(
        tmp_path / "one.jsonl", SyncJob(nodes=1, ranks_per_node=1, stages=1).steps(YEAR_AGO, 4)
    )
    result = fleetlens(
        "steps", "import", str(path), "--store", f"chdb://{tmp_path}/data", "--keep-days", days
    )
    assert result.returncode == 2
    assert f"--keep-days: a whole number of days from 1 to 3650, got {days}" in result.stderr


def slow_job(start: float) -> list[StepRecord]:
    """A synchronous 8-node job in which vela-003 computes half as fast again as its stage peers."""
    return SyncJob(slowdown=lambda node, stage, t: 1.5 if node == "vela-003" else 1.0).steps(start, 200)


def test_detect_save_writes_each_anomaly_once_however_often_it_runs(tmp_path: Path) -> None:
    records = slow_job(YEAR_AGO)
    path = write_lines(tmp_path / "slow.jsonl", records)
    store = f"chdb://{tmp_path / 'data'}"
    assert fleetlens("steps", "import", str(path), "--store", store, "--keep-days", "30").returncode == 0
    span = ("--from", str(records[0].ts - 1), "--to", str(records[-1].ts + 1))

    runs = [fleetlens("detect", "--store", store, *span, "--json", "--save") for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    found = json.loads(runs[0].stdout)
    assert found and found == json.loads(runs[1].stdout)
    assert any(anomaly["node"] == "vela-003" for anomaly in found)
    assert f"saved {len(found)} anomalies to the store" in runs[1].stderr

    rows = fleetlens(
        "query", "SELECT id, node, kind FROM anomalies FINAL ORDER BY id", "--store", store, "--json"
    )
    stored = json.loads(rows.stdout)
    assert sorted(anomaly["id"] for anomaly in found) == [row["id"] for row in stored]  # one row each

    report = fleetlens("postmortem", "--job", "llm", *span, "--store", store, "--format", "json")
    assert report.returncode == 0, report.stderr


def test_detect_save_through_a_hub_says_it_needs_the_store() -> None:
    result = fleetlens("detect", "--hub", "http://127.0.0.1:9", "--save")
    assert result.returncode == 2
    assert "--save writes anomalies to the store and needs --store" in result.stderr


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[str]:
    """A real `fleetlens hub` process (no targets, no detection) keeping steps 30 days."""
    env = {"FLEETLENS_HUB_STEPS_RETENTION_DAYS": "30", "FLEETLENS_HUB_SPOOL_DIR": str(tmp_path / "spool")}
    with hub_process(tmp_path, store=f"chdb://{tmp_path / 'hub-data'}", env=env) as running:
        yield running.url


def test_through_a_hub_old_records_are_refused_or_kept(hub: str, tmp_path: Path) -> None:
    old = SyncJob(nodes=2, ranks_per_node=2, name="old-job").steps(YEAR_AGO, 20)
    path = write_lines(tmp_path / "old.jsonl", old)

    refused = fleetlens("steps", "import", str(path), "--hub", hub)
    assert refused.returncode == 1
    assert (
        f"imported 0 of {len(old)} step records from {path}; {len(old)} refused: older than the steps "
        in (refused.stderr)
    )
    assert "Z (steps_days=30); use --keep-days N to keep imported history" in refused.stderr

    kept = fleetlens("steps", "import", str(path), "--hub", hub, "--keep-days", "90")
    assert kept.returncode == 0, kept.stderr
    deadline = time.monotonic() + 30  # the hub's writer stores it a moment after answering
    while (count := scalar_via_hub(hub)) != len(old) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert count == len(old)
    assert refused_rows(hub) == len(old)  # the refused import, counted on the hub's /metrics


def scalar_via_hub(hub: str) -> int:
    result = fleetlens("query", "SELECT count() FROM steps", "--hub", hub, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)[0]["count()"]


def refused_rows(hub: str) -> float:
    """Step rows the hub refused as past their retention (not the repeats it drops, counted apart)."""
    with urllib.request.urlopen(f"{hub}/metrics", timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
    (value,) = [
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == "fleetlens_hub_refused_rows_total"
        and sample.labels["kind"] == "steps"
        and sample.labels["reason"] == "retention"
    ]
    return value

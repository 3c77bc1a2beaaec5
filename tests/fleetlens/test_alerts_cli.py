"""`fleetlens silence`, `fleetlens drain` and `fleetlens alerts` as an SRE types them, on a store of
their own (each command is its own process, as on a real host)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from analytics.store.records import ActionRow

SEED_ACTIONS = """
import json, sys
from analytics.store import Store
from analytics.store.records import ActionRow
with Store.open(sys.argv[1]) as store:
    store.insert_actions([ActionRow(**row) for row in json.loads(sys.argv[2])], token="lifecycle-cli")
"""


def fleetlens(store: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", "--log-level", "ERROR", *args, "--store", f"chdb://{store}"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_silence_is_added_listed_and_expired_and_a_drain_is_requested(tmp_path: Path):
    store = tmp_path / "store"
    added = fleetlens(
        store,
        "silence",
        "add",
        "-m",
        "node=vela-007",
        "-m",
        'kind=~"link_.*"',
        "--duration",
        "2h",
        "--comment",
        "cable swap",
        "--by",
        "alice",
        "--json",
    )
    assert added.returncode == 0, added.stderr
    [silence] = json.loads(added.stdout)
    assert silence["matchers"] == 'node="vela-007",kind=~"link_.*"' and silence["created_by"] == "alice"

    listed = json.loads(fleetlens(store, "silence", "list", "--json").stdout)
    assert [s["id"] for s in listed] == [silence["id"]]
    assert fleetlens(store, "silence", "expire", silence["id"]).returncode == 0
    assert json.loads(fleetlens(store, "silence", "list", "--json").stdout) == []

    asked = fleetlens(store, "drain", "approve", "0b8f-decision", "--by", "bob")
    assert asked.returncode == 0 and "requested by bob" in asked.stdout
    status = json.loads(fleetlens(store, "drain", "list", "--json").stdout)
    assert [(row["action"], row["outcome"]) for row in status["recent"]] == [("approve", "requested")]
    assert status["pending"] == [] and status["drained"] == []
    assert fleetlens(store, "alerts", "list").stdout.split("\n")[0].startswith("state\talertname\tnode")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["silence", "add", "-m", "node", "--duration", "1h", "--comment", "x"], "expected NAME=VALUE"),
        (
            ["silence", "add", "-m", "node=~(", "--duration", "1h", "--comment", "x"],
            "not a regular expression",
        ),
        (["silence", "add", "-m", "node=a", "--duration", "1h", "--comment", " "], "needs a comment"),
        (["silence", "expire", "no-such-id"], "no silence no-such-id"),
        (
            ["silence", "add", "-m", 'node="vela"7"', "--duration", "1h", "--comment", "x"],
            "the quoted value is not a JSON string",
        ),
        (
            ["silence", "add", "-m", "node=~" + "a" * 1025, "--duration", "1h", "--comment", "x"],
            "value of 1025 characters, more than 1024",
        ),
    ],
)
def test_bad_silences_are_refused_naming_what_is_wrong(tmp_path: Path, args: list[str], message: str):
    result = fleetlens(tmp_path / "store", *args)
    assert result.returncode == 1 and message in result.stderr


def test_a_duration_that_is_not_one_is_refused_by_the_parser(tmp_path: Path):
    result = fleetlens(
        tmp_path / "store", "silence", "add", "-m", "a=b", "--duration", "soon", "--comment", "x"
    )
    assert result.returncode == 2 and "not a duration like 90s" in result.stderr


STORE_ROW = """
import json, sys
from analytics.store.records import SilenceRow
from analytics.store import Store
with Store.open("chdb://" + sys.argv[1]) as store:
    store.insert_silences([SilenceRow(**json.loads(sys.argv[2]))], token="test/bad-row")
"""


def test_an_invalid_stored_silence_is_listed_with_the_reason_and_can_be_expired(tmp_path: Path):
    """A row stored before the checks existed: `silence list` says what is wrong, `expire` ends it."""
    store = tmp_path / "store"
    now = time.time()
    bad = {
        "id": "bad-regex",
        "matchers": '[["node", "=~", "("]]',
        "starts_at": now - 60,
        "ends_at": now + 3600,
        "created_by": "mallory",
        "comment": "",
        "updated_at": now - 60,
    }
    stored = subprocess.run([sys.executable, "-c", STORE_ROW, str(store), json.dumps(bad)], timeout=120)
    assert stored.returncode == 0

    [listed] = json.loads(fleetlens(store, "silence", "list", "--json").stdout)
    assert listed["id"] == "bad-regex" and listed["matchers"] == bad["matchers"]
    assert listed["invalid"].startswith('matchers[0]: matcher node=~"(": not a regular expression')
    table = fleetlens(store, "silence", "list").stdout.splitlines()
    assert table[0].endswith("\tinvalid") and "not a regular expression" in table[1]

    expired = fleetlens(store, "silence", "expire", "bad-regex")
    assert expired.returncode == 0, expired.stderr
    assert json.loads(fleetlens(store, "silence", "list", "--json").stdout) == []


def test_a_test_is_requested_and_the_lifecycle_lists_the_states_the_audit_holds(tmp_path: Path):
    store = tmp_path / "store"
    drained = [
        ActionRow(1.8e9, "drain", "vela-003", "", "fleetlens: gpu_fault abc", "auto", "done", "d3"),
        ActionRow(1.8e9, "drain", "vela-004", "", "fleetlens: gpu_fault def", "auto", "done", "d4"),
        ActionRow(1.8e9 + 60, "test", "vela-004", "", "drained for 600 s", "auto", "done", "d4"),
        ActionRow(
            1.8e9 + 90, "fail", "vela-004", "", "checks failed: dcgm_diag gpu:2 FAIL", "auto", "done", "d4"
        ),
    ]
    seeded = subprocess.run(  # in its own process: this one may hold another embedded store already
        [sys.executable, "-c", SEED_ACTIONS, f"chdb://{store}", json.dumps([asdict(row) for row in drained])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seeded.returncode == 0, seeded.stderr

    asked = fleetlens(store, "alerts", "test", "vela-003", "--by", "carol")
    assert asked.returncode == 0 and "test vela-003: requested by carol" in asked.stdout
    listed = json.loads(fleetlens(store, "alerts", "lifecycle", "--json").stdout)
    assert [(row["node"], row["state"]) for row in listed] == [
        ("vela-003", "drained"),
        ("vela-004", "failed"),
    ]
    assert "dcgm_diag gpu:2 FAIL" in listed[1]["reason"]
    table = fleetlens(store, "alerts", "lifecycle").stdout.splitlines()
    assert table[0] == "node\tstate\tsince\treason" and table[2].startswith("vela-004\tfailed\t")

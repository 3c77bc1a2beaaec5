"""Silences checked at the door and read without failing: one bad row in the store must neither stop the
alerting cycle (no alerts, no drains, no breaker) nor hide from the people who have to remove it."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alerts import commands
from alerts.drain import DrainController
from alerts.engine import AlertEngine
from alerts.errors import SilenceError
from alerts.policy import DrainPolicy
from alerts.service import AlertService
from alerts.silences import MAX_MATCHERS, Silence, new_silence, silence_from_row, validate_row
from analytics.store import Store
from analytics.store.records import SilenceRow
from fleetlens import alerts_cli
from tests.alerts.test_drain import RecordingBackend, anomaly
from tests.support.strategies import JSON_VALUES

NOW = 1_750_000_000.0


def row(**columns: object) -> SilenceRow:
    """A valid row (one matcher, an hour from NOW), with `columns` replaced."""
    good = SilenceRow("silence-1", '[["node", "=", "vela-007"]]', NOW, NOW + 3600, "sre", "cable swap", NOW)
    return replace(good, **columns)


def matchers(*entries: object) -> str:
    return json.dumps(list(entries))


BAD_ROWS = {
    "regex-that-does-not-compile": (
        row(matchers=matchers(["node", "=~", "("])),
        r'^matchers\[0\]: matcher node=~"\(": not a regular expression',
    ),
    "regex-too-long": (
        row(matchers=matchers(["node", "=~", "a" * 1025])),
        r"^matchers\[0\]: matcher node: value of 1025 characters, more than 1024",
    ),
    "regex-repeat-past-the-limit": (
        row(matchers=matchers(["node", "=~", "a{4294967296}"])),
        "not a regular expression: the repetition number is too large",
    ),
    "regex-nested-past-the-recursion-limit": (
        row(matchers=matchers(["node", "!~", "(" * 500 + ")" * 500])),
        "not a regular expression",
    ),
    "not-json": (row(matchers="node=vela-007"), "^matchers: not JSON"),
    "json-nested-too-deeply": (row(matchers="[" * 100_000), "^matchers: JSON nested too deeply"),
    "no-matcher": (row(matchers="[]"), "^matchers: a silence needs at least one matcher"),
    "not-a-list": (row(matchers='{"node": "vela-007"}'), "^matchers: a silence needs at least one matcher"),
    "too-many-matchers": (
        row(matchers=matchers(*[["node", "=", "x"]] * (MAX_MATCHERS + 1))),
        f"^matchers: {MAX_MATCHERS + 1} matchers, more than {MAX_MATCHERS}",
    ),
    "pair-not-triple": (
        row(matchers=matchers(["node", "="])),
        r"^matchers\[0\]: must be \[name, operator, value\], three strings",
    ),
    "number-not-string": (row(matchers=matchers(["node", "=", 7])), r"^matchers\[0\]: must be \[name"),
    "bad-label-name": (
        row(matchers=matchers(["no de", "=", "x"])),
        r"^matchers\[0\]: matcher name 'no de' is not a label name",
    ),
    "unknown-operator": (
        row(matchers=matchers(["node", "==", "x"])),
        r"^matchers\[0\]: matcher 'node': operator '==' is not one of =~, !~, !=, =",
    ),
    "empty-id": (row(id=""), "^id: must not be empty"),
    "id-not-a-string": (row(id=7), "^id: must be a string, got 7"),
    "blank-comment": (row(comment="  "), "^comment: a silence needs a comment saying why"),
    "comment-too-long": (row(comment="x" * 4097), "^comment: 4097 characters, more than 4096"),
    "created-by-too-long": (row(created_by="x" * 4097), "^created_by: 4097 characters, more than 4096"),
    "lone-surrogate": (row(created_by="\ud800"), "^created_by: not valid Unicode"),
    "nan-start": (row(starts_at=float("nan")), "^starts_at: must be unix seconds from 0 .* got nan"),
    "start-as-text": (row(starts_at="now"), "^starts_at: must be unix seconds"),
    "start-as-boolean": (row(starts_at=True), "^starts_at: must be unix seconds"),
    "infinite-end": (row(ends_at=float("inf")), "^ends_at: must be unix seconds"),
    "end-past-2200": (
        row(ends_at=1e20),
        r"^ends_at: must be unix seconds from 0 \(1970-01-01\) to 7258118400",
    ),
    "end-before-start": (row(ends_at=NOW - 1), "^ends_at: 1749999999.0 is not after starts_at 1750000000.0"),
    "end-at-start": (row(ends_at=NOW), "^ends_at: .* is not after starts_at"),
    "update-before-1970": (row(updated_at=-1), "^updated_at: must be unix seconds"),
}


@pytest.mark.parametrize(("bad", "problem"), BAD_ROWS.values(), ids=BAD_ROWS.keys())
def test_a_row_that_is_no_silence_is_refused_naming_the_field(bad: SilenceRow, problem: str) -> None:
    with pytest.raises(SilenceError, match=problem):
        silence_from_row(bad)
    with pytest.raises(SilenceError, match=problem):
        validate_row(bad, now=NOW - 600)  # it would be in force, not an expiry: the hub refuses it whole


def test_a_valid_row_is_its_silence_and_back() -> None:
    silence = silence_from_row(row(matchers=matchers(["node", "=", "vela-007"], ["kind", "=~", "link_.*"])))
    assert [str(m) for m in silence.matchers] == ['node="vela-007"', 'kind=~"link_.*"']
    assert silence.row(NOW) == row(matchers=matchers(["node", "=", "vela-007"], ["kind", "=~", "link_.*"]))
    validate_row(silence.row(NOW), now=NOW)


def test_the_hub_takes_the_expiry_of_an_invalid_silence_but_only_storable_columns() -> None:
    """Expiring a silence stored before the checks writes its row again, ending now: it mutes nothing."""
    invalid = row(matchers=matchers(["node", "=~", "("]), comment="")
    expiry = replace(invalid, ends_at=NOW, updated_at=NOW)
    validate_row(expiry, now=NOW)
    validate_row(expiry, now=NOW - 30)  # the expiring client's clock a little ahead of the hub's
    with pytest.raises(SilenceError, match=r"^matchers"):
        validate_row(expiry, now=NOW - 3600)  # not an expiry: it would be in force for an hour
    for column, value in (("id", ""), ("created_by", "\udc80"), ("starts_at", float("nan")), ("comment", 1)):
        with pytest.raises(SilenceError, match=f"^{column}: "):
            validate_row(replace(expiry, **{column: value}), now=NOW)


@pytest.mark.parametrize(
    ("matcher_texts", "comment", "problem"),
    [
        (["node=~" + "a" * 1025], "why", "value of 1025 characters, more than 1024"),
        (['node="vela"7"'], "why", "the quoted value is not a JSON string"),
        ([], "why", "a silence needs at least one matcher"),
        (["node=a"], "x" * 5000, "^comment: 5000 characters"),
        (["node=a"], "", "needs a comment saying why"),
    ],
)
def test_new_silences_get_the_same_checks(matcher_texts: list[str], comment: str, problem: str) -> None:
    with pytest.raises(SilenceError, match=problem):
        new_silence(matcher_texts, 60, created_by="sre", comment=comment, now=NOW)


@settings(max_examples=200, deadline=None)
@given(
    columns=st.dictionaries(
        st.sampled_from(["id", "starts_at", "ends_at", "created_by", "comment", "updated_at"]),
        JSON_VALUES,
        max_size=3,
    ),
    matcher_json=JSON_VALUES,
    entry=st.lists(JSON_VALUES, max_size=4),
)
def test_any_value_in_any_column_is_a_silence_or_a_silence_error(
    columns: dict, matcher_json: object, entry: list
) -> None:
    for candidate in (
        row(**columns),
        row(matchers=json.dumps(matcher_json)),
        row(matchers=json.dumps([entry])),
    ):
        for check in (silence_from_row, lambda r: validate_row(r, now=NOW)):
            try:
                check(candidate)
            except SilenceError as error:
                assert str(error)


# -- a bad row in a real store, and a real alerting cycle -------------------------------------------------


@contextlib.contextmanager
def on(store: Store, args: argparse.Namespace) -> Iterator[Store]:
    """alerts_cli.connected, on the test's store."""
    yield store


def cli(function, capsys: pytest.CaptureFixture, **options: object) -> list[dict]:
    """Run a `fleetlens silence` command function with --json; what it printed."""
    assert function(argparse.Namespace(hub=None, json=True, **options)) == 0
    return json.loads(capsys.readouterr().out)


def test_an_invalid_stored_silence_stops_neither_alerts_nor_drains_and_can_be_listed_and_expired(
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = time.time()
    bad = SilenceRow(
        f"bad-{uuid.uuid4()}", matchers(["node", "=~", "("]), now - 60, now + 3600, "mallory", "x", now - 60
    )
    store.insert_silences([bad], token=f"test/{bad.id}")  # as a hub without the checks stored it
    swap = commands.add_silence(
        store, new_silence(["node=vela-002"], 3600, created_by="sre", comment="GPU swap", now=now - 60)
    )
    backend = RecordingBackend()
    controller = DrainController(DrainPolicy(mode="auto"), [backend], fleet_size=32)
    service = AlertService(store, AlertEngine(), controller=controller)
    faults = [anomaly("vela-001", start=now - 120), anomaly("vela-002", start=now - 120)]

    with caplog.at_level(logging.WARNING, logger=commands.log.name):
        service.cycle(faults, now=now)
        service.cycle([], now=now + 10)

    assert {alert.node for alert in service.engine.firing} == {"vela-001", "vela-002"}
    assert {(a["labels"]["node"], a["state"]) for a in commands.alert_states(store)} == {
        ("vela-001", "firing"),
        ("vela-002", "firing"),
    }
    assert [(node, verb) for verb, node, _ in backend.calls] == [("vela-001", "drain")]
    [held] = [a for a in commands.actions(store) if a.node == "vela-002"]
    assert held.outcome == "refused" and f"silenced by {swap.id}" in held.reason, "the valid silence holds"
    warnings = [r.getMessage() for r in caplog.records if bad.id in r.getMessage()]
    assert len(warnings) == 1 and "not a regular expression" in warnings[0], "logged once, not per cycle"

    monkeypatch.setattr(alerts_cli, "connected", lambda args: on(store, args))
    listed = {entry["id"]: entry for entry in cli(alerts_cli.cmd_silence_list, capsys)}
    assert listed.keys() == {bad.id, swap.id}
    assert "not a regular expression" in listed[bad.id]["invalid"] and listed[swap.id]["invalid"] == ""
    assert listed[bad.id]["matchers"] == bad.matchers

    [expired] = cli(alerts_cli.cmd_silence_expire, capsys, id=bad.id)
    assert expired["id"] == bad.id and expired["invalid"]
    assert [entry["id"] for entry in cli(alerts_cli.cmd_silence_list, capsys)] == [swap.id]
    assert [silence.id for silence in commands.silences(store)] == [swap.id]


def test_expiring_a_silence_to_come_takes_it_off_the_list(store: Store) -> None:
    later = new_silence(["node=vela-003"], 600, created_by="sre", comment="tomorrow", now=time.time() + 86400)
    commands.add_silence(store, later)
    expired = commands.expire_silence(store, later.id)
    assert isinstance(expired.silence, Silence) and expired.silence.ends_at == expired.row.ends_at
    assert commands.stored_silences(store) == []

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
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from alerts import commands
from alerts.drain import DrainController
from alerts.engine import AlertEngine
from alerts.errors import SilenceError
from alerts.policy import DrainLimits, DrainPolicy, DrainRule
from alerts.service import AlertService
from alerts.silences import (
    MAX_MATCHERS,
    Silence,
    expiry_row,
    new_silence,
    silence_from_row,
    validate_row,
)
from analytics.errors import StoreRejected
from analytics.store import Store
from analytics.store.hubclient import HubClient
from analytics.store.records import SilenceRow
from fleetlens import alerts_cli
from hub.app import Hub
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.alerts.test_drain import RecordingBackend, anomaly
from tests.support.hubserver import on_loopback
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
        row(matchers=matchers(["node", "=~", "a{1001}"])),
        r"not a regular expression \(RE2\): invalid repetition size",
    ),
    "regex-unbalanced-nesting": (
        row(matchers=matchers(["node", "!~", "(" * 500])),
        r"not a regular expression \(RE2\): missing \)",
    ),
    "regex-backreference": (
        row(matchers=matchers(["node", "=~", r"(vela)-\1"])),
        r"not a regular expression \(RE2\): invalid escape sequence: \\1",
    ),
    "regex-lookahead": (
        row(matchers=matchers(["node", "!~", "(?!vela).*"])),
        r"not a regular expression \(RE2\): invalid perl operator: \(\?!",
    ),
    "regex-program-over-the-budget": (
        row(matchers=matchers(["node", "=~", "(.*a){1000}"])),
        r"not a regular expression \(RE2\): pattern too large",
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


def test_an_invalid_stored_silence_can_be_expired_as_stored_and_changed_in_no_other_way() -> None:
    """Expiring a silence an older version stored unchecked writes its row again, ending now: it mutes
    nothing. That row, and only that, gets in without the checks; ending soon is no way around them."""
    invalid = row(matchers=matchers(["node", "=~", "("]), comment="")
    stored = {invalid.id: invalid}.get
    expiry = expiry_row(invalid, NOW)
    assert validate_row(expiry, stored, now=NOW) is None
    assert validate_row(expiry, stored, now=NOW - 30) is None  # the client's clock ahead of the hub's
    to_come = replace(invalid, starts_at=NOW + 600, ends_at=NOW + 3600)
    assert validate_row(expiry_row(to_come, NOW), {invalid.id: to_come}.get, now=NOW) is None

    with pytest.raises(SilenceError, match=r"^matchers"):
        validate_row(expiry, stored, now=NOW - 3600)  # not an expiry: it would be in force for an hour
    with pytest.raises(SilenceError, match=r"^matchers"):
        validate_row(expiry, now=NOW)  # no such silence stored: nothing to expire
    changed = {
        "matchers": matchers(*[["node", "=~", "("]] * 1000),
        "comment": "x" * 5_000_000,
        "created_by": "\udc80",
        "starts_at": NOW - 86400,
        "ends_at": float("nan"),
    }
    for column, value in changed.items():
        with pytest.raises(SilenceError, match=r"^(matchers|comment|created_by|ends_at)"):
            validate_row(replace(expiry, **{column: value}), stored, now=NOW)


@pytest.mark.parametrize(
    ("matcher_texts", "comment", "problem"),
    [
        (["node=~" + "a" * 1025], "why", "value of 1025 characters, more than 1024"),
        (['node="vela"7"'], "why", "the quoted value is not a JSON string"),
        ([], "why", "a silence needs at least one matcher"),
        (["node=a"], "x" * 5000, "^comment: 5000 characters"),
        (["node=a"], "", "needs a comment saying why"),
        ([r'node=~"(vela)-\\1"'], "why", r"not a regular expression \(RE2\): invalid escape sequence"),
        (["kind=~(?=link).*"], "why", r"not a regular expression \(RE2\): invalid perl operator"),
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


# -- one door for every write: the hub's API and alerts.commands -----------------------------------------


def hostile_writes(now: float) -> dict[str, tuple[list[SilenceRow], str]]:
    """The issue's silences that got in, each with what the refusal says: rows ending within a minute
    (taken unchecked, as expiries, before), patterns RE2 does not have, and too many in one request."""
    soon = SilenceRow(
        str(uuid.uuid4()), matchers(["node", "=", "vela-007"]), now - 10, now + 30, "m", "x", now
    )
    return {
        "invalid-regex-ending-soon": (
            [replace(soon, matchers=matchers(["node", "=~", "("]))],
            "not a regular",
        ),
        "1000-matchers-ending-soon": (
            [replace(soon, matchers=matchers(*[["node", "=~", "vela-.*"]] * 1000))],
            f"1000 matchers, more than {MAX_MATCHERS}",
        ),
        "5mb-comment-ending-soon": ([replace(soon, comment="x" * 5_000_000)], "comment: 5000000 characters"),
        "backreference": (
            [replace(soon, matchers=matchers(["node", "=~", r"(a)\1"]), ends_at=now + 3600)],
            r"\(RE2\): invalid escape sequence",
        ),
        "lookbehind": (
            [replace(soon, matchers=matchers(["node", "=~", "(?<=a)b"]), ends_at=now + 3600)],
            r"\(RE2\): invalid perl operator",
        ),
        "10000-silences-in-one-request": (
            [replace(soon, id=f"s-{i}", ends_at=now + 3600) for i in range(10_000)],
            f"10000 silences in one request, more than {commands.MAX_SILENCES_PER_REQUEST}",
        ),
    }


@pytest.fixture
def hub_url(store: Store, tmp_path) -> Iterator[str]:
    """A hub on loopback in front of the test's store."""
    hub = Hub(store, Writer(store, Spool(tmp_path / "spool", 64 << 20)), OtlpStepReceiver())
    with on_loopback(hub) as url:
        yield url


def stored_count(store: Store) -> int:
    [(count,)] = store.query("SELECT count() FROM silences").rows
    return count


@pytest.mark.parametrize("case", hostile_writes(NOW).keys())
def test_each_hostile_silence_is_refused_at_the_hubs_door_and_by_alerts_commands(
    case: str, store: Store, hub_url: str
) -> None:
    rows, problem = hostile_writes(time.time())[case]
    with pytest.raises(StoreRejected, match=problem):
        HubClient(hub_url).insert_silences(rows, token=f"test/{case}")  # straight to the hub's API
    with pytest.raises(SilenceError, match=problem):
        commands.store_silences(store, rows, token=f"test/{case}")  # the CLI's way to a store
    assert stored_count(store) == 0


def test_through_the_hub_a_silence_is_added_and_expired_and_an_invalid_one_ended_as_stored_only(
    store: Store, hub_url: str
) -> None:
    client, now = HubClient(hub_url), time.time()
    swap = commands.add_silence(
        client, new_silence(["node=vela-007"], 3600, created_by="sre", comment="swap")
    )
    assert [silence.id for silence in commands.silences(client)] == [swap.id]
    commands.expire_silence(client, swap.id)
    assert commands.silences(client) == []

    old = SilenceRow("old-1", matchers(["node", "=~", "("]), now - 60, now + 3600, "mallory", "", now - 60)
    store.insert_silences([old], token="test/old")  # as an older hub stored it, unchecked
    with pytest.raises(StoreRejected, match=r"rows\[0\]: matchers"):
        client.insert_silences([replace(expiry_row(old, now), comment="ended")], token="test/changed")
    expired = commands.expire_silence(client, old.id)
    assert expired.row.ends_at <= time.time() and commands.stored_silences(client) == []


@pytest.mark.parametrize("pattern", ["(a+)+$", "(a|aa)+b", "(.*a){20}"])
def test_catastrophic_patterns_are_matched_by_re2_whose_work_is_linear_in_the_label(pattern: str) -> None:
    """Python's re took a second to find that (a+)+$ does not match 24 a's and a "!", 4x more for every
    2 more; RE2 runs a program of a few hundred instructions once over the label, whatever it is."""
    silence = new_silence([f"node=~{json.dumps(pattern)}"], 60, created_by="sre", comment="why", now=NOW)
    [matcher] = silence.matchers
    assert isinstance(matcher.regex, re2._Regexp) and matcher.regex.programsize < 300
    for length in (24, 26, 1000):
        assert not silence.mutes({"node": "a" * length + "!"}, NOW)
    assert silence.mutes({"node": "a" * 40 + ("b" if pattern == "(a|aa)+b" else "")}, NOW)


LABELS = ("node", "kind", "job")
REGEX_TEXT = st.text("ab.*+?|()[]{}^$\\-,0123", max_size=12)
RE2_OPTIONS = re2.Options()
RE2_OPTIONS.log_errors = False


def re2_fullmatch(pattern: str, value: str) -> bool | None:
    """RE2's own answer, with its default options: whether `value` matches `pattern` whole (None when
    RE2 refuses the pattern)."""
    try:
        return re2.compile(pattern, RE2_OPTIONS).fullmatch(value) is not None
    except re2.error:
        return None


@settings(max_examples=300, deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.sampled_from(LABELS), st.sampled_from(["=", "!=", "=~", "!~"]), REGEX_TEXT),
        min_size=1,
        max_size=4,
    ),
    labels=st.dictionaries(st.sampled_from(LABELS), st.text("ab-.!\n", max_size=8)),
)
def test_a_silence_validation_accepts_round_trips_and_mutes_what_re2_fullmatch_says(
    entries: list[tuple[str, str, str]], labels: dict[str, str]
) -> None:
    candidate = row(matchers=matchers(*(list(entry) for entry in entries)))
    answers = []
    for name, operator, value in entries:
        label = labels.get(name, "")
        matched = re2_fullmatch(value, label) if "~" in operator else label == value
        answers.append(None if matched is None else matched == (operator in ("=", "=~")))
    try:
        silence = validate_row(candidate, now=NOW)
    except SilenceError:
        assert None in answers, "refused although RE2 takes every pattern"
        return
    assert None not in answers, "accepted a pattern RE2 refuses"
    assert silence is not None and silence.row(NOW) == candidate and silence_from_row(candidate) == silence
    assert silence.mutes(labels, NOW) == all(answers)


def test_an_alert_silenced_after_it_was_sent_holds_the_drain_before_it_is_due_to_be_sent_again(
    store: Store,
) -> None:
    """The controller is told of every firing alert a silence mutes, not only of those due to be sent."""
    now = time.time()
    backend = RecordingBackend()
    quick = DrainPolicy(
        mode="auto",
        rules=(DrainRule(("link_down",), after_s=30),),
        limits=DrainLimits(max_fraction=1, breaker_fraction=1),
    )
    service = AlertService(store, AlertEngine(), controller=DrainController(quick, [backend], 32))
    service.cycle([anomaly("vela-005", "link_down", start=now - 5, severity="warning")], now=now)
    swap = new_silence(["node=vela-005"], 3600, created_by="sre", comment="cable swap", now=now + 10)
    commands.add_silence(store, swap)
    for later in (20, 30, 40):  # the alert was sent at `now`: not due again before now + 60
        service.cycle([], now=now + later)

    assert backend.calls == []
    [held] = [row for row in commands.actions(store) if row.node == "vela-005"]
    assert held.outcome == "refused" and f"silenced by {swap.id}" in held.reason

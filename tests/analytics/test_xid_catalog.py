"""analytics.xid_catalog: NVIDIA's Xid codes, every one of them, with fleetlens's cause, severity and action.

The must-holds are what the fault detector relies on (it is tested against real kernel logs); the rule
checks restate docs/xid-catalog.md's rule here, independently of the module's tables, so a row that
drifts from it fails; and the committed doc's generated table must be what the module prints.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from analytics import xid_catalog
from analytics.xid_catalog import (
    LEGACY_CODES,
    SEVERITIES,
    Action,
    Cause,
    XidInfo,
    catalog,
    lookup,
    markdown,
    worst_action,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "xid-catalog.md"
BEGIN = "<!-- BEGIN GENERATED: python -m analytics.xid_catalog --markdown -->"
END = "<!-- END GENERATED -->"

# What was counted in NVIDIA's documents (read 2026-12): the catalog page lists every code from 1 to 172,
# one row each; the older Xid page lists 1 to 143 (LEGACY_CODES), none outside the catalog's range.
CATALOG_CODES = range(1, 173)

# The rule's direct bucket mappings, as docs/xid-catalog.md states them.
ACTION_OF_BUCKET = {
    "IGNORE": Action.NONE,
    "RESTART_APP": Action.RESTART_JOB,
    "RESET_GPU": Action.RESET_GPU,
    "WORKFLOW_XID_48": Action.RESET_GPU,
    "WORKFLOW_NVLINK_ERR": Action.RESET_GPU,
    "RESTART_BM": Action.REBOOT_NODE,
    "RESTART_VM": Action.REBOOT_NODE,
    "CONTACT_SUPPORT": Action.INSPECT,
    "CHECK_MECHANICALS": Action.INSPECT,
}
APPLICATION_BUCKETS = {"CHECK_APP/CUDA", "WORKFLOW_XID_13", "WORKFLOW_XID_31"}

ROWS = catalog()


def overridden(row: XidInfo) -> tuple[Cause | None, Action | None]:
    cause, action, _ = xid_catalog._OVERRIDES.get(row.code, (None, None, ""))
    return cause, action


# The must-holds.


@pytest.mark.parametrize("code", [13, 31, 43])
def test_application_faults_are_info_and_do_not_drain(code: int) -> None:
    row = lookup(code)
    assert row.cause is Cause.APPLICATION and row.by_application
    assert row.severity == "info"
    assert not row.action.drains


def test_double_bit_ecc_resets_the_gpu() -> None:
    row = lookup(48)
    assert (row.cause, row.severity, row.action) == (Cause.HARDWARE, "critical", Action.RESET_GPU)


def test_a_row_remap_event_does_not_outrank_a_double_bit_error() -> None:
    assert lookup(63).action.rank < lookup(48).action.rank
    assert worst_action([48, 63, 94]) is Action.RESET_GPU
    assert worst_action([63, 48]) is Action.RESET_GPU


def test_fallen_off_the_bus_reboots_the_node() -> None:
    assert lookup(79).action is Action.REBOOT_NODE
    assert lookup(79).severity == "critical"


def test_a_contained_ecc_error_restarts_the_job_only_but_is_critical_news_of_the_hardware() -> None:
    row = lookup(94)
    assert (row.cause, row.severity, row.action) == (Cause.HARDWARE, "critical", Action.RESTART_JOB)
    assert not row.action.drains


def test_an_uncontained_ecc_error_drains() -> None:
    row = lookup(95)
    assert row.cause is Cause.HARDWARE
    assert row.action.drains and row.severity == "critical"


def test_a_gsp_rpc_timeout_is_the_driver_and_drains_as_nvidia_says() -> None:
    row = lookup(119)
    assert row.cause is Cause.DRIVER
    assert row.immediate == "RESET_GPU" and row.action is Action.RESET_GPU
    assert row.action.drains and row.severity == "critical"


# Coverage and shape.


def test_every_code_nvidia_documents_has_exactly_one_row() -> None:
    codes = [row.code for row in ROWS]
    assert codes == sorted(set(codes)), "codes are unique and in order"
    assert all(code > 0 for code in codes)
    documented = set(CATALOG_CODES) | set(LEGACY_CODES)
    assert set(codes) == documented
    assert len(ROWS) == len(documented) == 172


def test_every_row_says_where_it_came_from() -> None:
    assert all(row.documented for row in ROWS)
    for row in ROWS:
        expected = "catalog" if row.code in CATALOG_CODES else "legacy"
        assert row.source == expected, row.code
    assert set(LEGACY_CODES) <= {row.code for row in ROWS}


def test_rows_are_filled_in() -> None:
    for row in ROWS:
        assert row.mnemonic and row.mnemonic == row.mnemonic.upper(), row.code
        assert row.description, row.code
        assert row.severity in SEVERITIES, row.code
        if not row.unused and row.code < 162:  # 162-172: the catalog leaves both buckets blank
            assert row.immediate, row.code
    assert all(lookup(row.code) is row for row in ROWS)


def test_the_older_meaning_is_only_given_for_codes_the_catalog_calls_unused() -> None:
    for row in ROWS:
        assert bool(row.legacy_description) <= row.unused, row.code
    assert lookup(9).legacy_description == "Driver error programming GPU"
    assert lookup(48).legacy_description == ""


def test_rows_are_frozen() -> None:
    with pytest.raises(FrozenInstanceError):
        lookup(48).action = Action.NONE  # type: ignore[misc]


# The rule.


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"xid{row.code}")
def test_severity_follows_cause_and_action(row: XidInfo) -> None:
    if row.cause is Cause.APPLICATION:
        assert row.severity == "info"
    elif row.action.drains or (row.cause is not Cause.UNKNOWN and row.action is not Action.NONE):
        assert row.severity == "critical"
    else:
        assert row.severity == "warning"


def test_unused_codes_are_unknown_and_need_nothing() -> None:
    unused = [row for row in ROWS if row.unused]
    assert unused, "NVIDIA marks some codes Unused"
    for row in unused:
        assert (row.cause, row.severity, row.action) == (Cause.UNKNOWN, "warning", Action.NONE), row.code
        assert row.override == ""


def test_actions_follow_the_immediate_bucket_unless_overridden() -> None:
    checked = 0
    for row in ROWS:
        _, action = overridden(row)
        if row.unused or action is not None or row.immediate not in ACTION_OF_BUCKET:
            continue
        assert row.action is ACTION_OF_BUCKET[row.immediate], row.code
        checked += 1
    assert checked > 80


def test_application_buckets_give_an_application_cause_unless_overridden() -> None:
    for row in ROWS:
        cause, _ = overridden(row)
        if not row.unused and cause is None and row.investigatory in APPLICATION_BUCKETS:
            assert row.cause is Cause.APPLICATION, row.code


def test_an_application_fault_never_drains_the_node() -> None:
    for row in ROWS:
        if row.cause is Cause.APPLICATION:
            assert not row.action.drains, row.code


def test_every_override_says_why_and_changes_something() -> None:
    for code, (cause, action, why) in xid_catalog._OVERRIDES.items():
        row = lookup(code)
        assert row.documented and not row.unused, code
        assert why and row.override == why, code
        assert cause is not None or action is not None, code
        assert cause is None or row.cause is cause, code
        assert action is None or row.action is action, code
    assert all(row.override == "" for row in ROWS if row.code not in xid_catalog._OVERRIDES)


def test_every_bucket_the_catalog_uses_has_an_action() -> None:
    for row in ROWS:
        if not row.unused and row.immediate != "WORKFLOW_NVLINK5_ERR":
            assert row.immediate in xid_catalog._ACTION_BY_BUCKET, row.code
    for bucket in xid_catalog._NVLINK5_DECODE_WORST.values():
        assert bucket in xid_catalog._ACTION_BY_BUCKET


# Codes the catalog lacks, and any int at all.


@pytest.mark.parametrize("code", [0, -1, 173, 999, 22013, 2**31, -(2**63), 10**30])
def test_an_unknown_code_gets_an_unknown_row(code: int) -> None:
    row = lookup(code)
    assert row.code == code
    assert not row.documented
    assert (row.cause, row.severity, row.action) == (Cause.UNKNOWN, "warning", Action.NONE)
    assert row.source == "none"
    assert worst_action([code]) is Action.NONE


@given(st.integers())
def test_lookup_accepts_any_int(code: int) -> None:
    row = lookup(code)
    assert row.code == code
    assert row.severity in SEVERITIES
    assert row.documented == (code in CATALOG_CODES)


@given(st.lists(st.integers() | st.sampled_from(list(CATALOG_CODES))))
def test_worst_action_accepts_any_ints(codes: list[int]) -> None:
    worst = worst_action(codes)
    assert worst.rank == max((lookup(code).action.rank for code in codes), default=0)
    assert worst_action(iter(codes)) is worst


def test_worst_action_of_nothing_is_none() -> None:
    assert worst_action([]) is Action.NONE


# The doc.


def test_the_committed_doc_carries_the_generated_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert block.strip("\n") == markdown().strip("\n"), (
        "docs/xid-catalog.md is stale: replace its generated block with "
        "`python -m analytics.xid_catalog --markdown`"
    )


def test_the_generated_table_has_a_line_per_row_and_states_the_counts() -> None:
    table = markdown()
    for row in ROWS:
        assert f"\n| {row.code} | {row.mnemonic} |" in table
    assert "NVIDIA documents 172 Xid codes" in table
    assert "The table has 172 rows" in table


def test_the_command_prints_the_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    assert xid_catalog.main(["--markdown"]) == 0
    assert capsys.readouterr().out == markdown()
    assert xid_catalog.main([]) == 2

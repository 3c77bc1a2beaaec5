"""`dcgmi diag -j` read for DCGM 3.x and 4.x: a failed test is never PASS, whatever the output holds."""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.checks.dcgm_diag import MAX_OUTPUT_BYTES, parse_diag_output, run_dcgm_diag
from collectors.checks.result import CheckResult, Status, worst
from collectors.errors import CollectorConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "checks"
DCGM3 = json.loads((FIXTURES / "dcgm3_per_gpu_sm_stress_fail.json").read_text())
DCGM4_TEST = json.loads((FIXTURES / "dcgm4_issue215_diagnostic_test.json").read_text())


def dcgm4_document(*tests: dict[str, Any]) -> dict[str, Any]:
    """Tests in the 4.x envelope of NVIDIA/DCGM's dcgm_diag_schema.json."""
    return {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": list(tests)}]}}


def parse(document: dict[str, Any] | str, returncode: int = 0) -> list[CheckResult]:
    text = document if isinstance(document, str) else json.dumps(document)
    return parse_diag_output("vela-001", text, level=3, returncode=returncode, started=100.0, duration_s=2.0)


def statuses(results: list[CheckResult], test: str) -> dict[str, Status]:
    return {result.target: result.status for result in results if result.evidence.get("test") == test}


def test_dcgm3_failed_sm_stress_is_fail_on_the_three_gpus_that_failed_and_pass_on_the_one_that_passed() -> (
    None
):
    results = parse(DCGM3)
    assert statuses(results, "sm_stress") == {
        "gpu:0": Status.FAIL,
        "gpu:1": Status.PASS,
        "gpu:2": Status.FAIL,
        "gpu:3": Status.FAIL,
    }
    failed = next(result for result in results if result.target == "gpu:2" and result.status is Status.FAIL)
    assert failed.evidence["warnings"] == [
        "Max stress level of 1096.5 did not exceed desired stress level of 3000.0 for GPU 2"
    ]
    assert failed.evidence["error_ids"] == [50]
    assert worst(results) is Status.FAIL


def test_dcgm3_deployment_test_covers_every_gpu_in_its_list_and_a_skipped_gpu_gives_no_row() -> None:
    results = parse(DCGM3)
    assert statuses(results, "Denylist") == {f"gpu:{index}": Status.PASS for index in range(4)}
    assert statuses(results, "memory") == {f"gpu:{index}": Status.PASS for index in (1, 2, 3)}
    assert statuses(results, "targeted_stress") == {}
    assert {result.check for result in results} == {"dcgm_diag"}
    assert {(result.node, result.started, result.duration_s) for result in results} == {
        ("vela-001", 100.0, 2.0)
    }


def test_dcgm4_real_passing_test_is_pass_on_all_eight_gpus() -> None:
    results = parse(dcgm4_document(DCGM4_TEST))
    assert statuses(results, "diagnostic") == {f"gpu:{index}": Status.PASS for index in range(8)}
    assert (
        results[0].evidence["info"][2]
        == "GPU 0 calculated at approximately 859.08 gigaflops during this test"
    )


@pytest.mark.parametrize(
    ("word", "expected"), [("Fail", Status.FAIL), ("FAIL", Status.FAIL), ("Warn", Status.WARN)]
)
def test_dcgm4_one_gpu_failing_or_warning_is_that_gpus_status_and_the_nodes_worst(
    word: str, expected: Status
) -> None:
    test = copy.deepcopy(DCGM4_TEST)
    test["results"][5]["status"] = word
    results = parse(dcgm4_document(test))
    assert statuses(results, "diagnostic")["gpu:5"] is expected
    assert sum(result.status is Status.PASS for result in results) == 7
    assert worst(results) is expected


def test_dcgm4_summary_failure_no_entity_carries_becomes_a_node_failure() -> None:
    test = copy.deepcopy(DCGM4_TEST)
    test["test_summary"]["status"] = "Fail"
    results = parse(dcgm4_document(test))
    assert [(result.target, result.status) for result in results if result.status is not Status.PASS] == [
        ("", Status.FAIL)
    ]


def test_failed_run_exiting_non_zero_stays_fail_in_either_schema() -> None:
    test = copy.deepcopy(DCGM4_TEST)
    test["results"][0]["status"] = "Fail"
    for document in (DCGM3, dcgm4_document(test)):
        assert worst(parse(document, returncode=226)) is Status.FAIL


def test_non_zero_exit_with_json_showing_only_passes_is_an_error_not_pass() -> None:
    results = parse(dcgm4_document(DCGM4_TEST), returncode=226)
    assert worst(results) is Status.ERROR
    assert results[-1].target == ""
    assert "exited with status 226" in results[-1].evidence["problem"]


def test_banner_before_the_json_is_read_past() -> None:
    results = parse(
        "Successfully ran diagnostic for group.\n" + json.dumps(dcgm4_document(DCGM4_TEST), indent=2)
    )
    assert len(results) == 8 and worst(results) is Status.PASS


@pytest.mark.parametrize(
    ("output", "named"),
    [
        ("", "no JSON object"),
        ("Error: unable to connect to host engine at localhost.\n", "unable to connect to host engine"),
        ('{"DCGM Diagnostic": {"test_categories": [', "not JSON at line 1"),
        ("[1, 2]", "no JSON object in dcgmi output: [1, 2]"),
        ('{"DCGM Diagnostic": ' + "9" * 5000 + "}", "not JSON this check reads"),
        ('{"version": "4.2.3"}', "'version'"),
        (json.dumps({**dcgm4_document(DCGM4_TEST), **DCGM3}), "holds 2 of"),
        (json.dumps({"DCGM Diagnostic": {"runtime_error": "NVVS failed: no GPUs"}}), "NVVS failed: no GPUs"),
    ],
)
def test_output_that_cannot_be_read_is_one_error_naming_why(output: str, named: str) -> None:
    results = parse(output)
    assert [(result.target, result.status) for result in results] == [("", Status.ERROR)]
    assert named in results[0].evidence["problem"]


def test_unknown_status_word_is_an_error_naming_it_and_the_other_tests_are_kept() -> None:
    document = copy.deepcopy(DCGM3)
    sm_stress = document["DCGM GPU Diagnostic"]["test_categories"][-1]["tests"][1]
    sm_stress["results"][1]["status"] = "Inconclusive"
    results = parse(document)
    errors = [result for result in results if result.status is Status.ERROR]
    assert len(errors) == 1 and errors[0].evidence["test"] == "sm_stress"
    assert "'Inconclusive'" in errors[0].evidence["problem"]
    assert ".tests[1].results[1].status" in errors[0].evidence["problem"]
    assert statuses(results, "Denylist") == {f"gpu:{index}": Status.PASS for index in range(4)}


def test_unknown_entity_group_and_bad_gpu_ids_are_errors_naming_them() -> None:
    test = copy.deepcopy(DCGM4_TEST)
    test["results"][0]["entity_group"] = "Toaster"
    document = copy.deepcopy(DCGM3)
    document["DCGM GPU Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]["gpu_ids"] = "0,x"
    assert "'Toaster'" in parse(dcgm4_document(test))[0].evidence["problem"]
    assert "'0,x'" in next(r for r in parse(document) if r.status is Status.ERROR).evidence["problem"]


def test_document_where_every_test_was_skipped_is_an_error_not_pass() -> None:
    test = copy.deepcopy(DCGM4_TEST)
    for result in test["results"]:
        result["status"] = "Skip"
    test["results"][0]["status"] = "Not Run"
    results = parse(dcgm4_document(test))
    assert [(result.target, result.status) for result in results] == [("", Status.ERROR)]
    assert "skipped or not run" in results[0].evidence["problem"]


def fake_dcgmi(tmp_path: Path, body: str) -> Path:
    """An executable standing in for dcgmi: records its arguments, then runs `body`."""
    path = tmp_path / "dcgmi"
    path.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/args"\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_run_asks_for_the_level_in_json_and_reads_a_failed_run_that_exits_non_zero(tmp_path: Path) -> None:
    (tmp_path / "out.json").write_text(json.dumps(DCGM3))
    dcgmi = fake_dcgmi(tmp_path, f'cat "{tmp_path}/out.json"\nexit 226')
    results = run_dcgm_diag("vela-001", 3, dcgmi=os.fspath(dcgmi), clock=lambda: 42.0)
    assert (tmp_path / "args").read_text().split() == ["diag", "-r", "3", "-j"]
    assert statuses(results, "sm_stress")["gpu:3"] is Status.FAIL
    assert worst(results) is Status.FAIL
    assert {result.started for result in results} == {42.0}


def test_run_without_dcgmi_is_one_error_saying_so(tmp_path: Path) -> None:
    results = run_dcgm_diag("vela-001", 1, dcgmi=os.fspath(tmp_path / "absent" / "dcgmi"))
    assert [(result.target, result.status) for result in results] == [("", Status.ERROR)]
    assert (
        results[0]
        .evidence["problem"]
        .endswith("dcgmi does not exist: install DCGM (datacenter-gpu-manager) or give dcgmi's path")
    )


def test_run_past_its_limit_is_an_error(tmp_path: Path) -> None:
    dcgmi = fake_dcgmi(tmp_path, "exec sleep 60")
    results = run_dcgm_diag("vela-001", 1, dcgmi=os.fspath(dcgmi), timeout_s=0.2)
    assert [result.status for result in results] == [Status.ERROR]
    assert "ran past its 0.2 s timeout" in results[0].evidence["problem"]


def test_run_printing_past_the_bound_is_an_error_not_a_read(tmp_path: Path) -> None:
    dcgmi = fake_dcgmi(tmp_path, f"exec head -c {MAX_OUTPUT_BYTES + 1} /dev/zero")
    results = run_dcgm_diag("vela-001", 1, dcgmi=os.fspath(dcgmi))
    assert [result.status for result in results] == [Status.ERROR]
    assert (
        results[0].evidence["problem"].endswith(f"dcgmi wrote more than {MAX_OUTPUT_BYTES} bytes to stdout")
    )


def test_level_outside_one_to_three_is_refused() -> None:
    with pytest.raises(CollectorConfigError, match="level 4"):
        run_dcgm_diag("vela-001", 4)


STATUS_WORDS = st.sampled_from(
    ["Pass", "PASS", "pass", "Fail", "FAIL", "Warn", "Skip", "SKIP", "Not Run", "", "ok"]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
RESULT_3X = st.fixed_dictionaries(
    {"status": STATUS_WORDS | JSON_VALUES},
    optional={
        "gpu_ids": st.sampled_from(["0", "0,1", "7", "-1", "", "a"]) | JSON_VALUES,
        "warnings": JSON_VALUES,
    },
)
RESULT_4X = st.fixed_dictionaries(
    {"status": STATUS_WORDS | JSON_VALUES},
    optional={
        "entity_group": st.sampled_from(["GPU", "None", "Switch", "vGPU"]) | JSON_VALUES,
        "entity_id": st.integers(-2, 9) | JSON_VALUES,
        "info": JSON_VALUES,
    },
)


def documents(schema: str, result: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    test = st.fixed_dictionaries(
        {"name": st.sampled_from(["memory", "pcie"]) | JSON_VALUES, "results": st.lists(result, max_size=4)},
        optional={"test_summary": st.fixed_dictionaries({"status": STATUS_WORDS})},
    )
    category = st.fixed_dictionaries(
        {"category": st.just("Hardware"), "tests": st.lists(test | JSON_VALUES, max_size=3)}
    )
    return st.fixed_dictionaries(
        {schema: st.fixed_dictionaries({"test_categories": st.lists(category, max_size=3)})}
    )


def reported_problem(document: Any) -> bool:
    """Whether a result's or test summary's "status" is a fail or warn word where the schema puts it."""

    def items(holder: Any, key: str) -> list[Any]:
        value = holder.get(key) if isinstance(holder, dict) else None
        return value if isinstance(value, list) else []

    bodies = (
        [document.get(key) for key in ("DCGM GPU Diagnostic", "DCGM Diagnostic")]
        if isinstance(document, dict)
        else []
    )
    holders = [
        holder
        for body in bodies
        for category in items(body, "test_categories")
        for test in items(category, "tests")
        for holder in [*items(test, "results"), test.get("test_summary") if isinstance(test, dict) else None]
    ]
    words = [holder.get("status") for holder in holders if isinstance(holder, dict)]
    return any(isinstance(word, str) and word.strip().casefold() in ("fail", "warn") for word in words)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    document=documents("DCGM GPU Diagnostic", RESULT_3X)
    | documents("DCGM Diagnostic", RESULT_4X)
    | JSON_VALUES,
    returncode=st.sampled_from([0, 1, 226]),
)
def test_hostile_documents_never_crash_and_pass_only_what_dcgmi_explicitly_passed(
    document: Any, returncode: int
) -> None:
    results = parse(json.dumps(document), returncode)
    assert results, "every run gives at least one row"
    for result in results:
        assert result.status in Status
        if result.status is Status.PASS:
            assert result.evidence["dcgm_status"].strip().casefold() == "pass"
    if returncode != 0 or reported_problem(document):
        assert worst(results) is not Status.PASS


@settings(max_examples=200)
@given(output=st.text(max_size=200) | st.binary(max_size=200).map(lambda raw: raw.decode("latin-1")))
def test_arbitrary_text_is_never_a_crash_and_never_pass(output: str) -> None:
    results = parse(output)
    assert worst(results) is not Status.PASS or "pass" in output.casefold()

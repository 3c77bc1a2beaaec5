"""`dcgmi diag -r 1|2|3 -j` run and read into one CheckResult per test and GPU.

DCGM 3.x writes its tests under "DCGM GPU Diagnostic", each result naming its GPUs in "gpu_ids" (a
string, a comma-separated list for the deployment tests that cover every GPU); DCGM 4.x writes them
under "DCGM Diagnostic", each result naming one entity ("entity_group", "entity_id") and each test a
"test_summary". Both are read here by their own allowlist (NVIDIA/DCGM testing/python3/
dcgm_diag_schema.json for 4.x, nvvs JsonOutput.cpp for 3.x).

Failure policy: a result is PASS only where dcgmi wrote an explicit pass for that test and target. A
failed test is FAIL, a warning WARN; a skipped or not-run test gives no row, and a document in which no
test was judged gives one ERROR for the node. Anything the parser does not know (a status word, an entity
group, a field of the wrong type, text that is not JSON, a runtime_error) is an ERROR naming it, and a
dcgmi that exits non-zero without the JSON showing a failure adds an ERROR for the node, so a failed
run never reads as healthy.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from collectors import commands
from collectors.checks.result import SEVERITY, CheckResult, Status
from collectors.errors import CheckOutputError, CollectorConfigError, CommandError, CommandNotFound

CHECK = "dcgm_diag"

# The wall-clock limit per level: NVIDIA's DCGM user guide ("Run Levels") gives level 1 as under a
# minute, level 2 as about two minutes and level 3 as about 30 minutes on a node of 8 GPUs; the limits
# leave room for slower nodes before a hung dcgmi is reported as an ERROR.
TIMEOUT_S = {1: 300.0, 2: 900.0, 3: 3600.0}
# dcgmi's JSON for a level 3 run on 8 GPUs is tens of kB; a tool printing past this is not dcgmi's answer.
MAX_OUTPUT_BYTES = 16 << 20

# DCGM 3.x prints "Pass"/"Fail"/"Warn"/"Skip" (its own tests also "PASS", "SKIP"), 4.x adds "Not Run"
# (dcgmi/Diag.cpp HelperDisplayDiagResult); compared case-folded.
_VERDICTS = {"pass": Status.PASS, "fail": Status.FAIL, "warn": Status.WARN}
_NOT_JUDGED = frozenset({"skip", "skipped", "not run"})

# DCGM 4.x entity group names (dcgmlib DcgmFieldsGetEntityGroupString) to this project's target prefix;
# "None" is a result about the node as a whole.
_TARGET_PREFIX = {"GPU": "gpu", "Switch": "switch", "CPU": "cpu", "ConnectX": "nic"}
_WHOLE_NODE_GROUP = "None"

_DOCUMENT_3X = "DCGM GPU Diagnostic"
_DOCUMENT_4X = "DCGM Diagnostic"
_MAX_TEXTS = 10
_MAX_TEXT_CHARS = 500


@dataclass(frozen=True)
class _Verdict:
    """One target's verdict in one test, before it is stamped with node and times."""

    target: str
    status: Status
    evidence: dict[str, Any]


def run_dcgm_diag(
    node: str,
    level: int,
    *,
    dcgmi: str = "dcgmi",
    timeout_s: float | None = None,
    clock: Callable[[], float] = time.time,
) -> list[CheckResult]:
    """Run `dcgmi diag -r level -j` (dcgmi at the path `dcgmi`) and read its output.

    A dcgmi that is missing, cannot be started, runs past `timeout_s` (TIMEOUT_S[level] by default) or
    prints more than MAX_OUTPUT_BYTES gives one ERROR for the node saying so. Raises CollectorConfigError
    for a level other than 1, 2, 3.
    """
    if level not in TIMEOUT_S:
        raise CollectorConfigError(f"dcgm_diag: level {level!r} is not one of 1, 2, 3")
    limit_s = TIMEOUT_S[level] if timeout_s is None else timeout_s
    command = [dcgmi, "diag", "-r", str(level), "-j"]
    started = clock()
    began = time.monotonic()
    try:
        done = commands.run(command, limit_s, max_output_bytes=MAX_OUTPUT_BYTES)
    except CommandNotFound as error:
        problem = f"{error}: install DCGM (datacenter-gpu-manager) or give dcgmi's path"
    except CommandError as error:
        problem = str(error)
    else:
        return parse_diag_output(
            node,
            done.stdout,
            level=level,
            returncode=done.returncode,
            started=started,
            duration_s=time.monotonic() - began,
        )
    return [_node_error(node, problem, level, started, time.monotonic() - began)]


def parse_diag_output(
    node: str, stdout: str, *, level: int, returncode: int, started: float, duration_s: float
) -> list[CheckResult]:
    """The CheckResults of one `dcgmi diag -j` run from its standard output and exit status.

    Never raises on the output: what cannot be read becomes ERROR rows naming it (see the module's
    failure policy). Rows keep the document's order: category, test, result.
    """

    def stamp(verdict: _Verdict) -> CheckResult:
        return CheckResult(
            node, CHECK, verdict.target, verdict.status, None, "", None, started, duration_s, verdict.evidence
        )

    try:
        verdicts = list(_document_verdicts(_json_document(stdout), level))
    except CheckOutputError as problem:
        verdicts = [_Verdict("", Status.ERROR, {"level": level, "problem": str(problem)})]
    except RecursionError:
        verdicts = [_Verdict("", Status.ERROR, {"level": level, "problem": "dcgmi output nests too deep"})]
    if not verdicts:
        problem = "dcgmi judged no test: every result was skipped or not run"
        verdicts = [_Verdict("", Status.ERROR, {"level": level, "problem": problem})]
    if returncode != 0 and not any(verdict.status in (Status.FAIL, Status.ERROR) for verdict in verdicts):
        problem = f"dcgmi exited with status {returncode} but its JSON shows no failed test"
        verdicts.append(_Verdict("", Status.ERROR, {"level": level, "problem": problem}))
    return [stamp(verdict) for verdict in verdicts]


def _node_error(node: str, problem: str, level: int, started: float, duration_s: float) -> CheckResult:
    evidence = {"level": level, "problem": problem}
    return CheckResult(node, CHECK, "", Status.ERROR, None, "", None, started, duration_s, evidence)


def _json_document(stdout: str) -> dict[str, Any]:
    """The JSON object dcgmi printed, after any banner lines before it ("Successfully ran ...")."""
    lines = stdout.splitlines(keepends=True)
    first = next((index for index, line in enumerate(lines) if line.lstrip().startswith("{")), None)
    if first is None:
        raise CheckOutputError(f"no JSON object in dcgmi output: {_clip(stdout.strip()) or 'nothing'}")
    text = "".join(lines[first:])
    try:
        document: dict[str, Any] = json.loads(text)  # text opens with "{": an object or an error
    except json.JSONDecodeError as error:
        raise CheckOutputError(
            f"dcgmi output is not JSON at line {first + error.lineno}: {error.msg}"
        ) from None
    except ValueError as error:  # a number past Python's digit limit for int
        raise CheckOutputError(f"dcgmi output is not JSON this check reads: {_clip(str(error))}") from None
    return document


def _document_verdicts(document: dict[str, Any], level: int) -> Iterator[_Verdict]:
    """Each verdict of a 3.x or 4.x document, in order; raises CheckOutputError on a schema break."""
    schemas = [key for key in (_DOCUMENT_3X, _DOCUMENT_4X) if key in document]
    if len(schemas) != 1:
        found = ", ".join(sorted(map(repr, document))[:5]) or "none"
        raise CheckOutputError(
            f"dcgmi JSON holds {len(schemas)} of {_DOCUMENT_3X!r} and {_DOCUMENT_4X!r} (keys: {found})"
        )
    schema = schemas[0]
    body = _field(document, schema, dict, schema)
    for holder, where in ((document, "top level"), (body, schema)):
        if "runtime_error" in holder:
            raise CheckOutputError(
                f"dcgmi reported a runtime_error ({where}): {_clip(str(holder['runtime_error']))}"
            )
    read_result = _results_3x if schema == _DOCUMENT_3X else _results_4x
    categories = _field(body, "test_categories", list, schema)
    for category_index, category in enumerate(categories):
        category_path = f"{schema}.test_categories[{category_index}]"
        try:
            category = _expect(category, dict, category_path)
            category_name = _field(category, "category", str, category_path)
            tests = _field(category, "tests", list, category_path)
        except CheckOutputError as problem:
            yield _Verdict("", Status.ERROR, {"level": level, "problem": str(problem)})
            continue
        for test_index, test in enumerate(tests):
            test_path = f"{category_path}.tests[{test_index}]"
            context = {"level": level, "category": category_name}
            if isinstance(test, dict) and isinstance(test.get("name"), str):
                context["test"] = test["name"]  # named in an ERROR too, where the test's name is readable
            try:
                yield from _test_verdicts(
                    _expect(test, dict, test_path), test_path, context, read_result, schema
                )
            except CheckOutputError as problem:
                yield _Verdict("", Status.ERROR, {**context, "problem": str(problem)})


def _test_verdicts(
    test: dict[str, Any],
    path: str,
    context: dict[str, Any],
    read_result: Callable[[dict[str, Any], str, dict[str, Any]], list[_Verdict]],
    schema: str,
) -> list[_Verdict]:
    """The verdicts of one test, all or none: a result that breaks the schema fails the whole test."""
    _field(test, "name", str, path)
    verdicts = []
    for result_index, result in enumerate(_field(test, "results", list, path)):
        result_path = f"{path}.results[{result_index}]"
        verdicts.extend(read_result(_expect(result, dict, result_path), result_path, context))
    if schema == _DOCUMENT_4X or "test_summary" in test:  # 4.x requires one; a 3.x one is read too
        verdicts.extend(_summary(test, path, context, verdicts))
    return verdicts


def _results_3x(result: dict[str, Any], path: str, context: dict[str, Any]) -> list[_Verdict]:
    """A 3.x result: one verdict per GPU index in its "gpu_ids" string."""
    status = _status(result, path)
    if status is None:
        return []
    gpu_ids = _field(result, "gpu_ids", str, path).split(",")
    if not all(gpu_id.strip().isdecimal() and gpu_id.strip().isascii() for gpu_id in gpu_ids):
        raise CheckOutputError(f"{path}.gpu_ids is not a list of GPU indices: {_clip(','.join(gpu_ids))!r}")
    evidence = _evidence(result, path, context)
    return [_Verdict(f"gpu:{int(gpu_id)}", status, evidence) for gpu_id in gpu_ids]


def _results_4x(result: dict[str, Any], path: str, context: dict[str, Any]) -> list[_Verdict]:
    """A 4.x result: one verdict for its entity (the node as a whole for entity group "None")."""
    status = _status(result, path)
    if status is None:
        return []
    group = _field(result, "entity_group", str, path)
    entity_id = _field(result, "entity_id", int, path)
    if group == _WHOLE_NODE_GROUP:
        target = ""
    elif group in _TARGET_PREFIX and entity_id >= 0:
        target = f"{_TARGET_PREFIX[group]}:{entity_id}"
    else:
        raise CheckOutputError(
            f"{path} names an entity this check does not know: {_clip(group)!r} {entity_id}"
        )
    return [_Verdict(target, status, _evidence(result, path, context))]


def _summary(
    test: dict[str, Any], path: str, context: dict[str, Any], verdicts: list[_Verdict]
) -> list[_Verdict]:
    """A node-wide verdict where a test_summary is worse than every per-target result (a failure
    DCGM reports on no entity is not lost); nothing otherwise."""
    summary = _field(test, "test_summary", dict, path)
    status = _status(summary, f"{path}.test_summary")
    if status is None or status is Status.PASS:
        return []
    if any(SEVERITY[verdict.status] >= SEVERITY[status] for verdict in verdicts):
        return []
    return [_Verdict("", status, _evidence(summary, f"{path}.test_summary", context))]


def _status(result: dict[str, Any], path: str) -> Status | None:
    """The verdict of a result's "status" word; None for skipped and not run; CheckOutputError otherwise."""
    word = _field(result, "status", str, path)
    folded = word.strip().casefold()
    if folded in _NOT_JUDGED:
        return None
    if folded not in _VERDICTS:
        raise CheckOutputError(f"{path}.status is a word this check does not know: {_clip(word)!r}")
    return _VERDICTS[folded]


def _evidence(result: dict[str, Any], path: str, context: dict[str, Any]) -> dict[str, Any]:
    """The context plus dcgmi's own status word, warnings (text and error ids) and info, clipped."""
    evidence = {**context, "dcgm_status": result["status"]}
    warnings = _expect(result.get("warnings", []), list, f"{path}.warnings")
    texts, error_ids = [], []
    for index, warning in enumerate(warnings[:_MAX_TEXTS]):
        if isinstance(warning, str):
            texts.append(_clip(warning))
        else:
            warning = _expect(warning, dict, f"{path}.warnings[{index}]")
            texts.append(_clip(_field(warning, "warning", str, f"{path}.warnings[{index}]")))
            if isinstance(warning.get("error_id"), int):
                error_ids.append(warning["error_id"])
    if texts:
        evidence["warnings"] = texts
    if error_ids:
        evidence["error_ids"] = error_ids
    info = result.get("info", [])
    info = [info] if isinstance(info, str) else _expect(info, list, f"{path}.info")
    if info:
        evidence["info"] = [_clip(str(line)) for line in info[:_MAX_TEXTS]]
    return evidence


def _field(holder: dict[str, Any], key: str, kind: type, path: str) -> Any:
    """`holder[key]`, which must be present and of `kind` (a bool is no int)."""
    if key not in holder:
        raise CheckOutputError(f"{path} has no {key!r}")
    return _expect(holder[key], kind, f"{path}.{key}")


def _expect(value: Any, kind: type, path: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CheckOutputError(f"{path} is {type(value).__name__}, not {kind.__name__}")
    return value


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_TEXT_CHARS else text[:_MAX_TEXT_CHARS] + "…"

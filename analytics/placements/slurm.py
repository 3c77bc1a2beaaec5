"""What runs where, from Slurm's `squeue --json` (openapi v0.0.38 of Slurm 22.05; the 23.x shapes of a
job state, a list, and of a number, {"set", "number"}, are read too).

A job on N nodes is N placements: its id ("<array job>_<task>" for an array task), user, the GPU indices
its gres detail gives per node (in the order of its expanded `nodes`), from its start; a job that has
ended (COMPLETED, CANCELLED... still listed for MinJobAge) until its end time. A pending job has none.
Every field read is checked against the shape Slurm writes; anything else, or a non-empty `errors`,
refuses the whole answer with a PlacementError naming the JSON path, so one broken job never closes the
placements already stored of the others.
"""

from __future__ import annotations

import json
import re
from typing import Any

from analytics.errors import PlacementError
from analytics.store.records import Placement
from analytics.topology.importers.slurm import expand_hostlist
from analytics.topology.model import Source

RUNNING_STATES = frozenset(
    {"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "STOPPED"}
)
ENDED_STATES = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
    | {"OUT_OF_MEMORY"}
)
WAITING_STATES = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT", "REVOKED"}
    | {"RESIZING"}
)
_NODE_NAME = re.compile(r"[A-Za-z0-9._-]{1,253}\Z")  # what slurm.conf's NodeName takes (a DNS name)
# One GPU entry of a gres detail: "gpu(IDX:0-1)", "gpu:2(IDX:0,2)", "gpu:a100:4(IDX:0-3)".
_GPU_DETAIL = re.compile(r"gpu(?::[A-Za-z0-9_.-]+)?(?::[0-9]+)?\(IDX:([0-9,-]*|N/A)\)\Z")


def parse_squeue(text: str, source: str = "squeue --json") -> list[Placement]:
    """The placements of every job `squeue --json` lists in `text`; PlacementError (naming `source` and
    the JSON path) on anything not of Slurm's shape."""
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PlacementError(source, "$", f"not JSON: {error}") from None
    if not isinstance(document, dict):
        raise PlacementError(source, "$", "not an object")
    if document.get("errors"):
        raise PlacementError(source, "$.errors", f"Slurm reports errors: {document['errors']!r:.200}")
    jobs = document.get("jobs")
    if not isinstance(jobs, list):
        raise PlacementError(source, "$.jobs", "missing or not a list")
    return [
        placement
        for index, job in enumerate(jobs)
        for placement in _job(JsonPath(source, f"$.jobs[{index}]"), job)
    ]


class JsonPath:
    """Where in the document a value is, to name in a PlacementError."""

    def __init__(self, source: str, where: str) -> None:
        self.source, self.where = source, where

    def error(self, field: str, what: str) -> PlacementError:
        return PlacementError(self.source, f"{self.where}.{field}", what)

    def get(self, job: dict[str, Any], field: str, kind: type, default: Any = ...) -> Any:
        """job[field], which must be a `kind` (not a bool for int); `default` where it may be missing."""
        if field not in job and default is not ...:
            return default
        value = job.get(field)
        if kind is int:
            value = _number(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.error(field, f"{value!r:.80} is not a {kind.__name__}")
        return value


def _number(value: Any) -> Any:
    """A Slurm number: a plain int, or 23.x's {"set": true, "number": n}; None when not set."""
    if isinstance(value, dict) and set(value) >= {"set", "number"}:
        return value["number"] if value["set"] is True else None
    return value


def _job(path: JsonPath, job: Any) -> list[Placement]:
    if not isinstance(job, dict):
        raise PlacementError(path.source, path.where, "not an object")
    state = _state(path, job.get("job_state"))
    if state in WAITING_STATES:
        return []
    nodes_text = path.get(job, "nodes", str)
    try:
        nodes = expand_hostlist(nodes_text) if nodes_text else []
    except ValueError as error:
        raise path.error("nodes", f"{nodes_text!r:.80}: {error}") from None
    if bad := next((node for node in nodes if not _NODE_NAME.match(node)), None):
        raise path.error("nodes", f"{bad!r:.80} is not a node name")
    start = path.get(job, "start_time", int)
    if not nodes or start <= 0:
        return []  # ended before it started (cancelled while pending)
    until = None
    if state in ENDED_STATES:
        until = path.get(job, "end_time", int)
        if until < start:
            raise path.error("end_time", f"{until} is before start_time {start}")
    gpus = _gpus(path, path.get(job, "gres_detail", list, []), len(nodes))
    user = path.get(job, "user_name", str, "")
    return [
        Placement(
            Source.SLURM,
            _job_id(path, job),
            user,
            node,
            node_gpus,
            float(start),
            None if until is None else float(until),
        )
        for node, node_gpus in zip(nodes, gpus, strict=True)
    ]


def _state(path: JsonPath, value: Any) -> str:
    """A job's base state: 22.05 writes a string, 23.x a list whose first item is the base state."""
    state = value[0] if isinstance(value, list) and value else value
    if state not in RUNNING_STATES | ENDED_STATES | WAITING_STATES:
        raise path.error("job_state", f"{value!r:.80} is not a Slurm job state")
    return state


def _job_id(path: JsonPath, job: dict[str, Any]) -> str:
    """The id squeue shows: "<job_id>", or "<array_job_id>_<array_task_id>" for an array task."""
    job_id = path.get(job, "job_id", int)
    task = _number(job.get("array_task_id"))
    if task is None:
        return str(job_id)
    return f"{path.get(job, 'array_job_id', int)}_{path.get(job, 'array_task_id', int)}"


def _gpus(path: JsonPath, details: list[Any], nodes: int) -> list[tuple[int, ...]]:
    """The GPU indices held on each of the job's `nodes` nodes from its gres detail (one string per node,
    e.g. "gpu:a100:4(IDX:0-3),mps:0"); () for every node where it has none."""
    if not details:
        return [()] * nodes
    if len(details) != nodes:
        raise path.error("gres_detail", f"{len(details)} entries for {nodes} nodes")
    held = []
    for index, detail in enumerate(details):
        if not isinstance(detail, str):
            raise path.error(f"gres_detail[{index}]", f"{detail!r:.80} is not a string")
        indices: list[int] = []
        for entry in re.split(r",(?![^()]*\))", detail) if detail else []:
            if not (entry == "gpu" or entry.startswith("gpu:") or entry.startswith("gpu(")):
                continue  # another gres (mps, shard...)
            match = _GPU_DETAIL.match(entry)
            if match is None:
                raise path.error(f"gres_detail[{index}]", f"{entry!r:.80} is not gpu[:type][:count](IDX:...)")
            if match.group(1) not in ("", "N/A"):
                try:
                    indices += map(int, expand_hostlist(f"[{match.group(1)}]"))  # IDX is a bracket's body
                except ValueError as error:
                    raise path.error(f"gres_detail[{index}]", f"{entry!r:.80}: {error}") from None
        held.append(tuple(sorted(set(indices))))
    return held

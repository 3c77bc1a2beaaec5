"""squeue --json read into placements: a real answer of Slurm 22.05 and hostile variants of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analytics.errors import PlacementError
from analytics.placements.slurm import parse_squeue
from analytics.store.records import Placement
from analytics.topology.model import Source

# squeue --json of the real slurmctld of tests/support/slurm.py (nodes vela-001, -002, -003, -007) after
# `sbatch -N 2 --wrap "sleep 30"` (job 1, then scancel'ed) and `sbatch -N 1 --wrap "sleep 30"` (job 2).
CAPTURED = Path(__file__).parents[2] / "fixtures/placements/squeue-22.05-one-running-one-cancelled.json"


def captured() -> dict[str, Any]:
    return json.loads(CAPTURED.read_text())


def with_job(change: dict[str, Any], index: int = 1) -> str:
    document = captured()
    document["jobs"][index].update(change)
    return json.dumps(document)


def test_a_running_job_holds_its_node_from_its_start_and_a_cancelled_one_ends_at_its_end() -> None:
    document = captured()
    cancelled, running = document["jobs"]
    assert parse_squeue(CAPTURED.read_text()) == [
        Placement(Source.SLURM, "1", "root", "vela-001", (), cancelled["start_time"], cancelled["end_time"]),
        Placement(Source.SLURM, "1", "root", "vela-002", (), cancelled["start_time"], cancelled["end_time"]),
        Placement(Source.SLURM, "2", "root", "vela-003", (), running["start_time"], None),
    ]


def test_the_gpus_of_each_node_come_from_its_gres_detail_in_node_order() -> None:
    text = with_job(
        {"nodes": "vela-[001,007]", "gres_detail": ["gpu:a100:2(IDX:0-1),mps:0", "gpu(IDX:1,3-4)"]}
    )
    placements = [p for p in parse_squeue(text) if p.job == "2"]
    assert [(p.node, p.gpus) for p in placements] == [("vela-001", (0, 1)), ("vela-007", (1, 3, 4))]


def test_a_pending_job_and_one_cancelled_before_it_started_hold_no_node() -> None:
    assert [p.job for p in parse_squeue(with_job({"job_state": "PENDING", "nodes": ""}))] == ["1", "1"]
    cancelled = {"job_state": "CANCELLED", "start_time": 0, "nodes": ""}
    assert [p.job for p in parse_squeue(with_job(cancelled))] == ["1", "1"]


def test_the_shapes_of_slurm_23_read_the_same() -> None:
    text = with_job({"job_state": ["RUNNING"], "start_time": {"set": True, "infinite": False, "number": 5}})
    assert parse_squeue(text)[-1].since == 5


def test_an_array_task_is_named_as_squeue_shows_it() -> None:
    assert parse_squeue(with_job({"array_job_id": 7, "array_task_id": 3}))[-1].job == "7_3"


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"job_state": "DANCING"}, "$.jobs[1].job_state"),
        ({"nodes": "vela-[003"}, "$.jobs[1].nodes"),
        ({"nodes": 3}, "$.jobs[1].nodes"),
        ({"nodes": "vela 003"}, "$.jobs[1].nodes"),
        ({"nodes": "vela-[1-2]'"}, "$.jobs[1].nodes"),
        ({"start_time": "yesterday"}, "$.jobs[1].start_time"),
        ({"start_time": True}, "$.jobs[1].start_time"),
        ({"job_id": None}, "$.jobs[1].job_id"),
        ({"user_name": ["root"]}, "$.jobs[1].user_name"),
        ({"gres_detail": ["gpu(IDX:0)", "gpu(IDX:1)"]}, "$.jobs[1].gres_detail"),
        ({"gres_detail": ["gpu(IDX:3-0)"]}, "$.jobs[1].gres_detail[0]"),
        ({"gres_detail": ["gpu:a100:1(IDX:0"]}, "$.jobs[1].gres_detail[0]"),
        ({"gres_detail": [7]}, "$.jobs[1].gres_detail[0]"),
        ({"job_state": "COMPLETED", "end_time": 1}, "$.jobs[1].end_time"),
    ],
)
def test_a_job_not_of_slurms_shape_refuses_the_whole_answer_naming_where(change: dict, where: str) -> None:
    with pytest.raises(PlacementError) as refused:
        parse_squeue(with_job(change), source="vela squeue")
    assert (refused.value.source, refused.value.where) == ("vela squeue", where)
    assert str(refused.value).startswith(f"vela squeue: {where}: ")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("{", "$"),
        ("[]", "$"),
        ('{"meta": {}}', "$.jobs"),
        ('{"jobs": [1]}', "$.jobs[0]"),
        ('{"jobs": [], "errors": [{"error": "Unable to contact slurm controller"}]}', "$.errors"),
    ],
)
def test_an_answer_that_is_not_squeues_is_refused(text: str, where: str) -> None:
    with pytest.raises(PlacementError) as refused:
        parse_squeue(text)
    assert refused.value.where == where

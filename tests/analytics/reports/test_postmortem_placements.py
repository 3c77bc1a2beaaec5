"""Postmortems of jobs the schedulers placed: a job that sent no step times is reported on the nodes and
over the span its placements give, and a job that did gains the nodes its steps do not name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analytics.errors import PostmortemError
from analytics.placements.slurm import parse_squeue
from analytics.reports.postmortem import build_report, to_json, to_markdown
from analytics.store import Store
from analytics.store.records import Placement
from analytics.topology.model import Source
from tests.support.incident import NODE, THROTTLED_GPU, Incident, seed_incident

# squeue --json of the suite's real slurmctld (tests/analytics/placements/test_slurm.py): job 1 ran on
# vela-001 and vela-002 and was cancelled.
SQUEUE = Path(__file__).parents[2] / "fixtures/placements/squeue-22.05-one-running-one-cancelled.json"


@pytest.fixture
def incident(store: Store, tmp_path: Path) -> Incident:
    return seed_incident(store, tmp_path)


def test_a_job_without_steps_is_reported_on_its_placed_node_over_its_span(store: Store, incident: Incident):
    since, until = incident.start + 10, incident.end - 10
    placed = Placement(Source.KUBERNETES, "train-7f", "ana", NODE, (THROTTLED_GPU,), since, until)
    store.replace_placements(Source.KUBERNETES, [placed], now=incident.end)

    report = build_report(store, job="train-7f", start=incident.start - 3600, end=incident.end + 3600)

    assert (report.nodes, report.nodes_from, report.placements) == ((NODE,), "placements", (placed,))
    assert (report.start, report.end) == (pytest.approx(since), pytest.approx(until))
    assert [event.what for event in report.events if event.source == "anomaly"] == [
        f"gpu_throttle gpu:{THROTTLED_GPU} opened",
        f"gpu_throttle gpu:{THROTTLED_GPU} closed",
    ]
    assert ("DCGM_FI_DEV_SM_CLOCK", f'gpu="{THROTTLED_GPU}"') in {
        (x.metric, x.labels) for x in report.excursions
    }
    markdown = to_markdown(report)
    assert "The job sent no step times: its nodes and span come from its placements (k8s)." in markdown
    assert f"| train-7f | ana | {NODE} | {THROTTLED_GPU} |" in markdown
    assert to_json(report)["placements"][0] | {"from": None, "until": None} == {
        "source": "k8s",
        "job": "train-7f",
        "user": "ana",
        "node": NODE,
        "gpus": [THROTTLED_GPU],
        "from": None,
        "until": None,
    }


def test_a_cancelled_slurm_job_read_from_squeue_is_reported_on_both_its_nodes(
    store: Store, incident: Incident
):
    document = json.loads(SQUEUE.read_text())
    document["jobs"][0].update(start_time=int(incident.start) + 1, end_time=int(incident.end) - 1)
    store.replace_placements(Source.SLURM, parse_squeue(json.dumps(document)), now=incident.end)

    report = build_report(store, job="1", start=incident.start, end=incident.end)

    assert (report.nodes, report.nodes_from) == (("vela-001", NODE), "placements")
    assert {(p.node, p.until) for p in report.placements} == {
        ("vela-001", int(incident.end) - 1),
        (NODE, int(incident.end) - 1),
    }
    assert f"gpu_throttle gpu:{THROTTLED_GPU} opened" in [event.what for event in report.events]
    assert "(slurm)" in to_markdown(report)


def test_placements_add_the_nodes_a_jobs_steps_do_not_name(store: Store, incident: Incident):
    placed = [
        Placement(Source.SLURM, "job-a", "bo", node, (0, 1), incident.start, None)
        for node in (NODE, "vela-003")
    ]
    store.replace_placements(Source.SLURM, placed, now=incident.end)

    report = build_report(store, job="job-a", start=incident.start, end=incident.end)

    assert (report.nodes, report.nodes_from) == (("vela-001", NODE, "vela-003"), "steps and placements")
    assert (report.start, report.end) == (incident.start, incident.end)
    assert "vela-003" in {gap.node for gap in report.gaps}
    assert "| job-a | bo | vela-003 | 0, 1 |" in to_markdown(report)
    assert "still running" in to_markdown(report)


def test_a_node_report_lists_what_ran_there_and_a_job_with_neither_is_refused(
    store: Store, incident: Incident
):
    placed = Placement(Source.SLURM, "42", "cy", NODE, (), incident.start, incident.end - 5)
    store.replace_placements(Source.SLURM, [placed], now=incident.end)

    assert build_report(store, node=NODE, start=incident.start, end=incident.end).placements == (placed,)
    with pytest.raises(PostmortemError, match="job 'job-z' has no steps and no placements"):
        build_report(store, job="job-z", start=incident.start, end=incident.end)

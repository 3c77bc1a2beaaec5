"""What a straggler costs, read from evidence as every reader reads it: absent, unreadable or out-of-range
figures count as absent, and the figures read the same wherever they are shown."""

from __future__ import annotations

import math

import pytest

from analytics.evidence import Evidence, stored, to_json
from analytics.reports.straggler import StragglerCost, cost_text, gpu_hours, percent, straggler_cost
from tests.support.evidence import example


def test_the_cost_is_read_from_stored_text_or_typed_evidence():
    evidence = example("slow_node", ratio=1.5, job_slowdown=0.314, lost_gpu_hours=2.43)
    assert straggler_cost(stored("slow_node", to_json(evidence))) == straggler_cost(evidence)
    assert straggler_cost(evidence) == StragglerCost(0.314, 2.43) and StragglerCost(0.314, 2.43).known
    assert straggler_cost(example("slow_node", job_slowdown=0, lost_gpu_hours=0)) == StragglerCost(0.0, 0.0)


@pytest.mark.parametrize(
    "evidence",
    [
        None,
        *(
            stored("slow_node", text)  # what the store's readers make of text that is not slow_node evidence
            for text in (
                "",
                "{}",
                "not json",
                "[0.3, 2]",
                '{"job_slowdown": "31%", "lost_gpu_hours": "2.4"}',
                '{"job_slowdown": true, "lost_gpu_hours": null}',
            )
        ),
        example("slow_node", job_slowdown=1.0, lost_gpu_hours=-0.1),
        example("slow_node", job_slowdown=math.nan, lost_gpu_hours=math.inf),
        example("gpu_fault"),  # another kind
    ],
)
def test_missing_unreadable_or_impossible_figures_are_absent(evidence: Evidence | None):
    cost = straggler_cost(evidence)

    assert cost == StragglerCost() and not cost.known
    assert (percent(cost.job_slowdown), gpu_hours(cost.lost_gpu_hours), cost_text(cost)) == ("n/a", "n/a", "")


def test_figures_read_as_people_read_them():
    assert [percent(x) for x in (0.314, 0.05, 0.004, 0.0)] == ["31%", "5%", "0.4%", "0%"]
    assert [gpu_hours(x) for x in (2.43, 0.043, 0.0004, 0.0, 37.2, 1234.5)] == [
        "2.4", "0.043", "< 0.001", "0", "37", "1,234",
    ]  # fmt: skip
    cost = StragglerCost(0.314, 2.43)
    assert cost_text(cost, "run-42") == "slows job run-42 by 31% (2.4 GPU-hours lost so far)"
    assert cost_text(cost) == "slows its job by 31% (2.4 GPU-hours lost so far)"

"""What a straggler costs its job, read from an anomaly's evidence (analytics.evidence.SlowNodeEvidence):
the one place that judges the figures, for the alert annotations, the drain policy, the UI's pages and the
postmortem report.

The slow_node detector puts two numbers in the evidence of each anomaly it opens:

    job_slowdown    the fraction of the job's step time due to the node, in [0, 1): 0.30 means the job's
                    steps would be 30% shorter without it
    lost_gpu_hours  the anomaly's cost so far in GPU-hours of the whole job (job_slowdown x elapsed time
                    x the job's GPUs), >= 0

Anomalies written before the detector reported them, anomalies of other kinds and stored evidence that
could not be read (analytics.evidence.Unreadable) lack them. A value that is not a finite number in its
range counts as absent too: every reader shows nothing ("n/a") rather than a wrong figure, and never fails
on it.

Standard library only: the alerting code imports this without pulling in pandas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from analytics.evidence import Evidence, SlowNodeEvidence

COSTED_KINDS = ("slow_node",)  # the anomaly kinds whose evidence may carry job_slowdown, lost_gpu_hours
JOB_SLOWDOWN, LOST_GPU_HOURS = "job_slowdown", "lost_gpu_hours"
ABSENT = "n/a"  # what a reader shows for a figure the evidence lacks


@dataclass(frozen=True)
class StragglerCost:
    """What an anomaly costs its job; None where its evidence does not say."""

    job_slowdown: float | None = None
    lost_gpu_hours: float | None = None

    @property
    def known(self) -> bool:
        """Both figures are known: enough to state the cost in a sentence."""
        return self.job_slowdown is not None and self.lost_gpu_hours is not None


def straggler_cost(evidence: Evidence | None) -> StragglerCost:
    """The cost an anomaly's evidence states; absent figures are None."""
    if not isinstance(evidence, SlowNodeEvidence):
        return StragglerCost()
    return StragglerCost(
        job_slowdown=_number(evidence.job_slowdown, below=1.0),
        lost_gpu_hours=_number(evidence.lost_gpu_hours),
    )


def _number(value: Any, below: float = math.inf) -> float | None:
    """`value` as a float when it is a finite number in [0, below); None otherwise (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and 0 <= value < below else None


def percent(fraction: float | None) -> str:
    """A job slowdown as people read it: 0.314 -> "31%", 0.004 -> "0.4%"; "n/a" when unknown."""
    if fraction is None:
        return ABSENT
    return f"{fraction:.0%}" if fraction >= 0.01 or fraction == 0 else f"{fraction:.1%}"


def gpu_hours(hours: float | None) -> str:
    """GPU-hours with two significant figures below 10 ("0.043", "2.4"), whole above ("1,234"), never
    in exponent form; "n/a" when unknown."""
    if hours is None:
        return ABSENT
    if hours < 0.001:
        return "0" if hours == 0 else "< 0.001"
    return f"{hours:.2g}" if hours < 10 else f"{hours:,.0f}"


def shown_figures(cost: StragglerCost) -> dict[str, str]:
    """The known figures as people read them, by evidence key: {"job_slowdown": "31%",
    "lost_gpu_hours": "2.4"}; an unknown figure is left out."""
    shown = {JOB_SLOWDOWN: (cost.job_slowdown, percent), LOST_GPU_HOURS: (cost.lost_gpu_hours, gpu_hours)}
    return {key: text(value) for key, (value, text) in shown.items() if value is not None}


def cost_text(cost: StragglerCost, job: str = "") -> str:
    """The cost in words, "slows job run-42 by 31% (2.4 GPU-hours lost so far)"; "" when not known."""
    if not cost.known:
        return ""
    whose = f"job {job}" if job else "its job"
    lost = gpu_hours(cost.lost_gpu_hours)
    return f"slows {whose} by {percent(cost.job_slowdown)} ({lost} GPU-hours lost so far)"

"""Postmortem reports: what happened to a node or a job in a time window, for the people who look back.

    report = build_report(source, node="vela-002", start=t0, end=t1)    # or job="run-42"
    print(to_markdown(report))                                            # or to_json / to_csv

report.py builds the timeline, excursions.py finds the metric excursions that mattered, layers.py what sat
above the nodes (the topology as it was, the shared faults), render.py writes
it out; model.py holds what they share.
"""

from analytics.reports.postmortem.model import Event, Excursion, Report, SharedFault, as_dict
from analytics.reports.postmortem.render import summarize, to_csv, to_json, to_markdown
from analytics.reports.postmortem.report import build_report

__all__ = [
    "Event",
    "Excursion",
    "Report",
    "SharedFault",
    "as_dict",
    "build_report",
    "summarize",
    "to_csv",
    "to_json",
    "to_markdown",
]

"""What a GPU's fault asks an operator to do, read from an anomaly's evidence: the one place that reads
it, for the alert annotations and the drain policy, and the words people read for each action.

The gpu_fault detector (analytics.detectors.gpu_fault) puts two fields in the evidence of the kinds it
reports (ACTION_KINDS; analytics.evidence.XidEvidence):

    action       the most disruptive analytics.xid_catalog.Action its signals ask for ("reset_gpu")
    action_text  the same in words (ACTION_TEXT)

Anomalies written before the detector reported an action, anomalies of other kinds and stored evidence
that could not be read (analytics.evidence.Unreadable, such as an action this code does not know)
recommend none (None): every reader shows nothing rather than a wrong action.

Standard library only, as analytics.reports.straggler: the alerting code imports this without pandas.
"""

from __future__ import annotations

from collections.abc import Mapping

from analytics.evidence import Evidence, XidEvidence
from analytics.xid_catalog import Action

ACTION_KINDS = ("gpu_fault", "gpu_app_error")  # the anomaly kinds whose evidence carries an action
ACTION, ACTION_TEXT_KEY = "action", "action_text"
ACTION_TEXT: Mapping[Action, str] = {
    Action.NONE: "nothing to do on the node; watch whether it recurs",
    Action.RESTART_JOB: "restart the job; the node may stay in service",
    Action.RESET_GPU: "drain the node and reset the GPU, then return it if the GPU stays clean",
    Action.REBOOT_NODE: "drain the node and reboot it",
    Action.INSPECT: "drain the node and have the GPU inspected: it cannot repair itself",
}


def recommended_action(evidence: Evidence | None) -> Action | None:
    """The action an anomaly's evidence recommends; None where it recommends none."""
    return evidence.action if isinstance(evidence, XidEvidence) else None


def shown_action(evidence: Evidence | None) -> dict[str, str]:
    """The recommended action as annotation templates use it, {"action": "reset_gpu", "action_text":
    "drain the node and reset the GPU, ..."}; {} when the evidence recommends none."""
    action = recommended_action(evidence)
    return {} if action is None else {ACTION: action.value, ACTION_TEXT_KEY: ACTION_TEXT[action]}

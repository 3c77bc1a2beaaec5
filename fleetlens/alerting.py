"""Wires the hub's alerting from the config: rules and receivers (alerts:), the drain controller and
its backend (drain:), the node lifecycle (lifecycle:). The hub runs the result after each detection
window."""

from __future__ import annotations

import time
from typing import Any

from alerts.backends import DrainBackend
from alerts.backends.exec_hook import ExecBackend
from alerts.backends.slurm import SlurmBackend
from alerts.drain import DrainController
from alerts.engine import AlertEngine
from alerts.lifecycle import CommandTrigger, Lifecycle
from alerts.notifiers import AlertmanagerNotifier, LogNotifier, Notifier, WebhookNotifier
from alerts.service import AlertService
from analytics.store.checks import checks_between
from analytics.store.topology import TopologyReads
from fleetlens.config import AlertsConfig, DrainConfig, LifecycleConfig


def drain_backends(config: DrainConfig, health_label_prefix: str | None = None) -> list[DrainBackend]:
    """The backend drain.backend names, configured (none for dry-run without one); Kubernetes labels
    `<health_label_prefix>/gpuhealth` when given (the lifecycle's)."""
    match config.backend:
        case "slurm":
            return [SlurmBackend(scontrol=config.scontrol)]
        case "kubernetes":
            from alerts.backends.kubernetes import KubernetesBackend  # the client is slow to import: on use

            return [
                KubernetesBackend(
                    evict=config.kubernetes_evict,
                    taint_key=config.kubernetes_taint_key,
                    taint_effect=config.kubernetes_taint_effect,
                    health_label_prefix=health_label_prefix,
                )
            ]
        case "exec":
            return [ExecBackend(config.exec_command)]
    return []


def build_alert_service(
    store: Any, alerts: AlertsConfig, drain: DrainConfig, lifecycle: LifecycleConfig | None = None
) -> AlertService:
    """The alert service on `store`, its controller (and lifecycle, when enabled) taking up where the
    audit says it left off."""
    lifecycle = lifecycle or LifecycleConfig()
    prefix = lifecycle.label_prefix if lifecycle.enabled else None
    engine = AlertEngine(alerts.alert_rules(), resend_s=alerts.resend_s, generator_url=alerts.generator_url)
    notifiers: list[Notifier] = [AlertmanagerNotifier(url) for url in alerts.alertmanager_urls]
    notifiers += [WebhookNotifier(url) for url in alerts.webhook_urls]
    notifiers = notifiers or [LogNotifier()]  # with no receiver, alerts go to the hub's log
    parents = TopologyReads(store).parents  # the per-parent drain limit's topology, read when it changes
    controller = DrainController(drain.policy(), drain_backends(drain, prefix), fleet_size=0, parents=parents)
    tested = None
    if lifecycle.enabled:
        trigger = CommandTrigger(lifecycle.command, timeout_s=lifecycle.command_timeout_s)
        results = lambda node, since, until: checks_between(store, since, until, node=node)  # noqa: E731
        tested = Lifecycle(lifecycle.policy(), controller, trigger, results)
    service = AlertService(store, engine, notifiers, controller, tested)
    service.restore(time.time())
    return service

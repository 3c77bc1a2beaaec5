"""Wires the hub's alerting from the config: rules and receivers (alerts:), the drain controller and
its backend (drain:). The hub runs the result after each detection window."""

from __future__ import annotations

import time
from typing import Any

from alerts.backends import DrainBackend
from alerts.backends.exec_hook import ExecBackend
from alerts.backends.slurm import SlurmBackend
from alerts.drain import DrainController
from alerts.engine import AlertEngine
from alerts.notifiers import AlertmanagerNotifier, LogNotifier, Notifier, WebhookNotifier
from alerts.service import AlertService
from analytics.store.topology import TopologyReads
from fleetlens.config import AlertsConfig, DrainConfig


def drain_backends(config: DrainConfig) -> list[DrainBackend]:
    """The backend drain.backend names, configured (none for dry-run without one)."""
    match config.backend:
        case "slurm":
            return [SlurmBackend(scontrol=config.scontrol)]
        case "kubernetes":
            from alerts.backends.kubernetes import KubernetesBackend  # the client is slow to import: on use

            return [KubernetesBackend(evict=config.kubernetes_evict)]
        case "exec":
            return [ExecBackend(config.exec_command)]
    return []


def build_alert_service(store: Any, alerts: AlertsConfig, drain: DrainConfig) -> AlertService:
    """The alert service on `store`, its controller taking up where the audit says it left off."""
    engine = AlertEngine(alerts.alert_rules(), resend_s=alerts.resend_s, generator_url=alerts.generator_url)
    notifiers: list[Notifier] = [AlertmanagerNotifier(url) for url in alerts.alertmanager_urls]
    notifiers += [WebhookNotifier(url) for url in alerts.webhook_urls]
    notifiers = notifiers or [LogNotifier()]  # with no receiver, alerts go to the hub's log
    parents = TopologyReads(store).parents  # the per-parent drain limit's topology, read when it changes
    controller = DrainController(drain.policy(), drain_backends(drain), fleet_size=0, parents=parents)
    service = AlertService(store, engine, notifiers, controller)
    service.restore(time.time())
    return service

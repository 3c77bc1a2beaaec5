"""Notifiers against real receivers: Debian's Alertmanager, and loopback HTTP servers that answer what a
test asks for (errors, nothing at all), so that every failure is a real one on the wire."""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from email.message import Message

import httpx
import pytest

from alerts.model import Alert
from alerts.notifiers import AlertmanagerNotifier, Delivery, DeliveryQueue, LogNotifier, WebhookNotifier
from fleetlens.alerting import build_alert_service
from fleetlens.config import AlertsConfig, DrainConfig
from tests.support.alertmanager import alertmanager
from tests.support.clock import FakeClock
from tests.support.loopback import LoopbackPostServer
from tests.support.peers import free_port, hung_listener

STARTS_AT = 1764500000.25  # 2025-11-30T10:53:20.250Z


def fault(node: str = "vela-007", *, kind: str = "gpu_fault", state: str = "firing", **fields) -> Alert:
    """An alert as the engine raises it for an anomaly of `kind` on `node`."""
    return Alert(
        fingerprint=f"{kind}-{node}",
        labels={"alertname": f"Fleetlens_{kind}", "node": node, "kind": kind, "severity": "critical"},
        annotations={"summary": f"{kind} on {node}", "evidence": '{"xid": [79]}'},
        state=state,
        starts_at=fields.pop("starts_at", STARTS_AT),
        generator_url=f"http://fleetlens.example/anomalies?node={node}",
        **fields,
    )


class Receiver:
    """A loopback receiver that answers POSTs with `statuses` in turn (the last one repeats) and keeps
    each JSON body and its headers."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses or [200])
        self.bodies: list = []
        self.headers: list[Message] = []

    def __call__(self, body: bytes, headers: Message) -> tuple[int, str, bytes]:
        self.bodies.append(json.loads(body))
        self.headers.append(headers)
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return status, "text/plain", b"simulated failure" if status >= 400 else b"{}"


@pytest.fixture
def serve() -> Iterator:
    """serve(*statuses) -> (receiver, its URL); servers stop when the test ends."""
    with contextlib.ExitStack() as servers:

        def start(*statuses: int) -> tuple[Receiver, str]:
            receiver = Receiver(*statuses)
            return receiver, servers.enter_context(LoopbackPostServer(receiver)).url

        yield start


@pytest.fixture(scope="module")
def alertmanager_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with alertmanager(tmp_path_factory.mktemp("alertmanager")) as base:
        yield base


def alerts_shown(base: str, alert: Alert) -> list[dict]:
    """What Alertmanager's API (and so its UI and amtool) lists for `alert`'s name and node."""
    matchers = [f'alertname="{alert.alertname}"', f'node="{alert.node}"']
    answer = httpx.get(f"{base}/api/v2/alerts", params={"filter": matchers}, timeout=5)
    answer.raise_for_status()
    return answer.json()


def instant(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339).timestamp()


@pytest.mark.integration
def test_alertmanager_lists_a_firing_alert_and_drops_it_once_resolved(alertmanager_url: str):
    notifier = AlertmanagerNotifier(alertmanager_url)
    firing = fault("vela-011", starts_at=time.time() - 60)

    assert notifier.send([firing]).ok
    [shown] = alerts_shown(alertmanager_url, firing)
    assert shown["labels"] == dict(firing.labels)
    assert shown["annotations"] == dict(firing.annotations)
    assert shown["generatorURL"] == firing.generator_url
    assert shown["status"]["state"] == "active"
    assert instant(shown["startsAt"]) == pytest.approx(firing.starts_at, abs=0.001)
    # A firing alert stays active only for a margin: if fleetlens stops resending it, it expires.
    assert time.time() + 60 < instant(shown["endsAt"]) < time.time() + 300

    resolved = replace(firing, state="resolved", ends_at=time.time())
    delivery = notifier.send([resolved])
    assert (delivery.ok, delivery.states) == (True, ("resolved",))
    assert alerts_shown(alertmanager_url, resolved) == []


@pytest.mark.integration
def test_a_firing_alert_that_is_no_longer_resent_expires_in_alertmanager(alertmanager_url: str):
    firing = fault("vela-012", starts_at=time.time())
    assert AlertmanagerNotifier(alertmanager_url, valid_for_s=1.0).send([firing]).ok
    assert alerts_shown(alertmanager_url, firing)

    deadline = time.monotonic() + 5
    while alerts_shown(alertmanager_url, firing) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alerts_shown(alertmanager_url, firing) == []


def test_alertmanager_gets_firing_and_resolved_alerts_but_never_pending_ones(serve):
    receiver, url = serve(200)
    clock = FakeClock(STARTS_AT + 30)
    notifier = AlertmanagerNotifier(url, clock=clock)

    nothing = notifier.send([fault("vela-001", state="pending")])
    assert (nothing.ok, nothing.alerts, receiver.bodies) == (True, 0, [])

    resolved = fault("vela-003", state="resolved", ends_at=STARTS_AT + 600)
    delivery = notifier.send([fault("vela-001", state="pending"), fault("vela-002"), resolved])
    assert (delivery.ok, delivery.alerts, delivery.states) == (True, 2, ("firing", "resolved"))
    assert delivery.fingerprints == ("gpu_fault-vela-002", "gpu_fault-vela-003")
    [sent] = receiver.bodies
    assert [alert["labels"]["node"] for alert in sent] == ["vela-002", "vela-003"]
    assert [alert["startsAt"] for alert in sent] == ["2025-11-30T10:53:20.250Z"] * 2
    # firing: now (startsAt + 30 s) + Prometheus' 4-minute margin; resolved: when it resolved
    assert [alert["endsAt"] for alert in sent] == ["2025-11-30T10:57:50.250Z", "2025-11-30T11:03:20.250Z"]
    assert sent[0]["generatorURL"] == "http://fleetlens.example/anomalies?node=vela-002"


def test_receiver_errors_come_back_as_failed_deliveries_naming_the_url(serve):
    _, url = serve(500)
    failed = AlertmanagerNotifier(url).send([fault()])
    assert (failed.ok, failed.status, failed.attempts) == (False, 500, 1)
    assert f"{url}/api/v2/alerts" in failed.error
    assert "HTTP 500: simulated failure" in failed.error

    refused_url = f"http://127.0.0.1:{free_port()}/hook"
    refused = WebhookNotifier(refused_url).send([fault()])
    assert (refused.ok, refused.status) == (False, None)
    assert refused_url in refused.error
    assert "ConnectError" in refused.error

    with_secrets = f"http://fleet:hunter2@127.0.0.1:{free_port()}/hook?token=abc123"
    failed = WebhookNotifier(with_secrets).send([fault()])
    assert "fleet:***@127.0.0.1" in failed.error and "token=***" in failed.error
    assert "hunter2" not in failed.error and "abc123" not in failed.error


@pytest.mark.parametrize(
    ("answers", "ok", "attempts", "waits"),
    [
        ((503, 503, 200), True, 3, [0.5, 1.0]),
        ((503,), False, 4, [0.5, 1.0, 1.0]),  # the wait stops doubling at max_backoff_s
        ((429, 200), True, 2, [0.5]),
        ((400,), False, 1, []),  # a rejected payload would be rejected again
    ],
)
def test_delivery_queue_retries_with_backoff_what_may_succeed_later(serve, answers, ok, attempts, waits):
    receiver, url = serve(*answers)
    outcomes: queue.Queue[Delivery] = queue.Queue()
    slept: list[float] = []
    deliveries = DeliveryQueue(
        WebhookNotifier(url),
        on_delivery=outcomes.put,
        max_attempts=4,
        initial_backoff_s=0.5,
        max_backoff_s=1.0,
        jitter=0.1,
        sleep=slept.append,
    )
    deliveries.submit([fault()])
    delivery = outcomes.get(timeout=10)
    assert deliveries.close(timeout_s=5)

    assert (delivery.ok, delivery.attempts, len(receiver.bodies)) == (ok, attempts, attempts)
    assert slept == pytest.approx(waits, rel=0.1)
    assert ok or "simulated failure" in delivery.error


def test_a_hung_receiver_does_not_delay_another_and_does_not_hold_up_close(serve):
    _, url = serve(200)
    outcomes: queue.Queue[Delivery] = queue.Queue()
    with hung_listener() as hung:
        stuck = DeliveryQueue(
            WebhookNotifier(f"http://{hung}", name="stuck", timeout_s=2.0),
            on_delivery=outcomes.put,
            max_attempts=1,
        )
        healthy = DeliveryQueue(WebhookNotifier(url, name="healthy"), on_delivery=outcomes.put)
        started = time.monotonic()
        stuck.submit([fault()])
        healthy.submit([fault()])

        first = outcomes.get(timeout=5)
        assert (first.receiver, first.ok) == ("healthy", True)
        assert time.monotonic() - started < 1.5  # the stuck receiver's timeout is 2 s

        second = outcomes.get(timeout=5)
        assert (second.receiver, second.ok, second.status) == ("stuck", False, None)
        assert "ReadTimeout" in second.error

        stuck.submit([fault()])
        closing = time.monotonic()
        assert stuck.close(timeout_s=0.2) is False  # the batch in flight is abandoned, not waited for
        assert time.monotonic() - closing < 1.0
        assert healthy.close(timeout_s=1)


class GatedNotifier:
    """A receiver that takes each batch only when the test opens its gate."""

    name = "gated"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.busy = threading.Event()
        self.nodes: list[str] = []

    def send(self, alerts) -> Delivery:
        self.busy.set()
        self.gate.wait(timeout=5)
        self.nodes.append(alerts[0].node)
        return Delivery(
            receiver=self.name,
            ok=True,
            attempts=1,
            status=200,
            error="",
            alerts=len(alerts),
            fingerprints=tuple(alert.fingerprint for alert in alerts),
            states=tuple(alert.state for alert in alerts),
            at=time.time(),
        )


def test_a_full_queue_drops_its_oldest_batch_without_blocking_the_caller():
    notifier = GatedNotifier()
    deliveries = DeliveryQueue(notifier, max_batches=2)
    deliveries.submit([fault("vela-001")])
    assert notifier.busy.wait(timeout=5)

    started = time.monotonic()
    for node in ("vela-002", "vela-003", "vela-004"):
        deliveries.submit([fault(node)])
    assert time.monotonic() - started < 1.0  # the receiver holds its batch for up to 5 s
    assert deliveries.dropped == 1

    notifier.gate.set()
    assert deliveries.close(timeout_s=5)
    assert notifier.nodes == ["vela-001", "vela-003", "vela-004"]


def test_webhook_payload_has_alertmanagers_webhook_shape(serve):
    receiver, url = serve(200)
    notifier = WebhookNotifier(url, name="oncall", headers={"Authorization": "Bearer s3cret"})
    link_down = fault(kind="link_down", state="resolved", ends_at=STARTS_AT + 600)

    assert notifier.send([fault(), link_down]).ok
    assert notifier.send([link_down]).ok

    mixed, resolved_only = receiver.bodies
    assert receiver.headers[0]["Authorization"] == "Bearer s3cret"
    assert (mixed["version"], mixed["status"], mixed["receiver"]) == ("4", "firing", "oncall")
    assert mixed["groupLabels"] == {"node": "vela-007"}
    assert mixed["groupKey"] == '{}:{node="vela-007"}'
    assert mixed["commonLabels"] == {"node": "vela-007", "severity": "critical"}
    assert mixed["commonAnnotations"] == {"evidence": '{"xid": [79]}'}
    assert [alert["status"] for alert in mixed["alerts"]] == ["firing", "resolved"]
    assert [alert["fingerprint"] for alert in mixed["alerts"]] == ["gpu_fault-vela-007", "link_down-vela-007"]
    assert [alert["endsAt"] for alert in mixed["alerts"]] == [
        "0001-01-01T00:00:00Z",
        "2025-11-30T11:03:20.250Z",
    ]
    assert mixed["alerts"][1]["labels"]["alertname"] == "Fleetlens_link_down"
    assert set(mixed["alerts"][0]) == {
        "status",
        "labels",
        "annotations",
        "startsAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
    }
    assert resolved_only["status"] == "resolved"


def test_with_no_receiver_the_hub_logs_each_alert_once_when_it_fires_and_once_when_it_resolves(
    caplog: pytest.LogCaptureFixture,
):
    notifier = LogNotifier()
    firing, pending = fault("vela-001"), fault("vela-002", state="pending")
    with caplog.at_level(logging.INFO, logger="fleetlens.alerts.notifiers"):
        first = notifier.send([firing, pending])
        resent = notifier.send([firing])  # the engine re-sends firing alerts every resend_s
        resolved = notifier.send([replace(firing, state="resolved", ends_at=STARTS_AT + 60)])

    assert (first.ok, first.alerts, first.states) == (True, 1, ("firing",))
    assert (resent.alerts, resolved.states) == (0, ("resolved",))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("alert firing {") and 'node="vela-001"' in lines[0]
    assert lines[0].endswith("gpu_fault on vela-001") and lines[1].startswith("alert resolved")
    assert caplog.records[0].levelno == logging.WARNING


def test_a_hub_configured_with_no_receiver_sends_its_alerts_to_the_log(store):
    service = build_alert_service(store, AlertsConfig(), DrainConfig())
    try:
        assert [queue.notifier.name for queue in service.queues] == ["log"]
    finally:
        service.close()

"""Notifiers: send alerts to Alertmanager (API v2) or a JSON webhook, one queue and thread per receiver.

    notifier = AlertmanagerNotifier("http://alertmanager:9093")
    queue = DeliveryQueue(notifier, on_delivery=record)   # record(delivery) stores the outcome
    queue.submit(alerts)                                  # never blocks the detection loop
    queue.close()

A notifier's `send` is one attempt that never raises: a refused connection, a timeout or an HTTP error
comes back as a Delivery with ok False and the reason. The queue retries what can succeed later
(no answer, 429, 5xx) with exponential backoff, and each receiver has its own thread, so a receiver that
hangs or fails delays nobody else. Pending alerts are never sent: receivers hear of firing and resolved
alerts only, as they do from Prometheus.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from alerts.model import Alert
from analytics.store.redact import redacted

log = logging.getLogger("fleetlens.alerts.notifiers")

Clock = Callable[[], float]
# What Prometheus gives a firing alert's endsAt: 4 x max(evaluation interval, resend delay), 1 min each by
# default, so that Alertmanager keeps it through two lost sends but resolves it if its sender disappears.
FIRING_VALID_FOR_S = 240.0
# Alertmanager's webhook sends a firing alert's endsAt as Go's zero time.
_GO_ZERO_TIME = "0001-01-01T00:00:00Z"
_ERROR_BODY_CHARS = 200


@dataclass(frozen=True)
class Delivery:
    """The outcome of sending one batch of alerts to one receiver, as the deliveries record keeps it."""

    receiver: str
    ok: bool
    attempts: int
    status: int | None  # the receiver's HTTP status; None when it never answered
    error: str  # what went wrong and where; "" when ok
    alerts: int
    fingerprints: tuple[str, ...]
    states: tuple[str, ...]
    at: float  # unix seconds when the outcome was known

    @property
    def retryable(self) -> bool:
        """Whether sending again may succeed: no answer, throttled, or a server error (not a bad request)."""
        return not self.ok and (self.status is None or self.status == 429 or self.status >= 500)


class Notifier(Protocol):
    """A receiver of alerts."""

    name: str

    def send(self, alerts: Sequence[Alert]) -> Delivery:
        """One attempt to deliver `alerts`; never raises, failures come back with ok False."""


def rfc3339(unix_s: float) -> str:
    """Unix seconds as the RFC 3339 UTC timestamp Alertmanager reads, to the millisecond."""
    return datetime.fromtimestamp(unix_s, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _JsonPostNotifier(abc.ABC):
    """What both receivers share: one JSON POST per batch of firing and resolved alerts."""

    def __init__(
        self,
        url: str,
        *,
        name: str,
        timeout_s: float,
        headers: Mapping[str, str] | None,
        transport: httpx.BaseTransport | None,
        clock: Clock,
    ) -> None:
        self.name = name
        self.url = url
        self._clock = clock
        self._client = httpx.Client(timeout=timeout_s, headers=dict(headers or {}), transport=transport)

    @abc.abstractmethod
    def payload(self, alerts: Sequence[Alert], now: float) -> Any:
        """The JSON document for `alerts` (none of them pending)."""

    def send(self, alerts: Sequence[Alert]) -> Delivery:
        sendable = [alert for alert in alerts if alert.state != "pending"]
        if not sendable:
            return self._delivery(sendable, attempts=0, status=None, error="")
        try:
            response = self._client.post(self.url, json=self.payload(sendable, self._clock()))
        except httpx.HTTPError as exc:
            return self._delivery(
                sendable,
                attempts=1,
                status=None,
                error=f"POST {redacted(self.url)}: {type(exc).__name__}: {exc}",
            )
        error = ""
        if response.is_error:
            answer = response.text[:_ERROR_BODY_CHARS]
            error = f"POST {redacted(self.url)}: HTTP {response.status_code}: {answer}"
        return self._delivery(sendable, attempts=1, status=response.status_code, error=error)

    def close(self) -> None:
        """Close the receiver's connections."""
        self._client.close()

    def _delivery(
        self, alerts: Sequence[Alert], *, attempts: int, status: int | None, error: str
    ) -> Delivery:
        return Delivery(
            receiver=self.name,
            ok=not error,
            attempts=attempts,
            status=status,
            error=error,
            alerts=len(alerts),
            fingerprints=tuple(alert.fingerprint for alert in alerts),
            states=tuple(alert.state for alert in alerts),
            at=self._clock(),
        )


class AlertmanagerNotifier(_JsonPostNotifier):
    """Posts to Alertmanager's `/api/v2/alerts`, the way Prometheus does.

    A firing alert carries endsAt = now + `valid_for_s` (Prometheus' default margin): Alertmanager keeps
    it active until then, so the sender must resend firing alerts well within that margin, and if
    fleetlens stops (a lost hub) its alerts resolve by themselves instead of firing forever. A resolved
    alert carries endsAt = its resolve time, after which Alertmanager no longer lists it as an alert.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "alertmanager",
        timeout_s: float = 5.0,
        valid_for_s: float = FIRING_VALID_FOR_S,
        transport: httpx.BaseTransport | None = None,
        clock: Clock = time.time,
    ) -> None:
        endpoint = f"{url.rstrip('/')}/api/v2/alerts"
        super().__init__(
            endpoint, name=name, timeout_s=timeout_s, headers=None, transport=transport, clock=clock
        )
        self.valid_for_s = valid_for_s

    def payload(self, alerts: Sequence[Alert], now: float) -> list[dict[str, Any]]:
        return [
            {
                "labels": dict(alert.labels),
                "annotations": dict(alert.annotations),
                "startsAt": rfc3339(alert.starts_at),
                "endsAt": rfc3339(self._ends_at(alert, now)),
                "generatorURL": alert.generator_url,
            }
            for alert in alerts
        ]

    def _ends_at(self, alert: Alert, now: float) -> float:
        if alert.state == "resolved":
            return alert.ends_at if alert.ends_at is not None else now
        return now + self.valid_for_s


class WebhookNotifier(_JsonPostNotifier):
    """Posts Alertmanager's webhook payload (version 4), so receivers written for Alertmanager read ours.

    One POST per batch; `group_by` names the labels that make the group (fleetlens groups per node).
    """

    def __init__(
        self,
        url: str,
        *,
        name: str = "webhook",
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
        group_by: Sequence[str] = ("node",),
        transport: httpx.BaseTransport | None = None,
        clock: Clock = time.time,
    ) -> None:
        super().__init__(
            url, name=name, timeout_s=timeout_s, headers=headers, transport=transport, clock=clock
        )
        self.group_by = tuple(group_by)

    def payload(self, alerts: Sequence[Alert], now: float) -> dict[str, Any]:
        common_labels = _common(alert.labels for alert in alerts)
        group_labels = {key: common_labels[key] for key in self.group_by if key in common_labels}
        return {
            "version": "4",
            "groupKey": f"{{}}:{_format_labels(group_labels)}",
            "status": "firing" if any(alert.state == "firing" for alert in alerts) else "resolved",
            "receiver": self.name,
            "groupLabels": group_labels,
            "commonLabels": common_labels,
            "commonAnnotations": _common(alert.annotations for alert in alerts),
            "alerts": [
                {
                    "status": alert.state,
                    "labels": dict(alert.labels),
                    "annotations": dict(alert.annotations),
                    "startsAt": rfc3339(alert.starts_at),
                    "endsAt": rfc3339(alert.ends_at) if alert.ends_at is not None else _GO_ZERO_TIME,
                    "generatorURL": alert.generator_url,
                    "fingerprint": alert.fingerprint,
                }
                for alert in alerts
            ],
        }


class LogNotifier:
    """The receiver of last resort: with no receiver configured, the hub logs its alerts. Each alert is
    logged when it fires and when it resolves; the re-sends of a firing alert are not logged again."""

    name = "log"

    def __init__(self, logger: logging.Logger = log, clock: Clock = time.time) -> None:
        self._logger = logger
        self._clock = clock
        self._firing: set[str] = set()  # fingerprints logged firing and not yet resolved

    def send(self, alerts: Sequence[Alert]) -> Delivery:
        told = [alert for alert in alerts if self._news(alert)]
        for alert in told:
            level = logging.WARNING if alert.state == "firing" else logging.INFO
            summary = alert.annotations.get("summary", "")
            self._logger.log(level, "alert %s %s: %s", alert.state, _format_labels(alert.labels), summary)
        return Delivery(
            receiver=self.name,
            ok=True,
            attempts=1 if told else 0,
            status=None,
            error="",
            alerts=len(told),
            fingerprints=tuple(alert.fingerprint for alert in told),
            states=tuple(alert.state for alert in told),
            at=self._clock(),
        )

    def _news(self, alert: Alert) -> bool:
        if alert.state == "firing":
            if alert.fingerprint in self._firing:
                return False
            self._firing.add(alert.fingerprint)
            return True
        if alert.state == "resolved":
            self._firing.discard(alert.fingerprint)
            return True
        return False


def _common(mappings: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """The key-value pairs every mapping has (at least one mapping)."""
    first, *rest = mappings
    return {key: value for key, value in first.items() if all(other.get(key) == value for other in rest)}


def _format_labels(labels: Mapping[str, str]) -> str:
    """A label set as Alertmanager writes it in a group key: {a="1", b="2"}."""
    return "{" + ", ".join(f'{key}="{value}"' for key, value in sorted(labels.items())) + "}"


class DeliveryQueue:
    """Delivers batches to one notifier from a thread of its own, retrying with exponential backoff.

    `submit` never blocks: the queue holds at most `max_batches`, and when it is full the oldest batch
    is dropped (counted in `dropped`), since newer states of the same alerts supersede it. After the
    final outcome of each batch, `on_delivery(delivery)` is called on the queue's thread, with
    `attempts` counting every try. Retry waits are `initial_backoff_s` doubling up to `max_backoff_s`,
    each spread by +/- `jitter` (a fraction) so that receivers coming back are not hit in step.
    """

    def __init__(
        self,
        notifier: Notifier,
        *,
        on_delivery: Callable[[Delivery], None] = lambda delivery: None,
        max_batches: int = 256,
        max_attempts: int = 5,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        jitter: float = 0.2,
        sleep: Callable[[float], object] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.notifier = notifier
        self.dropped = 0
        self._on_delivery = on_delivery
        self._max_attempts = max_attempts
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._jitter = jitter
        self._rng = rng or random.Random()
        self._batches: collections.deque[tuple[Alert, ...]] = collections.deque(maxlen=max_batches)
        self._ready = threading.Condition()
        self._closing = False
        self._give_up = threading.Event()  # set when close() runs out of time: stop retrying
        self._sleep = sleep or self._give_up.wait
        self._thread = threading.Thread(target=self._run, name=f"notify-{notifier.name}", daemon=True)
        self._thread.start()

    def submit(self, alerts: Sequence[Alert]) -> None:
        """Queue one batch for delivery and return at once."""
        with self._ready:
            if len(self._batches) == self._batches.maxlen:
                self.dropped += 1
                log.warning(
                    "receiver %s is behind: dropped its oldest batch of alerts (%d dropped so far)",
                    self.notifier.name,
                    self.dropped,
                )
            self._batches.append(tuple(alerts))
            self._ready.notify()

    def close(self, timeout_s: float = 10.0) -> bool:
        """Deliver what is queued within `timeout_s`, then stop; True when every batch got its outcome."""
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join(timeout_s)
        self._give_up.set()
        return not self._thread.is_alive() and not self._batches

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                delivery = self._deliver(batch)
                if not delivery.ok:
                    log.warning(
                        "alerts not delivered after %d attempts: %s", delivery.attempts, delivery.error
                    )
                self._on_delivery(delivery)
            except Exception:
                log.exception("delivering alerts to receiver %s failed", self.notifier.name)

    def _next_batch(self) -> tuple[Alert, ...] | None:
        """The oldest queued batch; None once closing with nothing queued, or given up."""
        with self._ready:
            while not self._batches and not self._closing:
                self._ready.wait()
            if not self._batches or self._give_up.is_set():
                return None
            return self._batches.popleft()

    def _deliver(self, batch: Sequence[Alert]) -> Delivery:
        delivery = self.notifier.send(batch)
        attempts = delivery.attempts
        while delivery.retryable and attempts < self._max_attempts and not self._give_up.is_set():
            self._sleep(self._backoff_s(attempts))
            delivery = self.notifier.send(batch)
            attempts += delivery.attempts
        return dataclasses.replace(delivery, attempts=attempts)

    def _backoff_s(self, attempt: int) -> float:
        """The wait after failed try number `attempt`."""
        base = min(self._max_backoff_s, self._initial_backoff_s * 2 ** (attempt - 1))
        return base * self._rng.uniform(1 - self._jitter, 1 + self._jitter)

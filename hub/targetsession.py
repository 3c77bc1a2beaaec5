"""One target across scrape rounds: its keep-alive connection, parser and up/down state.

A TargetSession outlives its scrapes: it keeps the idle keep-alive socket, the resolved addresses, the
target's own ExpositionParser (whose series cache makes a steady scrape cheap) and the bodies read and
waiting for their parse, oldest first. Each scrape ends in an Outcome: a TargetStatus (up or down with
the error) and, when it succeeded, a ScrapeBatch stamped with the scrape's start. A target that went
down or came back is logged one line per round for all such targets (log_changes), and one that starts
sending a series twice per body once, not on every scrape.
"""

from __future__ import annotations

import logging
import socket
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from isal import isal_zlib

from analytics.store.records import ScrapeBatch, TargetStatus
from hub.errors import ScrapeError
from hub.expfmt import Exposition, ExpositionParser
from hub.targets import Target

if TYPE_CHECKING:
    from hub.scraperound import Scrape

log = logging.getLogger("fleetlens.scraper")

REQUEST_HEADERS = {
    "Accept": "text/plain;version=0.0.4",
    "Accept-Encoding": "gzip",
    "User-Agent": "fleetlens-hub",
}
_LOGGED_TARGETS = 3  # named in a round's log line of targets that went down or came back


@dataclass(frozen=True)
class ScrapeLimits:
    """Per-target limits; exceeding one fails that target's scrape with an error naming the limit."""

    max_body_bytes: int = 32 * 1024 * 1024
    max_samples: int = 50_000
    max_label_length: int = 2048


def gunzip_scraped(body: bytes, limit: int) -> bytes:
    """A gzip body inflated, up to `limit` bytes, by ISA-L's inflate (as zlib's, but faster);
    ScrapeError when it is broken or inflates past the limit."""
    inflater = isal_zlib.decompressobj(wbits=31)
    try:
        data = inflater.decompress(body, limit + 1)
    except isal_zlib.error as exc:
        raise ScrapeError(f"bad gzip body: {exc}") from None
    if len(data) > limit:
        raise ScrapeError(f"body over max_body_bytes={limit} once decompressed")
    return data


def _request_bytes(address: str) -> bytes:
    headers = "".join(f"{name}: {value}\r\n" for name, value in REQUEST_HEADERS.items())
    return f"GET /metrics HTTP/1.1\r\nHost: {address}\r\n{headers}\r\n".encode()


@dataclass(frozen=True)
class Outcome:
    """How one scrape ended: its status, its batch if it succeeded, its families' types and the
    samples dropped as repeats of a series earlier in the body."""

    status: TargetStatus
    batch: ScrapeBatch | None = None
    types: Mapping[str, str] = field(default_factory=dict)
    duplicates: int = 0


class TargetSession:
    """One target across rounds: its keep-alive socket, resolved addresses, parser and up/down state."""

    def __init__(self, target: Target, timeout_s: float, limits: ScrapeLimits, carry_rounds: int) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.limits = limits
        self.carry_rounds = carry_rounds  # rounds after its own a scrape's body may be carried into
        self.parser = ExpositionParser(
            max_samples=limits.max_samples,
            max_label_length=limits.max_label_length,
            target_labels=target.sample_labels,
        )
        parts = urlsplit(f"//{target.address}")
        self.host, self.port = parts.hostname or "", parts.port or 0
        self.request = _request_bytes(target.address)
        self.sock: socket.socket | None = None  # the idle keep-alive connection, between scrapes
        self.addresses: list[tuple] = []  # getaddrinfo's, until a connection to them fails
        self._up: bool | None = None
        self.change = ""  # "down" or "up" when the last scrape changed the target's state
        self.error = ""  # the last scrape's error
        self.bodies: deque[Scrape] = deque()  # read, parse not ended, oldest first: the first parses
        self._duplicating = False

    def succeeded(self, ts: float, duration_s: float, exposition: Exposition) -> Outcome:
        self._note(True, "")
        self._note_duplicates(exposition)
        target = self.target
        batch = ScrapeBatch(
            target.address, target.node, ts, exposition.names, exposition.labels, exposition.values
        )
        status = TargetStatus(ts, target.address, target.node, True, duration_s, len(batch))
        return Outcome(status, batch, exposition.types, exposition.duplicates)

    def failed(self, ts: float, duration_s: float, error: str) -> Outcome:
        self._note(False, error)
        target = self.target
        return Outcome(TargetStatus(ts, target.address, target.node, False, duration_s, 0, error))

    @property
    def was_up(self) -> bool:
        return self._up is True

    def deadline_error(self, doing: str) -> str:
        """The error text of a scrape that its deadline stopped while `doing` something."""
        return f"deadline of {self.timeout_s:g} s exceeded while {doing}"

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def _note(self, up: bool, error: str) -> None:
        """Remember whether the target went down or came back in this scrape (`change`), for the round's
        log line: not one line per failed scrape of a dead target, nor per target when a fleet flaps."""
        went_down = not up and self._up is not False
        self.change = "down" if went_down else "up" if up and self._up is False else ""
        self.error = error
        self._up = up

    def _note_duplicates(self, exposition: Exposition) -> None:
        """Log when a target starts sending a series twice in one body, not on every such scrape."""
        if exposition.duplicates and not self._duplicating:
            log.warning(
                "target %s (%s) sends series more than once per body: %d samples dropped, the first of "
                "each series kept",
                self.target.address,
                self.target.node,
                exposition.duplicates,
            )
        self._duplicating = bool(exposition.duplicates)


def log_changes(sessions: Sequence[TargetSession]) -> None:
    """One line per round for the targets that went down (with their errors) and one for those back up:
    a fleet-wide blip is two lines, not one per target."""
    down = [session for session in sessions if session.change == "down"]
    if down:
        shown = ", ".join(f"{s.target.address} ({s.target.node}): {s.error}" for s in down[:_LOGGED_TARGETS])
        more = f"; and {len(down) - _LOGGED_TARGETS} more" if len(down) > _LOGGED_TARGETS else ""
        log.warning("%d target(s) went down: %s%s", len(down), shown, more)
    back = [session.target.address for session in sessions if session.change == "up"]
    if back:
        more = f" and {len(back) - _LOGGED_TARGETS} more" if len(back) > _LOGGED_TARGETS else ""
        log.info("%d target(s) back up: %s%s", len(back), ", ".join(back[:_LOGGED_TARGETS]), more)

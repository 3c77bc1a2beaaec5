"""The hub's scraper: every exporter in a file_sd targets file, scraped concurrently on aligned ticks.

Each round yields one ScrapeBatch per target that answered and one TargetStatus per target, failed
ones included (up False, the error text); a failed target is simply tried again next round. Each
target keeps its own keep-alive connection (gzip accepted) and its own parser, whose series cache
makes a steady-state scrape cheap. Samples carry the time their scrape started (timestamps written
in a body are not honoured, as with Prometheus's honor_timestamps: false). A scrape has one deadline
for connecting, waiting and reading, so a hung exporter costs one timeout, in parallel with the
others. `--shard i/n` keeps the targets whose crc32("host:port") modulo n is i: stable across
processes and hosts, so n hubs split a fleet exactly.

The hub drives it: `Scraper(TargetsFile(path).current, interval_s=1).run(stop_event, sink)`.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from analytics.records import ScrapeBatch, TargetStatus
from collectors.errors import CollectorError
from collectors.expfmt import ExpositionParser

log = logging.getLogger("fleetlens.scraper")

REQUEST_HEADERS = {
    "Accept": "text/plain;version=0.0.4",
    "Accept-Encoding": "gzip",
    "User-Agent": "fleetlens-hub",
}
_READ_CHUNK = 256 * 1024

Sink = Callable[[list[ScrapeBatch], list[TargetStatus]], None]


class ScraperConfigError(CollectorError):
    """A targets file, shard or scrape setting is invalid; the message names which one and why."""


class ScrapeError(CollectorError):
    """A target answered, but not with a usable body (HTTP status, size limit, encoding)."""


@dataclass(frozen=True)
class Target:
    """One exporter: its "host:port" and the labels its file_sd group gave it."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def node(self) -> str:
        """The fleet node the target belongs to: its `node` label, else its host."""
        return self.labels.get("node") or urlsplit(f"//{self.address}").hostname or self.address

    @property
    def sample_labels(self) -> dict[str, str]:
        """Labels added to every sample: all but `node` (a column of its own) and reserved `__*` ones."""
        return {k: v for k, v in self.labels.items() if k != "node" and not k.startswith("__")}


@dataclass(frozen=True)
class Shard:
    """Which part of the fleet this hub scrapes: targets whose crc32(address) % count == index."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ScraperConfigError(f"shard {self.index}/{self.count}: want 0 <= i < n")

    def owns(self, target: Target) -> bool:
        return zlib.crc32(target.address.encode()) % self.count == self.index


@dataclass(frozen=True)
class ScrapeLimits:
    """Per-target limits; exceeding one fails that target's scrape with an error naming the limit."""

    max_body_bytes: int = 32 * 1024 * 1024
    max_samples: int = 50_000
    max_label_length: int = 2048


def parse_targets(groups: object, source: str) -> list[Target]:
    """Targets from file_sd content: `[{"targets": ["host:port", ...], "labels": {...}}, ...]`.

    A target listed twice is scraped once, with its first group's labels.
    """
    if not isinstance(groups, list):
        raise ScraperConfigError(f"{source}: want a list of target groups, got {type(groups).__name__}")
    found: dict[str, Target] = {}
    for i, group in enumerate(groups):
        where = f"{source}: group {i}"
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise ScraperConfigError(f'{where}: want {{"targets": [...], "labels": {{...}}}}')
        unknown = sorted(set(group) - {"targets", "labels"})
        if unknown:
            raise ScraperConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise ScraperConfigError(f"{where}: labels must map strings to strings")
        for address in group["targets"]:
            _check_address(address, where)
            found.setdefault(address, Target(address, labels))
    return list(found.values())


def _check_address(address: object, where: str) -> None:
    if not isinstance(address, str):
        raise ScraperConfigError(f"{where}: target {address!r} is not a string")
    try:
        parts = urlsplit(f"//{address}")
        valid = parts.hostname and parts.port and parts.netloc == address
    except ValueError:
        valid = False
    if not valid:
        raise ScraperConfigError(f"{where}: target {address!r} is not host:port")


class TargetsFile:
    """A file_sd file (JSON, or YAML by its .yml/.yaml suffix), re-read whenever it changes.

    The first read must succeed (a hub with a broken targets file should not start). After that a
    broken or missing file keeps the last good targets and logs, once per change, what is wrong.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._signature = self._stat()
        self._targets = self._load()

    def current(self) -> list[Target]:
        """The targets, re-read if the file's inode, size or mtime changed since the last call."""
        signature = self._stat()
        if signature != self._signature:
            self._signature = signature
            try:
                self._targets = self._load()
                log.info("targets file %s: %d targets", self.path, len(self._targets))
            except ScraperConfigError as exc:
                log.error("%s; keeping the last good list of %d targets", exc, len(self._targets))
        return self._targets

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _load(self) -> list[Target]:
        try:
            text = self.path.read_text()
            groups = yaml.safe_load(text) if self.path.suffix in (".yml", ".yaml") else json.loads(text)
        except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
            raise ScraperConfigError(f"targets file {self.path}: {exc}") from None
        return parse_targets(groups, f"targets file {self.path}")


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _gunzip(body: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=31)
    try:
        data = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise ScrapeError(f"bad gzip body: {exc}") from None
    if len(data) > limit:
        raise ScrapeError(f"body over max_body_bytes={limit} once decompressed")
    return data


@dataclass(frozen=True)
class _Outcome:
    status: TargetStatus
    batch: ScrapeBatch | None = None
    types: Mapping[str, str] = field(default_factory=dict)


class _TargetSession:
    """One target's keep-alive connection, parser and up/down state; used by one scrape at a time."""

    def __init__(self, target: Target, timeout_s: float, limits: ScrapeLimits) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.limits = limits
        self.parser = ExpositionParser(
            max_samples=limits.max_samples,
            max_label_length=limits.max_label_length,
            target_labels=target.sample_labels,
        )
        self._conn: http.client.HTTPConnection | None = None
        self._up: bool | None = None

    def scrape(self, clock: Callable[[], float]) -> _Outcome:
        ts, start = clock(), time.perf_counter()
        try:
            exposition = self.parser.parse(self._fetch().decode())
        except (OSError, http.client.HTTPException, UnicodeDecodeError, CollectorError) as exc:
            self.close()
            error = self._describe(exc)
            self._note(False, error)
            return _Outcome(self._status(ts, start, False, 0, error))
        self._note(True, "")
        target = self.target
        batch = ScrapeBatch(
            target.address, target.node, ts, exposition.names, exposition.labels, exposition.values
        )
        return _Outcome(self._status(ts, start, True, len(batch)), batch, exposition.types)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _status(self, ts: float, start: float, up: bool, samples: int, error: str = "") -> TargetStatus:
        duration = time.perf_counter() - start
        return TargetStatus(ts, self.target.address, self.target.node, up, duration, samples, error)

    def _fetch(self) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        reused = self._conn is not None and self._conn.sock is not None
        try:
            return self._request(deadline)
        except (ConnectionResetError, BrokenPipeError):
            if not reused:
                raise
            self.close()  # the target dropped our idle keep-alive connection: once more on a fresh one
            return self._request(deadline)

    def _request(self, deadline: float) -> bytes:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.target.address, timeout=_remaining(deadline))
        conn = self._conn
        conn.timeout = _remaining(deadline)  # for connect() when the last response closed the socket
        if conn.sock is not None:
            conn.sock.settimeout(_remaining(deadline))
        conn.request("GET", "/metrics", headers=REQUEST_HEADERS)
        sock = conn.sock  # getresponse() hands the socket to the response when the server closes it
        with conn.getresponse() as response:  # closing a read response frees the connection for the next
            if response.status != 200:
                raise ScrapeError(f"HTTP {response.status} {response.reason}")
            body = self._read_body(response, sock, deadline)
            gzipped = (response.getheader("Content-Encoding") or "").lower() == "gzip"
        return _gunzip(body, self.limits.max_body_bytes) if gzipped else body

    def _read_body(self, response: http.client.HTTPResponse, sock: socket.socket, deadline: float) -> bytes:
        """The body, each read bounded by what is left of the deadline and the whole by max_body_bytes."""
        limit = self.limits.max_body_bytes
        chunks, size = [], 0
        while True:
            sock.settimeout(_remaining(deadline))
            chunk = response.read1(_READ_CHUNK)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise ScrapeError(f"body over max_body_bytes={limit}")
            chunks.append(chunk)

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):
            return f"timed out after {self.timeout_s:g}s"
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, CollectorError):
            return str(exc)
        if isinstance(exc, UnicodeDecodeError):
            return f"body is not UTF-8: {exc}"
        return f"{type(exc).__name__}: {exc}"

    def _note(self, up: bool, error: str) -> None:
        """Log when a target goes down or comes back, not on every failed scrape of a dead one."""
        if up and self._up is False:
            log.info("target %s (%s) is back up", self.target.address, self.target.node)
        elif not up and self._up is not False:
            log.warning("target %s (%s) is down: %s", self.target.address, self.target.node, error)
        self._up = up


class Scraper:
    """Scrapes this shard's targets, all at once, every `interval_s` seconds (1 to 60).

    `target_source` is called before every round (a TargetsFile's `current`, or any list in tests);
    `targets` holds the last round's targets of this shard. `clock` gives the unix time that stamps
    samples and aligns ticks. `types` collects every family's type from the targets' TYPE lines (the
    last one seen wins), for the hub's rate computations.
    """

    def __init__(
        self,
        target_source: Callable[[], Sequence[Target]],
        *,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
        shard: Shard = Shard(),
        limits: ScrapeLimits = ScrapeLimits(),
        workers: int = 64,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 1 <= interval_s <= 60:
            raise ScraperConfigError(f"scrape interval {interval_s:g}s: want 1 to 60 seconds")
        timeout_s = interval_s if timeout_s is None else timeout_s
        if not 0 < timeout_s <= interval_s:
            raise ScraperConfigError(
                f"scrape timeout {timeout_s:g}s: want more than 0 and at most the interval ({interval_s:g}s)"
            )
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.shard = shard
        self.limits = limits
        self.types: dict[str, str] = {}
        self.targets: list[Target] = []
        self._target_source = target_source
        self._clock = clock
        self._sessions: dict[str, _TargetSession] = {}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleetlens-scrape")

    def scrape_once(self) -> tuple[list[ScrapeBatch], list[TargetStatus]]:
        """One round: every target of this shard, concurrently; batches of those that answered."""
        self.targets = [target for target in self._target_source() if self.shard.owns(target)]
        sessions = self._sessions_for(self.targets)
        outcomes = list(self._pool.map(lambda session: session.scrape(self._clock), sessions))
        for outcome in outcomes:
            self.types.update(outcome.types)
        batches = [outcome.batch for outcome in outcomes if outcome.batch is not None]
        return batches, [outcome.status for outcome in outcomes]

    def run(self, stop: threading.Event, sink: Sink) -> None:
        """Scrape at each multiple of the interval until `stop` is set; `sink` gets every round.

        A round that overruns skips the ticks it missed instead of bunching scrapes together. A sink
        that raises loses only its own round: the loop goes on.
        """
        while not stop.wait(self.interval_s - self._clock() % self.interval_s):
            batches, statuses = self.scrape_once()
            try:
                sink(batches, statuses)
            except Exception:
                log.exception("scrape sink failed; %d batches of this round are lost", len(batches))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()

    def __enter__(self) -> Scraper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _sessions_for(self, targets: Sequence[Target]) -> list[_TargetSession]:
        """A session per target, kept across rounds; a target whose labels changed starts afresh."""
        wanted = {target.address: target for target in targets}
        for address, session in list(self._sessions.items()):
            if wanted.get(address) != session.target:
                session.close()
                del self._sessions[address]
        for address, target in wanted.items():
            if address not in self._sessions:
                self._sessions[address] = _TargetSession(target, self.timeout_s, self.limits)
        return [self._sessions[address] for address in wanted]

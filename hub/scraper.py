"""The hub's scraper: every exporter in a file_sd targets file, scraped concurrently on aligned ticks.

Each round yields one ScrapeBatch per target that answered and one TargetStatus per target, failed
ones included (up False, the error text); a failed target is simply tried again next round. Each
target keeps its own keep-alive connection (gzip accepted) and its own parser, whose series cache
makes a steady-state scrape cheap. Samples carry the time their scrape started (timestamps written
in a body are not honoured, as with Prometheus's honor_timestamps: false). A series sent twice in one
body keeps its first sample; the others are dropped and counted in `duplicates_dropped`.

A hostile target costs only itself. Each scrape has one deadline, its tick plus the timeout, for
connecting, waiting, reading and parsing (limits are enforced while reading and parsing, not after).
A round ends when all its scrapes have, or at its deadline: a scrape still reading then has its
connection cut, and one still running is reported down. Since the timeout is at most the interval,
the next tick starts on time for every target; a target whose scrape outlived even that is reported
"previous scrape still running" instead of being scraped twice at once. Only a sink that holds the loop
past a tick's deadline makes the loop skip ticks (counted in `ticks_skipped`).

`--shard i/n` keeps the targets whose crc32("host:port") modulo n is i: stable across processes and
hosts, so n hubs split a fleet exactly.

The hub drives it: `Scraper(TargetsFile(path).current, interval_s=1).run(stop_event, sink)`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from analytics.store.records import ScrapeBatch, TargetStatus
from hub.errors import DeadlineExceeded, HubError, ScrapeError, ScraperConfigError
from hub.expfmt import Exposition, ExpositionParser

log = logging.getLogger("fleetlens.scraper")

REQUEST_HEADERS = {
    "Accept": "text/plain;version=0.0.4",
    "Accept-Encoding": "gzip",
    "User-Agent": "fleetlens-hub",
}
_READ_CHUNK = 256 * 1024
# How long a round waits, past its deadline, for the scrapes it cut off to say where they were. Scrapes
# blocked on a socket return at once when it is cut; a parse stops at its next chunk.
_CUT_OFF_GRACE_S = 0.1

Sink = Callable[[list[ScrapeBatch], list[TargetStatus]], None]


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
    duplicates: int = 0


class _TargetSession:
    """One target's keep-alive connection, parser and up/down state; used by one scrape at a time.

    `busy` is set by the round that submits a scrape and cleared when that scrape ends (or is
    cancelled before it started), so that a target is never scraped twice at once.
    """

    def __init__(self, target: Target, timeout_s: float, limits: ScrapeLimits) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.limits = limits
        self.parser = ExpositionParser(
            max_samples=limits.max_samples,
            max_label_length=limits.max_label_length,
            target_labels=target.sample_labels,
        )
        self.busy = False
        self.phase = ""  # what the running scrape is doing, for a deadline's error text
        self._conn: http.client.HTTPConnection | None = None
        self._up: bool | None = None
        self._duplicating = False
        self._lock = threading.Lock()  # between cut_off() and the end of the scrape it cuts
        self._sock: socket.socket | None = None  # the running scrape's socket, while it has one
        self._cut = ""  # the phase in which the round cut the running scrape off, if it did

    def scrape(self, clock: Callable[[], float], deadline: float) -> _Outcome:
        """Fetch and parse one body by `deadline` (time.monotonic); every failure becomes a down status."""
        ts, start = clock(), time.perf_counter()
        # until it connects: a deadline already past when this started was spent waiting for a worker
        self.phase, self._cut = "waiting for a free scrape worker", ""
        try:
            exposition = self.parser.parse(self._fetch(deadline).decode(), deadline)
        except (OSError, http.client.HTTPException, UnicodeDecodeError, HubError) as exc:
            self.close()
            error = self._describe(exc)
            self._note(False, error)
            return self.failed(ts, time.perf_counter() - start, error)
        self._note(True, "")
        self._note_duplicates(exposition)
        target = self.target
        batch = ScrapeBatch(
            target.address, target.node, ts, exposition.names, exposition.labels, exposition.values
        )
        status = TargetStatus(ts, target.address, target.node, True, time.perf_counter() - start, len(batch))
        return _Outcome(status, batch, exposition.types, exposition.duplicates)

    def failed(self, ts: float, duration_s: float, error: str) -> _Outcome:
        """A down outcome, from the scrape itself or from a round that could not wait for it."""
        target = self.target
        return _Outcome(TargetStatus(ts, target.address, target.node, False, duration_s, 0, error))

    def deadline_error(self, doing: str) -> str:
        """The error text of a scrape that its deadline stopped while `doing` something."""
        return f"deadline of {self.timeout_s:g} s exceeded while {doing}"

    def cut_off(self) -> None:
        """Shut down the running scrape's socket: a read blocked on a target that sends a byte now and
        then (which each socket timeout would wait out afresh) returns at once."""
        with self._lock:
            if self._sock is not None:
                self._cut = self.phase
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)

    def ended(self, _: Future) -> None:
        """The scrape submitted for this session finished or was cancelled: the session is free again."""
        self.busy = False

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _fetch(self, deadline: float) -> bytes:
        reused = self._conn is not None and self._conn.sock is not None
        try:
            return self._request(deadline)
        except (ConnectionResetError, BrokenPipeError):
            if not reused or self._cut:
                raise
            self.close()  # the target dropped our idle keep-alive connection: once more on a fresh one
            return self._request(deadline)
        finally:
            with self._lock:  # parsing needs no cutting off: it checks the deadline itself
                self._sock = None

    def _request(self, deadline: float) -> bytes:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.target.address, timeout=_remaining(deadline))
        conn = self._conn
        if conn.sock is None:  # a new connection, or the last response closed it
            self.phase = "connecting"
            conn.timeout = _remaining(deadline)
            conn.connect()
        conn.sock.settimeout(_remaining(deadline))
        with self._lock:
            self._sock = conn.sock
        self.phase = "waiting for the response"
        conn.request("GET", "/metrics", headers=REQUEST_HEADERS)
        sock = conn.sock  # getresponse() hands the socket to the response when the server closes it
        with conn.getresponse() as response:  # closing a read response frees the connection for the next
            if response.status != 200:
                raise ScrapeError(f"HTTP {response.status} {response.reason}")
            self.phase = "reading the body"
            body = self._read_body(response, sock, deadline)
            gzipped = (response.getheader("Content-Encoding") or "").lower() == "gzip"
        self.phase = "parsing"
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
        if isinstance(exc, DeadlineExceeded):
            return self.deadline_error(f"parsing (line {exc.lineno})")
        if isinstance(exc, TimeoutError) or self._cut:
            return self.deadline_error(self._cut or self.phase)
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, HubError):
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


@dataclass(frozen=True)
class _Round:
    """The scrapes started at one tick: per session its future, or None when it was still busy."""

    ts: float  # the scraper's clock when the round started
    started: float  # time.monotonic() then
    deadline: float  # time.monotonic() by which every scrape of the round ends
    scrapes: list[tuple[_TargetSession, Future[_Outcome] | None]]


class Scraper:
    """Scrapes this shard's targets, all at once, every `interval_s` seconds (1 to 60).

    `target_source` is called before every round (a TargetsFile's `current`, or any list in tests);
    `targets` holds the last round's targets of this shard. `clock` gives the unix time that stamps
    samples and aligns ticks. `types` collects every family's type from the targets' TYPE lines (the
    last one seen wins), for the hub's rate computations. `workers` scrapes run at once at most; a
    scrape that found no free worker by its deadline is reported down. Counters for the hub's own
    metrics: `duplicates_dropped` (samples whose series came earlier in the same body) and
    `ticks_skipped` (ticks whose deadline had passed when a slow sink let the loop reach them).
    One caller at a time: `run` or `scrape_once`.
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
        self.duplicates_dropped = 0
        self.ticks_skipped = 0
        self._target_source = target_source
        self._clock = clock
        self._sessions: dict[str, _TargetSession] = {}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleetlens-scrape")

    def scrape_once(self) -> tuple[list[ScrapeBatch], list[TargetStatus]]:
        """One round now: every target of this shard, concurrently, each until its deadline."""
        return self._finish(self._start(time.monotonic() + self.timeout_s))

    def run(self, stop: threading.Event, sink: Sink) -> None:
        """Scrape at each multiple of the interval until `stop` is set; `sink` gets every round.

        A round ends by its deadline, which is never past the next tick, so slow targets delay no
        tick. A sink that raises loses only its own round; one that blocks past a tick's deadline
        makes the loop skip that tick rather than bunch scrapes together.
        """
        tick = self._first_tick(self._clock())
        while not stop.wait(max(0.0, tick - self._clock())):
            late = max(0.0, self._clock() - tick)
            batches, statuses = self._finish(self._start(time.monotonic() + self.timeout_s - late))
            try:
                sink(batches, statuses)
            except Exception:
                log.exception("scrape sink failed; %d batches of this round are lost", len(batches))
            tick = self._next_tick(tick)

    def close(self) -> None:
        for session in self._sessions.values():
            session.cut_off()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()

    def __enter__(self) -> Scraper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _first_tick(self, now: float) -> float:
        return (now // self.interval_s + 1) * self.interval_s

    def _next_tick(self, tick: float) -> float:
        """The tick after `tick`, unless the sink held the loop past its deadline (then the first tick
        whose deadline is still ahead, the skipped ones counted), or the clock was set back."""
        tick += self.interval_s
        now = self._clock()
        overdue = now - (tick + self.timeout_s)
        if overdue >= 0:
            skipped = int(overdue // self.interval_s) + 1
            self.ticks_skipped += skipped
            log.warning("scrape sink held the loop past %d tick(s); skipped them", skipped)
            tick += skipped * self.interval_s
        if tick - now > self.interval_s:
            tick = self._first_tick(now)
        return tick

    def _start(self, deadline: float) -> _Round:
        """Submit a scrape of every idle target of this shard; a busy one gets None (never a second)."""
        self.targets = [target for target in self._target_source() if self.shard.owns(target)]
        ts, started = self._clock(), time.monotonic()
        scrapes: list[tuple[_TargetSession, Future[_Outcome] | None]] = []
        for session in self._sessions_for(self.targets):
            future = None
            if not session.busy:
                session.busy = True
                future = self._pool.submit(session.scrape, self._clock, deadline)
                future.add_done_callback(session.ended)
            scrapes.append((session, future))
        return _Round(ts, started, deadline, scrapes)

    def _finish(self, round_: _Round) -> tuple[list[ScrapeBatch], list[TargetStatus]]:
        """Wait for the round's scrapes until its deadline, cut off the late ones, and collect."""
        futures = [future for _, future in round_.scrapes if future is not None]
        late = wait(futures, timeout=max(0.0, round_.deadline - time.monotonic())).not_done
        if late:
            for session, future in round_.scrapes:
                if future in late and not future.cancel():  # a scrape not started by now never will
                    session.cut_off()
            wait(late, timeout=_CUT_OFF_GRACE_S)
        outcomes = [self._outcome(round_, session, future) for session, future in round_.scrapes]
        for outcome in outcomes:
            self.types.update(outcome.types)
            self.duplicates_dropped += outcome.duplicates
        batches = [outcome.batch for outcome in outcomes if outcome.batch is not None]
        return batches, [outcome.status for outcome in outcomes]

    def _outcome(self, round_: _Round, session: _TargetSession, future: Future[_Outcome] | None) -> _Outcome:
        """A scrape's own outcome, or why the round has none: busy, no free worker, still running."""
        elapsed = time.monotonic() - round_.started
        if future is None:
            return session.failed(round_.ts, 0.0, "previous scrape still running, past its deadline")
        if future.cancelled():
            error = session.deadline_error("waiting for a free scrape worker")
        elif not future.done():
            error = session.deadline_error(f"{session.phase}; still running")
        else:
            return future.result()
        return session.failed(round_.ts, elapsed, error)

    def _sessions_for(self, targets: Sequence[Target]) -> list[_TargetSession]:
        """A session per target, kept across rounds; a target whose labels changed starts afresh, once
        its old session's scrape has ended (until then that target is reported busy)."""
        wanted = {target.address: target for target in targets}
        for address, session in list(self._sessions.items()):
            if wanted.get(address) != session.target and not session.busy:
                session.close()
                del self._sessions[address]
        for address, target in wanted.items():
            if address not in self._sessions:
                self._sessions[address] = _TargetSession(target, self.timeout_s, self.limits)
        return [self._sessions[address] for address in wanted]

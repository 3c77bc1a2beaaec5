"""The hub's scraper: every exporter in a file_sd targets file, scraped concurrently on aligned ticks.

Each scrape yields a TargetStatus, failed ones included (up False, the error text), and a ScrapeBatch
if it succeeded; a failed target is simply tried again next round. One loop on one thread drives every
target's scrape at once over non-blocking sockets: connect (or reuse the target's keep-alive connection,
gzip accepted), send `GET /metrics`, read the response as it arrives (hub.httpread, which treats its
bytes as hostile), and parse the body with the target's own parser, whose series cache makes a
steady-state scrape cheap, a few thousand lines at a time between reads of the other sockets. An idle
keep-alive connection the target dropped is retried once on a fresh one. Samples carry the time their
scrape started (timestamps written in a body are not honoured, as with Prometheus's honor_timestamps:
false). A series sent twice in one body keeps its first sample; the others are dropped and counted in
`duplicates_dropped`. Targets that went down or came back are logged one line per round, so a
fleet-wide blip is not a line per target.

A hostile target costs only itself (limits are enforced while reading and parsing, not after). A
scrape's fetch has a deadline, its tick plus the timeout, for connecting, waiting and reading, as
Prometheus's scrape_timeout bounds its HTTP request: a fetch still going at its round's deadline is cut
off and reported down ("deadline of N s exceeded while <what it was doing>"). A body read in time is
parsed within a budget of its parser's own CPU time, the timeout again ("parsing used up its N s of
CPU time"), not of the wall clock: the loop is one thread, and a hub starting (every series new to
every parser, the store's first inserts holding the GIL on other threads) can give it less CPU in a
round than that round's first parses take. A parse not done by its round's deadline goes on in the
following rounds (and between rounds), and the target's next body waits for it, so that a target's
bodies are parsed in order, each to its end before the next; one not done CARRY_S seconds after its
round (at least one round more) is reported down ("deadline of N more round(s) exceeded while
parsing"). So every scrape ends within a few rounds, and a target holds at most one body per round.
Each round hands the sink the scrapes that ended in it, its own and carried ones, each stamped with its
own tick. The timeout is at most the interval, so the next tick starts on time for every target; only a
sink that holds the loop past a tick's deadline makes the loop skip ticks (counted in `ticks_skipped`).

`--shard i/n` keeps the targets whose crc32("host:port") modulo n is i: stable across processes and
hosts, so n hubs split a fleet exactly.

The hub drives it: `Scraper(TargetsFile(path).current, interval_s=1).run(stop_event, sink)`.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import logging
import math
import os
import selectors
import socket
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from isal import isal_zlib

from analytics.store.records import ScrapeBatch, TargetStatus
from hub.errors import DeadlineExceeded, HubError, ScrapeError, ScraperConfigError
from hub.expfmt import Exposition, ExpositionParser
from hub.httpread import ResponseReader

log = logging.getLogger("fleetlens.scraper")

REQUEST_HEADERS = {
    "Accept": "text/plain;version=0.0.4",
    "Accept-Encoding": "gzip",
    "User-Agent": "fleetlens-hub",
}
_READ_CHUNK = 256 * 1024
# Host names are looked up on threads (getaddrinfo blocks); the loop looks for their answers this often.
_LOOKUP_THREADS = 4
_LOOKUP_POLL_S = 0.01
# Parsing runs in slices of this long between polls of the sockets, whose data waits in kernel buffers.
_PARSE_SLICE_S = 0.01
# How long after its round a scrape's body may still wait for its parse, or be parsed, in seconds (at
# least the next round): a hub starting parses every target's first body cold (about 10 us of CPU a
# sample, 50 times a steady body's), and its other threads hold the GIL for much of its first seconds.
CARRY_S = 5.0
_LOGGED_TARGETS = 3  # named in a round's log line of targets that went down or came back

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


def _gunzip(body: bytes, limit: int) -> bytes:
    """A gzip body inflated, up to `limit` bytes. ISA-L's inflate, as zlib's but twice as fast: a node's
    body (100 kB) took 0.16 us of CPU per sample with zlib, 0.08 with it."""
    inflater = isal_zlib.decompressobj(wbits=31)
    try:
        data = inflater.decompress(body, limit + 1)
    except isal_zlib.error as exc:
        raise ScrapeError(f"bad gzip body: {exc}") from None
    if len(data) > limit:
        raise ScrapeError(f"body over max_body_bytes={limit} once decompressed")
    return data


def _request(address: str) -> bytes:
    headers = "".join(f"{name}: {value}\r\n" for name, value in REQUEST_HEADERS.items())
    return f"GET /metrics HTTP/1.1\r\nHost: {address}\r\n{headers}\r\n".encode()


@dataclass(frozen=True)
class _Outcome:
    status: TargetStatus
    batch: ScrapeBatch | None = None
    types: Mapping[str, str] = field(default_factory=dict)
    duplicates: int = 0


class _TargetSession:
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
        self.request = _request(target.address)
        self.sock: socket.socket | None = None  # the idle keep-alive connection, between scrapes
        self.addresses: list[tuple] = []  # getaddrinfo's, until a connection to them fails
        self._up: bool | None = None
        self.change = ""  # "down" or "up" when the last scrape changed the target's state
        self.error = ""  # the last scrape's error
        self.bodies: deque[_Scrape] = deque()  # read, parse not ended, oldest first: the first parses
        self._duplicating = False

    def succeeded(self, ts: float, duration_s: float, exposition: Exposition) -> _Outcome:
        self._note(True, "")
        self._note_duplicates(exposition)
        target = self.target
        batch = ScrapeBatch(
            target.address, target.node, ts, exposition.names, exposition.labels, exposition.values
        )
        status = TargetStatus(ts, target.address, target.node, True, duration_s, len(batch))
        return _Outcome(status, batch, exposition.types, exposition.duplicates)

    def failed(self, ts: float, duration_s: float, error: str) -> _Outcome:
        self._note(False, error)
        target = self.target
        return _Outcome(TargetStatus(ts, target.address, target.node, False, duration_s, 0, error))

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


def _log_changes(sessions: Sequence[_TargetSession]) -> None:
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


class _Round:
    """What one round's loop shares with its scrapes: the selector, the deadline, the scrapes that wait
    for a host lookup or have a body to parse, a step at a time, and those that ended, in the order they
    did. Bodies of targets that were up last round are parsed first: their parse is cheap (their series
    are known), so a round short of CPU (a hub starting, a busy host) spends what it has on keeping them
    up rather than on the first parse of a new target's series."""

    def __init__(self, selector: selectors.BaseSelector, resolver: Callable[[], Executor], deadline: float):
        self.selector = selector
        self.resolver = resolver
        self.deadline = deadline
        self.running = 0
        self.lookups: list[_Scrape] = []
        self.warm: deque[_Scrape] = deque()
        self.cold: deque[_Scrape] = deque()
        self.ended: list[_Scrape] = []

    def drive(
        self, scrapes: Sequence[_Scrape], carried: Sequence[_Scrape] = (), *, counts: bool = True
    ) -> list[_Scrape]:
        """Run this round's scrapes, and those carried into it, until all have ended or the deadline has
        passed. Then a fetch still going is cut off, and a scrape with a body still to parse is returned,
        to be carried into the next round; a carried one is failed instead, if this round was the last of
        its session's carry_rounds (`counts`: the parsing between two rounds is not one)."""
        self._take(carried)
        self.running += len(scrapes)
        for scrape in scrapes:
            scrape.guarded(scrape.start)
        while self.running:
            left = self.deadline - time.monotonic()
            if left <= 0:
                break
            if self.warm or self.cold:
                left = 0
            elif self.lookups:
                left = min(left, _LOOKUP_POLL_S)
            self._serve_sockets(left)
            for scrape in [scrape for scrape in self.lookups if scrape.lookup.done()]:
                self.lookups.remove(scrape)
                scrape.guarded(scrape.looked_up)
            self._parse_for(_PARSE_SLICE_S)
        while self.running and self._serve_sockets(0):
            pass  # what arrived by the deadline counts, however busy the loop (or the GIL) was meanwhile
        carry = []
        for scrape in carried:  # the older first: one that fails lets the target's next body be parsed
            if scrape.outcome is None:
                if counts and scrape.rounds_left == 0:
                    scrape.guarded(scrape.give_up)
                else:
                    scrape.rounds_left -= counts
                    carry.append(scrape)
        for scrape in scrapes:
            if scrape.outcome is None:
                if scrape.has_body:
                    carry.append(scrape)
                else:
                    scrape.guarded(scrape.cut_off)
        return carry

    def _serve_sockets(self, timeout: float) -> int:
        """Step the scrapes whose sockets are ready, waiting up to `timeout` for one; how many were."""
        ready = self.selector.select(timeout)
        for key, events in ready:
            scrape = key.data
            scrape.guarded(lambda scrape=scrape, events=events: scrape.ready(events))
        return len(ready)

    def parse_all(self, carried: Sequence[_Scrape]) -> None:
        """Parse the bodies of `carried` to their ends, with no deadline but each parse's CPU budget."""
        self._take(carried)
        while self.warm or self.cold:
            self._parse_for(math.inf)

    def queue(self, scrape: _Scrape) -> None:
        """Queue a scrape whose parse has started for its steps, by whether its target was up."""
        (self.warm if scrape.session.was_up else self.cold).append(scrape)

    def _take(self, carried: Sequence[_Scrape]) -> None:
        """Make scrapes carried from an earlier round this one's: parsed, counted and ended here."""
        for scrape in carried:
            scrape.round = self
            if scrape.steps is not None:
                self.queue(scrape)
        self.running = len(carried)

    def _parse_for(self, seconds: float) -> None:
        """Parse steps, warm bodies first, for about `seconds`: sockets are polled between slices, not
        between steps (each poll lets the hub's other threads take the GIL, and waits to get it back).
        Bodies are parsed one after the other, each to its end, so that they end in the order they came
        and a round short of CPU ends as many as it can rather than none (a body's last step would
        otherwise wait for every other body's first); only a body that had a whole slice and is not done
        (a large one, a hostile one) goes to the back of its queue, so as not to hold the others."""
        end = time.monotonic() + seconds
        first = None
        while queue := self.warm or self.cold:
            scrape = queue[0]
            first = first or scrape
            scrape.guarded(scrape.parse_step)
            ended = scrape.steps is None
            if ended:
                queue.popleft()
            if time.monotonic() >= end:
                if not ended and scrape is first:
                    queue.rotate(-1)
                return


class _Scrape:
    """One target's scrape, a state machine the loop drives: look up the host if it is not an address,
    connect (or reuse the idle keep-alive connection), send the request, read the response as it arrives,
    then (once the target's earlier bodies are parsed) parse the body a step at a time, in its round or
    the next. `outcome` is set once it has ended."""

    def __init__(self, session: _TargetSession, round_: _Round, ts: float) -> None:
        self.session = session
        self.round = round_
        self.ts = ts
        self.started = time.perf_counter()
        self.phase = "connecting"
        self.outcome: _Outcome | None = None
        self.sock: socket.socket | None = None
        self.lookup: Future[list[tuple]] | None = None
        self.steps: Generator[int, None, Exposition] | None = None
        self.line = 1  # the next line to parse
        self.rounds_left = session.carry_rounds  # rounds it may still be carried into, past this one
        self._text = ""  # the body, until its parse starts
        self._reader: ResponseReader | None = ResponseReader(session.limits.max_body_bytes)  # till read
        self._sent = 0
        self._reused = False
        self._retried = False
        self._next_address = 0

    def guarded(self, action: Callable[[], None]) -> None:
        """Run a step; any failure ends this scrape down with its reason, never the round."""
        try:
            action()
        except (OSError, UnicodeDecodeError, HubError) as exc:
            self._fail(self._describe(exc))
        except Exception as exc:
            log.exception("scraping %s failed unexpectedly", self.session.target.address)
            self._fail(f"{type(exc).__name__}: {exc}")

    def start(self) -> None:
        session = self.session
        if session.sock is not None:  # the connection the last scrape left open
            self.sock, session.sock, self._reused = session.sock, None, True
            self._send()
        elif session.addresses:
            self._connect()
        else:
            try:
                session.addresses = socket.getaddrinfo(
                    session.host, session.port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
                )
            except socket.gaierror:  # a name: looked up on a thread, which a slow DNS server holds alone
                self.phase = "looking up the host"
                self.lookup = self.round.resolver().submit(
                    socket.getaddrinfo, session.host, session.port, type=socket.SOCK_STREAM
                )
                self.round.lookups.append(self)
                return
            self._connect()

    def looked_up(self) -> None:
        self.session.addresses = self.lookup.result()
        self._connect()

    def ready(self, events: int) -> None:
        if self.phase == "connecting":
            error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                self._close_socket()
                if self._next_address < len(self.session.addresses):
                    self._connect()
                    return
                self.session.addresses = []
                raise OSError(error, os.strerror(error))
            self._send()
        elif events & selectors.EVENT_WRITE:
            self._send()
        else:
            self._receive()

    @property
    def has_body(self) -> bool:
        """Whether its body was read and waits for its parse, or is being parsed."""
        return self in self.session.bodies

    def start_parse(self) -> None:
        """Parse the body, a step at a time, now that the target's earlier bodies are parsed."""
        self.phase = "parsing"
        self.steps = self.session.parser.parse_steps(self._text, self.session.timeout_s)
        self._text = ""
        self.round.queue(self)

    def parse_step(self) -> None:
        try:
            self.line = next(self.steps)
        except StopIteration as done:
            self.steps = None
            self._end(self.session.succeeded(self.ts, time.perf_counter() - self.started, done.value))

    def cut_off(self) -> None:
        """The round's deadline has passed during the fetch: it ends down, naming where it was."""
        self._fail(self.session.deadline_error(self.phase))

    def give_up(self) -> None:
        """The rounds it could be carried into have ended too, its body not parsed: it ends down."""
        doing = f"parsing (line {self.line})" if self.steps is not None else self.phase
        self._fail(f"deadline of {self.session.carry_rounds} more round(s) exceeded while {doing}")

    def _connect(self) -> None:
        self.phase = "connecting"
        family, kind, proto, _, address = self.session.addresses[self._next_address]
        self._next_address += 1
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        self.sock = sock
        error = sock.connect_ex(address)
        if error not in (0, errno.EINPROGRESS):
            raise OSError(error, os.strerror(error))
        self.round.selector.register(sock, selectors.EVENT_WRITE, self)

    def _send(self) -> None:
        self.phase = "waiting for the response"
        try:
            self._sent += self.sock.send(self.session.request[self._sent :])
        except BlockingIOError:
            pass
        except (ConnectionResetError, BrokenPipeError):
            if not self._may_retry():
                raise
            self._retry()
            return
        events = selectors.EVENT_READ if self._sent == len(self.session.request) else selectors.EVENT_WRITE
        self._watch(events)

    def _receive(self) -> None:
        """Read all the socket holds, up to the response's end: a chunk per poll would leave a large body
        waiting for the parse slices between polls (the reader's limits bound what is read)."""
        reader = self._reader
        while True:
            try:
                data = self.sock.recv(_READ_CHUNK)
            except BlockingIOError:
                return
            except ConnectionResetError:
                if not self._may_retry():
                    raise
                self._retry()
                return
            if not data:
                if self._may_retry():
                    self._retry()
                    return
                reader.closed()
                break
            if reader.feed(data):
                break
            if reader.head_done:
                self.phase = "reading the body"
        self._body_read(reader)

    def _body_read(self, reader: ResponseReader) -> None:
        """The response is complete: keep or close the connection, then start parsing the body."""
        sock, self.sock = self.sock, None
        self.round.selector.unregister(sock)
        if reader.reusable:
            self.session.sock = sock
        else:
            sock.close()
        body = reader.body
        if reader.content_encoding == "gzip":
            body = _gunzip(body, self.session.limits.max_body_bytes)
        self._text = body.decode()
        self._reader = None  # its bytes: the body may wait rounds for its parse, as text alone
        bodies = self.session.bodies
        bodies.append(self)
        if len(bodies) == 1:
            self.start_parse()
        else:
            self.phase = "waiting for the parse of the target's previous body"

    def _may_retry(self) -> bool:
        """Whether the connection that failed was the idle keep-alive one, before any byte of its answer:
        the target dropped it while idle, which is worth one more try on a fresh connection."""
        return self._reused and not self._retried and self._reader is not None and not self._reader.started

    def _retry(self) -> None:
        self._close_socket()
        self._retried, self._reused, self._sent, self._next_address = True, False, 0, 0
        if self.session.addresses:
            self._connect()
        else:
            self.start()

    def _watch(self, events: int) -> None:
        selector = self.round.selector
        try:
            key = selector.get_key(self.sock)
        except KeyError:
            selector.register(self.sock, events, self)
            return
        if key.events != events:
            selector.modify(self.sock, events, self)

    def _close_socket(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.round.selector.unregister(sock)
            sock.close()

    def _fail(self, error: str) -> None:
        self._close_socket()
        if self.steps is not None:
            self.steps.close()
            self.steps = None
        if self.outcome is None:
            self._end(self.session.failed(self.ts, time.perf_counter() - self.started, error))

    def _end(self, outcome: _Outcome) -> None:
        """Record the outcome; if this scrape held the target's parser, the target's next body may start."""
        self.outcome = outcome
        self.round.running -= 1
        self.round.ended.append(self)
        bodies = self.session.bodies
        if self in bodies:
            held_parser = bodies[0] is self
            bodies.remove(self)
            if held_parser and bodies:
                bodies[0].guarded(bodies[0].start_parse)

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, DeadlineExceeded):
            return f"parsing used up its {self.session.timeout_s:g} s of CPU time (line {exc.lineno})"
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, socket.gaierror):
            return f"cannot look up {self.session.host}: {exc.strerror}"
        if isinstance(exc, HubError):
            return str(exc)
        if isinstance(exc, UnicodeDecodeError):
            return f"body is not UTF-8: {exc}"
        return f"{type(exc).__name__}: {exc}"


class Scraper:
    """Scrapes this shard's targets, all at once, every `interval_s` seconds (1 to 60).

    One loop, on the caller's thread, drives every target's scrape over non-blocking sockets (stdlib
    `selectors`) and parses each body, a run of lines at a time between reads, as it completes: no
    thread per target, and so no threads fighting for the GIL. Host names are looked up on a small
    pool of threads (addresses need none). A round ends when all its scrapes have, or at its deadline,
    when every fetch still going is cut off and every body still to parse is carried into the next
    round (see the module's docstring); so no fetch outlives its round, no scrape the round after, and
    a target is asked once per round.

    `carry_rounds` is how many rounds after its own a body may still be parsed in (CARRY_S at least one).
    `target_source` is called before every round (a TargetsFile's `current`, or any list in tests);
    `targets` holds the last round's targets of this shard. `clock` gives the unix time that stamps
    samples and aligns ticks. `types` collects every family's type from the targets' TYPE lines (the
    last one seen wins), for the hub's rate computations. Counters for the hub's own metrics:
    `duplicates_dropped` (samples whose series came earlier in the same body) and `ticks_skipped`
    (ticks whose deadline had passed when the loop reached them). One caller at a time: `run` or
    `scrape_once`.
    """

    def __init__(
        self,
        target_source: Callable[[], Sequence[Target]],
        *,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
        shard: Shard = Shard(),
        limits: ScrapeLimits = ScrapeLimits(),
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
        self.carry_rounds = max(1, math.ceil(CARRY_S / interval_s))
        self.shard = shard
        self.limits = limits
        self.types: dict[str, str] = {}
        self.targets: list[Target] = []
        self.duplicates_dropped = 0
        self.ticks_skipped = 0
        self._target_source = target_source
        self._clock = clock
        self._sessions: dict[str, _TargetSession] = {}
        self._selector = selectors.DefaultSelector()
        self._resolver: ThreadPoolExecutor | None = None
        self._settled = False
        self._carried: list[_Scrape] = []  # scrapes whose body is still to parse, into the next round
        self._ended: list[_Scrape] = []  # scrapes ended and not yet handed over, in the order they ended

    def scrape_once(self) -> tuple[list[ScrapeBatch], list[TargetStatus]]:
        """One round now: every target of this shard, concurrently, each fetch until its deadline, and
        every body read parsed to its end (or its CPU budget's)."""
        self._round(time.monotonic() + self.timeout_s)
        self._parse_carried()
        return self._take_ended()

    def run(self, stop: threading.Event, sink: Sink) -> None:
        """Scrape at each multiple of the interval until `stop` is set; after each round, `sink` gets the
        scrapes that ended since its last call (the round's, and earlier rounds' that were still parsing).

        A round ends by its deadline, which is never past the next tick, so slow targets delay no tick;
        bodies still to parse are parsed until the next tick, and in the next round. A sink that raises
        loses only what it was given; one that blocks past a tick's deadline makes the loop skip that
        tick rather than bunch scrapes together. Once stopped, the bodies read are parsed and handed over.
        """
        tick = self._first_tick(self._clock())
        while not stop.is_set():
            self._parse_until(tick)
            if stop.wait(max(0.0, tick - self._clock())):
                break
            late = max(0.0, self._clock() - tick)
            self._round(time.monotonic() + self.timeout_s - late)
            self._hand_over(sink)
            if not self._settled:
                self._settle()
            tick = self._next_tick(tick)
        self._parse_carried()
        if self._ended:
            self._hand_over(sink)

    def _hand_over(self, sink: Sink) -> None:
        batches, statuses = self._take_ended()
        try:
            sink(batches, statuses)
        except Exception:
            log.exception("scrape sink failed; %d batches of this round are lost", len(batches))

    def _settle(self) -> None:
        """After the first round whose targets that answered all sent steady bodies (every series cached),
        collect garbage once and freeze what lives: the parsers' caches and the store's memo, a few objects
        per series, which every full collection would otherwise walk (about 240 ms of CPU for 126k series,
        one in some 30 rounds). Objects frozen are still freed when no longer referenced; series that come
        later are collected as usual. Only the hub's loop (`run`) does it, once."""
        up = [session for session in self._sessions.values() if session.was_up]
        if up and all(session.parser.steady for session in up):
            self._settled = True
            gc.collect()
            gc.freeze()

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()
        self._selector.close()
        if self._resolver is not None:
            self._resolver.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Scraper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _first_tick(self, now: float) -> float:
        return (now // self.interval_s + 1) * self.interval_s

    def _next_tick(self, tick: float) -> float:
        """The tick after `tick`, unless the sink (or one step of a parse) held the loop past its
        deadline (then the first tick whose deadline is still ahead, the skipped ones counted), or the
        clock was set back."""
        tick += self.interval_s
        now = self._clock()
        overdue = now - (tick + self.timeout_s)
        if overdue >= 0:
            skipped = int(overdue // self.interval_s) + 1
            self.ticks_skipped += skipped
            log.warning("the scrape loop was held past %d tick(s); skipped them", skipped)
            tick += skipped * self.interval_s
        if tick - now > self.interval_s:
            tick = self._first_tick(now)
        return tick

    def _round(self, deadline: float) -> None:
        """Scrape every target of this shard, each fetch by `deadline` (time.monotonic), and go on with
        the bodies carried from the round before; this round's last for them."""
        self.targets = [target for target in self._target_source() if self.shard.owns(target)]
        round_ = _Round(self._selector, self._lookups, deadline)
        ts = self._clock()
        scrapes = [_Scrape(session, round_, ts) for session in self._sessions_for(self.targets)]
        self._carried = round_.drive(scrapes, self._carried)
        self._ended += round_.ended

    def _parse_until(self, tick: float) -> None:
        """Go on parsing the carried bodies until `tick` (unix time, on `clock`), the next round's start."""
        if self._carried:
            round_ = _Round(self._selector, self._lookups, time.monotonic() + tick - self._clock())
            self._carried = round_.drive((), self._carried, counts=False)
            self._ended += round_.ended

    def _parse_carried(self) -> None:
        """Parse the carried bodies to their ends (each within its CPU budget)."""
        round_ = _Round(self._selector, self._lookups, math.inf)
        round_.parse_all(self._carried)
        self._carried = []
        self._ended += round_.ended

    def _take_ended(self) -> tuple[list[ScrapeBatch], list[TargetStatus]]:
        """The scrapes ended since the last call, as batches and statuses, their types and duplicates
        counted, and their targets' changes logged."""
        ended, self._ended = self._ended, []
        _log_changes(list(dict.fromkeys(scrape.session for scrape in ended)))
        outcomes = [scrape.outcome for scrape in ended]
        for outcome in outcomes:
            self.types.update(outcome.types)
            self.duplicates_dropped += outcome.duplicates
        batches = [outcome.batch for outcome in outcomes if outcome.batch is not None]
        return batches, [outcome.status for outcome in outcomes]

    def _lookups(self) -> Executor:
        if self._resolver is None:
            self._resolver = ThreadPoolExecutor(_LOOKUP_THREADS, thread_name_prefix="fleetlens-lookup")
        return self._resolver

    def _sessions_for(self, targets: Sequence[Target]) -> list[_TargetSession]:
        """A session per target, kept across rounds; a target whose labels changed starts afresh."""
        wanted = {target.address: target for target in targets}
        for address, session in list(self._sessions.items()):
            if wanted.get(address) != session.target:
                session.close()
                del self._sessions[address]
        for address, target in wanted.items():
            if address not in self._sessions:
                self._sessions[address] = _TargetSession(
                    target, self.timeout_s, self.limits, self.carry_rounds
                )
        return [self._sessions[address] for address in wanted]

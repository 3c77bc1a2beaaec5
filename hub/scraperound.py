"""One scrape round on one thread: every target's fetch and parse driven over non-blocking sockets.

A Scrape is one target's scrape, a state machine: look up the host (on a thread; addresses need none),
connect or reuse the target's keep-alive connection, send `GET /metrics`, read the response as it
arrives (hub.httpread, which treats its bytes as hostile), then parse the body with the target's parser
a step at a time. A ScrapeRound drives its scrapes until all have ended or its deadline passed: then a
fetch still going is cut off (down, "deadline of N s exceeded while <what it was doing>"), and a body
still to parse is carried into the next round, bodies of targets that were up first. A carried body not
parsed within its session's carry_rounds ends down too. Any failure of a step ends only its scrape
(`Scrape.guarded`), never the round.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Executor, Future

from hub.errors import DeadlineExceeded, HubError
from hub.expfmt import Exposition
from hub.httpread import ResponseReader
from hub.targetsession import Outcome, TargetSession, gunzip_scraped

log = logging.getLogger("fleetlens.scraper")

_READ_CHUNK = 256 * 1024
# Host name lookups run on threads; the loop looks for their answers this often.
_LOOKUP_POLL_S = 0.01
# Parsing runs in slices of this long between polls of the sockets, whose data waits in kernel buffers.
_PARSE_SLICE_S = 0.01


class ScrapeRound:
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
        self.lookups: list[Scrape] = []
        self.warm: deque[Scrape] = deque()
        self.cold: deque[Scrape] = deque()
        self.ended: list[Scrape] = []

    def drive(
        self, scrapes: Sequence[Scrape], carried: Sequence[Scrape] = (), *, counts: bool = True
    ) -> list[Scrape]:
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

    def parse_all(self, carried: Sequence[Scrape]) -> None:
        """Parse the bodies of `carried` to their ends, with no deadline but each parse's CPU budget."""
        self._take(carried)
        while self.warm or self.cold:
            self._parse_for(math.inf)

    def queue(self, scrape: Scrape) -> None:
        """Queue a scrape whose parse has started for its steps, by whether its target was up."""
        (self.warm if scrape.session.was_up else self.cold).append(scrape)

    def _take(self, carried: Sequence[Scrape]) -> None:
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


class Scrape:
    """One target's scrape, a state machine the loop drives: look up the host if it is not an address,
    connect (or reuse the idle keep-alive connection), send the request, read the response as it arrives,
    then (once the target's earlier bodies are parsed) parse the body a step at a time, in its round or
    the next. `outcome` is set once it has ended."""

    def __init__(self, session: TargetSession, round_: ScrapeRound, ts: float) -> None:
        self.session = session
        self.round = round_
        self.ts = ts
        self.started = time.perf_counter()
        self.phase = "connecting"
        self.outcome: Outcome | None = None
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
            body = gunzip_scraped(body, self.session.limits.max_body_bytes)
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

    def _end(self, outcome: Outcome) -> None:
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

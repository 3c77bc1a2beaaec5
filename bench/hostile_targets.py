"""Healthy targets' scrape interval next to hostile ones: silent, slow-loris and 1M-series targets.

Serves healthy targets (a fixed body of 480 DCGM-style samples) and hostile ones from this process, drives
`hub.scraper.Scraper(...).run(stop, sink)` for --duration seconds, and prints how often each healthy
target was scraped (p50 and max of the gaps between its consecutive requests, as its server saw them),
what the scraper said of each hostile one, and how much the process's peak RSS grew while scraping (the
servers' own share is small unless a slow-to-parse target builds its body anew). Only that interface is
used, so the same command measures an older scraper: put its tree first on the path.

    .venv/bin/python bench/hostile_targets.py [--duration 60] [--interval 5] [--silent 1] [--huge 1] ...
    git archive HEAD | tar -x -C /tmp/old && PYTHONPATH=/tmp/old .venv/bin/python bench/hostile_targets.py

The target servers are also the hostile targets of tests/hub/test_scraper.py.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gc
import itertools
import logging
import re
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

Handler = Callable[["TargetServer", socket.socket], None]


class TargetServer:
    """A loopback listener whose every connection runs `handler(server, connection)` on a thread of its
    own; `requests` holds the time.monotonic() at which each request was read."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.requests: list[float] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return self._address

    def read_request(self, connection: socket.socket) -> bool:
        """Read one request head; False once the client has hung up."""
        head = b""
        while b"\r\n\r\n" not in head:
            data = connection.recv(4096)
            if not data:
                return False
            head += data
        self.requests.append(time.monotonic())
        return True

    def close(self) -> None:
        """Stop listening and hang up on every client, so that no handler outlives the server."""
        with self._lock:
            self._closed = True
            connections, self._connections = self._connections, set()
        for sock in (self._listener, *connections):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    connection.close()
                    return
                self._connections.add(connection)
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with contextlib.suppress(OSError):
            self._handler(self, connection)
        with self._lock:
            self._connections.discard(connection)
        connection.close()


@contextlib.contextmanager
def serving(handler: Handler) -> Iterator[TargetServer]:
    server = TargetServer(handler)
    try:
        yield server
    finally:
        server.close()


def body_server(body: bytes | Callable[[int], bytes]) -> Handler:
    """Answers every request with `body`, or with `body(requests so far)`, keeping the connection alive."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n"

    def handle(server: TargetServer, connection: socket.socket) -> None:
        while server.read_request(connection):
            payload = body(len(server.requests)) if callable(body) else body
            connection.sendall(head % len(payload))
            connection.sendall(payload)

    return handle


def silent(server: TargetServer, connection: socket.socket) -> None:
    """Accepts and never answers: an exporter that is up but stuck."""
    while connection.recv(4096):
        pass


def slow_loris(every_s: float = 0.2) -> Handler:
    """Answers with a status line, then a header line that never ends, one byte every `every_s`: each
    byte arrives well within any socket timeout, so only a deadline for the whole scrape stops it."""

    def handle(server: TargetServer, connection: socket.socket) -> None:
        if server.read_request(connection):
            connection.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
            while True:
                connection.sendall(b"x")
                time.sleep(every_s)

    return handle


def healthy_body(gpus: int = 8, metrics: int = 60) -> bytes:
    """A steady exporter's body: `metrics` gauge families of `gpus` samples, dcgm-exporter's labels."""
    lines = []
    for m in range(metrics):
        name = f"DCGM_FI_DEV_BENCH_{m}"
        lines += [f"# HELP {name} A gauge.", f"# TYPE {name} gauge"]
        lines += [
            f'{name}{{gpu="{g}",UUID="GPU-{g:08x}-0000-0000-0000-000000000000",pci_bus_id="00000000:{g:02X}:00.0",'
            f'device="nvidia{g}",modelName="NVIDIA H100 80GB HBM3",Hostname="bench"}} {m * g}'
            for g in range(gpus)
        ]
    return ("\n".join(lines) + "\n").encode()


def series_body(count: int) -> bytes:
    """`count` distinct series, one short line each (1M series: a 17 MB body)."""
    return b"# TYPE x gauge\n" + b"".join(b'x{i="%d"} 1\n' % i for i in range(count))


def slow_body(megabytes: float, scrape: int = 0) -> bytes:
    """Lines whose label value is a thousand escaped newlines, unescaped one by one: parsing takes about
    0.2 s a megabyte (16 MB: seconds) with little memory. Every series names `scrape`, so that no scrape
    finds them in the parser's cache."""
    line = 'slow{i="%d",scrape="%d",v="' + "\\n" * 1000 + '"} 1\n'
    return b"".join((line % (i, scrape)).encode() for i in range(int(megabytes * 1e6 / len(line))))


def serve(count: int, make: Callable[[], Handler]) -> list[TargetServer]:
    """`count` servers sharing one handler (and its body), which is built only when wanted."""
    if not count:
        return []
    handler = make()
    return [TargetServer(handler) for _ in range(count)]


def gaps(times: list[float], end: float) -> list[float]:
    """Seconds between consecutive scrapes, and from the last one to `end` when that is longer."""
    between = [b - a for a, b in itertools.pairwise(times)]
    if times and (not between or end - times[-1] > max(between)):
        between.append(end - times[-1])
    return between


def memory_kb(field: str) -> int:
    """A /proc/self/status figure: VmRSS (resident now) or VmHWM (the peak since the last reset)."""
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)[1])


def reset_peak_rss() -> int:
    """Restart VmHWM from the current RSS (Linux), so that building the bodies does not count; returns it."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    return memory_kb("VmRSS")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of scraping (60)")
    parser.add_argument("--interval", type=float, default=5.0, help="scrape interval in seconds (5)")
    parser.add_argument("--timeout", type=float, help="scrape timeout in seconds (the interval)")
    parser.add_argument("--healthy", type=int, default=8, help="healthy targets (8)")
    parser.add_argument("--silent", type=int, default=1, help="targets that accept and never answer (1)")
    parser.add_argument("--loris", type=int, default=1, help="targets that send a byte every 0.2 s (1)")
    parser.add_argument("--huge", type=int, default=1, help="targets serving --series series (1)")
    parser.add_argument("--series", type=int, default=1_000_000, help="series of a huge target (1M)")
    parser.add_argument("--slow", type=int, default=0, help="targets whose body takes seconds to parse (0)")
    args = parser.parse_args()
    timeout = args.timeout or args.interval
    logging.basicConfig(level=logging.ERROR)  # targets going down is what this run is about

    sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: an old tree wins
    from hub import scraper as scraper_module
    from hub.scraper import Scraper
    from hub.targets import Target

    kinds: dict[str, tuple[int, Callable[[], Handler]]] = {
        "healthy": (args.healthy, lambda: body_server(healthy_body())),
        "silent": (args.silent, lambda: silent),
        "slow-loris": (args.loris, slow_loris),
        f"{args.series} series": (args.huge, lambda: body_server(series_body(args.series))),
        "slow to parse": (args.slow, lambda: body_server(functools.partial(slow_body, 16))),
    }
    servers = {kind: serve(count, make) for kind, (count, make) in kinds.items()}
    kind_of = {server.address: kind for kind, group in servers.items() for server in group}
    targets = [Target(address, {"node": f"{kind}-{i}"}) for i, (address, kind) in enumerate(kind_of.items())]
    said: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def sink(batches: list, statuses: list) -> None:
        for status in statuses:
            said[kind_of[status.target]][status.error or "up"] += 1

    print(f"scraper: {scraper_module.__file__}")
    print(f"{args.duration:g} s at a {args.interval:g} s interval, timeout {timeout:g} s")
    resident = reset_peak_rss()
    scraper = Scraper(lambda: targets, interval_s=args.interval, timeout_s=timeout)
    stop = threading.Event()
    runner = threading.Thread(target=scraper.run, args=(stop, sink), daemon=True)
    start = time.monotonic()
    runner.start()
    time.sleep(args.duration)
    stop.set()
    end = time.monotonic()
    runner.join(timeout=timeout + 10)
    stuck = runner.is_alive()  # before the servers close: closing them unblocks any stuck scrape
    peak_growth = memory_kb("VmHWM") - resident

    times = [[t for t in server.requests if start <= t <= end] for server in servers["healthy"]]
    spans = [gap for scrapes in times for gap in gaps(scrapes, end)] or [end - start]
    print(
        f"healthy targets ({len(times)}): at least {min(map(len, times), default=0)} scrapes each in "
        f"{int(args.duration // args.interval)} ticks; gaps between scrapes: "
        f"p50 {statistics.median(spans):.2f} s, max {max(spans):.2f} s"
    )
    for kind in (kind for kind, group in servers.items() if group):
        shown = ", ".join(f"{n}x {error[:100]!r}" for error, n in said[kind].most_common(2))
        print(f"  {kind:>16}: {sum(said[kind].values())} rounds reported; {shown}")
    print(f"peak RSS while scraping: {peak_growth / 1024:+.0f} MB over the RSS before it")
    for group in servers.values():
        for server in group:
            server.close()
    if stuck:
        print(f"run() had not returned {timeout + 10:g} s after stop: a round is stuck")
    else:
        scraper.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

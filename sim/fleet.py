"""A fleet of simulated GPU VMs served from one process: each node a real exporter on its own loopback port.

The ports are served by one asyncio loop (sim.loopserver), not a server thread per node, so that
a Vela-sized fleet polled every second by two scrapers stays within one process's means.

Each node gets a generated /sys tree (sim.sysfs) and an exporter built through the collector
registry like the real one (gpu with the simulated backend, infiniband, netclass), so that a hub, a
benchmark or a stock Prometheus scrapes the fleet exactly as it would scrape VMs. A background thread
advances every tree, so counters grow between scrapes; the simulated GPUs integrate over their own clock.

    with SimFleet(192, Path("/dev/shm/fleet"), cache_s=5) as fleet:
        fleet.write_file_sd(Path("targets.json"))  # [{"targets": ["127.0.0.1:P"], "labels": {"node": ...}}]
        fleet.nodes[3].sysfs.set_link(1, up=False)

    python -m sim.fleet --nodes 192 --dir /dev/shm/fleet --file-sd targets.json   # until Ctrl-C

`cache_s`: a scrape of one node costs ~15 ms of CPU (collect ~10, render ~3.5, HTTP), so 192 nodes scraped
every second would need ~3 cores. With cache_s > 0 each node's response is kept and served again for cache_s
seconds, so the fleet costs at most nodes/cache_s scrapes per second however many scrapers poll it. The
price: values are up to cache_s old, and a scraper polling faster than cache_s sees the same values
several times (rates read 0, then jump). Bodies keep their full size and sample count, so ingest and
parser throughput measured against a cached fleet stay true. The trees then advance every cache_s
seconds too (never more often than every second): an advance costs ~1 ms per node on tmpfs, and one no
render can show is wasted. Put `base_dir` on tmpfs for large fleets (see sim.sysfs).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from collectors import registry
from collectors.base import CollectorOptions
from collectors.exporter import Exporter, make_app, make_registry
from sim.loopserver import LoopServer
from sim.sysfs import SimSysfs

COLLECTORS = ("gpu", "infiniband", "netclass")
SEED_STRIDE = 100_000  # node seeds are seed * SEED_STRIDE + index: distinct for fleets under this size
MIN_TICK_S = 1.0
LOOPBACK = "127.0.0.1"


def node_name(index: int) -> str:
    """The name of the index-th node (0-based): vela-001, vela-002, ..."""
    return f"vela-{index + 1:03d}"


@dataclass(frozen=True)
class _Response:
    status: str
    headers: list[tuple[str, str]]
    body: bytes
    made_at: float


class CachedMetrics:
    """WSGI middleware that answers /metrics from a kept response, re-rendered at most every `max_age_s`.

    Responses are kept per (Accept, Accept-Encoding) pair, the headers that choose the format and the
    compression, so a Prometheus asking for OpenMetrics and a hub asking for text each get their own.
    Only the very first scrape of a format waits for a render. After that a stale response is still
    served at once while `refresher` (one worker shared by the whole fleet) renders its successor: with
    192 nodes expiring together, renders on the request path would pile up one thread per waiting
    scrape and starve the machine, which is what the scrapers being measured must not see.
    """

    def __init__(
        self,
        app: Callable,
        max_age_s: float,
        refresher: Executor,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app = app
        self._max_age_s = max_age_s
        self._refresher = refresher
        self._clock = clock
        self._lock = threading.Lock()
        self._responses: dict[tuple[str, str], _Response] = {}
        self._refreshing: set[tuple[str, str]] = set()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            return self._app(environ, start_response)
        key = (environ.get("HTTP_ACCEPT", ""), environ.get("HTTP_ACCEPT_ENCODING", ""))
        with self._lock:
            response = self._responses.get(key)
            if response is None:
                response = self._responses[key] = self._render(environ)
            elif self._clock() - response.made_at >= self._max_age_s and key not in self._refreshing:
                self._refreshing.add(key)
                self._refresher.submit(self._refresh, key, dict(environ))
        start_response(response.status, response.headers)
        return [response.body]

    def _refresh(self, key: tuple[str, str], environ: dict) -> None:
        response = self._render(environ)
        with self._lock:
            self._responses[key] = response
            self._refreshing.discard(key)

    def _render(self, environ: dict) -> _Response:
        started: list[tuple[str, list[tuple[str, str]]]] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: object = None) -> None:
            started.append((status, headers))

        now = self._clock()
        body = b"".join(self._app(environ, start_response))
        status, headers = started[-1]
        return _Response(status, headers, body, now)


@dataclass
class SimNode:
    """One simulated VM: its /sys tree (the fault hooks), its exporter and the "host:port" it answers on.

    The simulated GPUs are the gpu collector's shared backend for `options`: acquire_backend(options) reaches
    them (release_backend after) to set loads and faults.
    """

    name: str
    sysfs: SimSysfs
    options: CollectorOptions
    exporter: Exporter
    address: str


class SimFleet:
    """`nodes` simulated VMs with `gpus` GPUs and `nics` RoCE ports each, trees under `base_dir`/<node>."""

    def __init__(
        self,
        nodes: int,
        base_dir: Path,
        gpus: int = 8,
        nics: int = 4,
        seed: int = 0,
        cache_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < nodes < SEED_STRIDE:
            raise ValueError(f"nodes must be within 1..{SEED_STRIDE - 1}, got {nodes}")
        if cache_s < 0:
            raise ValueError(f"cache_s must not be negative, got {cache_s}")
        self._count = nodes
        self._base_dir = Path(base_dir)
        self._gpus = gpus
        self._nics = nics
        self._seed = seed
        self._cache_s = cache_s
        self._clock = clock
        self._stopping = threading.Event()
        self._ticker: threading.Thread | None = None
        self._refresher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="simfleet-render")
        self._server = LoopServer()
        self.nodes: list[SimNode] = []  # a fleet starts once: stop() ends its renderer for good

    def __enter__(self) -> SimFleet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> SimFleet:
        """Write the trees, start each node's server on a free port and the thread that advances the trees."""
        self._stopping.clear()
        self._server.start()
        try:
            for index in range(self._count):
                self.nodes.append(self._start_node(index))
        except BaseException:
            self.stop()
            raise
        self._ticker = threading.Thread(target=self._advance_trees, name="simfleet-ticker", daemon=True)
        self._ticker.start()
        return self

    def stop(self) -> None:
        """Stop the ticker and every server (their ports are free afterwards) and close the exporters."""
        self._stopping.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        self._server.stop()
        for node in self.nodes:
            node.exporter.close()
        self.nodes = []
        self._refresher.shutdown(wait=True, cancel_futures=True)

    @property
    def targets(self) -> list[dict]:
        """The fleet as Prometheus file_sd JSON: one group per node, labelled with its name."""
        return [{"targets": [node.address], "labels": {"node": node.name}} for node in self.nodes]

    def write_file_sd(self, path: Path) -> None:
        write_file_sd(path, self.targets)

    def _start_node(self, index: int) -> SimNode:
        name = node_name(index)
        node_seed = self._seed * SEED_STRIDE + index
        sysfs = SimSysfs(self._base_dir / name, name, nics=self._nics, seed=node_seed)
        sysfs.write()
        options = CollectorOptions(
            sysfs_root=sysfs.root,
            node=name,
            gpu_backend="sim",
            gpu_sim_seed=node_seed,
            gpu_sim_count=self._gpus,
        )
        exporter = Exporter(registry.build(COLLECTORS, options))
        app = make_app(make_registry(exporter, process_metrics=False))  # one process: no per-node process_*
        if self._cache_s > 0:
            app = CachedMetrics(app, self._cache_s, self._refresher, self._clock)
        try:
            port = self._server.serve(app, LOOPBACK)
        except BaseException:
            exporter.close()
            raise
        return SimNode(name, sysfs, options, exporter, f"{LOOPBACK}:{port}")

    def _advance_trees(self) -> None:
        period = max(MIN_TICK_S, self._cache_s)
        last = self._clock()
        while not self._stopping.wait(period):
            now = self._clock()
            for node in self.nodes:
                node.sysfs.advance(now - last)
            last = now


def write_file_sd(path: Path, groups: list[dict]) -> None:
    """Write file_sd target groups to `path` atomically, so a scraper watching it never reads half of it."""
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(groups, indent=1) + "\n")
    os.replace(staging, path)


def main(argv: list[str] | None = None) -> int:
    """Serve a simulated fleet until SIGINT (Ctrl-C) or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m sim.fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=192, help="simulated VMs (default 192, Vela-sized)")
    parser.add_argument("--dir", type=Path, required=True, help="where the /sys trees go (tmpfs is best)")
    parser.add_argument("--file-sd", type=Path, required=True, help="Prometheus file_sd JSON to write")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--nics", type=int, default=4, help="RoCE ports per node (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="fleet seed (default 0)")
    parser.add_argument(
        "--cache-s", type=float, default=0.0, help="serve each node's response this long (default 0: never)"
    )
    args = parser.parse_args(argv)
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # before any thread starts: all inherit it
    fleet = SimFleet(args.nodes, args.dir, args.gpus, args.nics, args.seed, args.cache_s)
    with fleet:
        fleet.write_file_sd(args.file_sd)
        print(f"simfleet: {len(fleet.nodes)} nodes serving, targets in {args.file_sd}", flush=True)
        signal.sigwait(stop_signals)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

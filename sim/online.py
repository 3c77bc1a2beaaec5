"""A scenario played online, through the hub's own parts: the nodes served on loopback and scraped by the
hub's Scraper in lockstep with simulated time, the rows written by the hub's Writer (with its spool), the
step records POSTed as JSON lines to a Hub's /api/v1/steps, the scenario's topology (if any) POSTed
once to its /api/v1/topology as the operator's inventory, before the first tick, on the hub's clock,
which is the fleet's. Same rows as sim.offline but for the
targets' duration_s (the real one)."""

from __future__ import annotations

import dataclasses
import http.client
import json
import math
import ssl
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from analytics.store import Store
from collectors.gpu.sim import ManualClock
from collectors.steprecord import CONTRACT_KEYS, StepRecord
from hub.app import Hub
from hub.otlp import OtlpStepReceiver
from hub.scraper import Scraper
from hub.spool import Spool
from hub.targets import Target
from hub.writer import Writer
from sim.errors import SimulationError
from sim.fleet import LOOPBACK
from sim.hostagents import TopologyReport, topology_reports
from sim.jobs import JobModel
from sim.loopserver import LoopServer
from sim.node import SCENARIO_EPOCH, SimNode, SimSummary, tick_times
from sim.scenario import Scenario

STEPS_PER_POST = 2_000  # online: step records per POST, well under the loopback server's body limit
SPOOL_BYTES = 1 << 30


def simulate_online(
    scenario: Scenario, store: Store, workdir: Path, speed: float = 1.0, epoch: float = SCENARIO_EPOCH
) -> SimSummary:
    """Play the scenario through the hub's own parts: nodes on loopback, scraped once per tick in lockstep
    with the simulation, paced at interval_s / speed real seconds (speed 0 or inf: no pause)."""
    if math.isnan(speed) or speed < 0:
        raise SimulationError(f"speed must be 0 (no pause), positive or inf, got {speed}")
    if scenario.exporters == "stock":
        raise SimulationError(
            f"{scenario.name}: exporters: stock plays offline (sim run --offline, eval) or on the wall clock "
            "(sim serve); the online mode scrapes with the hub's own scraper, which is not how a stock "
            "fleet reaches a hub"
        )
    started = time.perf_counter()
    workdir = Path(workdir)
    fleet_clock = ManualClock(epoch)
    ticks = tick_times(scenario)
    jobs = [JobModel(job, scenario, epoch) for job in scenario.jobs]
    samples = steps = targets_down = 0
    with ExitStack() as stack:
        nodes = [SimNode(scenario, index, workdir, epoch) for index in range(scenario.fleet.nodes)]
        for node in nodes:
            stack.callback(node.close)
        server = LoopServer().start()
        stack.callback(server.stop)
        addresses = {node.name: f"{LOOPBACK}:{server.serve(node.wsgi, LOOPBACK)}" for node in nodes}
        targets = [Target(address, {"node": name}) for name, address in addresses.items()]
        names = {addresses[node.name]: node.target for node in nodes}  # loopback address -> target name
        spool = Spool(tempfile.mkdtemp(prefix="spool-", dir=workdir), SPOOL_BYTES)
        writer = Writer(store, spool)  # a Store is thread-safe: the hub's request threads share it
        stack.callback(writer.close)
        hub = Hub(store, writer, OtlpStepReceiver(), wall_clock=lambda: fleet_clock.now)
        poster = stack.enter_context(StepPoster(f"{LOOPBACK}:{server.serve(hub.app, LOOPBACK)}"))
        for report in topology_reports(scenario):
            poster.post_topology(report)
        scraper = stack.enter_context(
            Scraper(lambda: targets, interval_s=min(scenario.interval_s, 60.0), clock=fleet_clock)
        )
        for k, t in enumerate(ticks):
            _pace(started, k * scenario.interval_s, speed)
            fleet_clock.now = epoch + t
            for node in nodes:
                node.play_until(t)
            rows = [row for job in jobs for row in job.steps_until(t)]
            poster.post(rows)
            batches, statuses = scraper.scrape_once()
            writer.write("samples", [dataclasses.replace(b, target=names[b.target]) for b in batches])
            writer.write("targets", [dataclasses.replace(s, target=names[s.target]) for s in statuses])
            samples += sum(len(batch) for batch in batches)
            steps += len(rows)
            targets_down += sum(not status.up for status in statuses)
    return SimSummary(len(ticks), samples, steps, targets_down, time.perf_counter() - started)


def _pace(started: float, simulated_s: float, speed: float) -> None:
    """Wait until `simulated_s` of simulated time has passed at `speed` x real time."""
    if speed in (0, math.inf):
        return
    delay = started + simulated_s / speed - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


_STEP_KEYS = CONTRACT_KEYS


def step_lines(rows: Sequence[StepRecord]) -> bytes:
    """Step rows as the step JSON-lines contract (collectors.steps), unknown values left out."""
    records = (
        {key: getattr(row, key) for key in _STEP_KEYS if getattr(row, key) is not None} for row in rows
    )
    return "".join(json.dumps(record) + "\n" for record in records).encode()


class StepPoster:
    """POSTs step records to a hub's /api/v1/steps over one keep-alive connection, with `token` (one with
    the write scope) as its bearer token when the hub needs one; over TLS with `tls` (a hub served with
    --web.config.file)."""

    def __init__(self, address: str, token: str | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.address = address
        self._tls = tls
        self._headers = {"Content-Type": "application/x-ndjson"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._conn = self._connect()

    def _connect(self) -> http.client.HTTPConnection:
        if self._tls is None:
            return http.client.HTTPConnection(self.address, timeout=30)
        return http.client.HTTPSConnection(self.address, timeout=30, context=self._tls)

    def reconnect(self) -> None:
        """Start over on a new connection (after the hub went away)."""
        self._conn.close()
        self._conn = self._connect()

    def post(self, rows: Sequence[StepRecord]) -> None:
        for first in range(0, len(rows), STEPS_PER_POST):
            body = step_lines(rows[first : first + STEPS_PER_POST])
            self._send("/api/v1/steps", body, self._headers, "step records")

    def post_topology(self, report: TopologyReport) -> None:
        """One topology report to the hub's /api/v1/topology, in the body `fleetlens host-agent` and
        `fleetlens topology import --hub` send; the hub parses it and stores it as what its reporter says
        now, stamped with its clock."""
        body = json.dumps(
            {"format": report.format, "text": report.text, "file": report.file, "reporter": report.reporter}
        ).encode()
        headers = {**self._headers, "Content-Type": "application/json"}
        self._send("/api/v1/topology", body, headers, f"topology {report.file}")

    def _send(self, path: str, body: bytes, headers: dict[str, str], what: str) -> None:
        self._conn.request("POST", path, body, headers)
        with self._conn.getresponse() as response:
            answer = response.read()
            if response.status != 200:
                raise SimulationError(
                    f"hub at {self.address} refused {what}: HTTP {response.status}: "
                    f"{answer.decode(errors='replace')[:300]}"
                )

    def __enter__(self) -> StepPoster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._conn.close()

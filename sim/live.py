"""A scenario played on the wall clock: what `fleetlens sim serve` and the demo's fleet run.

Each node of the scenario (sim.node.SimNode: its /sys tree, GPUs and NCCL logs read by a
real exporter) answers on its own loopback port, and every scrape first plays its node to the moment
of the scrape: a hub scraping at any interval sees the scenario unfold in real time, from `epoch`
(unix seconds of the scenario's time 0) on. The scenario's topology goes to a hub's /api/v1/topology
first, as its hosts' agents and its operator send it (sim.hostagents); then its jobs post their step
records to the hub's /api/v1/steps once per interval; what the hub could not take yet (it starts after
the fleet, or restarts) is kept and sent next time, step records up to MAX_PENDING_STEPS.

    fleet = LiveFleet(scenario, workdir, epoch=time.time())
    fleet.start()
    for path, groups in fleet.file_sd(Path("targets.json")).items():
        write_file_sd(path, groups)
    fleet.post_steps_until(stop_event, "127.0.0.1:9500", token)   # returns when stop_event is set
    fleet.close()

After the scenario's duration the nodes go on in the state it left them in.

In the stock flavour (sim.stock) each node answers on two ports: dcgm-exporter's rendering of its GPUs,
and its real node_exporter process, reached through a pass-through on the loopback server so that the
scrape first plays the node to that moment (node_exporter reads the /sys tree directly; without a
scrape nothing would write it) and a scrape_gap refuses both exporters alike (503). Prometheus scrapes
them as two jobs from two file_sd files (LiveFleet.file_sd).
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from collectors.steprecord import StepRecord
from sim.errors import SimulationError
from sim.fleet import LOOPBACK
from sim.hostagents import topology_reports
from sim.jobs import JobModel
from sim.loopserver import LoopServer
from sim.node import SimNode
from sim.online import STEPS_PER_POST, StepPoster
from sim.scenario import Scenario
from sim.stock import DCGM_EXPORTER, NODE_EXPORTER

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_PENDING_STEPS = 200_000  # step records kept for a hub that does not answer; the oldest go first


class _LiveNode:
    """A SimNode behind a lock, played to the wall clock whenever one of its exporters is scraped."""

    def __init__(self, node: SimNode, epoch: float, clock: Callable[[], float]) -> None:
        self.node = node
        self._epoch = epoch
        self._clock = clock
        self._lock = threading.Lock()

    def wsgi(self, environ: dict, start_response: Callable) -> list[bytes]:
        return self._played(self.node.wsgi, environ, start_response)

    def node_exporter_wsgi(self, environ: dict, start_response: Callable) -> list[bytes]:
        """node_exporter's answer, read while the lock keeps the tree still."""
        return self._played(self.node.node_exporter_wsgi, environ, start_response)

    def _played(self, app: Callable, environ: dict, start_response: Callable) -> list[bytes]:
        with self._lock:
            self.node.play_until(max(0.0, self._clock() - self._epoch))
            return app(environ, start_response)


class LiveFleet:
    """The scenario's nodes served on loopback in real time, and its jobs' step records sent to a hub."""

    def __init__(
        self, scenario: Scenario, workdir: Path, epoch: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.scenario = scenario
        self.epoch = epoch
        self._workdir = Path(workdir)
        self._clock = clock
        self._server = LoopServer()
        self._nodes: list[_LiveNode] = []
        self.addresses: dict[str, str] = {}  # node name -> 127.0.0.1:port (stock: dcgm-exporter's)
        self.node_exporter_addresses: dict[str, str] = {}  # stock flavour: node name -> its node_exporter
        self._jobs = [JobModel(job, scenario, epoch) for job in scenario.jobs]
        self._pending: list[StepRecord] = []
        self._topology = topology_reports(scenario)  # not yet taken by the hub

    def start(self) -> LiveFleet:
        """Build every node and serve each of its exporters on a free loopback port."""
        self._server.start()
        try:
            for index in range(self.scenario.fleet.nodes):
                node = SimNode(self.scenario, index, self._workdir, self.epoch)
                live = _LiveNode(node, self.epoch, self._clock)
                self._nodes.append(live)
                self.addresses[node.name] = self._serve(live.wsgi)
                if node.node_exporter is not None:
                    self.node_exporter_addresses[node.name] = self._serve(live.node_exporter_wsgi)
        except BaseException:
            self.close()
            raise
        return self

    def _serve(self, app: Callable) -> str:
        return f"{LOOPBACK}:{self._server.serve(app, LOOPBACK)}"

    @property
    def targets(self) -> list[dict]:
        """The nodes' exporters (stock flavour: dcgm-exporter) as Prometheus file_sd JSON: one group per
        node, labelled with its name."""
        return [{"targets": [address], "labels": {"node": name}} for name, address in self.addresses.items()]

    def file_sd(self, path: Path) -> dict[Path, list[dict]]:
        """The file_sd files to write for `path`, with their target groups: `path` itself with `targets`;
        in the stock flavour one file per exporter instead, named after its Prometheus job
        (targets.json: targets.dcgm-exporter.json, targets.node-exporter.json). node_exporter's groups
        are labelled with the node's name; dcgm-exporter's are not, as its series carry Hostname, the
        node label a hub's remote-write receiver looks at after `node`. Each group sets `instance` to the
        name the target has in a real fleet (vela-001:9612, vela-001:9100, as sim.offline names them),
        not to its loopback address, which would make every simulated node one host."""
        if not self.node_exporter_addresses:
            return {path: self.targets}
        return {
            _job_file(path, DCGM_EXPORTER.job): [
                {"targets": [address], "labels": {"instance": DCGM_EXPORTER.target(name)}}
                for name, address in self.addresses.items()
            ],
            _job_file(path, NODE_EXPORTER.job): [
                {"targets": [address], "labels": {"node": name, "instance": NODE_EXPORTER.target(name)}}
                for name, address in self.node_exporter_addresses.items()
            ],
        }

    def post_steps_until(
        self,
        stop: threading.Event,
        hub_address: str,
        token: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """Every interval, send the step records the jobs made since the last send, until `stop` is set;
        `token` is the hub's API token with the write scope, for a hub that has tokens; `tls` for a hub
        served over TLS."""
        with StepPoster(hub_address, token, tls) as poster:
            while not stop.wait(self.scenario.interval_s):
                self.post_steps(poster)
            self.post_steps(poster)

    def post_steps(self, poster: StepPoster) -> None:
        """Send the topology reports the hub has not taken yet, then what the jobs did up to now; what the
        hub does not take waits for the next call."""
        t = self._clock() - self.epoch
        self._pending += [row for job in self._jobs for row in job.steps_until(t)]
        del self._pending[:-MAX_PENDING_STEPS]
        if _delivered(poster, self._topology, 1, lambda reports: poster.post_topology(reports[0])):
            _delivered(poster, self._pending, STEPS_PER_POST, poster.post)

    def close(self) -> None:
        """Stop serving and close every node (its node_exporter process included)."""
        self._server.stop()
        for live in self._nodes:
            live.node.close()
        self._nodes = []


def _delivered(poster: StepPoster, pending: list[T], chunk: int, send: Callable[[list[T]], None]) -> bool:
    """Send `pending` `chunk` items at a time, each chunk the hub took removed from it; False, the rest
    kept, at the first the hub did not take (its connection started over)."""
    while pending:
        part = pending[:chunk]
        try:
            send(part)
        except (OSError, SimulationError) as error:
            log.warning("hub at %s did not take what the fleet sent yet: %s", poster.address, error)
            poster.reconnect()
            return False
        del pending[: len(part)]
    return True


def _job_file(path: Path, job: str) -> Path:
    """`path` with the job's name before its suffix: targets.json -> targets.<job>.json."""
    return path.with_name(f"{path.stem}.{job}{path.suffix}")

"""Realistic store rows for detector tests, made by the real collectors rather than written by hand.

Each node is a simulated VM: a generated /sys tree (sim.sysfs), simulated GPUs on a manual
clock (collectors.gpu.sim) and an exporter over the gpu, xid, infiniband, netclass and nccl_log
collectors, as sim.fleet builds one. Each tick advances simulated time by one interval,
renders every node's exposition, parses it as the hub does and stores it (samples, a targets row per
node, and a step row per node that runs a job). Faults go in between ticks, through each node's
`sysfs` and `gpus`, its `load` and `job`, an NCCL log dropped into its `nccl_dir`, or lines written to
the kernel log its xid collector follows (`kernel_logs`).

    with SimulatedFleet(store, tmp_path, nodes=4) as fleet:
        fleet.tick(3)
        fleet["vela-002"].sysfs.set_link(1, up=False)
        window = fleet.tick()                    # the window holding the last tick's samples
        findings = LinkDown().detect(store, window)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from analytics.detectors.base import Window
from analytics.store import Store
from analytics.store.records import ScrapeBatch, TargetStatus
from collectors import registry
from collectors.base import CollectorOptions, ReadErrors
from collectors.exporter import Exporter
from collectors.follow import FollowedFile
from collectors.gpu.collector import GpuCollector
from collectors.gpu.model import GpuBackend
from collectors.gpu.sim import ManualClock, SimBackend
from collectors.steprecord import StepRecord
from collectors.textformat import render
from collectors.xid import XidCollector
from hub.expfmt import ExpositionParser
from sim.fleet import node_name
from sim.sysfs import SimSysfs

SYSFS_COLLECTORS = ("infiniband", "netclass", "nccl_log")
View = Callable[[ScrapeBatch], list[ScrapeBatch]]  # one node's scrape -> what the hub stores of it
HOUR_S = 3600.0


@dataclass
class SimulatedNode:
    """One VM: the fault hooks (`sysfs`, `gpus`, `nccl_dir`), how busy its job keeps it, and that job."""

    name: str
    index: int
    sysfs: SimSysfs
    gpus: SimBackend  # the fault hooks; a node given real GPUs (`real_gpus`) is read from those instead
    nccl_dir: Path
    exporter: Exporter
    parser: ExpositionParser
    load: float = 1.0  # 0 idle .. 1 busy, for its GPUs and its RoCE ports alike
    job: str = ""  # "" runs no job: no step rows

    def scrape(self, ts: float) -> ScrapeBatch:
        """What the hub would store of one scrape of this node at `ts`."""
        exposition = self.parser.parse(render(self.exporter.collect()).decode())
        return ScrapeBatch(
            f"{self.name}:9400", self.name, ts, exposition.names, exposition.labels, exposition.values
        )


class SimulatedFleet:
    """`nodes` simulated VMs with `gpus` GPUs and `nics` RoCE ports each, stored into `store` tick by tick.

    Samples are `interval_s` apart from an hour ago, at multiples of `interval_s` (as the detection
    runner aligns its windows), so that the store's retention keeps them. `kernel_logs` names, per
    node, the file its xid collector follows as its kernel log (as it follows /var/log/kern.log);
    `real_gpus`, per node, a GPU backend its collectors read instead of simulated GPUs (a replayed
    nvidia-smi capture through the real NVML code); `view`, what the hub receives of each node's scrape
    (as it is, by default; tests.support.stock.StockExporters: what stock exporters would have sent).
    """

    def __init__(
        self,
        store: Store,
        root: Path,
        nodes: int = 4,
        *,
        gpus: int = 4,
        nics: int = 2,
        interval_s: float = 10.0,
        seed: int = 0,
        kernel_logs: Mapping[str, Path] | None = None,
        real_gpus: Mapping[str, GpuBackend] | None = None,
        view: View | None = None,
    ) -> None:
        self.store = store
        self.interval_s = interval_s
        self.clock = ManualClock(math.floor((time.time() - HOUR_S) / interval_s) * interval_s)
        self._root = Path(root)
        self._gpus = gpus
        self._nics = nics
        self._seed = seed
        self._kernel_logs = dict(kernel_logs or {})
        self._real_gpus = dict(real_gpus or {})
        self._view: View = view or (lambda batch: [batch])
        self._ticks = 0
        self._generations: dict[str, int] = {}
        self.nodes = [self._start_node(index) for index in range(nodes)]

    def __enter__(self) -> SimulatedFleet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getitem__(self, name: str) -> SimulatedNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r}; the fleet has {', '.join(node.name for node in self.nodes)}")

    def set_load(self, name: str, load: float) -> None:
        """Keep node `name`'s GPUs and ports `load` busy from now on (0 idle .. 1 busy)."""
        node = self[name]
        node.gpus.set_load(None, load)
        node.load = load

    def tick(self, count: int = 1, *, skip: Collection[str] = ()) -> Window:
        """Let `count` intervals pass, scraping and storing every node not in `skip` (a scrape gap: its
        target is stored as down) after each; returns the window holding the last tick's samples."""
        for _ in range(count):
            self.clock.advance(self.interval_s)
            self._ticks += 1
            now = self.clock()
            for node in self.nodes:
                node.sysfs.advance(self.interval_s, node.load)
            scraped = [node for node in self.nodes if node.name not in skip]
            token = f"fleetdata/{now}"
            batches = [batch for node in scraped for batch in self._view(node.scrape(now))]
            self.store.insert_samples(batches, token=token)
            self.store.insert_targets(
                [
                    TargetStatus(now, f"{node.name}:9400", node.name, node.name not in skip, 0.01, 0)
                    for node in self.nodes
                ],
                token=token,
            )
            steps = [
                StepRecord(now, node.job, node.index, node.name, self._ticks, self.interval_s)
                for node in self.nodes
                if node.job
            ]
            self.store.insert_steps(steps, token=token)
        now = self.clock()
        return Window(now, now + self.interval_s)

    def restart(self, name: str, *, gpus: int | None = None) -> None:
        """Reboot node `name`: a fresh /sys tree and fresh GPUs, every counter starting again from zero,
        with its load and job as they were; `gpus` fewer than before leaves the last ones off the bus."""
        old = self[name]
        old.exporter.close()
        self._generations[name] = self._generations.get(name, 0) + 1
        self.nodes[old.index] = self._start_node(old.index, load=old.load, job=old.job, gpus=gpus)

    def close(self) -> None:
        """Stop every exporter (each node's Xid listener with it)."""
        for node in self.nodes:
            node.exporter.close()

    def _start_node(
        self, index: int, load: float = 1.0, job: str = "", gpus: int | None = None
    ) -> SimulatedNode:
        name = node_name(index)
        node_dir = self._root / f"{name}.{self._generations.get(name, 0)}"
        node_seed = self._seed * 1000 + index
        sysfs = SimSysfs(node_dir / "sys", name, nics=self._nics, seed=node_seed)
        sysfs.write()
        backend = SimBackend(count=self._gpus if gpus is None else gpus, seed=node_seed, clock=self.clock)
        backend.set_load(None, load)
        nccl_dir = node_dir / "nccl"
        nccl_dir.mkdir(parents=True)
        options = CollectorOptions(
            sysfs_root=sysfs.root, node=name, gpu_backend="none", nccl_logs=str(nccl_dir / "*.log")
        )
        built = registry.build(SYSFS_COLLECTORS, options)
        gpu_errors, xid_errors = ReadErrors("gpu"), ReadErrors("xid")
        kernel_log = FollowedFile(self._kernel_logs[name]) if name in self._kernel_logs else None
        read = self._real_gpus.get(name, backend)
        built += [
            registry.BuiltCollector("gpu", GpuCollector(read, name, gpu_errors), gpu_errors),
            registry.BuiltCollector("xid", XidCollector(name, xid_errors, read, kernel_log), xid_errors),
        ]
        return SimulatedNode(
            name, index, sysfs, backend, nccl_dir, Exporter(built), ExpositionParser(), load=load, job=job
        )

"""Simulation scenarios: a fleet, its jobs, the faults injected and the confounders that must not count.

The YAML format is a public contract (README, "Scenario format"); `load_scenario` turns a file into a
validated Scenario or raises ScenarioError naming the file and the key, e.g.
`llm.yaml: faults[2].node: no node vela-099 in a fleet of 32`. The simulator (sim.offline, sim.online)
plays a Scenario; the evaluation (sim.evaluation) scores detectors against its faults.

Components name what a fault touches as detectors report it: "gpu:3" for a GPU, "mlx5_2:1" for port 1
of the RoCE device of NIC 2 (the node_exporter `device:port` labels of the simulated trees).

A scenario with a `topology` section (sim.topology lays it out) may also fault a shared layer: a leaf, a
spine, a rail, a host or a rack (LAYER_FAULT_KINDS). Such a fault is kept as one LayerFault, the truth the
evaluation scores against, and expands at load time into the per-node faults it plays as
(LayerFault.effects), so the nodes, their exporters and the jobs' step times play it unchanged.

A `repair` (`{kind: repair, node: N, at_s: T}`, written among the confounders: a timed event that is not
a fault) ends every fault of node N still active at T, so the node is healthy from T on and everything
that plays the faults follows; the faults of shared layers over N are not the node's and go on.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from analytics.topology.model import Kind, Link
from sim.errors import ScenarioError
from sim.topology import (
    DEFAULT_HOSTS_PER_LEAF,
    DEFAULT_HOSTS_PER_RACK,
    DEFAULT_LEAVES_PER_SPINE,
    DEFAULT_VMS_PER_HOST,
    Topology,
)
from sim.trace import trace_spans

FAULT_KINDS = (
    "slow_node",
    "thermal_throttle",
    "power_brake",
    "link_flap",
    "link_down",
    "dma_degraded",
    "gpu_lost",
    "xid",
    "xid_storm",
    "dbe_remap",
    "congestion",
    "port_errors",
)
# faults of a shared layer: the layer their target names, and the keys each takes besides kind, the
# target, start_s and end_s (defaults as _FAULT_KEYS's)
LAYER_FAULT_KINDS: dict[str, tuple[Kind, dict[str, Any]]] = {
    "leaf_degraded": (Kind.LEAF, {"mode": "flaps", "flaps": 3, "period_s": 30.0, "level": 1.0}),
    "spine_degraded": (Kind.SPINE, {"level": 1.0}),
    "rail_congestion": (Kind.RAIL, {"level": 1.0}),
    "host_pcie_degraded": (Kind.HOST, {"mode": "no_gdr"}),
    "rack_power": (Kind.RACK, {}),
}
LEAF_MODES = ("flaps", "errors", "congestion")
_LEAF_MODE_KEYS = {"flaps": {"flaps", "period_s"}, "errors": {"level"}, "congestion": {"level"}}
SPINE_SHARE = 0.5  # of a degraded spine's level, what each node below it sees: ECMP spreads its flows
CONFOUNDER_KINDS = ("job_stall", "stage_imbalance", "exporter_restart", "scrape_gap", "job_restart")
REPAIR = "repair"  # the one event kind of the confounders list that is not a confounder (module doc)
DMA_MODES = ("no_gdr", "pcie_downgrade")
EXPORTER_FLAVOURS = ("fleetlens", "stock")  # what reads a node: fleetlens's exporter, or stock exporters only
NOISE_MODELS = ("tidy", "pai")  # step-time noise (sim.jobs): the original +-1%, or calibrated on Alibaba PAI
_STEP_MODEL_KEYS = ("noise", "imbalance", "rank_offset", "warmup_steps", "warmup_slowdown")  # job keys

EVERY_GPU = "every GPU"  # a fault's `gpu` default where leaving it out means every GPU of the node
# keys each fault kind takes besides kind, node, start_s, end_s; `required` ones have no default
_FAULT_KEYS: dict[str, dict[str, Any]] = {
    "slow_node": {"severity": 0.15},
    "thermal_throttle": {"gpu": None},
    "power_brake": {"gpu": EVERY_GPU},  # as a chassis power brake does
    "link_flap": {"nic": None, "flaps": 3, "period_s": 30.0},
    "link_down": {"nic": None},
    "dma_degraded": {"mode": "no_gdr", "nic": 0, "gpu": 0},
    "gpu_lost": {"gpu": None},
    "xid": {"gpu": None, "code": 79},
    "xid_storm": {"events": 200},  # application Xids of a crashing job, spread over the node's GPUs
    "dbe_remap": {"gpu": None, "contained": 9},  # Xid 48, 63, then `contained` Xid 94s, as a real GPU did
    "congestion": {"nic": None, "level": 1.0},
    "port_errors": {"nic": None, "level": 1.0},  # bit errors on the port's link: a bad optic or cable
}
XID_STORM_S = 90.0  # how long an xid_storm lasts when its end is not given
_CONFOUNDER_KEYS: dict[str, dict[str, Any]] = {
    "job_stall": {"job": None, "start_s": None, "end_s": None},
    "stage_imbalance": {"job": None, "stage": None, "severity": 0.2},
    "exporter_restart": {"node": None, "at_s": None},
    "scrape_gap": {"node": None, "start_s": None, "end_s": None},
    "job_restart": {"job": None, "at_s": None, "down_s": 60.0},
}


@dataclass(frozen=True)
class FleetSpec:
    nodes: int
    gpus_per_node: int = 8
    nics_per_node: int = 4
    prefix: str = "vela-"

    @property
    def names(self) -> list[str]:
        """Node names: prefix + 1-based number, zero-padded to three digits (vela-001, ...)."""
        return [f"{self.prefix}{index + 1:03d}" for index in range(self.nodes)]


@dataclass(frozen=True)
class JobSpec:
    """A synchronous data/pipeline/tensor-parallel training job; ranks = len(nodes) x gpus_per_node.

    Rank r runs on node r // gpus_per_node, GPU r % gpus_per_node; tensor parallelism is innermost,
    then data, then pipeline: tp_rank = r % tp, dp_rank = (r // tp) % dp, pp_stage = r // (tp * dp).
    The step-time model's keys (sim.jobs says what each does) are optional; their defaults keep the
    original tidy jobs: `noise` tidy, `imbalance` and `rank_offset` None (the noise model's own), no
    warm-up.
    """

    name: str
    nodes: tuple[str, ...]
    step_s: float
    dp: int
    pp: int
    tp: int
    noise: str = "tidy"
    imbalance: float | None = None  # log sd of the per-step imbalance between data-parallel replicas
    rank_offset: float | None = None  # log sd of the ranks' steady offsets
    warmup_steps: int = 0  # steps after each (re)start that run slower
    warmup_slowdown: float = 1.0  # the first of them x (1 + this), the excess falling linearly to 0

    def stage_of_node(self, node: str, gpus_per_node: int) -> int:
        """The pipeline stage of a node's first rank (every rank of a node shares it when tp divides
        gpus_per_node or gpus_per_node divides tp*dp)."""
        return (self.nodes.index(node) * gpus_per_node) // (self.tp * self.dp)


@dataclass(frozen=True)
class Fault:
    """An injected fault. `end_s` None: it lasts to the end of the scenario."""

    kind: str
    node: str
    start_s: float
    end_s: float | None = None
    gpu: int | None = None
    nic: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # severity, flaps, period_s, mode, code, level,
    # events (xid_storm), contained (dbe_remap)

    @property
    def component(self) -> str:
        """What detectors should name: "gpu:N", "mlx5_N:1", or "" for the whole node; a fault on a
        real interface (the demo's veth) names it in params["device"]."""
        if "device" in self.params:
            return self.params["device"]
        if self.kind in ("link_flap", "link_down", "congestion", "port_errors") or (
            self.kind == "dma_degraded" and self.params.get("mode") == "no_gdr"
        ):
            return f"mlx5_{self.nic}:1"
        if self.gpu is not None:
            return f"gpu:{self.gpu}"
        return ""

    def active(self, t: float, duration_s: float) -> bool:
        return self.start_s <= t < (duration_s if self.end_s is None else self.end_s)

    def describe(self) -> str:
        """The fault in words, as reports name it: kind, node, component and span."""
        where = f"{self.node} {self.component}".rstrip()
        end = "end" if self.end_s is None else f"{self.end_s:g}"
        return f"{self.kind} on {where} {self.start_s:g}-{end} s"


@dataclass(frozen=True)
class LayerFault:
    """A fault of a shared layer, as the scenario's truth: one fault of `parent` ("leaf-02") in `layer`,
    the VMs below it that it touches, and the per-node faults it plays as on them (`effects`)."""

    kind: str
    layer: Kind
    parent: str
    start_s: float
    end_s: float | None
    params: Mapping[str, Any]
    nodes: tuple[str, ...]
    effects: tuple[Fault, ...]  # per-node faults (FAULT_KINDS)


@dataclass(frozen=True)
class Confounder:
    """Something that looks like a fault but is not one (see CONFOUNDER_KINDS)."""

    kind: str
    start_s: float
    end_s: float
    job: str | None = None
    node: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # stage, severity, down_s


@dataclass(frozen=True)
class Repair:
    """Node `node` repaired at `at_s`: the faults of it active then end there (module doc)."""

    node: str
    at_s: float


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    duration_s: float
    interval_s: float
    fleet: FleetSpec
    jobs: tuple[JobSpec, ...]
    faults: tuple[Fault, ...]
    confounders: tuple[Confounder, ...] = ()
    exporters: str = "fleetlens"  # EXPORTER_FLAVOURS: fleetlens's exporter, or dcgm-exporter + node_exporter
    topology: Topology | None = None  # None: no topology section, and no layer faults
    layer_faults: tuple[LayerFault, ...] = ()
    repairs: tuple[Repair, ...] = ()  # each already applied to `faults`: their ends are cut to it

    @property
    def played_faults(self) -> tuple[Fault, ...]:
        """Every per-node fault the nodes and jobs play: the node faults, then each layer fault's
        effects."""
        return (*self.faults, *(effect for layer in self.layer_faults for effect in layer.effects))

    def topology_links(self) -> list[Link]:
        """The fleet's shape as child -> parent links (sim.topology.Topology.links); none without a
        topology section."""
        return [] if self.topology is None else self.topology.links()

    def until(self, t: float) -> Scenario:
        """The scenario with only the faults and confounders that start before `t`: what a run cut
        short at `t` injects (those already running go on as written)."""
        return dataclasses.replace(
            self,
            faults=tuple(fault for fault in self.faults if fault.start_s < t),
            layer_faults=tuple(fault for fault in self.layer_faults if fault.start_s < t),
            confounders=tuple(item for item in self.confounders if item.start_s < t),
            repairs=tuple(repair for repair in self.repairs if repair.at_s < t),
        )


def load_scenario(path: Path | str, fixtures: Path | None = None) -> Scenario:
    """Read and validate a scenario file; ScenarioError names the file and the key that is wrong."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    return parse_scenario(document, path.stem, source=str(path), fixtures=fixtures)


def parse_scenario(
    document: object, name: str, *, source: str = "<scenario>", fixtures: Path | None = None
) -> Scenario:
    """A Scenario from parsed YAML; `source` prefixes every error message."""
    reader = _Reader(source)
    top = reader.mapping(
        document,
        "",
        {
            "seed",
            "duration_s",
            "interval_s",
            "exporters",
            "fleet",
            "jobs",
            "faults",
            "confounders",
            "topology",
        },
    )
    seed = reader.integer(top, "seed", "", default=0)
    duration = reader.number(top, "duration_s", "", minimum=1)
    interval = reader.number(top, "interval_s", "", default=10.0, minimum=1)
    exporters = reader.choice(top, "exporters", "", EXPORTER_FLAVOURS, default="fleetlens")
    if interval > duration:
        raise reader.error("interval_s", f"{interval:g} is longer than duration_s {duration:g}")
    fleet_doc = reader.mapping(
        top.get("fleet"), "fleet", {"nodes", "gpus_per_node", "nics_per_node", "prefix"}
    )
    fleet = FleetSpec(
        nodes=reader.integer(fleet_doc, "nodes", "fleet", minimum=1),
        gpus_per_node=reader.integer(fleet_doc, "gpus_per_node", "fleet", default=8, minimum=1),
        nics_per_node=reader.integer(fleet_doc, "nics_per_node", "fleet", default=4, minimum=1),
        prefix=reader.string(fleet_doc, "prefix", "fleet", default="vela-"),
    )
    names = fleet.names
    topology = _topology(reader, top["topology"], fleet) if "topology" in top else None
    jobs = tuple(
        _job(reader, item, f"jobs[{i}]", fleet)
        for i, item in enumerate(reader.sequence(top.get("jobs"), "jobs"))
    )
    job_names = [job.name for job in jobs]
    if len(set(job_names)) != len(job_names):
        raise reader.error("jobs", "job names must be unique")
    placed = [node for job in jobs for node in job.nodes]
    twice = sorted({node for node in placed if placed.count(node) > 1})
    if twice:
        raise reader.error("jobs", f"node(s) {', '.join(twice)} in more than one job")
    faults_doc = top.get("faults") or []
    layer_faults: tuple[LayerFault, ...] = ()
    if isinstance(faults_doc, Mapping):
        random_doc = reader.mapping(faults_doc, "faults", {"random"})
        spec = reader.mapping(random_doc.get("random"), "faults.random", {"rate_per_node_day", "seed"})
        rate = reader.number(spec, "rate_per_node_day", "faults.random", minimum=0)
        fault_seed = reader.integer(spec, "seed", "faults.random", default=seed)
        faults = tuple(random_faults(fleet, duration, rate, fault_seed, fixtures))
    else:
        items = list(enumerate(reader.sequence(faults_doc, "faults")))
        kinds = (*FAULT_KINDS, *LAYER_FAULT_KINDS)
        on_layers = [
            i for i, item in items if reader.choice(item, "kind", f"faults[{i}]", kinds) in LAYER_FAULT_KINDS
        ]
        faults = tuple(
            _fault(reader, item, f"faults[{i}]", fleet, duration) for i, item in items if i not in on_layers
        )
        layer_faults = tuple(
            _layer_fault(reader, faults_doc[i], f"faults[{i}]", fleet, topology, duration) for i in on_layers
        )
    events = list(enumerate(reader.sequence(top.get("confounders") or [], "confounders")))
    kinds = (*CONFOUNDER_KINDS, REPAIR)
    repaired = [i for i, item in events if reader.choice(item, "kind", f"confounders[{i}]", kinds) == REPAIR]
    confounders = tuple(
        _confounder(reader, item, f"confounders[{i}]", names, job_names, jobs, duration)
        for i, item in events
        if i not in repaired
    )
    repairs = _repairs(
        reader, [(f"confounders[{i}]", events[i][1]) for i in repaired], fleet, faults, duration
    )
    return Scenario(
        name,
        seed,
        duration,
        interval,
        fleet,
        jobs,
        repaired_faults(faults, repairs),
        confounders,
        exporters,
        topology,
        layer_faults,
        repairs,
    )


def repaired_faults(faults: Sequence[Fault], repairs: Sequence[Repair]) -> tuple[Fault, ...]:
    """`faults` with each one a repair of its node meets while it is active (start_s < at_s < its end)
    ended at the first such repair."""
    return tuple(
        dataclasses.replace(fault, end_s=min(cuts)) if (cuts := _repairs_during(fault, repairs)) else fault
        for fault in faults
    )


def _repairs_during(fault: Fault, repairs: Sequence[Repair]) -> list[float]:
    end = math.inf if fault.end_s is None else fault.end_s
    return [r.at_s for r in repairs if r.node == fault.node and fault.start_s < r.at_s < end]


def _repairs(
    reader: _Reader,
    items: Sequence[tuple[str, object]],
    fleet: FleetSpec,
    faults: Sequence[Fault],
    duration: float,
) -> tuple[Repair, ...]:
    """The repairs (where, item): each one's node in the fleet, at_s within the scenario, and a fault of
    that node still active then, after the repairs before it (a repair of a healthy node, or one repeated,
    is a mistake in the file, not a no-op)."""
    parsed = []
    for where, item in items:
        doc = reader.mapping(item, where, {"kind", "node", "at_s"})
        node = _node(reader, doc.get("node"), f"{where}.node", fleet)
        parsed.append((where, Repair(node, reader.number(doc, "at_s", where, minimum=0, maximum=duration))))
    for index, (where, repair) in enumerate(parsed):
        earlier = [other for i, (_, other) in enumerate(parsed) if (other.at_s, i) < (repair.at_s, index)]
        if not any(_repairs_during(fault, [repair]) for fault in repaired_faults(faults, earlier)):
            raise reader.error(
                f"{where}.at_s", f"no fault of {repair.node} is active at {repair.at_s:g} s to repair"
            )
    return tuple(repair for _, repair in parsed)


def with_exporters(scenario: Scenario, exporters: str | None) -> Scenario:
    """The scenario read by `exporters` (None: as its file says), as a command's --exporters asks;
    ScenarioError for an unknown flavour."""
    if exporters is None:
        return scenario
    check_exporters(exporters)
    return dataclasses.replace(scenario, exporters=exporters)


def check_exporters(exporters: str | None) -> None:
    """ScenarioError unless `exporters` is None or one of EXPORTER_FLAVOURS."""
    if exporters is not None and exporters not in EXPORTER_FLAVOURS:
        raise ScenarioError(f"--exporters: {exporters!r} is not one of {', '.join(EXPORTER_FLAVOURS)}")


def _job(reader: _Reader, item: object, where: str, fleet: FleetSpec) -> JobSpec:
    doc = reader.mapping(item, where, {"name", "nodes", "step_s", "dp", "pp", "tp", *_STEP_MODEL_KEYS})
    raw_nodes = doc.get("nodes")
    if isinstance(raw_nodes, int) and not isinstance(raw_nodes, bool):
        if not 1 <= raw_nodes <= fleet.nodes:
            raise reader.error(f"{where}.nodes", f"{raw_nodes} nodes, but the fleet has {fleet.nodes}")
        nodes = tuple(fleet.names[:raw_nodes])
    elif isinstance(raw_nodes, list) and raw_nodes:
        nodes = tuple(_node(reader, node, f"{where}.nodes", fleet) for node in raw_nodes)
        if len(set(nodes)) != len(nodes):
            raise reader.error(f"{where}.nodes", "a node is listed twice")
    else:
        raise reader.error(f"{where}.nodes", "want a node count or a list of node names")
    job = JobSpec(
        name=reader.string(doc, "name", where),
        nodes=nodes,
        step_s=reader.number(doc, "step_s", where, minimum=0.1),
        dp=reader.integer(doc, "dp", where, default=0, minimum=0),
        pp=reader.integer(doc, "pp", where, default=1, minimum=1),
        tp=reader.integer(doc, "tp", where, default=fleet.gpus_per_node, minimum=1),
    )
    ranks = len(nodes) * fleet.gpus_per_node
    dp = job.dp or ranks // (job.pp * job.tp)
    if dp < 1 or dp * job.pp * job.tp != ranks:
        raise reader.error(
            where, f"dp x pp x tp = {dp} x {job.pp} x {job.tp} must equal the job's {ranks} ranks"
        )
    return dataclasses.replace(job, dp=dp, **_step_model(reader, doc, where))


def _step_model(reader: _Reader, doc: Mapping, where: str) -> dict[str, Any]:
    """The job's optional step-time model keys, each only where the file gives it (JobSpec has the
    defaults); the log sds are bounded where a larger value would no longer describe a healthy job."""
    given: dict[str, Any] = {}
    if "noise" in doc:
        given["noise"] = reader.choice(doc, "noise", where, NOISE_MODELS)
    for key in ("imbalance", "rank_offset"):
        if key in doc:
            given[key] = reader.number(doc, key, where, minimum=0, maximum=0.5)
    if "warmup_steps" in doc:
        given["warmup_steps"] = reader.integer(doc, "warmup_steps", where, minimum=0, maximum=100_000)
    if "warmup_slowdown" in doc:
        given["warmup_slowdown"] = reader.number(doc, "warmup_slowdown", where, minimum=0, maximum=20)
    return given


def _fault(reader: _Reader, item: object, where: str, fleet: FleetSpec, duration: float) -> Fault:
    kind = reader.choice(item, "kind", where, FAULT_KINDS)
    extra = _FAULT_KEYS[kind]
    doc = reader.mapping(item, where, {"kind", "node", "start_s", "end_s", *extra})
    node = _node(reader, doc.get("node"), f"{where}.node", fleet)
    start, end = _span(reader, doc, where, duration, end_required=False)
    values: dict[str, Any] = {}
    for key, default in extra.items():
        if default == EVERY_GPU and key not in doc:
            values[key] = None  # Fault.gpu None: the whole node
        elif key in ("gpu", "nic"):
            count = fleet.gpus_per_node if key == "gpu" else fleet.nics_per_node
            values[key] = reader.integer(doc, key, where, default=default, minimum=0, maximum=count - 1)
        elif key == "mode":
            values[key] = reader.choice(doc, key, where, DMA_MODES, default=default)
        elif key in ("flaps", "code", "events", "contained"):
            values[key] = reader.integer(doc, key, where, default=default, minimum=1)
        else:
            values[key] = reader.number(doc, key, where, default=default, minimum=0)
    if kind == "slow_node" and not 0 < values["severity"] <= 5:
        raise reader.error(f"{where}.severity", "want a slowdown within (0, 5], e.g. 0.15 for 15% slower")
    if kind == "link_flap" and end is None:
        end = min(duration, start + values["flaps"] * values["period_s"])
    if kind == "xid_storm" and end is None:
        end = min(duration, start + XID_STORM_S)
    gpu, nic = values.pop("gpu", None), values.pop("nic", None)
    return Fault(kind, node, start, end, gpu, nic, values)


def _topology(reader: _Reader, value: object, fleet: FleetSpec) -> Topology:
    """The topology section: each fan-out at least 1 (defaults in sim.topology); one rail per NIC."""
    where = "topology"
    doc = reader.mapping(
        value, where, {"vms_per_host", "hosts_per_leaf", "leaves_per_spine", "rails", "hosts_per_rack"}
    )
    rails = reader.integer(doc, "rails", where, default=fleet.nics_per_node, minimum=1)
    if rails != fleet.nics_per_node:
        raise reader.error(
            f"{where}.rails",
            f"{rails}, but NIC j of every node is on rail j and nodes have {fleet.nics_per_node}",
        )
    return Topology(
        nodes=tuple(fleet.names),
        vms_per_host=reader.integer(doc, "vms_per_host", where, default=DEFAULT_VMS_PER_HOST, minimum=1),
        hosts_per_leaf=reader.integer(
            doc, "hosts_per_leaf", where, default=DEFAULT_HOSTS_PER_LEAF, minimum=1
        ),
        leaves_per_spine=reader.integer(
            doc, "leaves_per_spine", where, default=DEFAULT_LEAVES_PER_SPINE, minimum=1
        ),
        rails=rails,
        hosts_per_rack=reader.integer(
            doc, "hosts_per_rack", where, default=DEFAULT_HOSTS_PER_RACK, minimum=1
        ),
    )


def _layer_fault(
    reader: _Reader, item: Mapping, where: str, fleet: FleetSpec, topology: Topology | None, duration: float
) -> LayerFault:
    """A fault of a shared layer: its target named by the layer's key (`leaf: leaf-02`), which must be a
    parent the topology section lays out; expanded into its per-node effects (_layer_effects)."""
    kind = item["kind"]
    layer, extra = LAYER_FAULT_KINDS[kind]
    doc = reader.mapping(item, where, {"kind", str(layer), "start_s", "end_s", *extra})
    if topology is None:
        raise reader.error(_join(where, str(layer)), f"a {kind} fault needs a topology section")
    parent = reader.choice(doc, str(layer), where, topology.names(layer))
    start, end = _span(reader, doc, where, duration, end_required=False)
    params: dict[str, Any] = {}
    if "mode" in extra:
        modes = LEAF_MODES if layer == Kind.LEAF else DMA_MODES
        params["mode"] = reader.choice(doc, "mode", where, modes, default=extra["mode"])
    keys = _LEAF_MODE_KEYS[params["mode"]] if layer == Kind.LEAF else set(extra) - {"mode"}
    stray = sorted(set(doc) & (set(extra) - {"mode"} - keys))
    if stray:
        raise reader.error(_join(where, stray[0]), f"not a key of {kind} with mode {params['mode']}")
    for key in sorted(keys):
        if key == "flaps":
            params[key] = reader.integer(doc, key, where, default=extra[key], minimum=1)
        else:
            params[key] = reader.number(doc, key, where, default=extra[key], minimum=0)
    if params.get("mode") == "flaps" and end is None:
        end = min(duration, start + params["flaps"] * params["period_s"])
    nodes = topology.nodes_under(layer, parent)
    effects = tuple(_layer_effects(kind, parent, nodes, start, end, params, fleet))
    return LayerFault(kind, layer, parent, start, end, params, nodes, effects)


def _layer_effects(
    kind: str,
    parent: str,
    nodes: tuple[str, ...],
    start: float,
    end: float | None,
    params: Mapping[str, Any],
    fleet: FleetSpec,
) -> list[Fault]:
    """The per-node faults a layer fault plays as, on each of its `nodes`: a leaf's on every NIC (each is
    behind the leaf), a spine's as milder congestion on every NIC below it, a rail's on its NIC of every
    node, a host's PCIe root complex as GPUDirect RDMA lost on every NIC (or every GPU's link trained
    down), a rack's power as every GPU power-braked."""
    nics = range(fleet.nics_per_node)

    def on_every_nic(node_kind: str, **node_params: Any) -> list[Fault]:
        return [
            Fault(node_kind, node, start, end, nic=nic, params=node_params) for node in nodes for nic in nics
        ]

    match kind, params.get("mode"):
        case "leaf_degraded", "flaps":
            return on_every_nic("link_flap", flaps=params["flaps"], period_s=params["period_s"])
        case "leaf_degraded", "errors":
            return on_every_nic("port_errors", level=params["level"])
        case "leaf_degraded", _:
            return on_every_nic("congestion", level=params["level"])
        case "spine_degraded", _:
            return on_every_nic("congestion", level=params["level"] * SPINE_SHARE)
        case "rail_congestion", _:
            nic = int(parent.removeprefix("rail-"))
            return [
                Fault("congestion", node, start, end, nic=nic, params={"level": params["level"]})
                for node in nodes
            ]
        case "host_pcie_degraded", "no_gdr":
            return on_every_nic("dma_degraded", mode="no_gdr")
        case "host_pcie_degraded", _:
            gpus = range(fleet.gpus_per_node)
            return [
                Fault("dma_degraded", node, start, end, gpu=gpu, params={"mode": "pcie_downgrade"})
                for node in nodes
                for gpu in gpus
            ]
    return [Fault("power_brake", node, start, end) for node in nodes]  # rack_power: gpu None, every GPU


def _confounder(
    reader: _Reader,
    item: object,
    where: str,
    names: list[str],
    job_names: list[str],
    jobs: tuple[JobSpec, ...],
    duration: float,
) -> Confounder:
    kind = reader.choice(item, "kind", where, CONFOUNDER_KINDS)
    keys = _CONFOUNDER_KEYS[kind]
    doc = reader.mapping(item, where, {"kind", *keys})
    job = node = None
    if "job" in keys:
        job = reader.choice(doc, "job", where, tuple(job_names))
    if "node" in keys:
        node = reader.choice(doc, "node", where, tuple(names))
    params: dict[str, Any] = {}
    if "at_s" in keys:
        start = reader.number(doc, "at_s", where, minimum=0, maximum=duration)
        end = start
        if kind == "job_restart":
            params["down_s"] = reader.number(doc, "down_s", where, default=keys["down_s"], minimum=0)
            end = min(duration, start + params["down_s"])
    elif kind == "stage_imbalance":
        spec = next(j for j in jobs if j.name == job)
        params["stage"] = reader.integer(doc, "stage", where, minimum=0, maximum=spec.pp - 1)
        params["severity"] = reader.number(doc, "severity", where, default=keys["severity"], minimum=0)
        start, end = 0.0, duration
    else:
        span = _span(reader, doc, where, duration, end_required=True)
        start, end = span[0], span[1] or duration
    return Confounder(kind, start, end, job, node, params)


def _span(
    reader: _Reader, doc: Mapping, where: str, duration: float, end_required: bool
) -> tuple[float, float | None]:
    start = reader.number(doc, "start_s", where, minimum=0, maximum=duration - 1)
    if "end_s" not in doc and not end_required:
        return start, None
    end = reader.number(doc, "end_s", where, minimum=0, maximum=duration)
    if end <= start:
        raise reader.error(f"{where}.end_s", f"{end:g} is not after start_s {start:g}")
    return start, end


def _node(reader: _Reader, value: object, where: str, fleet: FleetSpec) -> str:
    if value not in fleet.names:
        raise reader.error(where, f"no node {value!r} in a fleet of {fleet.nodes} ({fleet.names[0]}...)")
    return str(value)


class _Reader:
    """Typed access to YAML values, each error naming the source and the dotted key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {key}: {message}" if key else f"{self.source}: {message}")

    def mapping(self, value: object, where: str, allowed: set[str]) -> Mapping:
        if not isinstance(value, Mapping):
            raise self.error(where, f"want a mapping, got {type(value).__name__}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.error(
                where, f"unknown key(s) {', '.join(map(str, unknown))}; known: {', '.join(sorted(allowed))}"
            )
        return value

    def sequence(self, value: object, where: str) -> list:
        if not isinstance(value, list):
            raise self.error(where, f"want a list, got {type(value).__name__}")
        return value

    def _get(self, doc: Mapping, key: str, where: str, default: Any) -> Any:
        if key in doc:
            return doc[key]
        if default is None:
            raise self.error(_join(where, key), "missing")
        return default

    def number(
        self,
        doc: Mapping,
        key: str,
        where: str,
        default: float | None = None,
        minimum: float = -math.inf,
        maximum: float = math.inf,
    ) -> float:
        value = self._get(doc, key, where, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.error(_join(where, key), f"want a number, got {value!r}")
        if not minimum <= value <= maximum:
            raise self.error(_join(where, key), f"{value!r} is outside {minimum:g}..{maximum:g}")
        return float(value)

    def integer(
        self,
        doc: Mapping,
        key: str,
        where: str,
        default: int | None = None,
        minimum: int = -(2**63),
        maximum: int = 2**63 - 1,
    ) -> int:
        value = self._get(doc, key, where, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(_join(where, key), f"want an integer, got {value!r}")
        if not minimum <= value <= maximum:
            raise self.error(_join(where, key), f"{value} is outside {minimum}..{maximum}")
        return value

    def string(self, doc: Mapping, key: str, where: str, default: str | None = None) -> str:
        value = self._get(doc, key, where, default)
        if not isinstance(value, str) or not value:
            raise self.error(_join(where, key), f"want a non-empty string, got {value!r}")
        return value

    def choice(
        self, doc: object, key: str, where: str, choices: tuple[str, ...], default: str | None = None
    ) -> str:
        if not isinstance(doc, Mapping):
            raise self.error(where, f"want a mapping, got {type(doc).__name__}")
        value = self._get(doc, key, where, default)
        if value not in choices:
            raise self.error(_join(where, key), f"{value!r} is not one of {', '.join(choices)}")
        return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


# -- random fault schedules from a real cluster's fault trace ------------------------------------------------

# InfiniteHBD trace fault descriptions -> the simulated fault that shows what a fleet would see
_TRACE_KINDS = {
    "GPU DBE(Double Bit ECC) > Threshold": "dbe_remap",
    "GPU xid Error": "xid",
    "GPU Lost": "gpu_lost",
    "GPU device not found": "gpu_lost",
    "GPU Temperature High": "thermal_throttle",
    "GPU PCI link width low": "dma_degraded",
    "NIC PCI link Width low": "dma_degraded",
    "Link Down": "link_down",
    "NIC Link Speed low": "link_flap",
    "GPU P2P Bandwidth Low": "slow_node",
}
_XID_FOR = {"GPU xid Error": 79}


@dataclass(frozen=True)
class TraceFault:
    kind: str
    desc: str
    duration_s: float | None  # None: the trace never saw it end


def trace_faults(fixtures: Path | None = None) -> list[TraceFault]:
    """The faults of the InfiniteHBD trace that the simulator can show, with their real durations
    (sim.trace reads the trace: FLEETLENS_FIXTURES, default ../shared/fixtures)."""
    return [
        TraceFault(
            _TRACE_KINDS[span.desc],
            span.desc,
            None if span.end_day is None else (span.end_day - span.start_day) * 86_400,
        )
        for span in trace_spans(fixtures)
        if span.desc in _TRACE_KINDS
    ]


def random_faults(
    fleet: FleetSpec, duration_s: float, rate_per_node_day: float, seed: int, fixtures: Path | None = None
) -> list[Fault]:
    """Faults drawn from the real trace's mix and durations, at `rate_per_node_day` per node.

    Arrivals are a Poisson process per node; each draws a trace fault (so the mix is the trace's) and
    keeps its real duration, cut to the scenario. A node holds one random fault at a time."""
    pool = trace_faults(fixtures)
    rng = random.Random(seed)
    faults: list[Fault] = []
    for node in fleet.names:
        t = rng.expovariate(rate_per_node_day / 86_400) if rate_per_node_day > 0 else math.inf
        while t < duration_s:
            drawn = rng.choice(pool)
            length = duration_s if drawn.duration_s is None else drawn.duration_s
            end = min(duration_s, t + max(length, 60.0))
            faults.append(_from_trace(drawn, node, t, end, fleet, rng))
            t = end + rng.expovariate(rate_per_node_day / 86_400)
    return faults


def _from_trace(
    drawn: TraceFault, node: str, start: float, end: float, fleet: FleetSpec, rng: random.Random
) -> Fault:
    gpu, nic = rng.randrange(fleet.gpus_per_node), rng.randrange(fleet.nics_per_node)
    start, end = round(start, 1), round(end, 1)
    match drawn.kind:
        case "xid":
            return Fault("xid", node, start, end, gpu=gpu, params={"code": _XID_FOR[drawn.desc]})
        case "dbe_remap":
            contained = _FAULT_KEYS["dbe_remap"]["contained"]
            return Fault("dbe_remap", node, start, end, gpu=gpu, params={"contained": contained})
        case "gpu_lost" | "thermal_throttle":
            return Fault(drawn.kind, node, start, end, gpu=gpu)
        case "dma_degraded":
            return Fault(
                "dma_degraded", node, start, end, gpu=gpu, nic=nic, params={"mode": "pcie_downgrade"}
            )
        case "link_down":
            return Fault("link_down", node, start, end, nic=nic)
        case "link_flap":
            return Fault(
                "link_flap", node, start, min(end, start + 90), nic=nic, params={"flaps": 3, "period_s": 30.0}
            )
        case _:
            return Fault("slow_node", node, start, end, params={"severity": 0.15})

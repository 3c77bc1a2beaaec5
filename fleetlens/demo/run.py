"""`fleetlens demo`: the whole platform end to end on one machine, each part a process of its own.

    fleet: fleetlens sim serve (32 simulated VMs, exporters on loopback) ◀─scrape── hub ──▶ UI (streamlit)
    job: torchrun, 4 PyTorch DDP ranks on demo nodes ──OTLP step times──▶ hub   (store: embedded chDB,
    --real-links: a real exporter on two network namespaces ◀─scrape──── hub    detectors, alerts,
    Alertmanager (when installed) ◀── alerts ── hub ── dry-run drains ──▶ Slurm (when installed, root)

The scenario (default fleet.yaml beside this module) injects faults and confounders into the fleet; the
job's third rank computes SLOW_FACTOR times per step part-way through; with --real-links a veth is
taken down and up with `ip link`. The demo prints each anomaly and drain decision as the hub records
them. With a duration it leaves out what would start too late to be detected (SETTLE_S) and, at the
end, scores the detections against everything it injected (sim.evaluation): it succeeds only if
every fault was detected and no confounder was reported. Ctrl-C (or the duration) stops every process
it started; the store stays in the work directory for `fleetlens postmortem`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml

from analytics.errors import StoreUnavailable
from analytics.store.hubclient import HubClient
from fleetlens.demo import peers
from fleetlens.demo.children import Children
from fleetlens.demo.links import RealLinks
from fleetlens.demo.report import Narrator, clock, passed, read_anomalies, verdict_lines
from fleetlens.errors import DemoError
from sim.evaluation import evaluate
from sim.scenario import Fault, Scenario, load_scenario

SCENARIO = Path(__file__).with_name("fleet.yaml")
JOB = "ddp-demo"
JOB_RANKS = 4
SLOW_RANK = 2  # the rank that computes SLOW_FACTOR times per step for a while
SLOW_FACTOR = 4
SLOW_FOR_S = 300.0
PACE_S = 0.5  # each step at least this long: the job leaves CPU for the rest of the demo
SETTLE_S = 90.0  # a timed run injects nothing in its last SETTLE_S: time to detect the last fault
MIN_DURATION_S = 2 * SETTLE_S
FLAP_DOWN_S = 5.0  # each real flap: the link down this long
FLAP_EVERY_S = 20.0
REAL_FLAPS = 2
LINKS_NODE = "demo-links"
WINDOW_S = 10.0  # the hub's detection window (its default)
POLL_S = 1.0  # the clock of the real flaps
NARRATE_S = 5.0  # how often the hub is asked what it recorded (each ask is a query on its store)
JOB_ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}  # one thread per rank, gloo on loopback
START_TIMEOUT_S = 120.0

Say = Callable[[str], None]


@dataclass(frozen=True)
class DemoOptions:
    workdir: Path
    scenario: Path = SCENARIO
    duration_s: float | None = None  # None: until Ctrl-C
    headless: bool = False
    real_links: bool = False
    ui_port: int = 8501


@dataclass(frozen=True)
class Plan:
    """What the demo injects and when, in seconds from the scenario's time 0 (`epoch`, unix seconds)."""

    scenario: Scenario
    epoch: float
    duration_s: float | None  # None: until stopped
    job_nodes: tuple[str, ...]
    slow_from_s: float
    flaps_at_s: tuple[float, ...]

    @property
    def slow_node(self) -> str:
        return self.job_nodes[SLOW_RANK]

    def expected(self, flap_port: str | None) -> Scenario:
        """The scenario with the demo's own faults added, for scoring: the slow rank's node, and the
        flapped real port when there is one. Its duration is the run's."""
        faults = [Fault("slow_node", self.slow_node, self.slow_from_s, self.slow_from_s + SLOW_FOR_S)]
        if flap_port is not None:
            params = {"device": flap_port, "period_s": 2 * FLAP_DOWN_S, "flaps": len(self.flaps_at_s)}
            end = self.flaps_at_s[-1] + FLAP_DOWN_S
            faults.append(Fault("link_flap", LINKS_NODE, self.flaps_at_s[0], end, params=params))
        return dataclasses.replace(
            self.scenario,
            duration_s=self.duration_s or self.scenario.duration_s,
            faults=(*self.scenario.faults, *faults),
        )

    def timeline(self) -> list[tuple[float, str]]:
        """(seconds from epoch, what starts) for every fault (of a node or a shared layer) and confounder
        of the scenario."""
        events = [
            (fault.start_s, f"{fault.kind} on {fault.node} {fault.component}".strip())
            for fault in self.scenario.faults
        ]
        events += [
            (fault.start_s, f"{fault.kind} on {fault.layer} {fault.parent} ({len(fault.nodes)} VMs below)")
            for fault in self.scenario.layer_faults
        ]
        events += [
            (item.start_s, f"confounder {item.kind} on {item.node or item.job}")
            for item in self.scenario.confounders
        ]
        return sorted(events)


def make_plan(scenario: Scenario, duration_s: float | None, now: float) -> Plan:
    """Place the job on nodes no simulated job uses, and time the slowdown and the real flaps: early
    enough to be detected within a timed run."""
    if duration_s is not None and duration_s < MIN_DURATION_S:
        raise DemoError(f"--duration must be at least {MIN_DURATION_S:g} s, got {duration_s:g}")
    busy = {node for job in scenario.jobs for node in job.nodes}
    free = [node for node in scenario.fleet.names if node not in busy]
    if len(free) < JOB_RANKS:
        raise DemoError(
            f"scenario {scenario.name} leaves {len(free)} node(s) without a job; the training job needs "
            f"{JOB_RANKS}"
        )
    if duration_s is not None:
        scenario = scenario.until(duration_s - SETTLE_S)
    span = duration_s if duration_s is not None else scenario.duration_s
    flap_start = min(120.0, 0.4 * span)
    return Plan(
        scenario=scenario,
        epoch=math.floor(now),
        duration_s=duration_s,
        job_nodes=tuple(free[-JOB_RANKS:]),
        slow_from_s=min(150.0, 0.35 * span),
        flaps_at_s=tuple(flap_start + k * FLAP_EVERY_S for k in range(REAL_FLAPS)),
    )


def run_demo(options: DemoOptions, say: Say = print) -> int:
    """Run the demo until its duration ends or SIGINT/SIGTERM; 0, or 1 when a timed run missed a fault
    or reported a confounder."""
    if importlib.util.find_spec("torch") is None:
        raise DemoError("PyTorch is not installed: `make demo` installs it (torch==2.13.0) into .venv")
    plan = make_plan(load_scenario(options.scenario), options.duration_s, time.time())
    workdir = options.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    stop = _stop_on_signals()
    with contextlib.ExitStack() as stack:
        alertmanager = _alertmanager(stack, workdir, say)
        slurm = _slurm(stack, workdir, plan, say)
        links = stack.enter_context(RealLinks(workdir / "links")) if options.real_links else None
        children = Children(workdir / "logs")
        stack.callback(children.stop_all, last=("hub",))
        hub_url = _start_platform(children, options, plan, workdir, alertmanager, slurm, links)
        _banner(say, options, plan, hub_url, alertmanager, slurm, links, workdir)
        client = HubClient(hub_url)
        finished = _watch(children, client, plan, links, stop, say)
        code = 0
        if finished and options.duration_s is not None:
            code = _score(client, plan, links, say)
        _peers_after(alertmanager, slurm, say)
        say("stopping every process the demo started ...")
    store = f"chdb://{workdir / 'store'}"
    span = " ".join(f"{flag} {_iso(t)}" for flag, t in (("--from", plan.epoch), ("--to", time.time())))
    say(f"store kept at {store}; for example:")
    say(f"  fleetlens postmortem --store {store} --node {plan.slow_node} {span}")
    return code


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def _alertmanager(stack: contextlib.ExitStack, workdir: Path, say: Say) -> str | None:
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        say("Alertmanager is not installed: alerts go to the hub's log")
        return None
    return stack.enter_context(peers.alertmanager(binary, workdir / "alertmanager"))


def _slurm(stack: contextlib.ExitStack, workdir: Path, plan: Plan, say: Say) -> peers.SlurmCluster | None:
    binaries = [shutil.which(name) for name in ("slurmctld", "slurmd", "scontrol")]
    if None in binaries or os.geteuid() != 0:
        say("Slurm is not installed (or not root): drain decisions are dry-run without a backend")
        return None
    slurmctld, slurmd, _ = binaries
    return stack.enter_context(
        peers.slurm_cluster(workdir / "slurm", plan.scenario.fleet.names, slurmctld, slurmd)
    )


def _start_platform(
    children: Children,
    options: DemoOptions,
    plan: Plan,
    workdir: Path,
    alertmanager: str | None,
    slurm: peers.SlurmCluster | None,
    links: RealLinks | None,
) -> str:
    """Start the fleet, the real-links exporter, the hub, the job and the UI; the hub's URL."""
    fleetlens = [sys.executable, "-m", "fleetlens.cli", "--log-level", "WARNING"]
    hub_port = peers.free_port()
    hub_url = f"http://127.0.0.1:{hub_port}"
    fleet_sd = workdir / "fleet-targets.json"
    fleet_sd.unlink(missing_ok=True)
    children.start(
        "fleet",
        [
            *fleetlens,
            *("sim", "serve", str(options.scenario), "--file-sd", str(fleet_sd), "--hub", hub_url),
            *("--epoch", str(plan.epoch)),
            *(("--until", str(plan.duration_s - SETTLE_S)) if plan.duration_s is not None else ()),
        ],
    )
    _wait(children, "the simulated fleet", fleet_sd.exists)
    targets = json.loads(fleet_sd.read_text())
    if links is not None:
        listen = f"127.0.0.1:{peers.free_port()}"
        children.start(
            "links-exporter",
            [
                *fleetlens,
                *("exporter", "--listen", listen, "--node", LINKS_NODE, "--gpu-backend", "none"),
                *("--sysfs-root", str(links.sysfs_root)),
            ],
        )
        _wait(children, "the real-links exporter", lambda: peers.answers(f"http://{listen}/metrics"))
        targets.append({"targets": [listen], "labels": {"node": LINKS_NODE}})
    (workdir / "targets.json").write_text(json.dumps(targets, indent=1) + "\n")
    config = workdir / "hub.yaml"
    config.write_text(yaml.safe_dump(_hub_config(options, plan, workdir, hub_port, alertmanager, slurm)))
    env = slurm.env if slurm is not None else {}
    children.start("hub", [*fleetlens, "hub", "--config", str(config)], env=env)
    _wait(children, "the hub", lambda: peers.answers(f"{hub_url}/healthz"))
    children.start("job", _job_command(plan, hub_url), env=JOB_ENV)
    if not options.headless:
        ui = [*fleetlens, "ui", "--hub", hub_url, "--config", str(config), "--port", str(options.ui_port)]
        children.start("ui", ui)
        _wait(children, "the UI", lambda: peers.answers(f"http://127.0.0.1:{options.ui_port}/_stcore/health"))
    return hub_url


def _hub_config(
    options: DemoOptions,
    plan: Plan,
    workdir: Path,
    port: int,
    alertmanager: str | None,
    slurm: peers.SlurmCluster | None,
) -> dict:
    return {
        "hub": {
            "store": f"chdb://{workdir / 'store'}",
            "targets": str(workdir / "targets.json"),
            "listen": f"127.0.0.1:{port}",
            "interval_s": plan.scenario.interval_s,
            "spool_dir": str(workdir / "spool"),
            "detect_window_s": WINDOW_S,
        },
        "alerts": {
            "alertmanager_urls": [alertmanager] if alertmanager else [],
            "generator_url": "" if options.headless else f"http://127.0.0.1:{options.ui_port}",
        },
        "drain": {"mode": "dry-run", "backend": "slurm" if slurm is not None else "none"},
    }


def _job_command(plan: Plan, hub_url: str) -> list[str]:
    """torchrun with 4 ranks of fleetlens.demo.train, each named after the demo node it stands for."""
    return [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(JOB_RANKS)),
        *("--master-addr", "127.0.0.1", "--master-port", str(peers.free_port())),
        *("-m", "fleetlens.demo.train", "--job", JOB, "--otlp-endpoint", hub_url),
        *("--node-of-rank", ",".join(plan.job_nodes), "--pace-s", str(PACE_S)),
        *("--slow-rank", str(SLOW_RANK), "--slow-factor", str(SLOW_FACTOR)),
        *("--slow-from-s", str(plan.slow_from_s), "--slow-until-s", str(plan.slow_from_s + SLOW_FOR_S)),
    ]


def _wait(children: Children, what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        children.check()
        if time.monotonic() > deadline:
            raise DemoError(f"{what} did not come up in {START_TIMEOUT_S:g} s (logs in {children.log_dir})")
        time.sleep(0.2)


def _banner(
    say: Say,
    options: DemoOptions,
    plan: Plan,
    hub_url: str,
    alertmanager: str | None,
    slurm: peers.SlurmCluster | None,
    links: RealLinks | None,
    workdir: Path,
) -> None:
    nodes = plan.scenario.fleet.nodes
    say(f"fleetlens demo: {nodes} simulated nodes ({plan.scenario.name}), work directory {workdir}")
    say(f"  hub:          {hub_url}  (store chdb://{workdir / 'store'})")
    if not options.headless:
        say(f"  UI:           http://127.0.0.1:{options.ui_port}")
    if alertmanager:
        say(f"  Alertmanager: {alertmanager}")
    if slurm is not None:
        say(f"  Slurm:        {len(slurm.nodes)} nodes, SLURM_CONF={slurm.conf} (drains are dry-run)")
    say(
        f"  job:          {JOB}, {JOB_RANKS} PyTorch DDP ranks on {', '.join(plan.job_nodes)}; "
        f"rank {SLOW_RANK} ({plan.slow_node}) computes {SLOW_FACTOR}x from {plan.slow_from_s:g} s"
    )
    if links is not None:
        flaps = ", ".join(f"{t:g} s" for t in plan.flaps_at_s)
        say(f"  real links:   {links.flap_port} in {links.namespaces[0]} flaps at {flaps} ({LINKS_NODE})")
    until = "Ctrl-C stops it" if options.duration_s is None else f"runs {options.duration_s:g} s"
    faults = len(plan.scenario.faults) + len(plan.scenario.layer_faults)
    injected = f"{faults} faults, {len(plan.scenario.confounders)} confounders"
    say(f"  {until}; the scenario injects {injected}")


Injection = tuple[float, str, Callable[[], None] | None]  # (unix time, what, what the demo does then)


def _injections(plan: Plan, links: RealLinks | None) -> list[Injection]:
    """The scenario's faults and confounders as they start (the fleet plays them), and the real flaps
    (the demo makes them), in time order."""
    events: list[Injection] = [(plan.epoch + t, what, None) for t, what in plan.timeline()]
    if links is not None:
        for t in plan.flaps_at_s:
            for offset, up in ((0.0, False), (FLAP_DOWN_S, True)):
                what = f"ip link set {links.flap_port} {'up' if up else 'down'}"
                events.append((plan.epoch + t + offset, what, functools.partial(links.set_link, up)))
    return sorted(events, key=lambda event: event[0])


def _watch(
    children: Children,
    client: HubClient,
    plan: Plan,
    links: RealLinks | None,
    stop: threading.Event,
    say: Say,
) -> bool:
    """Inject the real flaps and tell what happens until the run's end (True) or a signal (False)."""
    narrator = Narrator(client, plan.epoch)
    events = _injections(plan, links)
    end = plan.epoch + plan.duration_s if plan.duration_s is not None else math.inf
    hub_error, next_narration = "", 0.0
    while not stop.wait(POLL_S):
        children.check()
        while events and events[0][0] <= time.time():
            _, what, action = events.pop(0)
            if action is not None:
                action()
            say(f"{clock(time.time())}  injected  {what}")
        finished = time.time() >= end
        if finished or time.monotonic() >= next_narration:
            next_narration = time.monotonic() + NARRATE_S
            hub_error = _narrate(narrator, hub_error, say)
        if finished:
            return True
    return False


def _narrate(narrator: Narrator, hub_error: str, say: Say) -> str:
    """Say what the hub recorded since the last time; a hub that does not answer (busy, restarting)
    is said once per error. Returns the error, or "" when it answered."""
    try:
        for line in narrator.poll():
            say(line)
    except StoreUnavailable as error:
        if str(error) != hub_error:
            say(f"{clock(time.time())}  (hub did not answer: {error})")
        return str(error)
    return ""


def _iso(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _peers_after(alertmanager: str | None, slurm: peers.SlurmCluster | None, say: Say) -> None:
    """What the peers hold at the end: Alertmanager's alerts, and Slurm's nodes (dry-run drained none)."""
    if alertmanager is not None:
        try:
            with urllib.request.urlopen(f"{alertmanager}/api/v2/alerts", timeout=10) as answer:
                names = sorted({alert["labels"]["alertname"] for alert in json.load(answer)})
        except (OSError, ValueError) as error:
            say(f"Alertmanager did not say what it holds: {error}")
        else:
            say(f"Alertmanager holds {len(names)} alert name(s): {', '.join(names) or 'none'}")
    if slurm is not None:
        try:
            states = collections.Counter(state for state, _ in slurm.sinfo().values())
        except (OSError, subprocess.SubprocessError) as error:
            say(f"Slurm did not say how its nodes are: {error}")
        else:
            say("Slurm nodes: " + ", ".join(f"{count} {state}" for state, count in sorted(states.items())))


def _score(client: HubClient, plan: Plan, links: RealLinks | None, say: Say) -> int:
    """Score the run's anomalies against what it injected; 0 when every fault was found and no
    confounder reported."""
    expected = plan.expected(links.flap_port if links is not None else None)
    result = evaluate(expected, read_anomalies(client, plan.epoch), plan.epoch, WINDOW_S)
    for line in verdict_lines(result):
        say(line)
    return 0 if passed(result) else 1

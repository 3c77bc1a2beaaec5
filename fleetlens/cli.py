"""The `fleetlens` command: one entry point, one subcommand per job.

Flags override the environment, which overrides the config file (see fleetlens.config). The parser is
declared here whole; each command's code is imported only when that command runs (`run` names it), so
the exporter's process loads collectors/ and nothing of the hub, and a command whose extra is not
installed says which one to install.
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import logging
import sys
from collections.abc import Sequence

from fleetlens.arguments import duration, time_argument

log = logging.getLogger("fleetlens")

# Third-party modules by the extra that installs them: `pip install 'fleetlens[EXTRA]'`.
EXTRA_OF_MODULE = {
    "chdb": "hub",
    "clickhouse_connect": "hub",
    "numpy": "hub",
    "pandas": "hub",
    "sklearn": "hub",
    "httpx": "hub",
    "cramjam": "hub",
    "re2": "hub",
    "promql_parser": "hub",
    "streamlit": "ui",
    "altair": "ui",
    "kubernetes": "k8s",
}
# Commands whose extra holds more than the hub's: what they need beyond it is missing too.
EXTRA_OF_COMMAND = {"fleetlens.ui_cli": "ui", "fleetlens.demo_cli": "all"}
# The errors a command reports in one line, by where they are defined: a class never imported cannot
# have been raised, so none of these modules is imported to catch it.
CONFIG_ERRORS = ("fleetlens.errors:ConfigError", "analytics.errors:AddressError")
RUN_ERRORS = (
    "analytics.errors:AnalyticsError",
    "alerts.errors:AlertsError",
    "collectors.errors:CollectorError",
    "hub.errors:HubError",
    "sim.errors:SimError",
)


def _exporter_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config file (flags and FLEETLENS_* variables override it)")
    parser.add_argument("--sysfs-root", help="the /sys tree to read (default /sys)")
    parser.add_argument(
        "--gpu-backend",
        metavar="{nvml,sim,none,replay:FILE[#N]}",
        help="where GPU metrics come from: NVML, simulated GPUs, none, or NVML's code answered by an"
        " `nvidia-smi -q` capture in FILE (its Nth snapshot, counted from 1; the first by default)",
    )
    parser.add_argument("--node", help="node name for the Hostname label (default: this host's name)")
    parser.add_argument("--kernel-log", help="kernel log file to follow for NVRM Xid lines (e.g. /dev/kmsg)")
    parser.add_argument("--nccl-logs", help="glob of NCCL_DEBUG=INFO log files to watch for GPUDirect RDMA")
    parser.add_argument("--gpu-sim-seed", type=int, help="seed of the simulated GPU backend")
    parser.add_argument("--gpu-sim-count", type=int, help="number of simulated GPUs")
    parser.add_argument(
        "--gpu-poll-interval",
        type=float,
        dest="gpu_poll_interval_s",
        metavar="SECONDS",
        help="how often each GPU's cheap NVML values are read, off the scrape path (default 5)",
    )
    parser.add_argument(
        "--gpu-sample-interval",
        type=float,
        dest="gpu_sample_interval_s",
        metavar="SECONDS",
        help="how often each GPU's sampling NVML calls (PCIe throughput, energy) run (default 10)",
    )
    parser.add_argument(
        "--gpu-replay-latency",
        metavar="FILE",
        help="a replay answers each NVML call after its cost in this latency profile (text or JSON)",
    )
    parser.add_argument(
        "--gpu-replay-latency-pick",
        choices=("median", "max"),
        help="which of the profile's figures each call pays (default median; max: the worst case)",
    )
    parser.add_argument(
        "--netclass-ignored-devices", metavar="REGEX", help="interfaces the netclass collector skips"
    )
    parser.add_argument(
        "--kubernetes",
        action="store_const",
        const=True,
        help="label GPU series with the pod, namespace and container holding the GPU, from the kubelet's "
        "PodResources API (as dcgm-exporter's --kubernetes; the k8s extra)",
    )
    parser.add_argument(
        "--pod-resources-kubelet-socket",
        dest="pod_resources_socket",
        help="the kubelet's PodResources socket (default /var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    parser.add_argument(
        "--netclass-ignore-invalid-speed",
        action="store_const",
        const=True,
        help="omit speed when it reads -1",
    )
    parser.add_argument(
        "--enable-collector", action="append", dest="enable_collectors", metavar="NAME", help="repeatable"
    )
    parser.add_argument(
        "--disable-collector", action="append", dest="disable_collectors", metavar="NAME", help="repeatable"
    )


def _exporters_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exporters",
        metavar="FLAVOUR",
        help="what reads each simulated node, overriding the scenario's `exporters`: fleetlens (its "
        "exporter) or stock (dcgm-exporter and a real node_exporter, as a fleet without fleetlens's)",
    )


def _hub_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config file (flags and FLEETLENS_* variables override it)")
    parser.add_argument(
        "--store", help="chdb://DIR (embedded, default chdb://./data) or http(s)://host:8123/db"
    )


def _web_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS, basic auth and headers in node_exporter's web config format, re-read when it or a "
        "certificate it names changes (docs/tls.md)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fleetlens", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True)

    exporter = sub.add_parser("exporter", help="serve this VM's GPU, RoCE and link metrics over HTTP")
    exporter.add_argument("--listen", help="HOST:PORT to serve /metrics on (default 0.0.0.0:9612)")
    exporter.add_argument(
        "--web.max-requests",
        type=int,
        dest="web_max_requests",
        metavar="N",
        help="scrapes in flight at once, past which one is answered 503; 0: no bound (default 40)",
    )
    _web_config_flag(exporter)
    _exporter_flags(exporter)
    exporter.set_defaults(run="fleetlens.exporter_cli:cmd_exporter")

    collect = sub.add_parser("collect", help="print one scrape to stdout and exit")
    collect.add_argument("--once", action="store_true", help="one scrape (the only mode; kept for clarity)")
    collect.add_argument("--openmetrics", action="store_true", help="OpenMetrics instead of Prometheus text")
    _exporter_flags(collect)
    collect.set_defaults(run="fleetlens.exporter_cli:cmd_collect")

    collectors = sub.add_parser("collectors", help="list the collectors and whether they run by default")
    collectors.set_defaults(run="fleetlens.exporter_cli:cmd_collectors")

    host_agent = sub.add_parser(
        "host-agent", help="on a hypervisor: report its PFs, VFs, VMs and LLDP neighbors to a hub"
    )
    host_agent.add_argument("--hub", required=True, help="the hub's URL (FLEETLENS_API_TOKEN: a write token)")
    host_agent.add_argument("--host", help="this host's name in the topology (default: its hostname)")
    host_agent.add_argument(
        "--interval-s", type=float, default=60.0, dest="interval_s", help="seconds between reports (60)"
    )
    host_agent.add_argument("--sysfs-root", default="/sys", help="the /sys tree to read (default /sys)")
    host_agent.add_argument("--once", action="store_true", help="one report, then exit (1 if not stored)")
    host_agent.add_argument(
        "--virsh-connect", metavar="URI", help="libvirt's URI for virsh -c (default: virsh's own default)"
    )
    host_agent.add_argument(
        "--lldpd-socket", metavar="PATH", help="lldpd's control socket for lldpcli -u (default: lldpcli's)"
    )
    host_agent.set_defaults(run="fleetlens.hostagent_cli:cmd_host_agent")

    guest = sub.add_parser(
        "guest-report", help="in a VM: its NICs, GPUs and DMI UUID, as JSON or to a hub (format guest)"
    )
    guest.add_argument("--root", default="/", help="the filesystem root whose sys/ is read (default /)")
    guest.add_argument("--node", help="this VM's node name (default: its hostname)")
    guest.add_argument("--hub", help="post to this hub (FLEETLENS_API_TOKEN: a write token); else print")
    guest.set_defaults(run="fleetlens.guestreport_cli:cmd_guest_report")

    hub = sub.add_parser("hub", help="scrape the fleet, receive step times, store everything in ClickHouse")
    _hub_flags(hub)
    hub.add_argument("--targets", help="Prometheus file_sd JSON of the exporters to scrape")
    hub.add_argument(
        "--topology-file",
        dest="topology_file",
        help="the operator's topology inventory (YAML or JSON, docs/topology.md), re-read when it changes",
    )
    hub.add_argument("--listen", help="HOST:PORT of the hub's API (default 127.0.0.1:9500)")
    hub.add_argument("--shard", help="i/n: scrape only the targets whose hash falls in shard i of n")
    hub.add_argument("--cluster", help="ClickHouse cluster name: Replicated and Distributed tables")
    hub.add_argument("--interval-s", type=float, dest="interval_s", help="scrape interval, 1 to 60 s")
    hub.add_argument("--detectors", help='detectors to run on each window: "all" (default), "none" or names')
    hub.add_argument("--detect-window-s", type=float, dest="detect_window_s", help="detection window (10 s)")
    hub.add_argument(
        "--token-file", dest="token_file", help='scoped API tokens, lines of "read,write,act <token>"'
    )
    hub.add_argument(
        "--slurm-placements",
        action="store_const",
        const=True,
        dest="slurm_placements",
        help="poll squeue --json every 30 s for which job runs on which node (hub.slurm_placements)",
    )
    hub.add_argument(
        "--k8s-placements",
        action="store_const",
        const=True,
        dest="k8s_placements",
        help="poll the Kubernetes API server's pods every 30 s for which pod runs on which node, through "
        "the pod's service account or kubeconfig (hub.k8s_placements)",
    )
    hub.add_argument(
        "--listen-without-token",
        action="store_const",
        const=True,
        dest="listen_without_token",
        help="start on a non-loopback --listen address with no API token (FLEETLENS_API_TOKEN, "
        "--token-file), which is otherwise refused: the API then answers loopback clients only, and "
        "/metrics and /healthz every client (hub.listen_without_token)",
    )
    _web_config_flag(hub)
    hub.set_defaults(run="fleetlens.hub_cli:cmd_hub")

    query = sub.add_parser("query", help="read-only SQL on the store, through a hub or directly")
    _hub_flags(query)
    query.add_argument("sql")
    query.add_argument("--hub", help="hub URL (needed while a hub holds the embedded store)")
    query.add_argument("--max-rows", type=int, default=10_000)
    query.add_argument("--json", action="store_true", help="a JSON array of row objects")
    query.set_defaults(run="fleetlens.hub_cli:cmd_query")

    topology = sub.add_parser("topology", help="where each node sits: import sources, show the topology")
    topology_sub = topology.add_subparsers(dest="topology_command", required=True)
    topology_import = topology_sub.add_parser(
        "import", help="store what a file says of the topology, in place of what its source said before"
    )
    _hub_flags(topology_import)
    topology_import.add_argument("file")
    topology_import.add_argument(
        "--format",
        required=True,
        help="the file's format: inventory (docs/topology.md), slurm, k8s-nodes, ibnetdiscover, lldp, "
        "libvirt, host-agent, guest (docs/topology-importers.md)",
    )
    topology_import.add_argument(
        "--reporter",
        default="",
        help="who within the format's source says it (e.g. the host whose lldp output this is): an import "
        "replaces only the links the same reporter gave before",
    )
    topology_import.add_argument("--hub", help="send to this hub instead of opening the store")
    topology_import.set_defaults(run="fleetlens.topology_cli:cmd_topology_import")
    topology_show = topology_sub.add_parser("show", help="each node's host, leaf, spine, rails and rack")
    _hub_flags(topology_show)
    topology_show.add_argument("--at", type=time_argument, help="the topology as it was then (default: now)")
    topology_show.add_argument("--json", action="store_true", help="a JSON array, one object per node")
    topology_show.add_argument("--hub", help="hub URL (needed while a hub holds the embedded store)")
    topology_show.set_defaults(run="fleetlens.topology_cli:cmd_topology_show")

    checks = sub.add_parser("checks", help="active health checks on this node, and their stored results")
    checks_sub = checks.add_subparsers(dest="checks_command", required=True)
    checks_run = checks_sub.add_parser(
        "run", help="run checks here, one JSON line per result; exit 0 PASS/WARN, 1 any FAIL, 2 any ERROR"
    )
    checks_run.add_argument(
        "--checks",
        default="light",
        help="comma-separated checks or sets (light, heavy); docs/checks.md lists them (default: light)",
    )
    checks_run.add_argument("--level", type=int, default=1, choices=(1, 2, 3), help="dcgmi diag level (1)")
    checks_run.add_argument(
        "--peer", action="append", default=[], metavar="NAME=ADDR", help="a peer for ping and iperf3"
    )
    checks_run.add_argument(
        "--dev", metavar="NETDEV", help="the interface (or source address) ping sends from"
    )
    checks_run.add_argument(
        "--expected-gbps",
        type=float,
        default=100.0,
        dest="expected_gbps",
        help="iperf3's expected rate (100)",
    )
    checks_run.add_argument("--node", help="this node's name (default: its hostname)")
    checks_run.add_argument(
        "--hub", help="also post the results to this hub (FLEETLENS_API_TOKEN: a write token)"
    )
    checks_run.set_defaults(run="fleetlens.checks_cli:cmd_checks_run")
    checks_preflight = checks_sub.add_parser(
        "preflight", help="the preflight set, short: one JSON line; exit 0 PASS/WARN, 1 any FAIL, 2 any ERROR"
    )
    checks_preflight.add_argument("--node", help="this node's name (default: its hostname)")
    checks_preflight.add_argument("--hub", help="also post the results to this hub (a write token)")
    checks_preflight.set_defaults(run="fleetlens.checks_cli:cmd_checks_preflight")
    checks_list = checks_sub.add_parser("list", help="stored check results, oldest first")
    _hub_flags(checks_list)
    checks_list.add_argument("--node", help="only this node's")
    checks_list.add_argument("--since", type=time_argument, help="from then on (default: a day ago)")
    checks_list.add_argument("--hub", help="hub URL (needed while a hub holds the embedded store)")
    checks_list.add_argument("--json", action="store_true", help="a JSON array, one object per result")
    checks_list.set_defaults(run="fleetlens.checks_cli:cmd_checks_list")
    checks_schedule = checks_sub.add_parser(
        "schedule",
        help="run the light checks hourly and the heavy ones when this node is free, until SIGTERM",
    )
    checks_schedule.add_argument("--node", help="this node's name (default: its hostname)")
    checks_schedule.add_argument(
        "--hub", help="post the results to this hub (FLEETLENS_API_TOKEN: a write token)"
    )
    checks_schedule.add_argument("--interval", type=duration, default="1h", help="between light runs (1h)")
    checks_schedule.add_argument(
        "--jitter", type=duration, default="0s", help="at most this much later, at random (0s)"
    )
    checks_schedule.add_argument(
        "--heavy-every",
        type=duration,
        default="1d",
        dest="heavy_every",
        help="at most one heavy run per (1d)",
    )
    checks_schedule.add_argument("--force", action="store_true", help="heavy checks on a busy node too")
    checks_schedule.add_argument(
        "--without-slurm",
        action="store_true",
        dest="without_slurm",
        help="this node has no Slurm: do not ask squeue",
    )
    checks_schedule.add_argument(
        "--max-unsent",
        type=int,
        default=2000,
        dest="max_unsent",
        help="results kept while the hub is down (2000)",
    )
    checks_schedule.set_defaults(run="fleetlens.checks_cli:cmd_checks_schedule")

    steps = sub.add_parser("steps", help="training step records")
    steps_sub = steps.add_subparsers(dest="steps_command", required=True)
    steps_import = steps_sub.add_parser("import", help="import a step JSON-lines file into the store")
    _hub_flags(steps_import)
    steps_import.add_argument("file")
    steps_import.add_argument("--hub", help="send to this hub instead of opening the store")
    steps_import.add_argument(
        "--keep-days",
        type=int,
        metavar="N",
        help="keep the records N days from now (1 to 3650), even those older than the steps retention "
        "(without it, a file holding such records is refused)",
    )
    steps_import.set_defaults(run="fleetlens.hub_cli:cmd_steps_import")

    sim = sub.add_parser("sim", help="the fleet simulator")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True)
    sim_run = sim_sub.add_parser(
        "run", help="play a scenario through the collectors and the hub into a store"
    )
    _hub_flags(sim_run)
    sim_run.add_argument("scenario", help="scenario YAML (format in the README)")
    sim_run.add_argument("--speed", type=float, default=1.0, help="simulated seconds per real second")
    sim_run.add_argument("--offline", action="store_true", help="write the rows straight into the store")
    _exporters_flag(sim_run)
    sim_run.set_defaults(run="fleetlens.sim_cli:cmd_sim_run")
    sim_serve = sim_sub.add_parser(
        "serve", help="serve a scenario's nodes on loopback in real time for a hub to scrape"
    )
    sim_serve.add_argument("scenario", help="scenario YAML (format in the README)")
    sim_serve.add_argument(
        "--file-sd",
        required=True,
        help="write the nodes' targets here (file_sd JSON); with stock exporters, one file per exporter "
        "beside it instead (targets.json: targets.dcgm-exporter.json and targets.node-exporter.json)",
    )
    sim_serve.add_argument(
        "--hub",
        help="hub URL to send the simulated jobs' step records to (FLEETLENS_API_TOKEN: its write token)",
    )
    sim_serve.add_argument("--epoch", type=time_argument, help="scenario time 0 (default: now)")
    sim_serve.add_argument("--until", type=float, help="leave out faults and confounders starting later (s)")
    sim_serve.add_argument("--workdir", help="where the /sys trees go (default: a new directory on tmpfs)")
    _exporters_flag(sim_serve)
    sim_serve.set_defaults(run="fleetlens.sim_cli:cmd_sim_serve")

    detect_cmd = sub.add_parser("detect", help="run the detectors once over a time range and print anomalies")
    _hub_flags(detect_cmd)
    detect_cmd.add_argument("--hub", help="hub URL (needed while a hub holds the embedded store)")
    for flag, dest, default in (("--from", "start", "oldest"), ("--to", "end", "newest")):
        detect_cmd.add_argument(
            flag,
            dest=dest,
            type=time_argument,
            help=f"unix seconds or ISO 8601 (default: the {default} data)",
        )
    detect_cmd.add_argument(
        "--detector", dest="detectors", action="append", help="only this one (repeatable)"
    )
    detect_cmd.add_argument("--window-s", type=float, help="detection window in seconds (default 10)")
    detect_cmd.add_argument("--json", action="store_true", help="a JSON array of anomaly objects")
    detect_cmd.add_argument(
        "--save",
        action="store_true",
        help="also write the anomalies to the store (needs --store; a rerun stores each once)",
    )
    detect_cmd.set_defaults(run="fleetlens.hub_cli:cmd_detect")

    eval_cmd = sub.add_parser(
        "eval", help="simulate scenarios, run the detectors, score them against the faults"
    )
    eval_cmd.add_argument("scenarios", nargs="+", metavar="SCENARIO", help="scenario YAML files")
    eval_cmd.add_argument("--json", help="also write the full results (every miss and false report) here")
    eval_cmd.add_argument("--workers", type=int, default=2, help="scenarios evaluated at once (default 2)")
    _exporters_flag(eval_cmd)
    eval_cmd.set_defaults(run="fleetlens.sim_cli:cmd_eval")

    nccl = sub.add_parser("nccl", help="per-rank GPUDirect RDMA verdict and proof from NCCL_DEBUG=INFO logs")
    nccl.add_argument("files", nargs="+", metavar="FILE", help="NCCL_DEBUG=INFO log files")
    nccl.set_defaults(run="fleetlens.nccl_cli:cmd_nccl")
    _alert_commands(sub)
    _report_commands(sub)
    return parser


def _alert_commands(sub: argparse._SubParsersAction) -> None:
    """`alerts`, `silence` and `drain` (fleetlens.alerts_cli): through a hub or on the store."""

    def leaf(parent: argparse._SubParsersAction, name: str, help: str, run: str) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, help=help)
        _hub_flags(parser)
        parser.add_argument("--hub", help="a hub's URL: go through its API (the way to an embedded store)")
        parser.add_argument("--json", action="store_true", help="JSON instead of a table")
        parser.set_defaults(run=f"fleetlens.alerts_cli:{run}")
        return parser

    alerts = sub.add_parser("alerts", help="alerts raised from anomalies").add_subparsers(required=True)
    listing = leaf(alerts, "list", "the latest state of each alert", "cmd_alerts_list")
    listing.add_argument(
        "--state", choices=["pending", "firing", "resolved"], help="only alerts in this state"
    )
    leaf(
        alerts, "lifecycle", "nodes drained, testing or failed in the node lifecycle", "cmd_alerts_lifecycle"
    )
    tested = leaf(
        alerts, "test", "ask the hub's node lifecycle to test a node fleetlens drained", "cmd_drain_request"
    )
    tested.set_defaults(request="test")
    tested.add_argument("target", metavar="NODE", help="node")
    tested.add_argument("--by", default=getpass.getuser(), help="who (default: this user)")

    silence = sub.add_parser("silence", help="mute alerts by label matchers").add_subparsers(required=True)
    add = leaf(silence, "add", "create a silence starting now", "cmd_silence_add")
    add.add_argument(
        "-m",
        "--matcher",
        action="append",
        required=True,
        help="NAME=VALUE, NAME!=VALUE, NAME=~RE or NAME!~RE",
    )
    add.add_argument("--duration", type=duration, required=True, help="how long: 90s, 15m, 2h, 1d")
    add.add_argument("--comment", required=True, help="why (kept in the audit)")
    add.add_argument("--by", default=getpass.getuser(), help="who (default: this user)")
    leaf(silence, "list", "silences in force or to come (an invalid one says why)", "cmd_silence_list")
    expire = leaf(silence, "expire", "end a silence now", "cmd_silence_expire")
    expire.add_argument("id", help="the silence's id (from silence list)")

    drain = sub.add_parser("drain", help="the drain controller's decisions").add_subparsers(required=True)
    leaf(drain, "list", "drains waiting for approval and nodes fleetlens drained", "cmd_drain_list")
    for request, target, help in (
        ("approve", "decision id (from drain list)", "carry out a drain that waits for approval"),
        ("deny", "decision id (from drain list)", "drop a drain that waits for approval"),
        ("undrain", "node", "put a node fleetlens drained back into scheduling"),
    ):
        parser = leaf(drain, request, help, "cmd_drain_request")
        parser.set_defaults(request=request)
        parser.add_argument("target", help=target)
        parser.add_argument("--by", default=getpass.getuser(), help="who (default: this user)")


def _report_commands(sub: argparse._SubParsersAction) -> None:
    """`postmortem`, `ui` and `demo`: what people read."""
    postmortem = sub.add_parser(
        "postmortem", help="the incident report of a node or a job over a time window (Markdown, JSON, CSV)"
    )
    _hub_flags(postmortem)
    postmortem.add_argument("--hub", help="a hub's URL: go through its API (the way to an embedded store)")
    scope = postmortem.add_mutually_exclusive_group(required=True)
    scope.add_argument("--node", help="the node the report is about")
    scope.add_argument("--job", help="the job the report is about (its nodes: from its steps and placements)")
    for flag, dest in (("--from", "start"), ("--to", "end")):
        postmortem.add_argument(
            flag, dest=dest, type=time_argument, required=True, help="unix seconds or ISO 8601 (UTC)"
        )
    postmortem.add_argument("--format", choices=["csv", "json", "md"], default="md", help="md, json or csv")
    postmortem.set_defaults(run="fleetlens.postmortem_cli:cmd_postmortem")

    ui = sub.add_parser("ui", help="serve the SRE dashboards (Streamlit) on a hub or a store")
    _hub_flags(ui)
    ui.add_argument("--hub", help="a hub's URL: read through its API (the way to an embedded store)")
    ui.add_argument("--address", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    ui.set_defaults(run="fleetlens.ui_cli:cmd_ui")

    demo = sub.add_parser("demo", help="run the whole platform here: simulated fleet, real DDP job, UI")
    demo.add_argument("--scenario", help="scenario YAML (default: the demo's fleet)")
    demo.add_argument("--duration", type=float, help="stop after this many seconds and score the run")
    demo.add_argument("--headless", action="store_true", help="no UI")
    demo.add_argument(
        "--real-links", action="store_true", help="as root: flap a real veth between two network namespaces"
    )
    demo.add_argument(
        "--workdir", default="fleetlens-demo", help="where the store and logs go (default ./fleetlens-demo)"
    )
    demo.add_argument("--ui-port", type=int, default=8501, help="the UI's port (default 8501)")
    demo.set_defaults(run="fleetlens.demo_cli:cmd_demo")


def _loaded(names: Sequence[str]) -> tuple[type[BaseException], ...]:
    """The classes `module:Class` among modules already imported."""
    found = []
    for name in names:
        module, _, cls = name.partition(":")
        if module in sys.modules:
            found.append(getattr(sys.modules[module], cls))
    return tuple(found)


def _missing_extra(exc: ModuleNotFoundError, command_module: str) -> str | None:
    """The extra to install for the module `exc` found missing, if it is one of ours."""
    extra = EXTRA_OF_MODULE.get((exc.name or "").partition(".")[0])
    return EXTRA_OF_COMMAND.get(command_module, extra) if extra == "hub" else extra


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=args.log_level.upper(), format=log_format, stream=sys.stderr)
    module, _, function = args.run.partition(":")
    try:
        return getattr(importlib.import_module(module), function)(args)
    except ModuleNotFoundError as exc:
        extra = _missing_extra(exc, module)
        if extra is None:
            raise
        print(
            f"fleetlens {args.command}: needs the {extra} extra ({exc.name} is not installed): "
            f"pip install 'fleetlens[{extra}]'",
            file=sys.stderr,
        )
        return 2
    except Exception as exc:
        if isinstance(exc, _loaded(CONFIG_ERRORS)):
            print(f"fleetlens: configuration error: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, (OSError, *_loaded(RUN_ERRORS))):
            print(f"fleetlens: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())

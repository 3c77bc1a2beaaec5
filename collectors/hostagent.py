"""The host agent: what a hypervisor sees of its VMs' place, gathered into one report for the hub.

Each report (REPORT_VERSION, format `host-agent` on the hub; docs/topology.md) holds three parts:

- `pfs`: from sysfs, every network interface with SR-IOV VFs (`/sys/class/net/<pf>/device/virtfn*`
  symlinks), its own PCI address and its VFs' PCI addresses, as the symlinks' targets name them;
- `domains`: each libvirt domain's XML, raw (`virsh list --all --name`, then `virsh dumpxml NAME`);
- `lldp`: the raw text of `lldpcli -f json0 show neighbors`.

Failure policy: a part whose tool is not installed, fails, times out or answers more than
MAX_OUTPUT_BYTES is left out, and `errors` says why under the part's name; a domain whose dumpxml fails
is left out of `domains` alone. No failure fails the report. Commands run without a shell, with fixed
argument lists, through a Runner (the seam tests replace). The analytics side (the hub) validates every
field again: nothing here is trusted there.

Standard library only: the agent runs from a base install.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collectors import commands
from collectors.errors import CommandError, HostAgentError
from collectors.logtext import printable

log = logging.getLogger("fleetlens.hostagent")

REPORT_VERSION = 1
FORMAT = "host-agent"
COMMAND_TIMEOUT_S = 10.0
MAX_OUTPUT_BYTES = 4 << 20  # a domain's XML is some kB, lldpcli's neighbors of 100 ports < 1 MiB
MAX_REASON_CHARS = 500  # how much of a failure's stderr a reason keeps
MAX_JOINED_REASON_CHARS = 2000  # a part's reasons together (several domains may fail)
POST_TIMEOUT_S = 30.0

Runner = Callable[[Sequence[str]], str]


def run_command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """`argv`'s standard output as text, read for at most `timeout_s` and MAX_OUTPUT_BYTES; a
    HostAgentError saying why otherwise (not installed, exit status and stderr's start, timeout, too
    much output, not UTF-8). No shell; stdin is /dev/null; a command past a limit is killed."""
    try:
        ran = commands.run(argv, timeout_s, max_output_bytes=MAX_OUTPUT_BYTES)
    except CommandError as exc:
        raise HostAgentError(str(exc)) from None
    if ran.returncode != 0:
        said = printable(ran.stderr.strip())[:MAX_REASON_CHARS]
        raise HostAgentError(f"{argv[0]} exited with status {ran.returncode}: {said}")
    if ran.stdout_replaced:
        raise HostAgentError(f"{argv[0]} wrote output that is not UTF-8")
    return ran.stdout


def sriov_pfs(sysfs_root: Path) -> list[dict[str, Any]]:
    """Every interface under `sysfs_root`/class/net with virtfn* links: {"name", "pci", "vfs"}, sorted by
    name, each VF's PCI address (the link's target's name) in virtfn order."""
    pfs = []
    net = sysfs_root / "class" / "net"
    for interface in sorted(net.iterdir()) if net.is_dir() else []:
        device = interface / "device"
        links = sorted(device.glob("virtfn*"), key=lambda link: _virtfn_index(link.name))
        if not links:
            continue
        pfs.append(
            {
                "name": interface.name,
                "pci": Path(os.readlink(device)).name,
                "vfs": [Path(os.readlink(link)).name for link in links],
            }
        )
    return pfs


def _virtfn_index(name: str) -> int:
    """N of "virtfnN" (virtfn10 after virtfn9); -1 for a name that is not so numbered."""
    suffix = name.removeprefix("virtfn")
    return int(suffix) if suffix.isdigit() else -1


@dataclass
class HostAgent:
    """Gathers this host's report. `virsh` and `lldpcli` are the commands' fixed leading arguments (add
    `-c URI` or `-u SOCKET` to reach another libvirt or lldpd); `run` runs each command."""

    host: str
    sysfs_root: Path = Path("/sys")
    virsh: Sequence[str] = ("virsh",)
    lldpcli: Sequence[str] = ("lldpcli",)
    run: Runner = run_command
    errors: dict[str, str] = field(default_factory=dict, init=False)

    def report(self) -> dict[str, Any]:
        """One report of what this host sees now (module docstring); never raises for a part's failure."""
        self.errors = {}
        report: dict[str, Any] = {"version": REPORT_VERSION, "host": self.host}
        for part, gather in (("pfs", self._pfs), ("domains", self._domains), ("lldp", self._lldp)):
            try:
                report[part] = gather()
            except (HostAgentError, OSError) as exc:
                self._failed(part, exc)
        if self.errors:
            report["errors"] = self.errors
        return report

    def _failed(self, part: str, exc: Exception) -> None:
        # ASCII, control characters escaped: the hub refuses a report whose reasons are not one plain line
        reason = printable(str(exc).encode("ascii", "backslashreplace").decode())[:MAX_REASON_CHARS]
        joined = f"{self.errors[part]}; {reason}" if part in self.errors else reason
        self.errors[part] = joined[:MAX_JOINED_REASON_CHARS]
        log.warning("host agent: %s left out: %s", part, reason)

    def _pfs(self) -> list[dict[str, Any]]:
        return sriov_pfs(self.sysfs_root)

    def _domains(self) -> list[dict[str, str]]:
        names = [line.strip() for line in self.run([*self.virsh, "list", "--all", "--name"]).splitlines()]
        domains = []
        for name in filter(None, names):
            try:
                domains.append({"name": name, "xml": self.run([*self.virsh, "dumpxml", "--", name])})
            except HostAgentError as exc:
                self._failed("domains", HostAgentError(f"domain {name}: {exc}"))
        return domains

    def _lldp(self) -> str:
        return self.run([*self.lldpcli, "-f", "json0", "show", "neighbors"])


def post_report(
    hub: str, report: dict[str, Any], token: str | None, timeout_s: float = POST_TIMEOUT_S
) -> dict:
    """POST a host agent's `report` to `hub` as format `host-agent`, reporter = its host (post_topology)."""
    return post_topology(hub, FORMAT, report["host"], report, token, timeout_s)


def post_topology(
    hub: str,
    format_name: str,
    reporter: str,
    report: dict[str, Any],
    token: str | None,
    timeout_s: float = POST_TIMEOUT_S,
) -> dict:
    """POST `report` (a host agent's, or a guest's: collectors.guestreport) to `hub`'s /api/v1/topology as
    `format_name`, stored as what `reporter` says now; the hub's JSON answer, or HostAgentError with what
    the hub said (or why it could not be reached)."""
    body = {
        "format": format_name,
        "text": json.dumps(report),
        "file": f"{format_name} {reporter}",
        "reporter": reporter,
    }
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{hub.rstrip('/')}/api/v1/topology"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read(1 << 20))
    except urllib.error.HTTPError as exc:
        said = printable(exc.read(MAX_REASON_CHARS * 4).decode("utf-8", "replace"))[:MAX_REASON_CHARS]
        raise HostAgentError(f"the hub at {url} answered {exc.code}: {said}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HostAgentError(f"the hub at {url} cannot be reached: {printable(str(exc))}") from None


def run_agent(
    agent: HostAgent,
    hub: str,
    token: str | None,
    *,
    interval_s: float,
    once: bool = False,
    stop: threading.Event | None = None,
) -> bool:
    """Gather and post one report every `interval_s` until `stop` is set (or once); each answer logged. A
    hub that is down is tried again with the next interval's fresh report: nothing is queued. Returns
    whether the last report was stored."""
    stop = stop or threading.Event()
    while True:
        try:
            answer = post_report(hub, agent.report(), token)
            log.info("host agent: the hub stored %s links (%s)", answer.get("links"), _changes(answer))
            stored = True
        except HostAgentError as exc:
            log.warning("host agent: report not stored: %s", exc)
            stored = False
        if once or stop.wait(interval_s):
            return stored


def _changes(answer: dict) -> str:
    return ", ".join(f"{answer.get(key)} {key}" for key in ("opened", "closed", "unchanged"))

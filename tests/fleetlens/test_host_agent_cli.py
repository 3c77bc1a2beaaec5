"""`fleetlens host-agent --once` as a hypervisor runs it (a real CLI process), against a real
`fleetlens hub` with an API token: real virsh (libvirt's test driver), real lldpd in network namespaces,
a kernel-shaped /sys tree; then `fleetlens topology show` places the VM under its host and leaf. A
hostile report through the same API is refused whole and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collectors.hostagent import HostAgent
from tests.fleetlens.test_roles import HEAVY, LOADED, OTHER_PROGRAMS
from tests.support import hostpeers
from tests.support.hostpeers import GPU_PCI, LEAF, VFS
from tests.support.hubserver import hub_process
from tests.support.peers import free_port, require_binary

TOKEN = "host-agent-test-token"
PLACED = [{"node": "vela-001", "host": "hv-01", "leaf": LEAF}, {"node": "vela-002", "host": "hv-01"}]


def fleetlens(*args: str, token: str = TOKEN) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FLEETLENS_")}
    return subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "FLEETLENS_API_TOKEN": token},
    )


def shown(hub: str) -> list[dict]:
    done = fleetlens("topology", "show", "--json", "--hub", hub)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.integration
def test_the_agent_places_each_vm_under_its_host_and_the_leaf_behind_its_vf(tmp_path: Path) -> None:
    require_binary("virsh")
    sysfs = hostpeers.sriov_tree(tmp_path / "sys")
    uri = hostpeers.libvirt_node(tmp_path / "node.xml", {"vela-001": [VFS[3], GPU_PCI], "vela-002": []})
    with (
        hostpeers.lldp_pair() as lldp,
        hub_process(tmp_path, env={"FLEETLENS_API_TOKEN": TOKEN}) as hub,
    ):
        agent = ["host-agent", "--hub", hub.url, "--host", "hv-01", "--sysfs-root", str(sysfs), "--once"]
        flags = ["--virsh-connect", uri, "--lldpd-socket", lldp.socket]
        done = fleetlens(*agent, *flags)
        assert done.returncode == 0, done.stderr
        assert "the hub stored" in done.stderr
        assert shown(hub.url) == PLACED

        again = fleetlens(*agent, *flags)
        assert "0 opened, 0 closed" in again.stderr  # the same view again changes nothing

        refused = fleetlens(*agent, *flags, token="not-the-token")
        assert refused.returncode == 1
        assert "report not stored: the hub at" in refused.stderr

        report = HostAgent(
            "hv-01", sysfs_root=sysfs, virsh=("virsh", "-c", uri), lldpcli=("lldpcli", "-u", lldp.socket)
        ).report()
        report["domains"][0]["xml"] = '<!DOCTYPE d [<!ENTITY x "vela-009">]><domain><name>&x;</name></domain>'
        (tmp_path / "hostile.json").write_text(json.dumps(report))
        imported = fleetlens(
            "topology", "import", str(tmp_path / "hostile.json"), "--format", "host-agent", "--hub", hub.url
        )
        assert imported.returncode == 1
        assert "$.domains[0].xml line 1: a DOCTYPE" in imported.stderr
        assert shown(hub.url) == PLACED


def test_a_non_positive_interval_is_refused_before_anything_runs() -> None:
    done = fleetlens("host-agent", "--hub", "http://127.0.0.1:9", "--interval-s", "0")
    assert done.returncode == 2
    assert "--interval-s: 0.0 is not a positive number of seconds" in done.stderr


def test_once_against_a_hub_that_is_down_says_so_and_exits_1(tmp_path: Path) -> None:
    done = fleetlens(
        "host-agent", "--hub", f"http://127.0.0.1:{free_port()}", "--sysfs-root", str(tmp_path), "--once"
    )
    assert done.returncode == 1
    assert "report not stored: the hub at" in done.stderr and "cannot be reached" in done.stderr


def test_the_agent_process_loads_nothing_of_the_hub_or_analytics(tmp_path: Path) -> None:
    """A base install runs it: the hub parses the report, the agent only gathers and posts."""
    hub = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", LOADED, "host-agent", "--hub", hub, "--sysfs-root", str(tmp_path), "--once"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert loaded["code"] == 1  # the hub is down: reported, not raised
    roots = {name.partition(".")[0] for name in loaded["modules"]}
    assert roots & (HEAVY | OTHER_PROGRAMS) == set()

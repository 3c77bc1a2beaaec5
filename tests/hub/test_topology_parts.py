"""Reports through a real hub's /api/v1/topology, posted as the agents post them: a host agent's part
that failed this time (lldpcli or virsh once down) keeps that part's links in force, a good report
without the PF ends them; a guest's report joins it to the host agent's domain through its UUID."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from analytics.store import Store
from analytics.topology.view import node_views
from collectors.guestreport import FORMAT as GUEST_FORMAT
from collectors.hostagent import post_report, post_topology
from fleetlens.cli import main
from hub.app import Hub
from hub.auth import Tokens
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.analytics.topology.test_guest_importer import REPORT as GUEST_REPORT
from tests.analytics.topology.test_host_agent_importer import REPORT as GOOD
from tests.collectors.test_guestreport import DOMAIN_UUID, captured_guest, with_vf, write
from tests.support.hubserver import on_loopback

WRITER = "write-token"
LEAF = "ns-2.example.com"  # behind PF eth0 in lldpd's own json0 example


@pytest.fixture
def hub_url(store: Store, tmp_path: Path) -> Iterator[str]:
    writer = Writer(store, Spool(tmp_path / "spool", 1 << 20))
    hub = Hub(store, writer, OtlpStepReceiver(), tokens=Tokens({WRITER: frozenset({"write"})}))
    with on_loopback(hub) as url:
        yield url


def views(store: Store) -> dict[str, dict]:
    return {view["node"]: view for view in node_views(store.topology_at(time.time()))}


def failed(part: str) -> dict:
    """GOOD as the agent sends it when `part`'s tool failed: the part absent, its reason in errors."""
    report = copy.deepcopy(GOOD)
    del report[part]
    report["errors"] = {part: f"{part}: exited with status 1: Connection refused"}
    return report


def test_a_part_that_failed_keeps_its_links_and_a_good_report_ends_them(hub_url: str, store: Store) -> None:
    post_report(hub_url, GOOD, WRITER)
    placed = {"node": "QEMUGuest2", "host": "hv-01", "leaf": LEAF}
    assert views(store)["QEMUGuest2"] == placed

    answer = post_report(hub_url, failed("lldp"), WRITER)
    assert answer["closed"] == 0
    assert views(store)["QEMUGuest2"] == placed  # lldpcli down once: the PF is still behind its leaf
    post_report(hub_url, failed("domains"), WRITER)
    assert views(store)["QEMUGuest2"] == placed  # virsh down once: the VM is still on its host

    gone = {**GOOD, "pfs": [], "lldp": '{"lldp": [{}]}'}  # the PF is gone and lldpd sees no neighbor
    assert post_report(hub_url, gone, WRITER)["closed"] > 0
    assert views(store)["QEMUGuest2"] == {"node": "QEMUGuest2", "host": "hv-01"}


def test_a_guest_named_apart_from_its_domain_gets_the_hosts_host_and_leaf(hub_url: str, store: Store) -> None:
    post_report(hub_url, GOOD, WRITER)
    post_topology(hub_url, GUEST_FORMAT, "vela-001", GUEST_REPORT, WRITER)
    assert views(store)["vela-001"] == {"node": "vela-001", "host": "hv-01", "leaf": LEAF}


def test_the_guest_report_command_posts_what_the_guest_sees(
    hub_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    root = with_vf(captured_guest(tmp_path))
    write(root / "sys" / "class" / "dmi" / "id" / "product_uuid", DOMAIN_UUID + "\n")
    post_report(hub_url, GOOD, WRITER)
    monkeypatch.setenv("FLEETLENS_API_TOKEN", WRITER)
    assert main(["guest-report", "--root", str(root), "--node", "vela-002", "--hub", hub_url]) == 0
    assert json.loads(capsys.readouterr().out)["opened"] == 4  # its VF, the VF's MAC, its GPU, its domain
    assert views(store)["vela-002"] == {"node": "vela-002", "host": "hv-01", "leaf": LEAF}
    monkeypatch.setenv("FLEETLENS_API_TOKEN", "not-a-token")
    assert main(["guest-report", "--root", str(root), "--node", "vela-002", "--hub", hub_url]) == 1

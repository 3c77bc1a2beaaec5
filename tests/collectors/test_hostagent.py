"""The host agent's report from a real-shaped /sys tree, libvirt's real test driver and two real lldpd
daemons; every failing part left out with its reason, the rest kept; a hub that is down retried later."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from collectors.errors import HostAgentError
from collectors.hostagent import MAX_OUTPUT_BYTES, HostAgent, run_agent, run_command, sriov_pfs
from tests.support import hostpeers
from tests.support.hostpeers import GPU_PCI, LEAF, LEAF_PORT, PF, PF_PCI, VFS
from tests.support.peers import free_port, require_binary

ABSENT = ("fleetlens-no-such-tool",)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_sysfs_gives_each_pf_with_vfs_its_address_and_vfs_in_virtfn_order(tmp_path: Path) -> None:
    tree = hostpeers.sriov_tree(tmp_path)
    assert sriov_pfs(tree) == [{"name": PF, "pci": PF_PCI, "vfs": list(VFS)}]  # virtfn10 after virtfn9
    assert len(VFS) > 10


def test_a_host_without_sriov_or_class_net_reports_no_pfs(tmp_path: Path) -> None:
    assert sriov_pfs(tmp_path) == []


def test_each_domain_is_read_from_libvirt_raw(tmp_path: Path) -> None:
    require_binary("virsh")
    uri = hostpeers.libvirt_node(tmp_path / "node.xml", {"vela-001": [VFS[0], GPU_PCI], "vela-002": []})
    report = HostAgent("hv-01", sysfs_root=tmp_path, virsh=("virsh", "-c", uri), lldpcli=ABSENT).report()
    assert [domain["name"] for domain in report["domains"]] == ["vela-001", "vela-002"]
    assert "<name>vela-001</name>" in report["domains"][0]["xml"]
    assert "bus='0x3b' slot='0x02'" in report["domains"][0]["xml"]
    assert report["errors"] == {"lldp": "fleetlens-no-such-tool is not installed (not found on PATH)"}


def test_a_domain_whose_dumpxml_fails_is_left_out_alone(tmp_path: Path) -> None:
    require_binary("virsh")
    uri = hostpeers.libvirt_node(tmp_path / "node.xml", {"vela-001": [], "vela-002": []})

    def runner(argv: Sequence[str]) -> str:
        if argv[-1] == "vela-002":
            raise HostAgentError("virsh exited with status 1: error: failed to get domain 'vela-002'")
        return run_command(argv)

    report = HostAgent("hv-01", sysfs_root=tmp_path, virsh=("virsh", "-c", uri), run=runner).report()
    assert [domain["name"] for domain in report["domains"]] == ["vela-001"]
    assert report["errors"]["domains"].startswith("domain vela-002: virsh exited with status 1")


def test_tools_absent_or_failing_leave_their_parts_out_and_the_report_whole(tmp_path: Path) -> None:
    require_binary("virsh")
    hostpeers.sriov_tree(tmp_path)
    virsh = ("virsh", "-c", f"test://{tmp_path}/no-such-node.xml")
    report = HostAgent("hv-01", sysfs_root=tmp_path, virsh=virsh, lldpcli=ABSENT).report()
    assert report["pfs"][0]["vfs"] == list(VFS)
    assert "domains" not in report and "lldp" not in report
    assert report["errors"]["domains"].startswith("virsh exited with status 1: ")
    assert report["errors"]["lldp"] == "fleetlens-no-such-tool is not installed (not found on PATH)"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import time; time.sleep(60)", "ran past its 0.5 s timeout"),
        (
            f"import sys; sys.stdout.write('x' * {MAX_OUTPUT_BYTES + 1})",
            f"more than {MAX_OUTPUT_BYTES} bytes to stdout",
        ),
        ("import sys; sys.stdout.buffer.write(b'<domain>\\xff')", "output that is not UTF-8"),
        ("import sys; sys.stderr.write('bad\\nline\\x1b[2J'); sys.exit(3)", "status 3: bad\\x0aline\\x1b[2J"),
    ],
)
def test_a_command_past_a_bound_is_a_reason_on_one_line(code: str, reason: str) -> None:
    with pytest.raises(HostAgentError) as refused:
        run_command(_python(code), timeout_s=0.5 if "sleep" in code else 30)
    assert str(refused.value).endswith(reason)


def test_a_reason_is_one_plain_ascii_line_whatever_the_tool_wrote(tmp_path: Path) -> None:
    code = "import sys; sys.stderr.write('no\\u202eroute\\n\\x85'); sys.exit(1)"
    report = HostAgent("hv-01", sysfs_root=tmp_path, virsh=ABSENT, lldpcli=_python(code)).report()
    reason = report["errors"]["lldp"]
    assert reason.isascii() and reason.isprintable()
    assert "\u202e" not in reason and reason.endswith("u202eroute")  # the bidi override escaped


@pytest.mark.integration
def test_lldp_neighbors_come_raw_from_a_real_lldpd(tmp_path: Path) -> None:
    with hostpeers.lldp_pair() as pair:
        agent = HostAgent("hv-01", sysfs_root=tmp_path, virsh=ABSENT, lldpcli=("lldpcli", "-u", pair.socket))
        neighbors = json.loads(agent.report()["lldp"])
    [interface] = neighbors["lldp"][0]["interface"]
    assert interface["name"] == PF
    assert interface["chassis"][0]["name"][0]["value"] == LEAF
    assert interface["port"][0]["id"][0]["value"] == LEAF_PORT


def test_a_hub_that_is_down_is_logged_and_left_for_the_next_interval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = HostAgent("hv-01", sysfs_root=tmp_path, virsh=ABSENT, lldpcli=ABSENT)
    with caplog.at_level(logging.WARNING, "fleetlens.hostagent"):
        stored = run_agent(agent, f"http://127.0.0.1:{free_port()}", None, interval_s=60, once=True)
    assert stored is False
    assert "report not stored: the hub at http://127.0.0.1:" in caplog.text
    assert "cannot be reached" in caplog.text

"""The guest report on sysfs trees laid out as a real KVM guest's (the H200 passthrough capture: no
InfiniBand, no DMI, one GPU on a flat bus), one with an SR-IOV VF and a DMI UUID added, and hostile
trees: values refused per field with a reason, never a crash."""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.guestreport import MAX_VALUE_BYTES, guest_report
from fleetlens.cli import main

GUEST_VIEW = Path(__file__).parents[2] / ".." / "shared" / "fixtures" / "h200-passthrough" / "guest-view.txt"
PCI_LINE = re.compile(r"(?P<address>\S+) vendor=(?P<vendor>\S+) device=(?P<device>\S+) .*class=(?P<cls>\S+)")
DOMAIN_UUID = "c7a5fdbd-edaf-9466-926a-d65c16db1809"  # libvirt's hostdev test domain's <uuid>


def write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())


def captured_guest(root: Path) -> Path:
    """`root` with a /sys holding what the captured guest's has: each PCI function's vendor, device and
    class as guest-view.txt lists them, its net devices, and empty class/infiniband (no DMI)."""
    lines = GUEST_VIEW.read_text().split("### pci devices")[1].split("###")[0].splitlines()
    for match in filter(None, map(PCI_LINE.match, lines)):
        device = root / "sys" / "devices" / "pci0000:00" / match["address"]
        for name in ("vendor", "device"):
            write(device / name, match[name] + "\n")
        write(device / "class", match["cls"] + "\n")
        link = root / "sys" / "bus" / "pci" / "devices" / match["address"]
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(device)
    (root / "sys" / "class" / "infiniband").mkdir(parents=True)
    for netdev, address in (("eth0", "02:fc:00:00:00:01"), ("lo", "00:00:00:00:00:00")):
        write(root / "sys" / "class" / "net" / netdev / "address", address + "\n")
    return root


def with_vf(root: Path, *, rdma: str = "mlx5_0", pci: str = "0000:00:07.0", netdev: str = "ens7") -> Path:
    """Add an SR-IOV VF as a guest's kernel shows it: the RDMA device, its PCI function, its netdev."""
    device = root / "sys" / "devices" / "pci0000:00" / pci
    write(device / "net" / netdev / "address", "02:fc:00:00:00:02\n")
    write(root / "sys" / "class" / "net" / netdev / "address", "02:fc:00:00:00:02\n")
    ib = root / "sys" / "class" / "infiniband" / rdma
    ib.mkdir(parents=True)
    (ib / "device").symlink_to(os.path.relpath(device, ib))
    return root


def test_the_captured_guest_reports_its_gpu_and_nothing_it_does_not_have(tmp_path: Path) -> None:
    report = guest_report(captured_guest(tmp_path), "vela-001")
    assert report == {
        "version": 1,
        "node": "vela-001",
        "nics": [],
        "gpus": [{"pci": "0000:00:06.0", "device": "0x2335"}],
    }  # no product_uuid (no DMI tables) and no errors: absent hardware is not a fault


def test_a_vf_and_a_dmi_uuid_are_reported_as_the_kernel_names_them(tmp_path: Path) -> None:
    root = with_vf(captured_guest(tmp_path))
    write(root / "sys" / "class" / "dmi" / "id" / "product_uuid", DOMAIN_UUID.upper() + "\n")
    report = guest_report(root, "vela-001")
    assert report["product_uuid"] == DOMAIN_UUID
    assert report["nics"] == [
        {"rdma": "mlx5_0", "pci": "0000:00:07.0", "netdev": "ens7", "mac": "02:fc:00:00:00:02"}
    ]
    assert "errors" not in report


# lspci lines gpud tests its GPU detection on (leptonai/gpud pkg/nvidia-query/detect_lspci_test.go, commit
# 40c0f93): Azure's Hyper-V guests give each passed-through device a PCI domain of its own, and an
# NVSwitch is an NVIDIA bridge, no GPU. Device IDs are the PCI ID database's for the names lspci printed.
AZURE_LSPCI = (
    ("000b:00:00.0", "0x20b2", "0x030200"),  # 3D controller: NVIDIA Corporation GA100 [A100 SXM4 80GB]
    ("0001:00:00.0", "0x2331", "0x030200"),  # 3D controller: NVIDIA Corporation GH100 [H100 PCIe]
    ("0005:00:00.0", "0x1af1", "0x068000"),  # Bridge [0680]: NVIDIA Corporation Device [10de:1af1]
)


def test_gpus_in_pci_domains_of_their_own_are_reported_and_an_nvswitch_is_not(tmp_path: Path) -> None:
    for address, device_id, pci_class in AZURE_LSPCI:
        device = tmp_path / "sys" / "devices" / f"pci{address[:4]}:00" / address
        for name, value in (("vendor", "0x10de"), ("device", device_id), ("class", pci_class)):
            write(device / name, value + "\n")
        link = tmp_path / "sys" / "bus" / "pci" / "devices" / address
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(device)
    report = guest_report(tmp_path, "azure-nd-001")
    assert report["gpus"] == [
        {"pci": "0001:00:00.0", "device": "0x2331"},
        {"pci": "000b:00:00.0", "device": "0x20b2"},
    ]
    assert "errors" not in report


@pytest.mark.parametrize(
    ("file", "content", "where"),
    [
        ("class/dmi/id/product_uuid", "not-a-uuid\n", "class/dmi/id/product_uuid"),
        ("class/net/ens7/address", "zz:fc:00:00:00:02\n", "class/net/ens7/address"),
        ("class/net/ens7/address", "02:fc:00:00:00:02\x1b[2J\n", "class/net/ens7/address"),
        ("devices/pci0000:00/0000:00:06.0/vendor", "0x10de" * 100, "bus/pci/devices/0000:00:06.0"),
        ("devices/pci0000:00/0000:00:06.0/device", "0x23\n", "bus/pci/devices/0000:00:06.0"),
    ],
)
def test_an_odd_value_is_refused_with_its_path_and_the_rest_is_kept(
    tmp_path: Path, file: str, content: str, where: str
) -> None:
    root = with_vf(captured_guest(tmp_path))
    write(root / "sys" / file, content)
    report = guest_report(root, "vela-001")
    assert list(report["errors"]) == [where]
    assert "\x1b" not in json.dumps(report["errors"])
    assert report["nics"][0]["rdma"] == "mlx5_0"  # a refused MAC leaves the NIC without it, not out


def test_a_device_named_oddly_is_left_out_with_its_escaped_name(tmp_path: Path) -> None:
    root = with_vf(captured_guest(tmp_path), rdma="mlx5\n0", pci="0000:00:07.0")
    report = guest_report(root, "vela-001")
    assert report["nics"] == []
    assert list(report["errors"]) == ["class/infiniband/mlx5\\x0a0"]


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    file=st.sampled_from(
        [
            "class/dmi/id/product_uuid",
            "class/net/ens7/address",
            "devices/pci0000:00/0000:00:06.0/vendor",
            "devices/pci0000:00/0000:00:06.0/class",
            "devices/pci0000:00/0000:00:06.0/device",
        ]
    ),
    content=st.binary(max_size=MAX_VALUE_BYTES + 8),
)
def test_any_file_content_is_either_what_the_kernel_writes_or_an_error(
    tmp_path_factory: pytest.TempPathFactory, file: str, content: bytes
) -> None:
    root = with_vf(captured_guest(tmp_path_factory.mktemp("guest")))
    write(root / "sys" / file, content)
    report = guest_report(root, "vela-001")
    json.dumps(report, ensure_ascii=False).encode("utf-8")  # always serializable
    for reason in report.get("errors", {}).values():
        assert reason.isprintable()
    if "product_uuid" in report:
        assert str(uuid.UUID(report["product_uuid"])) == report["product_uuid"]
    for nic in report["nics"]:
        assert re.fullmatch(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}", nic.get("mac", "00:00:00:00:00:00"))
    for gpu in report["gpus"]:
        assert re.fullmatch(r"0x[0-9a-f]{4}", gpu["device"])


def test_the_cli_prints_the_report_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = with_vf(captured_guest(tmp_path))
    assert main(["guest-report", "--root", str(root), "--node", "vela-001"]) == 0
    assert json.loads(capsys.readouterr().out)["nics"][0]["pci"] == "0000:00:07.0"

"""The guest report: what a VM sees of its own devices, for the hub to join to what its host reports.

A VM sees nothing above its devices, but what it does see names them: each RDMA device's PCI address,
netdev and MAC (the VF its host passed through), its NVIDIA GPUs' PCI addresses, and its DMI
product_uuid, which a libvirt guest reads as its domain's UUID (the hub's join to the host agent's
report, docs/topology.md "The guest report"). One JSON object, REPORT_VERSION, format `guest` on the hub:

    {"version": 1, "node": "vela-001", "product_uuid": "c7a5fdbd-edaf-9466-926a-d65c16db1809",
     "nics": [{"rdma": "mlx5_0", "pci": "0000:00:07.0", "netdev": "ens7", "mac": "02:fc:00:00:00:02"}],
     "gpus": [{"pci": "0000:00:06.0", "device": "0x2335"}],
     "errors": {"class/infiniband/mlx5_0/device/net/ens7/address": "'zz' is not a MAC address"}}

Read under an injectable root (`<root>/sys/...`): /sys/class/infiniband/*/device (the PCI address is the
symlink target's name), its net/* (netdevs), /sys/class/net/<netdev>/address, /sys/class/dmi/id/
product_uuid, and /sys/bus/pci/devices/* with vendor 0x10de and class 0x030200 or 0x030000.

Failure policy: absent hardware (no InfiniBand class, no DMI tables, as in a KVM microVM) is not an
error. Every value read is bounded (MAX_VALUE_BYTES) and checked against what the kernel writes there;
one that is not (non-hex, too long, control characters, an unreadable file) is left out, and `errors`
says why under the sysfs path it came from (escaped). A refused device is left out whole (a NIC without
its PCI address names nothing); a refused netdev or MAC leaves the NIC without it. Never raises for what
the tree holds. The hub checks every field again: nothing here is trusted there.

Standard library only: it runs in a guest from a base install.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Any

from collectors.errors import SysfsError
from collectors.logtext import printable

REPORT_VERSION = 1
FORMAT = "guest"
MAX_VALUE_BYTES = 256  # a sysfs attribute read here is < 64 bytes; more is not what the kernel writes
MAX_REASON_CHARS = 500
NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = frozenset({"0x030200", "0x030000"})  # 3D controller (datacenter GPUs), VGA controller
PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]")
RDMA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # IB_DEVICE_NAME_MAX is 64
INTERFACE_NAME = re.compile(r"[A-Za-z0-9_.@+-]{1,15}")  # under IFNAMSIZ, no '/', ':' or whitespace
# An Ethernet MAC (6 octets) or an IPoIB hardware address (20), lowercase as the kernel writes them.
MAC_ADDRESS = re.compile(r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}|[0-9a-f]{2}(?::[0-9a-f]{2}){19}")
PCI_ID = re.compile(r"0x[0-9a-f]{4}")
PCI_CLASS = re.compile(r"0x[0-9a-f]{6}")
UUID = re.compile(r"[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}")


def _value(path: Path, pattern: re.Pattern[str]) -> str:
    """The one-line value of sysfs file `path` if it matches `pattern` whole, else SysfsError saying why."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_VALUE_BYTES + 1)
    except OSError as exc:
        raise SysfsError(f"not readable: {exc.strerror}") from None
    if len(raw) > MAX_VALUE_BYTES:
        raise SysfsError(f"more than {MAX_VALUE_BYTES} bytes")
    text = raw.decode("ascii", "backslashreplace").removesuffix("\n")
    if not pattern.fullmatch(text):
        raise SysfsError(f"{printable(text)[:64]!r} is not what the kernel writes there")
    return text


def _name(name: str, pattern: re.Pattern[str], what: str) -> str:
    if not pattern.fullmatch(name):
        raise SysfsError(f"{printable(name)[:64]!r} is not {what}")
    return name


def _link_name(link: Path, pattern: re.Pattern[str], what: str) -> str:
    """The name of symlink `link`'s target (a device's PCI address), checked as `what`."""
    try:
        target = os.readlink(link)
    except OSError as exc:
        raise SysfsError(f"not a readable link: {exc.strerror}") from None
    return _name(Path(target).name, pattern, what)


def _entries(directory: Path) -> list[Path]:
    """`directory`'s entries sorted, none when it is absent (absent hardware is not an error)."""
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


class GuestReader:
    """Reads one guest's report from the tree under `root` (module docstring)."""

    def __init__(self, root: Path) -> None:
        self.sys = root / "sys"
        self.errors: dict[str, str] = {}

    def report(self, node: str) -> dict[str, Any]:
        """This guest's report as `node`; never raises for what the tree holds."""
        self.errors = {}
        report: dict[str, Any] = {"version": REPORT_VERSION, "node": node}
        product_uuid = self._product_uuid()
        if product_uuid is not None:
            report["product_uuid"] = product_uuid
        report["nics"] = [
            nic for entry in _entries(self.sys / "class" / "infiniband") if (nic := self._nic(entry))
        ]
        report["gpus"] = [
            gpu for entry in _entries(self.sys / "bus" / "pci" / "devices") if (gpu := self._gpu(entry))
        ]
        if self.errors:
            report["errors"] = self.errors
        return report

    def _refused(self, path: Path, exc: SysfsError) -> None:
        where = printable(str(path.relative_to(self.sys)))
        self.errors[where] = str(exc)[:MAX_REASON_CHARS]

    def _product_uuid(self) -> str | None:
        path = self.sys / "class" / "dmi" / "id" / "product_uuid"
        if not path.exists():
            return None  # no DMI tables (a microVM) or no such field: nothing to join by
        try:
            return str(uuid.UUID(_value(path, UUID)))  # lowercase, as the host's libvirt importer writes it
        except SysfsError as exc:
            self._refused(path, exc)
        return None

    def _nic(self, entry: Path) -> dict[str, str] | None:
        """An RDMA device: its name, PCI address, and its first netdev with that netdev's MAC."""
        try:
            nic = {
                "rdma": _name(entry.name, RDMA_NAME, "an RDMA device name"),
                "pci": _link_name(entry / "device", PCI_ADDRESS, "a PCI address"),
            }
        except SysfsError as exc:
            self._refused(entry, exc)
            return None
        for netdev in _entries(entry / "device" / "net")[:1]:
            try:
                nic["netdev"] = _name(netdev.name, INTERFACE_NAME, "a network interface name")
            except SysfsError as exc:
                self._refused(netdev, exc)
                break
            address = self.sys / "class" / "net" / netdev.name / "address"
            try:
                nic["mac"] = _value(address, MAC_ADDRESS)
            except SysfsError as exc:
                self._refused(address, exc)
        return nic

    def _gpu(self, entry: Path) -> dict[str, str] | None:
        """A PCI function that is an NVIDIA GPU: its address and device ID; None for any other."""
        try:
            if _value(entry / "vendor", PCI_ID) != NVIDIA_VENDOR:
                return None
            if _value(entry / "class", PCI_CLASS) not in GPU_CLASSES:
                return None
            return {
                "pci": _name(entry.name, PCI_ADDRESS, "a PCI address"),
                "device": _value(entry / "device", PCI_ID),
            }
        except SysfsError as exc:
            self._refused(entry, exc)
            return None


def guest_report(root: Path, node: str) -> dict[str, Any]:
    """The report of the guest whose filesystem is under `root` ("/" on the guest itself), as `node`."""
    return GuestReader(root).report(node)

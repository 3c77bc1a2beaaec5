"""Network interfaces from /sys/class/net, exported as node_exporter's netclass collector.

Names, labels, help, types and units are node_exporter 1.5's, and so are the values on the same tree;
node_network_info also carries newer node_exporter's `adminstate` label (IFF_UP of flags), which tells an
interface an operator took down from one whose cable or peer failed. Where node_exporter fails the whole
collector on one unreadable file, only that sample is skipped here (and reported through ReadErrors).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from collectors import sysfs
from collectors.base import CollectorOptions, ReadErrors
from collectors.errors import SysfsError
from collectors.registry import register

IFF_UP = 0x1  # the administrative state bit of /sys/class/net/<iface>/flags


@dataclass(frozen=True)
class Property:
    """One numeric interface attribute file and the node_network_* metric it becomes."""

    file: str
    metric: str  # without the node_network_ prefix, as node_exporter's help text names it
    counter: bool = False
    scale: int = 1

    def new_family(self) -> Metric:
        family = CounterMetricFamily if self.counter else GaugeMetricFamily
        return family(
            f"node_network_{self.metric}", f"Network device property: {self.metric}", labels=["device"]
        )


PROPERTIES = (
    Property("addr_assign_type", "address_assign_type"),
    Property("carrier", "carrier"),
    Property("carrier_changes", "carrier_changes_total", counter=True),
    Property("carrier_up_count", "carrier_up_changes_total", counter=True),
    Property("carrier_down_count", "carrier_down_changes_total", counter=True),
    Property("dev_id", "device_id"),
    Property("dormant", "dormant"),
    Property("flags", "flags"),
    Property("ifindex", "iface_id"),
    Property("iflink", "iface_link"),
    Property("link_mode", "iface_link_mode"),
    Property("mtu", "mtu_bytes"),
    Property("name_assign_type", "name_assign_type"),
    Property("netdev_group", "net_dev_group"),
    Property("speed", "speed_bytes", scale=1_000_000 // 8),  # the file is in Mb/s
    Property("tx_queue_len", "transmit_queue_length"),
    Property("type", "protocol_type"),
)
INFO_FILES = ("address", "broadcast", "duplex", "operstate", "ifalias")  # in the info label order
INFO_LABELS = ["device", *INFO_FILES, "adminstate"]


class NetClassCollector:
    """Reads every interface below <sysfs>/class/net on each scrape.

    `ignored_devices` and `ignore_invalid_speed` are node_exporter's --collector.netclass.ignored-devices
    (a regular expression searched in the name) and --collector.netclass.ignore-invalid-speed (drop the
    -1 Mb/s that drivers report for an unknown speed); the defaults are node_exporter 1.5's.
    """

    def __init__(
        self,
        sysfs_root: str | os.PathLike[str],
        errors: ReadErrors,
        *,
        ignored_devices: str = "^$",
        ignore_invalid_speed: bool = False,
    ) -> None:
        self._class_dir = os.path.join(sysfs_root, "class", "net")
        self._errors = errors
        self._ignored = re.compile(ignored_devices)
        self._ignore_invalid_speed = ignore_invalid_speed

    def collect(self) -> Iterator[Metric]:
        properties = {prop: prop.new_family() for prop in PROPERTIES}
        up = GaugeMetricFamily(
            "node_network_up", "Value is 1 if operstate is 'up', 0 otherwise.", labels=["device"]
        )
        info = GaugeMetricFamily(
            "node_network_info",
            "Non-numeric data from /sys/class/net/<iface>, value is always 1.",
            labels=INFO_LABELS,
        )
        for device in self._devices():
            self._collect_device(device, properties, up, info)
        yield from (family for family in (*properties.values(), up, info) if family.samples)

    def _devices(self) -> list[str]:
        try:
            names = sysfs.list_dir(self._class_dir, missing_ok=True, skip_files=True) or []
        except SysfsError as exc:
            self._errors.report("every node_network sample", str(exc))
            return []
        return [name for name in names if not self._ignored.search(name)]

    def _collect_device(
        self, device: str, properties: dict[Property, Metric], up: Metric, info: Metric
    ) -> None:
        device_dir = f"{self._class_dir}/{device}"
        try:
            present = set(sysfs.list_dir(device_dir) or ())
        except SysfsError as exc:
            self._errors.report(f"every sample of network device {device}", str(exc))
            return
        label = sysfs.label_value(device)
        values = self._read_properties(device_dir, label, present)
        if self._ignore_invalid_speed and values.get("speed", 0) < 0:
            del values["speed"]
        for prop, family in properties.items():
            if prop.file in values:
                family.add_metric([label], values[prop.file] * prop.scale)
        try:
            address, broadcast, duplex, operstate, ifalias = sysfs.read_labels(
                device_dir, INFO_FILES, present
            )
        except SysfsError as exc:
            self._errors.report(f'node_network_up and node_network_info{{device="{label}"}}', str(exc))
            return
        up.add_metric([label], 1 if operstate == "up" else 0)
        admin_state = _admin_state(values.get("flags"))
        info.add_metric([label, address, broadcast, duplex, operstate, ifalias, admin_state], 1)

    def _read_properties(self, device_dir: str, device: str, present: set[str]) -> dict[str, int]:
        """File name -> value of the numeric attributes the interface has and that read well."""
        values = {}
        for prop in PROPERTIES:
            if prop.file in present:
                where = f'node_network_{prop.metric}{{device="{device}"}}'
                value = sysfs.read_sample(f"{device_dir}/{prop.file}", sysfs.parse_int, self._errors, where)
                if value is not None:
                    values[prop.file] = value
        return values


def _admin_state(flags: int | None) -> str:
    if flags is None:
        return "unknown"
    return "up" if flags & IFF_UP else "down"


@register("netclass")
def netclass_collector(options: CollectorOptions, errors: ReadErrors) -> NetClassCollector:
    return NetClassCollector(
        options.sysfs_root,
        errors,
        ignored_devices=options.netclass_ignored_devices,
        ignore_invalid_speed=options.netclass_ignore_invalid_speed,
    )

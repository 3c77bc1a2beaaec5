"""InfiniBand and RoCE ports from /sys/class/infiniband, exported as node_exporter's infiniband collector.

Names, labels, help, types and units are node_exporter 1.5's, so its dashboards and alerts work
unchanged, and the values equal its values on the same tree. Beyond 1.5:

- `hw_counters/` (the mlx5 RoCE congestion, retransmission and error counters) under the names newer
  node_exporter gives them (HW_COUNTERS). A driver counter missing from that table is still exported,
  as `node_infiniband_hw_<name>_total` with <name> in snake case (hw_counter_metric): the `hw_` prefix
  keeps generated names clear of node_exporter's, present and future.
- `fleetlens_infiniband_port_info{device,port,link_layer,netdev}`: the netdev that carries each port,
  so that RDMA counters can be joined with the link state in node_network_*.
- One unreadable file skips its sample (reported through ReadErrors) where node_exporter fails the
  whole collector.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from collectors import sysfs
from collectors.base import CollectorOptions, ReadErrors
from collectors.errors import SysfsError
from collectors.registry import register

PORT_LABELS = ("device", "port")
NO_PMA = "N/A (no PMA)"  # what i40iw writes in every counter it lacks: no counter, not bad input


@dataclass(frozen=True)
class MetricSpec:
    """How one sysfs attribute becomes samples of one metric family."""

    name: str
    help: str
    gauge: bool = False
    scale: float = 1
    labels: Sequence[str] = PORT_LABELS

    def new_family(self) -> Metric:
        family = GaugeMetricFamily if self.gauge else CounterMetricFamily
        return family(self.name, self.help, labels=self.labels)


def _ib(name: str, help: str, **kwargs: object) -> MetricSpec:
    return MetricSpec(f"node_infiniband_{name}", help, **kwargs)


_WORDS = 4  # port_{rcv,xmit}_data count 4-byte words (one per lane); node_exporter exports bytes

COUNTERS = {  # ports/<n>/counters/<file>
    "excessive_buffer_overrun_errors": _ib(
        "excessive_buffer_overrun_errors_total",
        "Number of times that OverrunErrors consecutive flow control update periods occurred, "
        "each having at least one overrun error.",
    ),
    "link_downed": _ib(
        "link_downed_total",
        "Number of times the link failed to recover from an error state and went down",
    ),
    "link_error_recovery": _ib(
        "link_error_recovery_total", "Number of times the link successfully recovered from an error state"
    ),
    "local_link_integrity_errors": _ib(
        "local_link_integrity_errors_total",
        "Number of times that the count of local physical errors exceeded the threshold specified by "
        "LocalPhyErrors.",
    ),
    "multicast_rcv_packets": _ib(
        "multicast_packets_received_total", "Number of multicast packets received (including errors)"
    ),
    "multicast_xmit_packets": _ib(
        "multicast_packets_transmitted_total", "Number of multicast packets transmitted (including errors)"
    ),
    "port_rcv_constraint_errors": _ib(
        "port_constraint_errors_received_total",
        "Number of packets received on the switch physical port that are discarded",
    ),
    "port_rcv_data": _ib(
        "port_data_received_bytes_total", "Number of data octets received on all links", scale=_WORDS
    ),
    "port_rcv_discards": _ib(
        "port_discards_received_total",
        "Number of inbound packets discarded by the port because the port is down or congested",
    ),
    "port_rcv_errors": _ib(
        "port_errors_received_total", "Number of packets containing an error that were received on this port"
    ),
    "port_rcv_packets": _ib(
        "port_packets_received_total", "Number of packets received on all VLs by this port (including errors)"
    ),
    "port_rcv_remote_physical_errors": _ib(
        "port_receive_remote_physical_errors_total",
        "Number of packets marked with the EBP (End of Bad Packet) delimiter received on the port.",
    ),
    "port_rcv_switch_relay_errors": _ib(
        "port_receive_switch_relay_errors_total",
        "Number of packets that could not be forwarded by the switch.",
    ),
    "port_xmit_constraint_errors": _ib(
        "port_constraint_errors_transmitted_total",
        "Number of packets not transmitted from the switch physical port",
    ),
    "port_xmit_data": _ib(
        "port_data_transmitted_bytes_total", "Number of data octets transmitted on all links", scale=_WORDS
    ),
    "port_xmit_discards": _ib(
        "port_discards_transmitted_total",
        "Number of outbound packets discarded by the port because the port is down or congested",
    ),
    "port_xmit_packets": _ib(
        "port_packets_transmitted_total",
        "Number of packets transmitted on all VLs from this port (including errors)",
    ),
    "port_xmit_wait": _ib(
        "port_transmit_wait_total",
        "Number of ticks during which the port had data to transmit but no data was sent during the entire "
        "tick",
    ),
    "symbol_error": _ib(
        "symbol_error_total", "Number of minor link errors detected on one or more physical lanes."
    ),
    "unicast_rcv_packets": _ib(
        "unicast_packets_received_total", "Number of unicast packets received (including errors)"
    ),
    "unicast_xmit_packets": _ib(
        "unicast_packets_transmitted_total", "Number of unicast packets transmitted (including errors)"
    ),
    "VL15_dropped": _ib(
        "vl15_dropped_total", "Number of incoming VL15 packets dropped due to resource limitations."
    ),
}

COUNTERS_EXT = {  # ports/<n>/counters_ext/<file>: the 64-bit counters of older (mlx4) drivers
    "port_multicast_rcv_packets": _ib(
        "legacy_multicast_packets_received_total", "Number of multicast packets received"
    ),
    "port_multicast_xmit_packets": _ib(
        "legacy_multicast_packets_transmitted_total", "Number of multicast packets transmitted"
    ),
    "port_rcv_data_64": _ib(
        "legacy_data_received_bytes_total", "Number of data octets received on all links", scale=_WORDS
    ),
    "port_rcv_packets_64": _ib(
        "legacy_packets_received_total", "Number of data packets received on all links"
    ),
    "port_unicast_rcv_packets": _ib(
        "legacy_unicast_packets_received_total", "Number of unicast packets received"
    ),
    "port_unicast_xmit_packets": _ib(
        "legacy_unicast_packets_transmitted_total", "Number of unicast packets transmitted"
    ),
    "port_xmit_data_64": _ib(
        "legacy_data_transmitted_bytes_total", "Number of data octets transmitted on all links", scale=_WORDS
    ),
    # node_exporter's help says "received" here too; kept so that the exposition is identical
    "port_xmit_packets_64": _ib(
        "legacy_packets_transmitted_total", "Number of data packets received on all links"
    ),
}

HW_COUNTERS = {  # ports/<n>/hw_counters/<file>, named as newer node_exporter names them
    "duplicate_request": _ib(
        "duplicate_requests_packets_total", "Received requests that had been executed before (mlx5)."
    ),
    "implied_nak_seq_err": _ib(
        "implied_nak_seq_errors_total",
        "Times the requester saw an ACK with a PSN above the expected one for an RDMA read or response.",
    ),
    "lifespan": _ib(
        "lifespan_seconds",
        "Period during which consecutive reads of the hw counters may return the same values.",
        gauge=True,
        scale=1e-3,  # the file is in ms; node_exporter divides by 1000 in integers (10 ms -> 0), not we
    ),
    "local_ack_timeout_err": _ib(
        "local_ack_timeout_errors_total", "Times a QP's ACK timer expired at the sender (RC, XRC, DCT)."
    ),
    "np_cnp_sent": _ib(
        "np_cnp_packets_sent_total",
        "CNPs sent by the notification point on seeing ECN congestion marks in RoCEv2 traffic.",
    ),
    "np_ecn_marked_roce_packets": _ib(
        "np_ecn_marked_roce_packets_received_total",
        "RoCEv2 packets received with ECN congestion-experienced marks.",
    ),
    "out_of_buffer": _ib("out_of_buffer_drops_total", "Packets dropped for lack of a receive WQE on the QP."),
    "out_of_sequence": _ib("out_of_sequence_packets_received_total", "Out-of-sequence packets received."),
    "packet_seq_err": _ib(
        "packet_sequence_errors_total", "NAK sequence error packets received (QP retry limit not exceeded)."
    ),
    "req_cqe_error": _ib("req_cqes_errors_total", "Requester CQEs completed with an error."),
    "req_cqe_flush_error": _ib("req_cqes_flush_errors_total", "Requester CQEs completed with a flush error."),
    "req_remote_access_errors": _ib(
        "req_remote_access_errors_total", "Remote access errors seen by the requester."
    ),
    "req_remote_invalid_request": _ib(
        "req_remote_invalid_request_errors_total", "Remote invalid request errors seen by the requester."
    ),
    "resp_cqe_error": _ib("resp_cqes_errors_total", "Responder CQEs completed with an error."),
    "resp_cqe_flush_error": _ib(
        "resp_cqes_flush_errors_total", "Responder CQEs completed with a flush error."
    ),
    "resp_local_length_error": _ib(
        "resp_local_length_errors_total", "Local length errors seen by the responder."
    ),
    "resp_remote_access_errors": _ib(
        "resp_remote_access_errors_total", "Remote access errors seen by the responder."
    ),
    "rnr_nak_retry_err": _ib(
        "rnr_nak_retry_packets_received_total", "RNR NAK packets received (QP retry limit not exceeded)."
    ),
    "roce_adp_retrans": _ib("roce_adp_retransmits_total", "Adaptive retransmissions of RoCE traffic."),
    "roce_adp_retrans_to": _ib(
        "roce_adp_retransmits_timeout_total", "Timeouts of RoCE traffic under adaptive retransmission."
    ),
    "roce_slow_restart": _ib("roce_slow_restart_used_total", "Times RoCE slow restart was used."),
    "roce_slow_restart_cnps": _ib("roce_slow_restart_cnps_total", "CNPs generated by RoCE slow restart."),
    "roce_slow_restart_trans": _ib("roce_slow_restart_total", "Times RoCE changed state to slow restart."),
    "rp_cnp_handled": _ib(
        "rp_cnp_packets_handled_total", "CNPs the reaction point handled by throttling its sending rate."
    ),
    "rp_cnp_ignored": _ib(
        "rp_cnp_ignored_packets_received_total",
        "CNPs the reaction point received and ignored (RoCE congestion control off?).",
    ),
    "rx_atomic_requests": _ib("rx_atomic_requests_total", "ATOMIC requests received on the QPs."),
    "rx_dct_connect": _ib("rx_dct_connect_requests_total", "Connection requests received on the DCTs."),
    "rx_icrc_encapsulated": _ib(
        "rx_icrc_encapsulated_errors_total", "RoCE packets received with ICRC errors."
    ),
    "rx_read_requests": _ib("rx_read_requests_total", "READ requests received on the QPs."),
    "rx_write_requests": _ib("rx_write_requests_total", "WRITE requests received on the QPs."),
}

STATE = _ib(
    "state_id",
    "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)",
    gauge=True,
)
PHYS_STATE = _ib(
    "physical_state_id",
    "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, 4: shift, "
    "5: link up, 6: link error recover, 7: phytest)",
    gauge=True,
)
RATE = _ib("rate_bytes_per_second", "Maximum signal transfer rate", gauge=True)
DEVICE_INFO = _ib(
    "info",
    "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.",
    gauge=True,
    labels=("device", "board_id", "firmware_version", "hca_type"),
)
DEVICE_INFO_FILES = ("board_id", "fw_ver", "hca_type")  # in DEVICE_INFO's label order
PORT_INFO = MetricSpec(
    "fleetlens_infiniband_port_info",
    "Link layer of an InfiniBand/RoCE port and the netdev that carries it ('' if sysfs names none).",
    gauge=True,
    labels=("device", "port", "link_layer", "netdev"),
)

_CAMEL_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NOT_NAME = re.compile(r"[^a-z0-9_]+")


@lru_cache(maxsize=1024)
def hw_counter_metric(counter: str) -> MetricSpec:
    """The metric for a hw counter: its node_exporter name, or for one it lacks the generic rule.

    Generic rule: node_infiniband_hw_<counter>_total, <counter> in snake case with every character
    outside [a-z0-9_] replaced by "_" (irdma's ip4InOctets becomes hw_ip4_in_octets_total).
    """
    known = HW_COUNTERS.get(counter)
    if known is not None:
        return known
    name = _NOT_NAME.sub("_", _CAMEL_HUMP.sub("_", counter).lower()).strip("_")
    return _ib(
        f"hw_{name}_total", f"Driver hw counter {counter} (hw_counters/{counter}), no node_exporter name."
    )


def parse_counter(text: str, path: str) -> int | None:
    """A PMA counter; None for i40iw's "N/A (no PMA)", which says the counter does not exist."""
    if NO_PMA in text:
        return None
    return sysfs.parse_uint(text, path)


def parse_state_id(text: str, path: str) -> int:
    """The number in "4: ACTIVE" (state) or "5: LinkUp" (phys_state)."""
    number, colon, name = text.partition(":")
    if not colon or ":" in name:
        raise SysfsError(f"{path}: {text!r} is not 'ID: NAME'")
    return sysfs.parse_uint(number.strip(), path)


def parse_rate(text: str, path: str) -> int:
    """Bytes per second from "40 Gb/sec (4X QDR)": Gb/s times 125000000, truncated as node_exporter does."""
    number, space, _unit = text.partition(" ")
    try:
        gbits = float(number)
    except ValueError:
        gbits = math.nan
    if not space or not 0 <= gbits < math.inf:
        raise SysfsError(f"{path}: {text!r} is not a rate like '40 Gb/sec (4X QDR)'")
    return int(gbits * 125_000_000)


class _Families:
    """The families of one scrape, each made on its first sample, so that absent hardware yields none."""

    def __init__(self) -> None:
        self._by_name: dict[str, Metric] = {}

    def add(self, spec: MetricSpec, labels: Sequence[str], value: float) -> None:
        family = self._by_name.get(spec.name)
        if family is None:
            family = self._by_name[spec.name] = spec.new_family()
        family.add_metric(labels, value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(sorted(self._by_name.values(), key=lambda family: family.name))


class InfiniBandCollector:
    """Reads every port of every device below <sysfs>/class/infiniband on each scrape."""

    def __init__(self, sysfs_root: str | os.PathLike[str], errors: ReadErrors) -> None:
        self._class_dir = os.path.join(sysfs_root, "class", "infiniband")
        self._errors = errors

    def collect(self) -> Iterator[Metric]:
        families = _Families()
        for device in self._list(self._class_dir, "every InfiniBand sample", missing_ok=True):
            self._collect_device(families, device)
        yield from families

    def _list(self, path: str, lost: str, *, missing_ok: bool = False) -> list[str]:
        """The names in a directory; [] after reporting `lost` (the samples skipped) if it is unreadable."""
        try:
            return sysfs.list_dir(path, missing_ok=missing_ok) or []
        except SysfsError as exc:
            self._errors.report(lost, str(exc))
            return []

    def _collect_device(self, families: _Families, device: str) -> None:
        device_dir = f"{self._class_dir}/{device}"
        present = self._list(device_dir, f"every sample of InfiniBand device {device}")
        if not present:
            return
        label = sysfs.label_value(device)
        try:  # node_exporter leaves a missing file's label empty: hfi1 has no hca_type
            info = sysfs.read_labels(device_dir, DEVICE_INFO_FILES, present)
        except SysfsError as exc:
            self._errors.report(f'{DEVICE_INFO.name}{{device="{label}"}}', str(exc))
        else:
            families.add(DEVICE_INFO, (label, *info), 1)

        @cache
        def pci_netdevs() -> dict[str, str]:
            return self._pci_netdevs(device_dir) if "device" in present else {}

        for port in self._list(f"{device_dir}/ports", f"every port of InfiniBand device {device}"):
            self._collect_port(families, label, f"{device_dir}/ports/{port}", pci_netdevs)

    def _collect_port(
        self, families: _Families, device: str, port_dir: str, pci_netdevs: Callable[[], dict[str, str]]
    ) -> None:
        """The samples of one port; `device` is the device's label value."""
        name = os.path.basename(port_dir)
        if not name.isdecimal():
            self._errors.report(f"InfiniBand port {device}/{name}", f"{port_dir}: port name is not a number")
            return
        present = self._list(port_dir, f"every sample of InfiniBand port {device}/{name}")
        if not present:
            return
        labels = (device, str(int(name)))  # node_exporter's port label is the number, "01" -> "1"
        for spec, file, parse in _PORT_ATTRIBUTES:
            value = sysfs.read_sample(f"{port_dir}/{file}", parse, self._errors, _where(spec, labels))
            if value is not None:
                families.add(spec, labels, value)
        for directory, metric_for in _COUNTER_DIRECTORIES:
            if directory in present:
                self._collect_counters(families, f"{port_dir}/{directory}", metric_for, labels)
        self._collect_port_info(families, port_dir, present, labels, pci_netdevs)

    def _collect_counters(
        self,
        families: _Families,
        directory: str,
        metric_for: Callable[[str], MetricSpec | None],
        labels: tuple[str, str],
    ) -> None:
        lost = f"every counter in {directory}"
        for file in self._list(directory, lost):
            spec = metric_for(file)
            if spec is None:  # a counters/ file node_exporter has no name for: it ignores it too
                continue
            value = sysfs.read_sample(
                f"{directory}/{file}", parse_counter, self._errors, _where(spec, labels)
            )
            if value is not None:
                families.add(spec, labels, value * spec.scale)

    def _collect_port_info(
        self,
        families: _Families,
        port_dir: str,
        present: list[str],
        labels: tuple[str, str],
        pci_netdevs: Callable[[], dict[str, str]],
    ) -> None:
        """Link layer and netdev: GID 0's netdev for RoCE, else the netdev of the same PCI function."""
        try:
            (link_layer,) = sysfs.read_labels(port_dir, ("link_layer",), present)
            gid_netdev = f"{port_dir}/gid_attrs/ndevs/0"
            netdev = sysfs.read_text(gid_netdev, missing_ok=True) if "gid_attrs" in present else None
        except SysfsError as exc:
            self._errors.report(_where(PORT_INFO, labels), str(exc))
            return
        netdev = sysfs.label_value(netdev) if netdev else pci_netdevs().get(labels[1], "")
        families.add(PORT_INFO, (*labels, link_layer, netdev), 1)

    def _pci_netdevs(self, device_dir: str) -> dict[str, str]:
        """Port label -> netdev label for the netdevs of the device's PCI function (IPoIB, older kernels).

        A netdev's port is max(dev_id, dev_port) + 1, as ibdev2netdev computes it: mlx4 numbers ports in
        dev_id, later drivers in dev_port. The first name wins, so ib0 beats its child ib0.8001.
        """
        net_dir = f"{device_dir}/device/net"
        by_port: dict[str, str] = {}
        for netdev in self._list(net_dir, f"the netdev label of every port of {device_dir}", missing_ok=True):
            where = f"port of netdev {netdev}"
            numbers = [
                sysfs.read_sample(f"{net_dir}/{netdev}/{file}", sysfs.parse_int, self._errors, where) or 0
                for file in ("dev_id", "dev_port")
            ]
            by_port.setdefault(str(max(numbers) + 1), sysfs.label_value(netdev))
        return by_port


_PORT_ATTRIBUTES = (
    (STATE, "state", parse_state_id),
    (PHYS_STATE, "phys_state", parse_state_id),
    (RATE, "rate", parse_rate),
)
_COUNTER_DIRECTORIES = (
    ("counters", COUNTERS.get),
    ("counters_ext", COUNTERS_EXT.get),
    ("hw_counters", hw_counter_metric),
)


def _where(spec: MetricSpec, labels: tuple[str, str]) -> str:
    """The sample a bad file costs, for the log: node_infiniband_x{device="mlx5_0",port="1"}."""
    return f'{spec.name}{{device="{labels[0]}",port="{labels[1]}"}}'


@register("infiniband")
def infiniband_collector(options: CollectorOptions, errors: ReadErrors) -> InfiniBandCollector:
    return InfiniBandCollector(options.sysfs_root, errors)

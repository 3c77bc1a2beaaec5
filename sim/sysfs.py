"""A generated /sys tree for one simulated GPU VM: its mlx5 RoCE ports, their netdevs and eth0.

The layout is the kernel's, so the infiniband and netclass collectors and node_exporter read it as a real
one: class/infiniband/mlx5_<i> and class/net/<if> are links into devices/pci0000:00/<slot>/, each port
has the IB PMA `counters/` (port_*_data in 4-byte words) and the mlx5 RoCE `hw_counters/` of a real
ConnectX port (../shared/fixtures/oci-tutorials), and gid_attrs/ndevs/0 names the netdev. The tree starts
as a VM a minute or two after boot, before its job: NCCL setup moved a little data (the fixture's
rx_write_requests of 18747 is that magnitude).

Driving it (the fleet simulator's API); everything is a function of the seed and the call sequence:

    tree = SimSysfs(Path("/dev/shm/sim/vela-001"), "vela-001", nics=4, seed=1)
    tree.write()
    tree.advance(1.0, load=0.9)        # one second of a busy job: data, packets, a little ECN/CNP
    tree.set_link(2, up=False)         # link lost: IB state, carrier, link_downed and carrier counts
    tree.set_congestion(1, 0.5)        # ECN marks, CNPs and transmit waits rise, throughput falls
    tree.set_traffic(3, 0.6)           # port 3 carries 60% of its share (no GPUDirect RDMA: host-staged)
    tree.reload_driver()               # mlx5 reloaded: counters and carrier counts start over

Every file is replaced atomically (written in <root>/.staging, outside every directory a collector lists,
then renamed over the old one), so a concurrent scrape never reads a half-written value; only files whose
text changed are rewritten (about 40 per advance of 4 ports). A rename over a file costs ~0.4 ms on ext4
(it flushes the replaced file's blocks) but ~20 us on tmpfs, so advance() takes ~12 ms on ext4 and ~1 ms
on tmpfs: put trees for a large fleet on tmpfs (/dev/shm), as the kernel keeps /sys in memory too.
"""

from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path

# `ls ports/1/counters/` and `ls ports/1/hw_counters/` of a real ConnectX RoCE port (OCI's mlx5_2)
COUNTER_FILES = (
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "VL15_dropped",
)
HW_COUNTER_FILES = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_dct_connect",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
)
LIFESPAN_MS = 10  # mlx5's default: hw counters are cached this long

# Traffic model. `load` is how busy the node's job is, 0..1, as for the simulated GPUs' set_load.
BUSY_LINE_SHARE = 0.6  # share of line rate a busy job's collectives use, averaged over a second
ROCE_PAYLOAD = 4096  # bytes per RoCE packet (path MTU 4096 on a 9000-byte netdev)
WORD = 4  # port_rcv_data and port_xmit_data count 4-byte words
NCCL_CHUNK = 512 * 1024  # bytes per RDMA WRITE request NCCL posts
BOOT_LOAD = 0.01  # NCCL setup and health checks after boot, before the job starts
BOOT_SECONDS = (30.0, 120.0)
JITTER = 0.05  # second-to-second wobble of each direction's traffic
ECN_BASE = 1e-6  # share of received packets ECN-marked on a healthy fabric
ECN_PER_LEVEL = 0.02  # ... added per unit of congestion level
CNP_PER_MARK = 0.5  # CNPs the notification point sends per marked packet (it coalesces marks per QP)
XMIT_WAIT_PER_LEVEL = 2_000_000  # port_xmit_wait ticks per busy second per unit of congestion level
CORRUPT_PER_LEVEL = 1e-4  # share of received packets corrupted per unit of error level (a failing optic)
SYMBOLS_PER_CORRUPT = 4  # symbol errors the PHY counts per packet it could not deliver
ACK_TIMEOUT_PER_CORRUPT = 0.1  # a lost ACK: the requester's retry timer fires instead of a NAK arriving

UP = {"state": "4: ACTIVE", "phys_state": "5: LinkUp"}
DOWN = {"state": "1: DOWN", "phys_state": "3: Disabled"}  # a RoCE port whose cable or peer is gone
# mlx5 fills a RoCE port's speed from the Ethernet link; without one it leaves its defaults, 4X QDR
DOWN_RATE = "40 Gb/sec (4X QDR)"
IFF_UP_BROADCAST_MULTICAST = "0x1003"  # sysfs flags hold the administrative flags, not carrier
FIRST_NIC_SLOT = 0x11  # PCI slots 00:11.0 onwards, after the simulated GPUs' 00:09.0-00:10.0
MAX_NICS = 0x20 - FIRST_NIC_SLOT
PROBE_CARRIER_CHANGES = 1  # the driver turns a port's carrier off and on once while probing it


@dataclass(frozen=True)
class NicModel:
    """What an SR-IOV virtual function of one ConnectX generation reports about itself."""

    hca_type: str
    fw_ver: str
    board_id: str
    rate: str  # ports/1/rate
    speed_mbps: int  # the netdev's speed file


MODELS = {
    200: NicModel("MT4124", "20.39.2048", "MT_0000000222", "200 Gb/sec (4X HDR)", 200_000),  # ConnectX-6 VF
    400: NicModel("MT4126", "28.39.2048", "MT_0000000838", "400 Gb/sec (4X NDR)", 400_000),  # ConnectX-7 VF
}


@dataclass
class _Port:
    """One RoCE VF: its RDMA device, netdev, counters and link state."""

    index: int
    slot: str  # PCI address
    mac: str
    node_guid: str
    traffic_share: float  # this port's steady share of the node's traffic, around 1
    counter_paths: dict[str, str] = field(default_factory=dict)  # counter name -> file
    values: dict[str, float] = field(default_factory=dict)  # counter name -> value
    up: bool = True
    congestion: float = 0.0
    errors: float = 0.0  # set_errors(): bit errors on the link, 0 none
    traffic_factor: float = 1.0  # set_traffic(): how much of its healthy traffic the port carries
    carrier_up_count: int = PROBE_CARRIER_CHANGES
    carrier_down_count: int = PROBE_CARRIER_CHANGES

    @property
    def device(self) -> str:
        return f"mlx5_{self.index}"

    @property
    def netdev(self) -> str:
        return f"ens{self.index + 1}f0np0"

    @property
    def ifindex(self) -> int:
        return self.index + 3  # after lo (1) and eth0 (2)

    @property
    def ib_dir(self) -> str:
        return f"devices/pci0000:00/{self.slot}/infiniband/{self.device}"

    @property
    def net_dir(self) -> str:
        return f"devices/pci0000:00/{self.slot}/net/{self.netdev}"


class SimSysfs:
    """The /sys tree of one simulated VM below `root`, with `nics` RoCE ports of `rate_gbps` each."""

    def __init__(self, root: Path, node: str, nics: int = 4, seed: int = 0, rate_gbps: int = 200) -> None:
        if not 0 <= nics <= MAX_NICS:
            raise ValueError(f"nics must be within 0..{MAX_NICS}, got {nics}")
        if rate_gbps not in MODELS:
            raise ValueError(f"rate_gbps must be one of {sorted(MODELS)}, got {rate_gbps}")
        self.root = Path(root)
        self.node = node
        self.model = MODELS[rate_gbps]
        self._line_bytes_per_second = rate_gbps * 125_000_000
        self._rng = random.Random(f"{seed}/{node}/sysfs")
        self._staging = f"{self.root}/.staging/next"
        self._shown: dict[str, str] = {}  # file -> text last written
        self._made_dirs: set[str] = set()
        self._lock = threading.Lock()
        self.ports = [self._new_port(index) for index in range(nics)]
        self._eth0_mac = _mac(0x52, 0x54, 0x00, *self._rng.randbytes(3))  # QEMU's OUI
        self._grow(self._rng.uniform(*BOOT_SECONDS), BOOT_LOAD)

    def _new_port(self, index: int) -> _Port:
        rng = self._rng
        mac = _mac(0x02, *rng.randbytes(5))  # locally administered
        guid = rng.randbytes(8).hex()
        port = _Port(
            index=index,
            slot=f"0000:00:{FIRST_NIC_SLOT + index:02x}.0",
            mac=mac,
            node_guid=":".join(guid[i : i + 4] for i in range(0, 16, 4)),
            traffic_share=rng.uniform(0.95, 1.05),
        )
        port_dir = f"{self.root}/{port.ib_dir}/ports/1"
        for directory, names in (("counters", COUNTER_FILES), ("hw_counters", HW_COUNTER_FILES)):
            for name in names:
                port.counter_paths[name] = f"{port_dir}/{directory}/{name}"
                port.values[name] = 0.0
        port.values["lifespan"] = LIFESPAN_MS
        return port

    def write(self) -> None:
        """Write every file of the tree; advance() and the fault hooks then rewrite only what changed."""
        with self._lock:
            self._shown.clear()
            self._made_dirs.clear()
            os.makedirs(os.path.dirname(self._staging), exist_ok=True)
            self._write_eth0()
            for port in self.ports:
                self._write_port(port)

    def advance(self, seconds: float, load: float = 1.0) -> None:
        """Let `seconds` of traffic pass on every port that is up, at job `load` (0 idle .. 1 busy)."""
        if seconds < 0:
            raise ValueError(f"seconds must not be negative, got {seconds}")
        if not 0 <= load <= 1:
            raise ValueError(f"load must be within 0..1, got {load}")
        with self._lock:
            self._grow(seconds, load)
            for port in self.ports:
                self._write_counters(port)

    def set_link(self, nic: int, up: bool) -> None:
        """Bring port `nic`'s link up or down as a cable, transceiver or switch port would.

        Going down counts link_downed and carrier_down_count, coming up carrier_up_count; carrier_changes
        is their sum, as the kernel computes it. Setting the state it already has changes nothing.
        """
        with self._lock:
            port = self._port(nic)
            if port.up == up:
                return
            port.up = up
            if up:
                port.carrier_up_count += 1
            else:
                port.carrier_down_count += 1
                port.values["link_downed"] += 1
            self._write_link(port)
            self._write_counters(port)

    def set_congestion(self, nic: int, level: float) -> None:
        """Congest port `nic` from now on: 0 none, 1 heavy (2% of packets ECN-marked, throughput halved)."""
        if level < 0:
            raise ValueError(f"congestion level must not be negative, got {level}")
        with self._lock:
            self._port(nic).congestion = level

    def set_errors(self, nic: int, level: float) -> None:
        """Corrupt packets on port `nic`'s link from now on, as a failing optic or switch port does: 0 none,
        1 one packet in 10,000. The port counts symbol and receive errors, and RoCE's go-back-N shows as
        out-of-sequence packets, sequence-error NAKs and a few ACK timeouts (the peers see it alike)."""
        if level < 0:
            raise ValueError(f"error level must not be negative, got {level}")
        with self._lock:
            self._port(nic).errors = level

    def set_traffic(self, nic: int, factor: float) -> None:
        """Scale port `nic`'s traffic from now on: 1 healthy, below 1 a port that moves less per second,
        e.g. when NCCL stages its messages through host memory instead of GPUDirect RDMA."""
        if factor < 0:
            raise ValueError(f"traffic factor must not be negative, got {factor}")
        with self._lock:
            self._port(nic).traffic_factor = factor

    def reload_driver(self) -> None:
        """Reload the mlx5 driver, as a node repair or an exporter host restart does: every counter starts
        again from zero and every netdev's carrier counts from the probe's, with the links as they were."""
        with self._lock:
            for port in self.ports:
                for name in port.counter_paths:
                    port.values[name] = 0.0
                port.values["lifespan"] = LIFESPAN_MS
                port.carrier_up_count = port.carrier_down_count = PROBE_CARRIER_CHANGES
                self._write_link(port)
                self._write_counters(port)

    def _port(self, nic: int) -> _Port:
        if not 0 <= nic < len(self.ports):
            raise ValueError(f"no NIC {nic} on {self.node}: it has {len(self.ports)}")
        return self.ports[nic]

    def _grow(self, seconds: float, load: float) -> None:
        """Add `seconds` of traffic to every port's counters (no files written)."""
        for port in self.ports:
            if not port.up:
                continue
            level = port.congestion
            share = port.traffic_share * port.traffic_factor
            mean = load * BUSY_LINE_SHARE * self._line_bytes_per_second * share / (1 + level)
            received = mean * seconds * self._rng.uniform(1 - JITTER, 1 + JITTER)
            sent = mean * seconds * self._rng.uniform(1 - JITTER, 1 + JITTER)
            marked = received / ROCE_PAYLOAD * (ECN_BASE + ECN_PER_LEVEL * level)
            corrupt = received / ROCE_PAYLOAD * CORRUPT_PER_LEVEL * port.errors
            for name, amount in (
                ("port_rcv_data", received / WORD),
                ("port_xmit_data", sent / WORD),
                ("port_rcv_packets", received / ROCE_PAYLOAD),
                ("unicast_rcv_packets", received / ROCE_PAYLOAD),
                ("port_xmit_packets", sent / ROCE_PAYLOAD),
                ("unicast_xmit_packets", sent / ROCE_PAYLOAD),
                ("rx_write_requests", received / NCCL_CHUNK),
                ("np_ecn_marked_roce_packets", marked),
                ("np_cnp_sent", marked * CNP_PER_MARK),
                ("rp_cnp_handled", marked * CNP_PER_MARK),  # the peers are congested alike
                ("port_xmit_wait", XMIT_WAIT_PER_LEVEL * level * load * seconds),
                ("port_rcv_errors", corrupt),
                ("symbol_error", corrupt * SYMBOLS_PER_CORRUPT),
                ("out_of_sequence", corrupt),
                ("packet_seq_err", corrupt),
                ("local_ack_timeout_err", corrupt * ACK_TIMEOUT_PER_CORRUPT),
            ):
                port.values[name] += amount

    def _write_port(self, port: _Port) -> None:
        for directory in (port.ib_dir, port.net_dir):
            self._link(f"{directory}/device", f"../../../{port.slot}")
        self._link(f"class/infiniband/{port.device}", f"../../{port.ib_dir}")
        self._link(f"class/net/{port.netdev}", f"../../{port.net_dir}")
        ib_files = {
            "board_id": self.model.board_id,
            "fw_ver": self.model.fw_ver,
            "hca_type": self.model.hca_type,
            "node_desc": f"{self.node} {port.device}",
            "node_guid": port.node_guid,
            "node_type": "1: CA",
            "sys_image_guid": port.node_guid,
            "ports/1/link_layer": "Ethernet",
            "ports/1/lid": "0x0",  # RoCE has no LIDs and no subnet manager
            "ports/1/sm_lid": "0x0",
            "ports/1/gid_attrs/ndevs/0": port.netdev,
            "ports/1/gid_attrs/ndevs/1": port.netdev,
            "ports/1/gid_attrs/types/0": "IB/RoCE v1",
            "ports/1/gid_attrs/types/1": "RoCE v2",
            "ports/1/gids/0": _link_local_gid(port.mac),
            "ports/1/gids/1": _link_local_gid(port.mac),
        }
        net_files = _netdev_files(address=port.mac, ifindex=port.ifindex, mtu=9000, name_assign_type=4)
        self._put_all(port.ib_dir, ib_files)
        self._put_all(port.net_dir, net_files)
        self._write_link(port)
        self._write_counters(port)

    def _write_eth0(self) -> None:
        """The VM's virtio-net management interface; virtio reports no speed or duplex."""
        eth0_dir = "devices/pci0000:00/0000:00:03.0/virtio0/net/eth0"
        files = _netdev_files(address=self._eth0_mac, ifindex=2, mtu=1500, name_assign_type=1)
        files.update(_carrier_files(up=True, up_count=1, down_count=1, speed="-1", duplex="unknown"))
        self._put_all(eth0_dir, files)
        self._link(f"{eth0_dir}/device", "../../../virtio0")
        self._link("class/net/eth0", f"../../{eth0_dir}")

    def _write_link(self, port: _Port) -> None:
        """The files that follow the link state: IB state and rate, netdev carrier, speed and counts."""
        speed, duplex = (str(self.model.speed_mbps), "full") if port.up else ("-1", "unknown")
        states = UP if port.up else DOWN
        self._put_all(f"{port.ib_dir}/ports/1", {**states, "rate": self.model.rate if port.up else DOWN_RATE})
        files = _carrier_files(port.up, port.carrier_up_count, port.carrier_down_count, speed, duplex)
        self._put_all(port.net_dir, files)

    def _write_counters(self, port: _Port) -> None:
        for name, path in port.counter_paths.items():
            self._put(path, f"{int(port.values[name])}\n")

    def _put_all(self, directory: str, files: dict[str, str]) -> None:
        for name, text in files.items():
            self._put(f"{self.root}/{directory}/{name}", text + "\n")

    def _put(self, path: str, text: str) -> None:
        """Replace the file's text atomically, unless it already holds `text`."""
        if self._shown.get(path) == text:
            return
        directory = os.path.dirname(path)
        if directory not in self._made_dirs:
            os.makedirs(directory, exist_ok=True)
            self._made_dirs.add(directory)
        fd = os.open(self._staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.rename(self._staging, path)
        self._shown[path] = text

    def _link(self, path: str, target: str) -> None:
        """Make `path` (relative to the root) a symbolic link to `target`, replacing what is there."""
        absolute = self.root / path
        absolute.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, self._staging)
        os.replace(self._staging, absolute)


def _mac(*octets: int) -> str:
    return ":".join(f"{octet:02x}" for octet in octets)


def _netdev_files(*, address: str, ifindex: int, mtu: int, name_assign_type: int) -> dict[str, str]:
    """The attributes of a netdev that do not follow its link state."""
    return {
        "addr_assign_type": "0",
        "addr_len": "6",
        "address": address,
        "broadcast": "ff:ff:ff:ff:ff:ff",
        "dev_id": "0x0",
        "dev_port": "0",
        "dormant": "0",
        "flags": IFF_UP_BROADCAST_MULTICAST,
        "ifalias": "",
        "ifindex": str(ifindex),
        "iflink": str(ifindex),
        "link_mode": "0",
        "mtu": str(mtu),
        "name_assign_type": str(name_assign_type),  # 1: enumerated by the kernel (eth0), 4: renamed by udev
        "netdev_group": "0",
        "proto_down": "0",
        "tx_queue_len": "1000",
        "type": "1",  # ARPHRD_ETHER
    }


def _carrier_files(up: bool, up_count: int, down_count: int, speed: str, duplex: str) -> dict[str, str]:
    """Carrier and operstate, and the speed and duplex that ethtool reports as unknown without carrier."""
    return {
        "carrier": "1" if up else "0",
        "carrier_changes": str(up_count + down_count),
        "carrier_up_count": str(up_count),
        "carrier_down_count": str(down_count),
        "operstate": "up" if up else "down",
        "speed": speed,
        "duplex": duplex,
    }


def _link_local_gid(mac: str) -> str:
    """GID 0 of a RoCE port: the fe80:: address of its netdev's EUI-64."""
    octets = [int(part, 16) for part in mac.split(":")]
    eui = [octets[0] ^ 0x02, *octets[1:3], 0xFF, 0xFE, *octets[3:]]
    groups = [f"{eui[i]:02x}{eui[i + 1]:02x}" for i in range(0, 8, 2)]
    return ":".join(["fe80", "0000", "0000", "0000", *groups])

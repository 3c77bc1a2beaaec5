"""What a simulated fleet tells the hub of its topology, as a real one does: one host agent's report per
host (collectors/hostagent.py, format `host-agent`), plus the operator's inventory of what no host sees.

Each host of the layout (sim.topology) is a hypervisor with one SR-IOV PF per NIC (NIC j of every VM is
on rail j), named and addressed as an mlx5 port is (`enp<bus>s0np0` at `0000:<bus>:00.0`), each PF
with one VF per VM (VF i at function i + 1 of the PF's bus); its VMs as libvirt domains (name = the node,
a UUID derived from it, an <interface type='hostdev'> per VF and a PCI <hostdev> per GPU, as `virsh
dumpxml` prints them); and `lldpcli -f json0 show neighbors` naming the host's leaf as the chassis of
every PF's neighbor, one switch port per PF. The agents say node -> host and PF -> leaf; the operator's
part is `Topology.inventory()` with those two keys taken out (nodes' `host`, hosts' `leaf`), so what
the inventory gains later passes through unchanged, and the inventory, which outranks a host agent for
the same child and kind of parent, never restates what the agents say.

`topology_reports` is the one list both the offline run (sim.offline) and the online ones (sim.online,
sim.live) deliver, each the way its path delivers it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from xml.sax.saxutils import escape

from analytics.topology.model import Kind
from collectors.hostagent import FORMAT as HOST_AGENT_FORMAT
from collectors.hostagent import REPORT_VERSION
from sim.errors import SimulationError
from sim.scenario import Scenario
from sim.topology import Topology

INVENTORY_FORMAT = "inventory"  # the operator's part goes through the inventory importer
AGENT_KEYS = {"nodes": "host", "hosts": "leaf"}  # what host agents say, left out of the operator's part
# A host's devices take buses from FIRST_BUS on, PFs first, then GPUs; a new PCI domain every BUSES_PER_DOMAIN
FIRST_BUS = 0x10
BUSES_PER_DOMAIN = 0xF0
MAX_VFS_PER_PF = 255  # functions 1..255 of the PF's bus (ARI), as slot < 0x20 allows
QEMU_OUI = (0x52, 0x54, 0x00)  # the prefix libvirt gives the MACs it makes
_UUIDS = uuid.UUID("5f1c39a0-2d3e-4b7a-9c1e-6a3f0b2d7e41")  # namespace of the domains' UUIDs


@dataclass(frozen=True)
class TopologyReport:
    """One text the hub imports: its `format` (topology.importers), who says it (`reporter`: the host
    for an agent's report, "" for the operator's inventory), the text, and the name errors give it."""

    format: str
    reporter: str
    text: str
    file: str


def topology_reports(scenario: Scenario) -> list[TopologyReport]:
    """Every host agent's report, in host order, then the operator's inventory; none without a
    topology. SimulationError when a host has more VMs than a PF has VFs."""
    topology = scenario.topology
    if topology is None:
        return []
    if topology.vms_per_host > MAX_VFS_PER_PF:
        raise SimulationError(
            f"{scenario.name}: topology.vms_per_host {topology.vms_per_host}: a simulated PF has at most "
            f"{MAX_VFS_PER_PF} VFs, one per VM"
        )
    agents = [
        TopologyReport(HOST_AGENT_FORMAT, host, json.dumps(report), f"host-agent {host}")
        for host, report in host_reports(topology, scenario.fleet.gpus_per_node).items()
    ]
    operator = operator_inventory(topology.inventory())
    return [*agents, TopologyReport(INVENTORY_FORMAT, "", operator, f"{scenario.name} inventory")]


def host_reports(topology: Topology, gpus_per_node: int) -> dict[str, dict]:
    """Per host, the report its agent would send (collectors.hostagent.HostAgent.report's shape)."""
    vms: dict[str, list[str]] = {}
    for node in topology.nodes:
        vms.setdefault(topology.parent(node, Kind.HOST), []).append(node)
    reports = {}
    for number, (host, nodes) in enumerate(vms.items()):  # hosts are numbered in node order
        leaf = topology.parent(nodes[0], Kind.LEAF)
        pfs = [_pf(nic, len(nodes)) for nic in range(topology.rails)]
        domains = [
            {
                "name": node,
                "xml": _domain_xml(
                    node, i + 1, [pf["vfs"][i] for pf in pfs], _gpus(topology, i, gpus_per_node)
                ),
            }
            for i, node in enumerate(nodes)
        ]
        reports[host] = {
            "version": REPORT_VERSION,
            "host": host,
            "pfs": pfs,
            "domains": domains,
            "lldp": _lldp(
                leaf, [pf["name"] for pf in pfs], first_port=number % topology.hosts_per_leaf * len(pfs)
            ),
        }
    return reports


def operator_inventory(layout: str) -> str:
    """The layout's inventory text (Topology.inventory) without what the host agents say (AGENT_KEYS),
    every other key kept."""
    document = json.loads(layout)
    for section, key in AGENT_KEYS.items():
        for parents in document.get(section, {}).values():
            parents.pop(key, None)
    return json.dumps(document, indent=1)


def _bus(device: int) -> str:
    """The host's `device`-th PCI bus as "dddd:bb"."""
    domain, bus = divmod(device, BUSES_PER_DOMAIN)
    return f"{domain:04x}:{FIRST_BUS + bus:02x}"


def _function(bus: str, number: int) -> str:
    """Function `number` (0: the PF itself) of device 0 on `bus`, ARI-numbered: "dddd:bb:ss.f"."""
    slot, function = divmod(number, 8)
    return f"{bus}:{slot:02x}.{function}"


def _pf(nic: int, vfs: int) -> dict:
    """PF `nic` of a host whose VMs take `vfs` of its VFs, as sysfs shows it."""
    bus = _bus(nic)
    number = int(bus.split(":")[1], 16)
    return {
        "name": f"enp{number}s0np0",
        "pci": _function(bus, 0),
        "vfs": [_function(bus, 1 + vf) for vf in range(vfs)],
    }


def _gpus(topology: Topology, vm: int, gpus_per_node: int) -> list[str]:
    """The PCI addresses of the GPUs passed to the host's `vm`-th VM, on buses after the PFs'."""
    first = topology.rails + vm * gpus_per_node
    return [_function(_bus(first + gpu), 0) for gpu in range(gpus_per_node)]


def _source_address(address: str) -> str:
    domain, bus, device = address.split(":")
    slot, function = device.split(".")
    return f"<address type='pci' domain='0x{domain}' bus='0x{bus}' slot='0x{slot}' function='0x{function}'/>"


def _domain_xml(node: str, domain_id: int, vfs: list[str], gpus: list[str]) -> str:
    """`virsh dumpxml` of `node`'s running domain `domain_id`: its VFs as hostdev interfaces, its GPUs as
    PCI hostdevs."""
    interfaces = "".join(
        f"    <interface type='hostdev' managed='yes'>\n"
        f"      <mac address='{_mac(f'{node}/{vf}', QEMU_OUI)}'/>\n"
        f"      <driver name='vfio'/>\n"
        f"      <source>\n        {_source_address(vf)}\n      </source>\n"
        f"      <alias name='hostdev{index}'/>\n"
        f"    </interface>\n"
        for index, vf in enumerate(vfs)
    )
    hostdevs = "".join(
        f"    <hostdev mode='subsystem' type='pci' managed='yes'>\n"
        f"      <driver name='vfio'/>\n"
        f"      <source>\n        {_source_address(gpu)}\n      </source>\n"
        f"      <alias name='hostdev{len(vfs) + index}'/>\n"
        f"    </hostdev>\n"
        for index, gpu in enumerate(gpus)
    )
    return (
        f"<domain type='kvm' id='{domain_id}'>\n  <name>{escape(node)}</name>\n"
        f"  <uuid>{uuid.uuid5(_UUIDS, node)}</uuid>\n"
        f"  <devices>\n    <emulator>/usr/libexec/qemu-kvm</emulator>\n{interfaces}{hostdevs}  </devices>\n"
        f"</domain>\n"
    )


def _lldp(leaf: str, interfaces: list[str], first_port: int) -> str:
    """`lldpcli -f json0 show neighbors`: each of `interfaces` sees `leaf`, on switch port swp<n> from
    `first_port` + 1 on."""
    neighbors = [
        {
            "name": name,
            "via": "LLDP",
            "rid": "1",
            "chassis": [{"id": [{"type": "mac", "value": _mac(leaf)}], "name": [{"value": leaf}]}],
            "port": [
                {
                    "id": [{"type": "ifname", "value": f"swp{port + 1}"}],
                    "descr": [{"value": f"swp{port + 1}"}],
                }
            ],
        }
        for port, name in enumerate(interfaces, start=first_port)
    ]
    return json.dumps({"lldp": [{"interface": neighbors}]})


def _mac(name: str, prefix: tuple[int, ...] = (0x02,)) -> str:
    """A MAC address derived from `name`, after `prefix` (a locally administered one by default)."""
    digest = uuid.uuid5(_UUIDS, name).bytes
    return ":".join(f"{byte:02x}" for byte in (*prefix, *digest[: 6 - len(prefix)]))

"""Shared-fault localization per detection cycle for a large virtualized fleet (2,000 VMs on 250 hosts, 64
leaves under 4 spines, 8 rails of one NIC per VM each, counted per NIC: 16,000 NICs, 8 racks), beside a
per-node detection step over the same nodes.

The topology is built once (Topology.of, as after a change of it). Each window the shared-fault detector
takes the nodes active in it, which churn (a node scraped or not from one window to the next): timed side
by side, its Topology of a window with CHURN of the VMs inactive (a new draw each window) rebuilt from the
layers (Topology.of(layers, active)) and applied to the Membership built once (Membership.topology), the
detector's way. Then each cycle localizes one window's per-node anomalies with the previous window's
streaks, as the hub's loop will: the steady state, where a fault persists and the parents' streaks carry
over. Four windows are timed: a quiet one (scattered node faults, about 1.5% of the fleet, on the node, a
GPU or a NIC), a busy one (those, plus every VM of one leaf flapping on two ports and one host's VMs with
degraded DMA), a rail one (NIC 3 of every VM congested) and a storm (a whole spine's 500 VMs flapping).
The peer, in the same run: the congestion detector's score and findings (analytics.detectors.congestion)
over a features frame of the same VMs' 8 ports each, the part of a per-node detector after its read. The
whole per-node cycle of the hub is bench/detect.py's (per 192 nodes; docs/performance.md).

    .venv/bin/python bench/localize.py [--vms 2000] [--cycles 300]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.detectors.congestion import NOTIFICATIONS, Congestion
from analytics.topology.localize import (
    Membership,
    NodeAnomaly,
    Parent,
    SharedFaultLocalizer,
    Topology,
    score,
)

VMS_PER_HOST, LEAVES, LEAVES_PER_SPINE, RAILS, RACKS = 8, 64, 16, 8, 8
STRAY_KINDS = ("slow_node", "gpu_throttle", "dma_degraded", "congestion", "link_flap", "gpu_fault")
GOAL_MS = 50.0
CHURN = 0.01  # the share of VMs not active in a window


def fleet(vms: int) -> dict[str, dict[str, list[str]]]:
    """Layer -> parent -> VMs: VMs in host order, hosts spread evenly over the leaves and racks (a host
    never straddles two), leaves over the spines; a rail's children are NICs, NIC j of each VM on rail j."""
    nodes = [f"vm-{at:04d}" for at in range(vms)]
    hosts = -(-vms // VMS_PER_HOST)
    layers: dict[str, dict[str, list[str]]] = {layer: {} for layer in ("host", "leaf", "spine", "rack")}
    for at, node in enumerate(nodes):
        host = at // VMS_PER_HOST
        leaf = host * LEAVES // hosts
        parents = {
            "host": f"host-{host:03d}",
            "leaf": f"leaf-{leaf:02d}",
            "spine": f"spine-{leaf // LEAVES_PER_SPINE}",
            "rack": f"rack-{host * RACKS // hosts:02d}",
        }
        for layer, parent in parents.items():
            layers[layer].setdefault(parent, []).append(node)
    layers["rail"] = {f"rail-{rail}": [f"{node}/mlx5_{rail}" for node in nodes] for rail in range(RAILS)}
    return layers


# the windows timed: each shared fault's layer, parent and the kind its VMs show
WINDOWS = {
    "quiet": (),
    "busy": (("leaf", "leaf-07", "link_flap"), ("host", "host-201", "dma_degraded")),
    "rail": (("rail", "rail-3", "congestion"),),
    "storm": (("spine", "spine-1", "link_flap"),),
}


def window_anomalies(
    layers: dict[str, dict[str, list[str]]], faults: tuple[tuple[str, str, str], ...]
) -> list[NodeAnomaly]:
    """Scattered node faults on 1.5% of the VMs (on the node, a GPU or a NIC), and each child of each of
    `faults` (layer, parent, kind) anomalous: a NIC on itself, a VM on two ports."""
    chooser = random.Random(7)
    nodes = sorted(node for members in layers["host"].values() for node in members)
    anomalies = [
        NodeAnomaly(node, kind, f"{kind}@{node}", chooser.choice(("", "gpu:1", "mlx5_5:1")))
        for node in chooser.sample(nodes, len(nodes) * 15 // 1000)
        for kind in chooser.sample(STRAY_KINDS, chooser.choice((1, 1, 2)))
    ]
    for layer, parent, kind in faults:
        for child in layers[layer][parent]:
            node, _, nic = child.partition("/")
            anomalies += [
                NodeAnomaly(node, kind, f"{kind}@{node}:{device}", f"{device}:1")
                for device in ((nic,) if nic else ("mlx5_0", "mlx5_3"))
            ]
    return anomalies


def churned(layers: dict[str, dict[str, list[str]]], windows: int) -> list[frozenset[str]]:
    """The active nodes of `windows` windows: every VM but a fresh random CHURN of them each."""
    chooser = random.Random(11)
    nodes = sorted(node for members in layers["host"].values() for node in members)
    return [frozenset(nodes) - set(chooser.sample(nodes, int(len(nodes) * CHURN))) for _ in range(windows)]


def congestion_features(vms: int) -> pd.DataFrame:
    """The congestion detector's features for `vms` VMs of 8 ports: notifications per second around a
    fabric median, a few ports far above it."""
    rates = np.random.default_rng(3).gamma(4.0, 25.0, vms * 8)
    rates[::997] *= 40  # a few congested ports
    median = float(np.median(rates))
    mad = float(np.median(np.abs(rates - median)))
    return pd.DataFrame(
        {
            "node": np.repeat([f"vm-{at:04d}" for at in range(vms)], 8),
            "component": np.tile([f"mlx5_{port}:1" for port in range(8)], vms),
            "job": "llm",
            "signal": NOTIFICATIONS,
            "per_s": rates,
            "ecn_marks_per_s": rates * 0.6,
            "cnp_sent_per_s": rates * 0.6,
            "cnp_handled_per_s": rates * 0.4,
            "transmit_wait_per_s": np.nan,
            "fleet_median_per_s": median,
            "fleet_mad_per_s": mad,
        }
    )


def timed(action: Callable[[], object], cycles: int) -> tuple[float, float]:
    """Median CPU and wall milliseconds of `action` over `cycles` runs."""
    cpu, wall = [], []
    for _ in range(cycles):
        started_cpu, started_wall = time.process_time(), time.perf_counter()
        action()
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started_wall)
    return statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vms", type=int, default=2000)
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args()
    layers = fleet(args.vms)
    topology = Topology.of(layers)
    localizer = SharedFaultLocalizer()
    print(
        f"{args.vms} VMs; parents: "
        + ", ".join(f"{layer} {len(parents)}" for layer, parents in layers.items())
        + f"; {sum(len(nodes) for nodes in topology.children.values()):,} memberships"
    )
    build_cpu, build_wall = timed(lambda: Topology.of(layers), max(1, args.cycles // 10))
    print(f"\n{'per cycle, medians of ' + str(args.cycles):44} {'CPU ms':>8} {'wall ms':>8}")
    print(f"{'topology built (once per change of it)':44} {build_cpu:8.2f} {build_wall:8.2f}")
    actives, membership = churned(layers, args.cycles), Membership.of(layers)
    assert all(membership.topology(active) == Topology.of(layers, active) for active in actives[:10])
    for label, build in (
        ("active nodes, rebuilt: Topology.of", lambda active: Topology.of(layers, active)),
        ("active nodes, applied: Membership.topology", membership.topology),
    ):
        each = itertools.cycle(actives)
        cpu, wall = timed(lambda build=build, each=each: build(next(each)), args.cycles)
        print(f"{label:44} {cpu:8.2f} {wall:8.2f}")
    figures = {}
    for name, faults in WINDOWS.items():
        anomalies = window_anomalies(layers, faults)
        streaks: dict[Parent, int] = dict(localizer.localize(topology, anomalies).streaks)
        result = localizer.localize(topology, anomalies, streaks)
        figures[name] = timed(partial(localizer.localize, topology, anomalies, streaks), args.cycles)
        label = f"localization, {name} window ({len(anomalies)} anomalies)"
        print(f"{label:44} {figures[name][0]:8.2f} {figures[name][1]:8.2f}")
        for fault in result.faults:
            print(
                f"    {fault.check} (-log10 p corrected {score(fault):.0f}, explains {len(fault.explains)})"
            )
    detector, features = Congestion(), congestion_features(args.vms)
    peer = timed(lambda: detector.findings(features, detector.score(features)), args.cycles)
    label = f"peer: congestion score+findings, {args.vms * 8:,} ports"
    print(f"{label:44} {peer[0]:8.2f} {peer[1]:8.2f}")
    worst = max(cpu for cpu, _ in figures.values())
    print(
        f"localization CPU / peer CPU: busy {figures['busy'][0] / peer[0]:.2f}x, "
        f"rail {figures['rail'][0] / peer[0]:.2f}x, "
        f"storm {figures['storm'][0] / peer[0]:.2f}x; "
        f"worst window {worst:.2f} ms CPU (goal < {GOAL_MS:.0f} ms)"
    )
    return 0 if worst < GOAL_MS else 1


if __name__ == "__main__":
    sys.exit(main())

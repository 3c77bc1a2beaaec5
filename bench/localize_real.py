"""The shared-fault localizer on real faults: the InfiniteHBD trace (sim.trace; 400 GPU servers, 348 days)
replayed through SharedFaultLocalizer with its defaults, on topologies the trace does not have.

The trace has no topology, so its 400 servers (the 231 with a fault and 169 quiet ones) are placed at
random, one placement per seed, on a Vela-like fabric: one VM per host, 8 hosts per leaf, 4 leaves per
spine, 4 hosts per rack (two racks a leaf), in server order of a seeded shuffle. Hosts of one VM and the
rails (every server is on every rail; the trace names no NIC) cannot hold k >= 2 of n with k/n >= 0.5
and are left out. Each fault becomes the per-node anomaly a fleet would see of it (KIND_OF; None: not
one of the kinds the localizer counts, so it is left out), open over every detection window it touches
(an open-ended fault until the trace's last event).

- null: the trace alone. Under a random placement the faults' co-occurrence is real but their parents
  are not, so every shared fault reported is false by construction.
- planted: the same, plus one leaf fault (every VM of a random leaf flapping for PLANTED_S from a random
  time): found when that leaf is reported, as a leaf, in one of its windows.

Windows are the hub's (10 s); the anomalies only change at a fault's first or last window, so a run of
identical windows is localized `persistence` times and the rest are the same answer.

    .venv/bin/python bench/localize_real.py [--placements 200]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.topology.localize import NodeAnomaly, Parent, SharedFaultLocalizer, Topology
from analytics.topology.model import Kind
from sim.trace import TraceSpan, trace_spans

SERVERS, HOSTS_PER_LEAF, LEAVES_PER_SPINE, HOSTS_PER_RACK = 400, 8, 4, 4
WINDOW_S = 10.0
PLANTED_S = 600.0
DAY_S = 86_400.0
YEAR_DAYS = 365.25

# trace description -> the per-node anomaly kind a fleet would see of it; None where the localizer does
# not count it (a GPU's own fault is gpu_fault, never counted: SHARED_KINDS) or where it shows nothing a
# detector reads (a CPU, a disk, a firmware mismatch, an unknown error)
KIND_OF: Mapping[str, str | None] = {
    "Link Down": "link_down",  # parameter-plane cable
    "NIC Lost": "link_down",
    "Rnic Gid Error": "link_down",  # the RDMA port has no usable GID: RoCE traffic stops
    "Remote Optical Module Failure": "link_down",
    "Y-cables Taken offline": "link_down",
    "NIC Link Speed low": "link_flap",  # a link retrained to a lower speed
    "GPU PCI link width low": "dma_degraded",
    "NIC PCI link Width low": "dma_degraded",
    "GPU P2P Bandwidth Low": "slow_node",
    "Suspect Machine Offline": "slow_node",  # pulled while troubleshooting a slow training job
    "GPU Temperature High": "gpu_throttle",
    "Speed Critical (Sensor)": "gpu_throttle",  # a fan: the GPUs heat and throttle
    "Redundancy Lost": "gpu_throttle",  # a fan or power supply: throttling as a chassis brakes
    "Power Supply Failure detected": "gpu_throttle",
    "GPU DBE(Double Bit ECC) > Threshold": "gpu_fault",
    "GPU SBE(Single Bit ECC) > Threshold": "gpu_fault",
    "GPU xid Error": "gpu_fault",
    "GPU Lost": "gpu_fault",
    "GPU device not found": "gpu_fault",
    "GPU device unknow error": "gpu_fault",
    "nvidia-smi Timeout": "gpu_fault",
    "Silent Data Corruption": "gpu_fault",
}


@dataclass(frozen=True)
class Replay:
    """One placement's replay: the shared faults reported (each as its parent and first window) and,
    where a leaf fault was planted, whether it was found and after how many windows."""

    reported: tuple[tuple[Parent, int], ...]
    coincidences: int  # times a parent began to hold >= 2 anomalous children, half of them or more
    planted: Parent | None = None
    found_after: int | None = None  # windows from the planted fault's start to its report; None: missed


def node_names(spans: Iterable[TraceSpan]) -> list[str]:
    """The fleet's 400 servers: the trace's, sorted, then quiet ones to make up the number."""
    faulty = sorted({span.node for span in spans})
    return faulty + [f"quiet-{at:03d}" for at in range(SERVERS - len(faulty))]


def placement(nodes: Sequence[str], seed: int) -> dict[str, dict[str, list[str]]]:
    """layer -> parent -> nodes of one random placement of `nodes` on the Vela-like fabric."""
    order = list(nodes)
    random.Random(seed).shuffle(order)
    layers: dict[str, dict[str, list[str]]] = {Kind.LEAF: {}, Kind.SPINE: {}, Kind.RACK: {}}
    for at, node in enumerate(order):
        leaf = at // HOSTS_PER_LEAF
        layers[Kind.LEAF].setdefault(f"leaf-{leaf:02d}", []).append(node)
        layers[Kind.SPINE].setdefault(f"spine-{leaf // LEAVES_PER_SPINE}", []).append(node)
        layers[Kind.RACK].setdefault(f"rack-{at // HOSTS_PER_RACK:03d}", []).append(node)
    return layers


def window_anomalies(
    spans: Iterable[TraceSpan], kind_of: Mapping[str, str | None]
) -> list[tuple[int, int, str, str]]:
    """(first window, last window, node, kind) of each fault the localizer counts; an open-ended one lasts
    to the last event's window."""
    spans = list(spans)
    last_day = max(day for span in spans for day in (span.start_day, span.end_day) if day is not None)
    counted = []
    for span in spans:
        kind = kind_of.get(span.desc)
        if kind is None:
            continue
        end_day = last_day if span.end_day is None else span.end_day
        first = math.floor(span.start_day * DAY_S / WINDOW_S)
        last = max(first, math.ceil(end_day * DAY_S / WINDOW_S) - 1)
        counted.append((first, last, span.node, kind))
    return counted


def replay(
    layers: Mapping[str, Mapping[str, Iterable[str]]],
    anomalies: Sequence[tuple[int, int, str, str]],
    localizer: SharedFaultLocalizer,
    planted: tuple[str, int] | None = None,
) -> Replay:
    """Localize every window of `anomalies` on `layers`; `planted` (leaf, first window): every VM of the
    leaf flaps over PLANTED_S from that window on."""
    topology = Topology.of(layers)
    rows = list(anomalies)
    if planted is not None:
        leaf, start = planted
        end = start + math.ceil(PLANTED_S / WINDOW_S) - 1
        rows += [(start, end, node, "link_flap") for node in layers[Kind.LEAF][leaf]]
    changes = sorted({edge for first, last, _, _ in rows for edge in (first, last + 1)})
    streaks: Mapping[Parent, int] = {}
    before: set[Parent] = set()
    reported: list[tuple[Parent, int]] = []
    gated: set[Parent] = set()
    coincidences = 0
    for start, stop in itertools.pairwise(changes):
        window = [
            NodeAnomaly(node, kind, f"{node}/{kind}/{first}")
            for first, last, node, kind in rows
            if first <= start <= last
        ]
        now_gated = _gated(topology, {anomaly.node for anomaly in window}, localizer)
        coincidences += len(now_gated - gated)
        gated = now_gated
        for at in range(start, min(stop, start + localizer.persistence)):
            answer = localizer.localize(topology, window, streaks)
            streaks = answer.streaks
            now = {(fault.layer, fault.parent) for fault in answer.faults}
            reported += [(parent, at) for parent in sorted(now - before)]
            before = now
    if planted is None:
        return Replay(tuple(reported), coincidences)
    parent: Parent = (Kind.LEAF, planted[0])
    hits = [
        at - planted[1]
        for found, at in reported
        if found == parent and 0 <= at - planted[1] < PLANTED_S / WINDOW_S
    ]
    background = tuple(item for item in reported if item[0] != parent)
    return Replay(background, coincidences, parent, min(hits) if hits else None)


def _gated(topology: Topology, anomalous: set[str], localizer: SharedFaultLocalizer) -> set[Parent]:
    """The parents whose anomalous children pass the localizer's count gates (before its p-value)."""
    return {
        parent
        for parent, nodes in topology.children.items()
        if (k := len(nodes & anomalous)) >= localizer.min_anomalous
        and k >= localizer.min_fraction * len(nodes)
    }


def planted_at(
    layers: Mapping[str, Mapping[str, Iterable[str]]],
    anomalies: Sequence[tuple[int, int, str, str]],
    seed: int,
) -> tuple[str, int]:
    """A random leaf and a random first window within the trace's span, drawn from `seed`."""
    rng = random.Random(f"planted-{seed}")
    last = max(last for _, last, _, _ in anomalies)
    return rng.choice(sorted(layers[Kind.LEAF])), rng.randrange(last)


def run(
    placements: Iterable[int], kind_of: Mapping[str, str | None] = KIND_OF, fixtures: Path | None = None
) -> list[tuple[Replay, Replay]]:
    """Per seed: the trace's replay alone (null) and with a leaf fault planted; the trace read from
    `fixtures` (sim.trace.trace_path)."""
    spans = trace_spans(fixtures)
    nodes, anomalies = node_names(spans), window_anomalies(spans, kind_of)
    localizer = SharedFaultLocalizer()
    replays = []
    for seed in placements:
        layers = placement(nodes, seed)
        null = replay(layers, anomalies, localizer)
        replays.append((null, replay(layers, anomalies, localizer, planted_at(layers, anomalies, seed))))
    return replays


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--placements", type=int, default=200, help="random placements, seeds 0.. (200)")
    args = parser.parse_args(argv)
    spans = trace_spans()
    days = max(day for span in spans for day in (span.start_day, span.end_day) if day is not None)
    years = days / YEAR_DAYS
    counted = [span for span in spans if KIND_OF.get(span.desc) not in (None, "gpu_fault")]
    servers = len({span.node for span in spans})
    print(f"trace: {len(spans)} faults on {servers} of {SERVERS} servers over {days:.0f} days")
    rates = f"{len(spans) / years:.0f}, of kinds the localizer counts {len(counted) / years:.0f}"
    print(f"node faults per fleet-year: {rates}")
    seeds = range(args.placements)
    unknown = {**KIND_OF, "Unknown Error": "peer_outlier"}
    for label, kind_of in (("KIND_OF", KIND_OF), ("KIND_OF + unknown errors as peer_outlier", unknown)):
        results = run(seeds, kind_of)
        false = [item for null, _ in results for item in null.reported]
        found = [planted.found_after for _, planted in results if planted.found_after is not None]
        print(f"\n{label}, {args.placements} placements, {WINDOW_S:.0f} s windows:")
        rate = len(false) / len(results) / years
        print(f"  null: {len(false)} shared faults reported ({rate:.2f} per fleet-year)")
        coincidences = sum(null.coincidences for null, _ in results)
        print(f"  parents passing k >= 2 and k/n >= 0.5 (before the p-value): {coincidences}")
        for (layer, parent), at in false[:10]:
            print(f"    {layer} {parent} at day {at * WINDOW_S / DAY_S:.2f}")
        latency = f", after {statistics.median(found) * WINDOW_S:.0f} s (median)" if found else ""
        print(f"  planted leaf: found {len(found)} of {len(results)}{latency}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

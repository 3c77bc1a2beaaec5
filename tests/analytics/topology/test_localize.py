"""Shared-fault localization (analytics.topology.localize) on worked examples a reader can check by hand,
then its guarantees on any topology: no anomaly explained twice, p-values in [0, 1], more anomalous
children never less evidence, no anomalies no faults."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analytics.errors import AnalyticsError, DetectorError, SettingError
from analytics.evidence import SharedFaultEvidence, from_json, to_json
from analytics.topology.localize import (
    Localization,
    NodeAnomaly,
    Parent,
    SharedFaultLocalizer,
    Topology,
    log10_upper_tail,
    score,
)


def vms(count: int) -> list[str]:
    return [f"vm-{at:02d}" for at in range(count)]


def split(nodes: Sequence[str], size: int, prefix: str) -> dict[str, list[str]]:
    """`nodes` in consecutive groups of `size`, named prefix-0, prefix-1, ..."""
    return {
        f"{prefix}-{at}": list(nodes[start : start + size])
        for at, start in enumerate(range(0, len(nodes), size))
    }


def flaps(nodes: Iterable[str], kind: str = "link_flap") -> list[NodeAnomaly]:
    return [NodeAnomaly(node, kind, f"{kind}@{node}") for node in nodes]


def windows(
    topology: Topology,
    anomalies: Iterable[NodeAnomaly],
    count: int = 2,
    localizer: SharedFaultLocalizer | None = None,
) -> Localization:
    """The localization of the last of `count` windows that all saw `anomalies`."""
    localizer = localizer or SharedFaultLocalizer()
    anomalies = list(anomalies)
    streaks: Mapping[Parent, int] = {}
    for _ in range(count):
        result = localizer.localize(topology, anomalies, streaks)
        streaks = result.streaks
    return result


NODES = vms(32)
# 32 VMs: 4 leaves of 8, 8 hosts of 4 (two per leaf), one spine over all: 13 parents tested
FLEET = Topology.of(
    {"leaf": split(NODES, 8, "leaf"), "host": split(NODES, 4, "host"), "spine": {"spine-0": NODES}}
)


def test_eight_of_eight_flapping_under_one_leaf_is_one_leaf_fault():
    """P(X >= 8) for 8 drawn from 32 of which 8 are anomalous is 1 / C(32, 8), times 13 parents tested;
    its two hosts (4 of 4 each: C(8, 4) / C(32, 4) x 13, about 0.025) fall short, the spine (8 of 32) is
    under half."""
    result = windows(FLEET, flaps(NODES[:8]))
    (fault,) = result.faults
    assert (fault.layer, fault.parent, fault.n, fault.k) == ("leaf", "leaf-0", 8, 8)
    assert fault.p_value == pytest.approx(1 / math.comb(32, 8))
    assert fault.tested == 13
    assert fault.p_corrected == pytest.approx(13 / math.comb(32, 8))
    assert fault.explains == tuple(sorted(f"link_flap@{node}" for node in NODES[:8]))
    assert fault.check == "leaf-0: link flaps on 8 of 8 nodes; check optics and switch logs"
    assert score(fault) == pytest.approx(-math.log10(13 / math.comb(32, 8)))
    assert result.explained_by() == {f"link_flap@{node}": ("leaf", "leaf-0") for node in NODES[:8]}


def test_a_gpu_of_its_own_under_a_flapping_leaf_stays_a_node_fault():
    lost_gpu = NodeAnomaly(NODES[3], "gpu_fault", "gpu_fault@vm-03")
    (fault,) = windows(FLEET, [*flaps(NODES[:8]), lost_gpu]).faults
    assert lost_gpu.id not in fault.explains
    assert fault.kinds == {"link_flap": 8}


def test_two_unrelated_node_faults_under_one_leaf_of_16_are_no_shared_fault():
    """2 of 16 is under half the leaf, and they sit on two different hosts (1 of 8 each)."""
    nodes = vms(32)
    topology = Topology.of({"leaf": split(nodes, 16, "leaf"), "host": split(nodes, 8, "host")})
    assert windows(topology, [*flaps([nodes[1]]), *flaps([nodes[12]], "dma_degraded")], count=5).faults == ()


def test_a_lone_anomalous_child_under_a_healthy_parent_stays_a_node_fault():
    assert windows(FLEET, flaps([NODES[5]]), count=5).faults == ()


def test_a_spine_whose_three_leaves_all_qualify_is_the_spine_alone():
    """96 VMs, 12 leaves of 8, 4 spines of 3 leaves each: the 24 VMs under spine-0 all anomalous make
    each of its leaves a candidate (C(24, 8) / C(96, 8) x 40 parents, about 2.4e-4) and the spine one;
    the spine explains all 24."""
    nodes = vms(96)
    topology = Topology.of(
        {
            "leaf": split(nodes, 8, "leaf"),
            "host": split(nodes, 4, "host"),
            "spine": split(nodes, 24, "spine"),
        }
    )
    result = windows(topology, flaps(nodes[:24]))
    assert {("leaf", "leaf-0"), ("leaf", "leaf-1"), ("leaf", "leaf-2"), ("spine", "spine-0")} <= set(
        result.streaks
    )
    (fault,) = result.faults
    assert (fault.layer, fault.parent, fault.n, fault.k) == ("spine", "spine-0", 24, 24)
    assert len(fault.explains) == 24


def test_a_rack_holding_one_faulty_leaf_and_a_stray_anomaly_is_the_leaf():
    """rack-0 holds leaves 0 and 1: 8 + 1 of its 16 are anomalous (over half), but all but one lie under
    leaf-0, which speaks for them; the stray stays a node fault."""
    topology = Topology.of({"leaf": split(NODES, 8, "leaf"), "rack": split(NODES, 16, "rack")})
    result = windows(topology, flaps([*NODES[:8], NODES[9]]))
    assert ("rack", "rack-0") in result.streaks
    (fault,) = result.faults
    assert (fault.layer, fault.parent) == ("leaf", "leaf-0")
    assert "link_flap@vm-09" not in fault.explains


def test_a_parent_crossing_a_reported_one_is_not_reported_for_one_node_left():
    """96 VMs, leaves of 8, PDUs of 4 from vm-01 (pdu-1 is vm-05..vm-08, across leaves 0 and 1): leaf-0 all
    flapping and vm-08 too make pdu-1 (4 of 4) a candidate, but three of its four are leaf-0's, and one
    node left is no shared fault: vm-08 stays a node fault."""
    nodes = vms(96)
    topology = Topology.of({"leaf": split(nodes, 8, "leaf"), "pdu": split(nodes[1:], 4, "pdu")})
    result = windows(topology, flaps([*nodes[:8], nodes[8]]))
    assert ("pdu", "pdu-1") in result.streaks
    assert [(fault.parent, len(fault.explains)) for fault in result.faults] == [("leaf-0", 8)]


def test_a_host_explains_its_vms_and_the_leaf_above_it_stays_quiet():
    (fault,) = windows(FLEET, flaps(NODES[4:8], "dma_degraded")).faults
    assert (fault.layer, fault.parent, fault.k) == ("host", "host-1", 4)
    assert fault.check.endswith("check the host's PCIe links, root complex and IOMMU settings")


def test_a_job_alone_on_one_leaf_slowing_by_itself_reads_as_the_leaf():
    """What the core cannot tell apart: it sees nodes and anomaly kinds, not jobs. A job whose ranks all
    sit under leaf-2 and slow by themselves reaches it only if each node is reported (slow_node compares
    a node with its own job's peers, so a job slowing whole reports none); when they are, the leaf is
    named, with the kind that says where to look first, and telling the two apart is the caller's (the
    job's nodes are exactly the leaf's). When only some of them are reported, nothing is."""
    leaf_2 = NODES[16:24]
    (fault,) = windows(FLEET, flaps(leaf_2, "slow_node")).faults
    assert (fault.layer, fault.parent, fault.dominant_kind) == ("leaf", "leaf-2", "slow_node")
    assert fault.check == "leaf-2: slow steps on 8 of 8 nodes; check optics and switch logs"
    assert windows(FLEET, flaps(leaf_2[::3], "slow_node")).faults == ()


# 16 VMs: 4 leaves of 4, 4 NICs each, NIC j of every VM on rail j (a rail-optimized fabric)
RAILED_NODES = vms(16)
RAILED = Topology.of(
    {
        "leaf": split(RAILED_NODES, 4, "leaf"),
        "rail": {f"rail-{nic}": [f"{node}/mlx5_{nic}" for node in RAILED_NODES] for nic in range(4)},
    }
)


def on_nic(nodes: Iterable[str], nic: int, kind: str = "congestion") -> list[NodeAnomaly]:
    return [NodeAnomaly(node, kind, f"{kind}@{node}:mlx5_{nic}", f"mlx5_{nic}:1") for node in nodes]


def test_congestion_on_nic_2_of_12_of_16_nodes_is_rail_2_counted_in_nics():
    """P(X >= 12) for 16 NICs drawn from 64 of which 12 are anomalous is 1 / C(64, 12); the leaves (4 of
    4 nodes against 12 of 16) are chance. A second NIC of one node on another rail adds nothing to
    rail-2's k and is left to its node."""
    elsewhere = on_nic(RAILED_NODES[:1], 3)
    result = windows(RAILED, [*on_nic(RAILED_NODES[:12], 2), *elsewhere])
    (fault,) = result.faults
    assert (fault.layer, fault.parent, fault.n, fault.k) == ("rail", "rail-2", 16, 12)
    assert (fault.fleet_nodes, fault.fleet_anomalous) == (64, 13)
    assert fault.anomalous_children == tuple(f"{node}/mlx5_2" for node in RAILED_NODES[:12])
    assert fault.children == tuple(RAILED_NODES)  # the nodes, which a postmortem of one is scoped by
    assert fault.explains == tuple(sorted(anomaly.id for anomaly in on_nic(RAILED_NODES[:12], 2)))
    assert fault.check.startswith("rail-2: congestion on 12 of 16 NICs; check the rail's switches")


def test_two_nics_of_one_node_are_one_anomalous_child_of_each_rail_not_two():
    result = windows(RAILED, [*on_nic(RAILED_NODES[:1], 2), *on_nic(RAILED_NODES[:1], 3)])
    assert result == Localization((), {})


def test_a_leaf_faults_nic_anomalies_still_go_to_the_leaf():
    """Every NIC of leaf-1's 4 nodes flaps: 4 of 16 NICs on each rail is under half, the leaf's 4 of 4
    nodes (1 / C(16, 4) x 8 parents tested) is the fault, and it explains all 16 anomalies."""
    flapping = [anomaly for nic in range(4) for anomaly in on_nic(RAILED_NODES[4:8], nic, "link_flap")]
    (fault,) = windows(RAILED, flapping).faults
    assert (fault.layer, fault.parent, fault.n, fault.k) == ("leaf", "leaf-1", 4, 4)
    assert fault.explains == tuple(sorted(anomaly.id for anomaly in flapping))


def test_an_anomaly_of_no_nic_counts_for_the_node_layers_alone():
    gpus = [NodeAnomaly(node, "gpu_throttle", f"gpu_throttle@{node}", "gpu:2") for node in RAILED_NODES[:12]]
    assert windows(RAILED, gpus).faults == ()  # no rail: no NIC named; no leaf: 12 of 16 everywhere


# the same 16 VMs, 4 per host, each host's two PFs giving VF mlx5_j of each of its VMs
HOSTED = Topology.of(
    {
        "host": split(RAILED_NODES, 4, "host"),
        "pf": {
            f"{host}/eth{nic}": [f"{node}/mlx5_{nic}" for node in nodes]
            for host, nodes in split(RAILED_NODES, 4, "host").items()
            for nic in range(2)
        },
    }
)


def test_a_pf_and_its_host_over_the_same_vms_name_the_pf_for_its_nics_and_the_host_for_the_rest():
    """host-1's 4 VMs are 4 of 4 in both; the PF, more specific, explains the VF anomalies, and the
    host the anomalies that name no NIC (its PCIe, its DMA)."""
    (fault,) = windows(HOSTED, on_nic(RAILED_NODES[4:8], 1, "link_flap")).faults
    assert (fault.layer, fault.parent, fault.n, fault.k) == ("pf", "host-1/eth1", 4, 4)
    dma = [NodeAnomaly(node, "dma_degraded", f"dma@{node}") for node in RAILED_NODES[4:8]]
    (fault,) = windows(HOSTED, dma).faults
    assert (fault.layer, fault.parent) == ("host", "host-1")


def test_only_active_nodes_count_a_leaf_of_8_with_4_dead_and_3_flapping_has_n_4():
    """Counting its 4 dead VMs, leaf-0 would hold 3 anomalous of 8, under half; of its 4 active VMs it
    holds 3 of 4, against 3 of the fleet's 28 active: 4 / C(28, 3) x 4 leaves tested."""
    layers = {"leaf": split(NODES, 8, "leaf")}
    assert windows(Topology.of(layers), flaps(NODES[:3])).faults == ()
    active = set(NODES) - set(NODES[4:8])
    (fault,) = windows(Topology.of(layers, active), flaps(NODES[:3])).faults
    assert (fault.parent, fault.n, fault.k, fault.fleet_nodes) == ("leaf-0", 4, 3, 28)
    assert fault.children == tuple(NODES[:4])


def test_a_dead_nodes_nics_leave_the_rails_and_the_nic_count():
    active = set(RAILED_NODES) - {RAILED_NODES[15]}
    topology = Topology.of({"rail": {"rail-0": [f"{node}/mlx5_0" for node in RAILED_NODES]}}, active)
    assert topology.children[("rail", "rail-0")] == frozenset(f"{node}/mlx5_0" for node in RAILED_NODES[:15])
    assert topology.fleet == frozenset(RAILED_NODES[:15])


def test_one_window_is_not_enough_and_a_gap_starts_over():
    localizer = SharedFaultLocalizer()
    anomalies = flaps(NODES[:8])
    first = localizer.localize(FLEET, anomalies)
    assert first.faults == ()
    assert first.streaks == {("leaf", "leaf-0"): 1}
    quiet = localizer.localize(FLEET, [], first.streaks)
    assert quiet.streaks == {}
    assert localizer.localize(FLEET, anomalies, quiet.streaks).faults == ()
    second = localizer.localize(FLEET, anomalies, first.streaks)
    assert [fault.parent for fault in second.faults] == ["leaf-0"]
    assert second.faults[0].windows == 2


def test_persistence_is_configurable():
    anomalies = flaps(NODES[:8])
    assert windows(FLEET, anomalies, count=1, localizer=SharedFaultLocalizer(persistence=1)).faults
    assert not windows(FLEET, anomalies, count=2, localizer=SharedFaultLocalizer(persistence=3)).faults
    assert windows(FLEET, anomalies, count=3, localizer=SharedFaultLocalizer(persistence=3)).faults


def test_more_parents_tested_raises_the_bar():
    """3 of a leaf's 4 VMs anomalous in a fleet of 64 where only they are: p = C(4, 3) / C(64, 3), about
    9.6e-5. With the 16 leaves alone tested it passes 0.01 / 16; with 96 more parents of 2 VMs (hosts,
    racks and PDUs over the same VMs) it fails 0.01 / 112."""
    nodes = vms(64)
    p = 4 / math.comb(64, 3)
    assert p * 16 < 0.01 < p * 112
    anomalies = flaps(nodes[:3])
    leaves = {"leaf": split(nodes, 4, "leaf")}
    pairs = {layer: split(nodes, 2, layer) for layer in ("host", "rack", "pdu")}
    (fault,) = windows(Topology.of(leaves), anomalies).faults
    assert (fault.parent, fault.tested, fault.p_value) == ("leaf-0", 16, pytest.approx(p))
    assert windows(Topology.of({**leaves, **pairs}), anomalies).faults == ()


def test_the_evidence_crosses_the_store_and_back():
    (fault,) = windows(FLEET, flaps(NODES[:8])).faults
    assert from_json("shared_fault", to_json(fault)) == fault


@pytest.mark.parametrize(
    "parameters",
    [{"alpha": 0}, {"alpha": 1.5}, {"min_anomalous": 1}, {"min_fraction": 0}, {"persistence": 0}],
)
def test_parameters_out_of_range_are_refused(parameters):
    with pytest.raises(SettingError, match=next(iter(parameters))):
        SharedFaultLocalizer(**parameters)


def test_a_layer_it_does_not_know_is_refused_by_name():
    topology = Topology.of({"pod": {"pod-1": NODES[:4]}})
    with pytest.raises(DetectorError, match="pod") as raised:
        SharedFaultLocalizer().localize(topology, [])
    assert isinstance(raised.value, AnalyticsError)


def test_get_params_rebuilds_an_identical_localizer():
    localizer = SharedFaultLocalizer(alpha=0.05, persistence=3, layers=("leaf", "host"))
    assert SharedFaultLocalizer(**localizer.get_params()).get_params() == localizer.get_params()
    assert localizer.get_params()["alpha"] == 0.05


# Any topology: up to 80 VMs, leaves and hosts each a partition of them in random sizes, a spine over
# the first of them, and anomalies (one to three per anomalous node, of random kinds) on every node of a
# few parents and on a few strays, so that some parents qualify and some overlap.
KINDS = ("link_flap", "congestion", "slow_node", "gpu_fault")


@st.composite
def fleets(draw: st.DrawFn) -> tuple[Topology, list[NodeAnomaly]]:
    nodes = vms(draw(st.integers(2, 80)))
    layers: dict[str, dict[str, list[str]]] = {}
    for layer, most in (("leaf", 10), ("host", 24)):
        cuts = sorted(draw(st.sets(st.integers(1, len(nodes) - 1), max_size=most)))
        bounds = [0, *cuts, len(nodes)]
        layers[layer] = {f"{layer}-{at}": nodes[a:b] for at, (a, b) in enumerate(itertools.pairwise(bounds))}
    layers["spine"] = {"spine-0": nodes[: draw(st.integers(1, len(nodes)))]}
    layers["rail"] = {
        f"rail-{nic}": [f"{node}/mlx5_{nic}" for node in nodes] for nic in range(draw(st.integers(0, 4)))
    }
    parents = [(layer, parent) for layer, named in layers.items() for parent in named]
    faulty = draw(st.lists(st.sampled_from(parents), max_size=3))
    strays = draw(st.lists(st.sampled_from(nodes), max_size=6))
    # (node, component) of each anomalous node or NIC: a stray on the node or on one of its NICs
    anomalous = {
        (unit.partition("/")[0], nic_component(unit))
        for layer, parent in faulty
        for unit in layers[layer][parent]
    }
    anomalous |= {(node, draw(st.sampled_from(("", "gpu:0", "mlx5_0:1", "mlx5_1:1")))) for node in strays}
    anomalies = [
        NodeAnomaly(node, kind, f"{kind}@{node}@{component}", component)
        for node, component in sorted(anomalous)
        for kind in draw(st.sets(st.sampled_from(KINDS), min_size=1, max_size=3))
    ]
    return Topology.of(layers), anomalies


def nic_component(unit: str) -> str:
    """The component an anomaly of `unit` names: its NIC's port 1, none for a node."""
    return f"{unit.partition('/')[2]}:1" if "/" in unit else ""


def check(fault: SharedFaultEvidence) -> None:
    assert 0.0 <= fault.p_value <= fault.p_corrected <= 1.0
    assert fault.p_corrected <= 0.01 and score(fault) >= 2.0 - 1e-9
    assert fault.k >= 2 and fault.k >= 0.5 * fault.n


@settings(max_examples=200)
@given(fleet=fleets(), persistence=st.integers(1, 3))
def test_no_anomaly_is_explained_twice_and_p_values_are_probabilities(fleet, persistence):
    topology, anomalies = fleet
    result = windows(topology, anomalies, 3, SharedFaultLocalizer(persistence=persistence))
    explained = [id_ for fault in result.faults for id_ in fault.explains]
    assert len(explained) == len(set(explained))
    assert set(explained) <= {anomaly.id for anomaly in anomalies if anomaly.kind != "gpu_fault"}
    for fault in result.faults:
        check(fault)
        assert len({id_.split("@")[1] for id_ in fault.explains}) >= 2  # a fault explains 2 nodes or more
        # a NIC layer explains only the anomalies of its NICs, never a node's others
        assert fault.layer != "rail" or all(
            id_.endswith(f"mlx5_{fault.parent[5:]}:1") for id_ in fault.explains
        )


@settings(max_examples=100)
@given(fleet=fleets())
def test_a_fleet_without_anomalies_has_no_shared_fault(fleet):
    topology, _ = fleet
    assert windows(topology, [], 3) == Localization((), {})


@settings(max_examples=200)
@given(fleet=fleets(), data=st.data())
def test_one_more_anomalous_child_never_unmakes_a_candidate(fleet, data):
    """Making a healthy child of a candidate parent anomalous adds to its k and to the fleet's K: the tail
    only shrinks, so the parent stays a candidate."""
    topology, anomalies = fleet
    localizer = SharedFaultLocalizer()
    before = localizer.localize(topology, anomalies).streaks
    healthy = {
        (parent, unit)
        for parent in before
        for unit in topology.children[parent] - {u for anomaly in anomalies for u in anomaly.units()}
    }
    if not healthy:
        return
    parent, unit = data.draw(st.sampled_from(sorted(healthy)))
    one_more = NodeAnomaly(unit.partition("/")[0], "link_flap", "one-more", nic_component(unit))
    assert parent in localizer.localize(topology, [*anomalies, one_more]).streaks


@given(
    fleet=st.integers(1, 400),
    data=st.data(),
)
def test_the_tail_never_grows_with_one_more_anomalous_child(fleet, data):
    """log10 P(X >= k) against one more anomalous child: a healthy one turned (k+1 of the same n, K+1 in
    the fleet) or a new one (k+1 of n+1, K+1 of N+1). Never above 0 (a probability of at most 1)."""
    anomalous = data.draw(st.integers(0, fleet - 1))
    n = data.draw(st.integers(1, fleet))
    k = data.draw(st.integers(max(0, n - (fleet - anomalous)), min(n, anomalous)))
    tail = log10_upper_tail(fleet, anomalous, np.array([n]), np.array([k]))[0]
    assert tail <= 1e-12
    turned = log10_upper_tail(fleet, anomalous + 1, np.array([n]), np.array([k + 1]))[0] if k < n else -np.inf
    added = log10_upper_tail(fleet + 1, anomalous + 1, np.array([n + 1]), np.array([k + 1]))[0]
    assert turned <= tail + 1e-9
    assert added <= tail + 1e-9

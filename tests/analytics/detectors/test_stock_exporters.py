"""Every detector on what a fleet running only stock exporters sends: dcgm-exporter's default counter set
(plus the fields a test enables) and node_exporter's infiniband and netclass series, with the job and
instance labels remote write adds, and no fleetlens_* series (tests.support.stock). Each fault is found
where the stock series can show it, with the degraded evidence docs/stock-exporters.md describes, and
what they cannot show is asserted missing, not assumed."""

from __future__ import annotations

import itertools
import math
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from analytics.detectors.base import Detector, Finding, Window
from analytics.detectors.congestion import Congestion
from analytics.detectors.dcgm import mask_reasons
from analytics.detectors.dma import DmaDegraded
from analytics.detectors.gpu_fault import GpuFault
from analytics.detectors.gpu_throttle import GpuThrottle
from analytics.detectors.links import LinkDown, LinkFlap
from analytics.detectors.peer_outlier import PeerOutlier
from analytics.detectors.runner import DetectionRunner, detect
from analytics.evidence import DmaDegradedEvidence
from analytics.store import Store
from analytics.store.records import ScrapeBatch
from analytics.xid_catalog import Action, lookup
from collectors.gpu.model import THROTTLE_REASONS
from sim.node import NO_GDR_TRAFFIC
from tests.analytics.detectors import SyncJob, gpu_clock_straggler
from tests.analytics.detectors.test_dma import GDR_LOG, NO_GDR_LOG
from tests.analytics.detectors.test_hostile_inputs import BASE, EXAMPLES, WINDOW_S
from tests.support.fleetdata import SimulatedFleet
from tests.support.stock import CLOCK_EVENT_MASKS, StockExporters

FIXTURE_CHECKS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
EXAMPLE_HOURS = itertools.count(100)  # each example an hour apart, after the hostile suite's


@contextmanager
def stock_fleet(
    store: Store,
    tmp_path: Path,
    fixtures: Path,
    *,
    dcgm_fields: frozenset[str] = frozenset(),
    hw_counters: bool = False,
    **fleet: Any,
) -> Iterator[tuple[SimulatedFleet, StockExporters]]:
    """A simulated fleet whose scrapes reach the store as stock exporters would have sent them; on leaving,
    checks that the store holds nothing else."""
    stock = StockExporters(fixtures, dcgm_fields=dcgm_fields, hw_counters=hw_counters)
    with SimulatedFleet(store, tmp_path, view=stock, **fleet) as simulated:
        yield simulated, stock
    assert_stock_only(store)


def assert_stock_only(store: Store) -> None:
    """No fleetlens_* series, and every series carries the job and instance labels of remote write."""
    [(ours, unlabelled, total)] = store.query(
        "SELECT countIf(startsWith(metric, 'fleetlens_')),"
        " countIf(NOT (mapContains(labels, 'job') AND mapContains(labels, 'instance'))), count()"
        " FROM (SELECT DISTINCT metric, labels FROM metrics)"
    ).rows
    assert (ours, unlabelled) == (0, 0) and total > 0


def by_place(findings: list[Finding]) -> dict[tuple[str, str], Finding]:
    return {(finding.node, finding.component): finding for finding in findings}


def reported(detector: Detector, store: Store, window: Window) -> set[tuple[str, str]]:
    return set(by_place(detector.detect(store, window)))


# -- gpu_fault ---------------------------------------------------------------------------------------------


def test_gpu_faults_from_the_default_counter_set_xid_gauge_remapped_rows_and_a_gpu_gone_silent(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures) as (fleet, _):
        fleet.tick(3)
        fleet["vela-001"].gpus.set_fault(2, "xid", code=48)  # a DBE: hardware
        fleet["vela-002"].gpus.set_fault(1, "gpu_lost")  # DCGM loses it: all its series go
        fleet["vela-003"].gpus.set_fault(0, "ecc", dbe=1)  # no ECC counters by default: remapped rows
        for code in (48, 63, 94, 94):  # a DBE as gpud's real dmesg.0 shows it: the gauge keeps the last
            fleet["vela-003"].gpus.set_fault(0, "xid", code=code)
        fleet["vela-004"].gpus.set_fault(3, "xid", code=13)  # the application's
        onset = by_place(GpuFault().detect(store, fleet.tick()))
        fleet.tick()
        third = by_place(GpuFault().detect(store, fleet.tick()))

    assert set(onset) == {("vela-001", "gpu:2"), ("vela-003", "gpu:0"), ("vela-004", "gpu:3")}
    xid, dbe, app = onset["vela-001", "gpu:2"], onset["vela-003", "gpu:0"], onset["vela-004", "gpu:3"]
    assert (xid.kind, xid.severity, xid.evidence.xid_counts) == ("gpu_fault", "critical", {"48": 1})
    assert (dbe.kind, dbe.evidence.signals, dbe.evidence.xid_counts) == (
        "gpu_fault",
        ("ecc_dbe", "xid"),
        {"94": 1},
    )
    assert (dbe.evidence.uncorrectable_remapped_rows, dbe.evidence.ecc_dbe_errors) == (1, 0)
    assert dbe.evidence.action == max(Action.RESET_GPU, lookup(94).action, key=lambda a: a.rank).value
    assert (app.kind, app.severity, app.evidence.xid_counts) == ("gpu_app_error", "info", {"13": 1})
    # the lost GPU after lost_after_scrapes scrapes without it, with a reboot asked for
    lost = third["vela-002", "gpu:1"]
    assert (lost.kind, lost.severity, lost.evidence.signals) == ("gpu_fault", "critical", ("lost",))
    assert (lost.evidence.silent_scrapes, lost.evidence.action) == (3, "reboot_node")
    assert "lost" not in {
        signal for finding in onset.values() for signal in getattr(finding.evidence, "signals", ())
    }


def test_a_lost_gpu_stays_reported_while_its_node_answers_and_goes_with_its_node(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures, nodes=2) as (fleet, _):
        fleet.tick(2)
        fleet["vela-001"].gpus.set_fault(3, "gpu_lost")
        windows = [fleet.tick() for _ in range(8)]
        gap = fleet.tick(skip={"vela-001"})

        found = [reported(GpuFault(), store, window) for window in windows]
        assert found == [set()] * 2 + [{("vela-001", "gpu:3")}] * 6
        assert reported(GpuFault(), store, gap) == set()  # no other GPU answers: nothing to tell it by


def test_gpus_whose_series_stop_with_their_node_or_start_late_are_not_lost(
    store: Store, tmp_path: Path, fixtures: Path
):
    """A scrape gap, dcgm-exporter down while node_exporter answers, GPUs whose readings come back a scrape
    or two after the others' (DCGM's fields are blank until its watches have a sample), and a GPU first
    seen after its node's others: no lost GPU, no fault at all."""
    with stock_fleet(store, tmp_path, fixtures) as (fleet, stock):
        stock.mute("vela-004", gpu="2")  # first seen later than its node's other GPUs
        windows = [fleet.tick() for _ in range(2)]
        stock.unmute("vela-004", gpu="2")
        windows += [fleet.tick() for _ in range(2)]
        windows += [fleet.tick(skip={"vela-001"}) for _ in range(4)]  # scrape gap
        stock.mute("vela-002")  # dcgm-exporter restarts: no GPU series for a while
        windows += [fleet.tick() for _ in range(4)]
        stock.unmute("vela-002")
        stock.mute("vela-002", gpu="1")
        stock.mute("vela-002", gpu="3")
        windows += [fleet.tick() for _ in range(2)]  # two of its GPUs late after the restart
        stock.unmute("vela-002", gpu="1")
        stock.unmute("vela-002", gpu="3")
        windows += [fleet.tick() for _ in range(3)]

        assert [reported(GpuFault(), store, window) for window in windows] == [set()] * len(windows)
        assert GpuFault(lost_after_scrapes=2).detect(store, windows[-4])  # the late ones would count at 2


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=FIXTURE_CHECKS)
@given(ticks=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=12))
@example(ticks=[(True, True), (True, False), (True, False), (True, False), (True, False)])  # lost
@example(ticks=[(True, True), (False, False), (False, False), (True, False), (True, True)])  # gap, late
@example(ticks=[(True, False), (True, False), (True, False), (True, True), (True, True)])  # first seen late
def test_a_gpu_is_lost_exactly_when_it_missed_enough_scrapes_its_node_answered(
    store: Store, ticks: list[tuple[bool, bool]]
):
    """Any pattern of scrapes of a node (answering or not) and of its GPU 1 in them (answering or not),
    GPU 0 answering whenever its node does: gpu_fault calls GPU 1 lost in a scrape's window exactly when
    its node answered then, GPU 1 did not, and GPU 1 answered before but not in the last
    `lost_after_scrapes` scrapes its node answered in."""
    base = BASE - next(EXAMPLE_HOURS) * 3600
    batches = [
        ScrapeBatch(
            "10.0.0.1:9400",
            "vela-001",
            base + WINDOW_S * tick,
            ["DCGM_FI_DEV_SM_CLOCK"] * (1 + gpu_answers),
            [
                {"gpu": gpu, "job": "dcgm", "instance": "10.0.0.1:9400"}
                for gpu in ("0", "1")[: 1 + gpu_answers]
            ],
            [1980.0] * (1 + gpu_answers),
        )
        for tick, (node_answers, gpu_answers) in enumerate(ticks)
        if node_answers
    ]
    store.insert_samples(batches, token=f"lost-{base}")
    detector = GpuFault()
    for tick, (node_answers, gpu_answers) in enumerate(ticks):
        window = Window(base + WINDOW_S * tick, base + WINDOW_S * (tick + 1))
        earlier = [gpu for up, gpu in ticks[:tick] if up]
        answered_before = any(earlier)
        missed = len(earlier) - max((i + 1 for i, gpu in enumerate(earlier) if gpu), default=0)
        expected = node_answers and not gpu_answers and answered_before
        expected = expected and missed + 1 >= detector.lost_after_scrapes
        assert (("vela-001", "gpu:1") in reported(detector, store, window)) == expected


def test_a_lost_gpu_whose_last_xid_gauge_is_still_served_stays_lost_past_the_lookback(store: Store):
    """dcgm-exporter may keep serving a GPU's last-Xid gauge (it holds its value until a restart) while
    DCGM reads nothing else of it: the gauge keeps the GPU a candidate, and it stays lost."""
    base, detector = BASE - 99 * 3600, GpuFault(lookback_s=60)

    def scrape(tick: int, gpu_1_answers: bool, gpu_1_xid: bool) -> ScrapeBatch:
        target = {"job": "dcgm", "instance": "10.0.0.1:9400"}
        series = [("DCGM_FI_DEV_SM_CLOCK", "0", 1980.0), ("DCGM_FI_DEV_XID_ERRORS", "0", 0.0)]
        series += [("DCGM_FI_DEV_SM_CLOCK", "1", 1980.0)] * gpu_1_answers
        series += [("DCGM_FI_DEV_XID_ERRORS", "1", 79.0 if tick >= 3 else 0.0)] * gpu_1_xid
        return ScrapeBatch(
            target["instance"],
            "vela-001",
            base + WINDOW_S * tick,
            [name for name, _, _ in series],
            [{"gpu": gpu, **target} for _, gpu, _ in series],
            [value for _, _, value in series],
        )

    ticks = range(16)
    store.insert_samples([scrape(tick, tick < 3, tick < 10) for tick in ticks], token=f"sticky-{base}")
    signals = [
        [
            f.evidence.signals
            for f in detector.detect(store, Window(base + WINDOW_S * t, base + WINDOW_S * (t + 1)))
        ]
        for t in ticks
    ]
    # Xid 79 when the gauge turns; silent from tick 3, lost from its third silent scrape while the gauge
    # is served, and for the lookback after the gauge went too (ticks 10-15: its last series at tick 9)
    assert signals == [[]] * 3 + [[("xid",)]] + [[]] + [[("lost",)]] * 11


# -- gpu_throttle ------------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=FIXTURE_CHECKS)
@given(mask=st.one_of(st.integers(0, 2**32 - 1).map(float), st.floats()))
def test_a_reasons_mask_decodes_to_the_names_of_its_nvml_bits_and_anything_else_to_none(
    store: Store, mask: float
):
    [(decoded,)] = store.query(
        f"SELECT {mask_reasons('mask')} FROM (SELECT {{mask:Float64}} AS mask)", parameters={"mask": mask}
    ).rows
    valid = math.isfinite(mask) and 0 <= mask < 2**32
    bits = int(mask) if valid else 0
    assert decoded == [name for name, bit in THROTTLE_REASONS.items() if bits & bit]


@pytest.mark.parametrize("mask", CLOCK_EVENT_MASKS)
def test_throttling_read_from_dcgms_reasons_bitmask_names_its_reasons(
    store: Store, tmp_path: Path, fixtures: Path, mask: str
):
    """DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (before DCGM 3.3) or DCGM_FI_DEV_CLOCKS_EVENT_REASONS enabled."""
    with stock_fleet(store, tmp_path, fixtures, dcgm_fields=frozenset({mask}), gpus=8) as (fleet, _):
        fleet.tick(2)
        fleet["vela-002"].gpus.set_fault(3, "thermal_throttle", temp_c=91, clock_factor=0.7)
        for gpu in range(8):
            fleet["vela-001"].gpus.set_fault(gpu, "power_brake")
        fleet["vela-003"].gpus.set_fault(0, "slow", clock_factor=0.6)  # no reason: no throttling
        found = by_place(GpuThrottle().detect(store, fleet.tick()))

    assert found.keys() == {("vela-002", "gpu:3"), ("vela-001", "")}
    thermal, brake = found["vela-002", "gpu:3"], found["vela-001", ""]
    assert thermal.evidence.reasons == ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown")
    assert thermal.evidence.gpu_temp_c >= 90 and thermal.score == pytest.approx(0.3, abs=0.02)
    assert brake.evidence.reason_names == ("HW Power Brake Slowdown", "HW Slowdown")
    assert brake.evidence.gpus_throttled == 8


def test_without_reasons_a_busy_gpu_far_below_its_peers_is_throttled_for_unknown_reasons(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures, nodes=5, gpus=8) as (fleet, _):
        fleet.set_load("vela-005", 0.0)  # an idle node: its GPUs' clocks are not judged
        fleet.tick(2)
        fleet["vela-002"].gpus.set_fault(3, "thermal_throttle", temp_c=91, clock_factor=0.6)
        for gpu in range(8):
            fleet["vela-001"].gpus.set_fault(gpu, "power_brake")
            fleet["vela-005"].gpus.set_fault(gpu, "power_brake")
        fleet["vela-003"].gpus.set_fault(0, "slow", clock_factor=0.85)  # a power cap's worth: too little
        window = fleet.tick()
        found = by_place(GpuThrottle().detect(store, window))

    assert found.keys() == {("vela-002", "gpu:3"), ("vela-001", "")}
    thermal, brake = found["vela-002", "gpu:3"], found["vela-001", ""]
    assert thermal.evidence.reasons == ("unknown",) and thermal.evidence.gpu_temp_c >= 90
    assert thermal.evidence.sm_clock_mhz < 0.65 * thermal.evidence.peers_sm_clock_mhz
    assert brake.evidence.reasons == ("unknown",) and brake.evidence.gpus_throttled == 8
    assert brake.evidence.gpu_power_w < 0.5 * 600  # a braked node draws little while busy
    assert ("vela-003", "gpu:0") in reported(GpuThrottle(min_unknown_drop=0.1), store, window)


def test_without_reasons_a_node_alone_of_its_model_is_judged_against_its_own_past(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures, nodes=1, gpus=8) as (fleet, _):
        fleet.tick(6)
        for gpu in range(8):
            fleet["vela-001"].gpus.set_fault(gpu, "power_brake")
        [finding] = GpuThrottle().detect(store, fleet.tick())

    assert (finding.node, finding.component, finding.evidence.reasons) == ("vela-001", "", ("unknown",))
    assert finding.evidence.fleet_peers_sm_clock_mhz is None
    assert finding.evidence.sm_clock_mhz < 0.3 * finding.evidence.past_sm_clock_mhz


def test_without_reasons_idle_gpus_at_any_clock_and_an_evenly_loaded_fleet_are_no_throttling(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures, gpus=8) as (fleet, _):
        busy = [fleet.tick() for _ in range(3)]
        for node in fleet.nodes:
            fleet.set_load(node.name, 0.0)
        for gpu in range(8):
            fleet["vela-002"].gpus.set_fault(gpu, "power_brake")  # idle and braked: 86 vs 345 MHz
        idle = [fleet.tick() for _ in range(3)]

        for window in busy + idle:
            assert reported(GpuThrottle(), store, window) == set()
        idle_clocks = GpuThrottle().features(store, idle[-1])
        assert idle_clocks.empty  # not even a candidate: no reason series, not busy


# -- dma_degraded ------------------------------------------------------------------------------------------

PCIE_FIELDS = frozenset(
    {
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
    }
)


@pytest.mark.parametrize(("fields", "found"), [(PCIE_FIELDS, {("vela-004", "gpu:2")}), (frozenset(), set())])
def test_a_downgraded_pcie_link_is_read_from_dcgms_link_fields_and_unseen_without_them(
    store: Store, tmp_path: Path, fixtures: Path, fields: frozenset[str], found: set[tuple[str, str]]
):
    with stock_fleet(store, tmp_path, fixtures, dcgm_fields=fields) as (fleet, _):
        fleet.tick(2)
        fleet["vela-004"].gpus.set_fault(2, "pcie_downgrade", gen=4, width=8, replays_per_second=2.0)
        fleet["vela-001"].gpus.set_fault(0, "pcie_downgrade", gen=3, width=16, replays_per_second=0.0)
        findings = by_place(DmaDegraded().detect(store, fleet.tick()))

    assert set(findings) == found
    for finding in findings.values():
        assert finding.evidence == DmaDegradedEvidence(
            signals=("pcie",), pcie_link="gen4 x8", pcie_max_link="gen5 x16", pcie_replays=20
        )


def test_without_nccl_logs_a_rank_without_gpudirect_rdma_shows_only_as_its_port_moving_less(
    store: Store, tmp_path: Path, fixtures: Path
):
    """The rank's NCCL log says it runs without GPUDirect RDMA, but only fleetlens reads NCCL logs."""
    with stock_fleet(store, tmp_path, fixtures, gpus=1) as (fleet, _):
        for node in fleet.nodes:
            node.job = "llm"
            log = NO_GDR_LOG if node.name == "vela-002" else GDR_LOG
            shutil.copy(fixtures / "nccl" / log, node.nccl_dir / "rank.log")
        fleet["vela-002"].sysfs.set_traffic(0, NO_GDR_TRAFFIC)  # its messages staged through host memory
        [finding] = DmaDegraded().detect(store, fleet.tick(2))

    assert (finding.kind, finding.node, finding.component, finding.job) == (
        "dma_degraded",
        "vela-002",
        "mlx5_0:1",
        "llm",
    )
    assert finding.evidence.signals == ("roce_bytes",)  # no `nccl` signal: no verdict on GPUDirect RDMA
    assert finding.evidence.roce_ratio == pytest.approx(NO_GDR_TRAFFIC, abs=0.1)
    assert finding.evidence.transmit_wait_per_s == 0  # node_exporter 1.5 reads no ECN counters


# -- congestion, and what dma_degraded makes of it ---------------------------------------------------------


@pytest.mark.parametrize(("hw_counters", "signal"), [(False, "transmit_wait"), (True, "notifications")])
def test_a_congested_port_is_congestion_with_or_without_ecn_counters_and_no_dma_fault(
    store: Store, tmp_path: Path, fixtures: Path, hw_counters: bool, signal: str
):
    """node_exporter 1.5 reads no hw_counters (no ECN marks or CNPs): transmit wait tells instead."""
    with stock_fleet(store, tmp_path, fixtures, gpus=1, hw_counters=hw_counters) as (fleet, _):
        for node in fleet.nodes:
            node.job = "llm"
        fleet.tick(2)
        fleet["vela-003"].sysfs.set_congestion(1, 1.0)  # throughput halved
        window = fleet.tick()

        [finding] = Congestion().detect(store, window)
        ports = DmaDegraded().features(store, window).set_index(["node", "component"])
        assert DmaDegraded().detect(store, window) == []
        assert reported(
            DmaDegraded(max_transmit_wait_per_s=math.inf, max_ecn_marks_per_s=math.inf), store, window
        )

    assert (finding.kind, finding.node, finding.component, finding.severity) == (
        "congestion",
        "vela-003",
        "mlx5_1:1",
        "info",
    )
    assert finding.evidence.signal == signal and finding.score >= Congestion().min_score
    assert ports.loc[("vela-003", "mlx5_1:1"), "has_ecn"] == hw_counters


def test_a_quiet_or_evenly_congested_fabric_without_ecn_counters_is_no_congestion(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures, gpus=0) as (fleet, _):
        quiet = [fleet.tick() for _ in range(3)]
        for node in fleet.nodes:
            for nic in range(2):
                node.sysfs.set_congestion(nic, 0.5)
        everywhere = [fleet.tick() for _ in range(3)]
        fleet.restart("vela-002")
        restarted = [fleet.tick() for _ in range(2)]

        for window in quiet + everywhere + restarted:
            assert reported(Congestion(), store, window) == set()


# -- link_flap and link_down -------------------------------------------------------------------------------


def test_flaps_and_a_link_down_are_found_on_node_exporters_series(
    store: Store, tmp_path: Path, fixtures: Path
):
    with stock_fleet(store, tmp_path, fixtures, gpus=0) as (fleet, _):
        fleet.tick(3)
        fleet["vela-002"].sysfs.set_link(1, up=False)  # down and back between two scrapes
        fleet["vela-002"].sysfs.set_link(1, up=True)
        fleet["vela-004"].sysfs.set_link(0, up=False)
        flapped = fleet.tick()
        down = [fleet.tick() for _ in range(6)]
        gap = [fleet.tick(skip={"vela-001"}) for _ in range(3)] + [fleet.tick()]

        [flap] = LinkFlap().detect(store, flapped)
        assert (flap.node, flap.component, flap.evidence.link_downed) == ("vela-002", "mlx5_1:1", 1)
        assert reported(LinkDown(), store, down[-1]) == {("vela-004", "mlx5_0:1")}
        for window in gap:
            assert reported(LinkFlap(), store, window) == set()
            assert reported(LinkDown(), store, window) == {("vela-004", "mlx5_0:1")}


# -- slow_node and peer_outlier ----------------------------------------------------------------------------


def test_without_phase_times_the_slow_node_is_found_by_its_stock_sm_clocks(
    store: Store, tmp_path: Path, fixtures: Path
):
    """Step records come from the step SDK or OTLP, never from an exporter; the GPU signal is stock."""
    with stock_fleet(store, tmp_path, fixtures, nodes=8) as (fleet, _):
        start = gpu_clock_straggler(fleet, store)
    (anomaly,) = detect(store, start, start + 100, names=["slow_node"])
    evidence = anomaly.evidence
    assert (anomaly.node, anomaly.kind, evidence.signal) == ("vela-003", "slow_node", "sm_clock_mhz")
    assert evidence.ratio == pytest.approx(1 / 0.85, abs=0.02)
    assert evidence.power_w < evidence.peer_power_w


def test_a_node_unlike_its_peers_on_stock_series_is_a_peer_outlier_and_no_node_is_without_steps(
    store: Store, tmp_path: Path, fixtures: Path
):
    nodes, ticks = 16, 10
    with stock_fleet(store, tmp_path, fixtures, nodes=nodes) as (fleet, _):
        start = fleet.clock() + fleet.interval_s
        fleet.tick(2)
        for gpu in range(4):
            fleet["vela-005"].gpus.set_fault(gpu, "thermal_throttle")
        fleet.tick(ticks - 2)
    span = (start, start + ticks * fleet.interval_s)
    assert DetectionRunner([PeerOutlier()]).run(store, *span) == []  # no step records: no job, no peers

    store.insert_steps(SyncJob(nodes=nodes).steps(start, ticks * fleet.interval_s), token="steps")
    (anomaly,) = DetectionRunner([PeerOutlier()]).run(store, *span)
    drivers = {driver.feature for driver in anomaly.evidence.features}
    assert (anomaly.node, anomaly.kind, anomaly.job) == ("vela-005", "peer_outlier", "llm")
    assert {"sm_clock_mhz", "gpu_temp_c"} <= drivers

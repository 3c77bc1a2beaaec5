"""No detector raises on any table of steps and samples the store can hold (hypothesis, every registered
detector, next to the conformance test): missing phases and topology, one node or one stage, duplicate
ranks, a node hosting ranks of two stages, zero and huge durations, aggregated OTLP rows, NaN and infinite
samples, labels missing or odd (Xid codes that are no number or no Xid), and records that stop mid-window.

Each example writes its rows an hour apart from every other example's into one store, so examples do not
see each other. Bounded for `make test`; FLEETLENS_FUZZ_EXAMPLES sets the count for a longer run.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors import registered
from analytics.detectors.base import Window
from analytics.detectors.runner import DetectionRunner
from analytics.store import Store
from analytics.store.records import ScrapeBatch
from collectors.steprecord import StepRecord

EXAMPLES = int(os.environ.get("FLEETLENS_FUZZ_EXAMPLES", "12"))
WINDOW_S = 10.0
SPAN_S = 3 * WINDOW_S
BASE = time.time() // 3600 * 3600 - 3 * 86400  # recent enough for every retention
NODES = ("vela-001", "vela-002", "vela-003", "vela-004")
METRICS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_PCIE_LINK_GEN",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "fleetlens_gpu_up",
    "fleetlens_gpu_xid_errors_total",
    "fleetlens_gpu_clock_throttle_reason",
    "fleetlens_gpu_pcie_link_generation",
    "fleetlens_gpu_pcie_max_link_generation",
    "fleetlens_gpu_pcie_link_width",
    "fleetlens_gpu_pcie_max_link_width",
    "fleetlens_nccl_gpudirect_rdma_status",
    "fleetlens_nccl_connections",
    "fleetlens_nccl_net_device_info",
    "node_infiniband_port_data_received_bytes_total",
    "node_infiniband_port_data_transmitted_bytes_total",
    "node_infiniband_link_downed_total",
    "node_infiniband_state_id",
    "node_infiniband_physical_state_id",
    "node_infiniband_np_cnp_packets_sent_total",
    "node_infiniband_np_ecn_marked_roce_packets_received_total",
    "node_infiniband_rp_cnp_packets_handled_total",
    "node_infiniband_port_transmit_wait_total",
    "node_infiniband_symbol_error_total",
    "node_infiniband_port_errors_received_total",
    "node_infiniband_link_error_recovery_total",
    "node_infiniband_port_packets_received_total",
    "node_network_carrier",
    "node_network_carrier_down_changes_total",
)
LABEL_VALUES = st.sampled_from(
    ["0", "1", "7", "mlx5_0", "eth0", "", "hw_slowdown", "yes", "NET/IB/GDRDMA", "x y"]
)
# Xid codes as the xid collector's `xid` label may hold them, and what a broken exporter might send
XID_LABELS = st.one_of(
    st.sampled_from(["13", "48", "79", "119", "-1", "99999999999999999999", "1e3", " 31", "abc"]),
    st.integers(-(2**63), 2**64).map(str),
)
LABELS = st.dictionaries(
    st.sampled_from(
        [
            "gpu",
            "UUID",
            "device",
            "port",
            "reason",
            "status",
            "transport",
            "via",
            "netdev",
            "pci_bus_id",
            "source",
        ]
    ),
    st.one_of(LABEL_VALUES, st.sampled_from(["00000000:19:00.0", "nvml", "kernel_log"])),
    max_size=4,
)
LABELS = st.tuples(LABELS, st.dictionaries(st.just("xid"), XID_LABELS, max_size=1)).map(
    lambda pair: {**pair[0], **pair[1]}
)
DURATIONS = st.one_of(
    st.sampled_from([0.0, 1e-9, 0.05, 1.0, 46.0, 600.0, 1e6]), st.floats(0, 1e4, allow_nan=False)
)
OPTIONAL_INT = st.one_of(st.none(), st.integers(0, 3))
VALUES = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e18]),
    st.floats(allow_nan=True, allow_infinity=True),
)
examples = itertools.count()


@st.composite
def step_records(draw: st.DrawFn, base: float) -> StepRecord:
    duration = draw(DURATIONS)
    compute = draw(st.one_of(st.none(), DURATIONS))
    return StepRecord(
        ts=base + draw(st.floats(0, SPAN_S - 0.001)),
        job=draw(st.sampled_from(["llm", "llm", "eval"])),
        rank=draw(st.integers(0, 9)),
        node=draw(st.sampled_from(NODES)),
        step=draw(st.integers(0, 12)),
        duration_s=duration,
        compute_s=compute,
        comm_s=draw(st.one_of(st.none(), DURATIONS)),
        dp_rank=draw(OPTIONAL_INT),
        pp_stage=draw(OPTIONAL_INT),
        tp_rank=draw(OPTIONAL_INT),
        steps=draw(st.sampled_from([1, 1, 1, 5])),
        source="jsonl",
    )


@st.composite
def scrapes(draw: st.DrawFn, base: float) -> list[ScrapeBatch]:
    samples = draw(
        st.lists(
            st.tuples(
                st.sampled_from(NODES),
                st.integers(0, int(SPAN_S) - 1),
                st.sampled_from(METRICS),
                LABELS,
                VALUES,
            ),
            max_size=80,
        )
    )
    batches: dict[tuple[str, int], ScrapeBatch] = defaultdict(lambda: ScrapeBatch("", "", 0.0, [], [], []))
    for node, offset, metric, labels, value in samples:
        batch = batches[(node, offset)]
        if not batch.target:
            batch = batches[(node, offset)] = ScrapeBatch(f"{node}:9400", node, base + offset, [], [], [])
        batch.names.append(metric)
        batch.labels.append(labels)
        batch.values.append(value)
    return list(batches.values())


@st.composite
def fleets(draw: st.DrawFn) -> tuple[float, list[StepRecord], list[ScrapeBatch]]:
    base = BASE - next(examples) * 7200  # an hour from every other example's rows, both ways
    return base, draw(st.lists(step_records(base), max_size=60)), draw(scrapes(base))


@pytest.mark.parametrize("name", sorted(registered()))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(fleet=fleets())
def test_no_detector_raises_on_any_table_the_store_can_hold(
    name: str, store: Store, fleet: tuple[float, list[StepRecord], list[ScrapeBatch]]
) -> None:
    base, steps, batches = fleet
    store.insert_steps(steps, token=f"steps-{base}")
    store.insert_samples(batches, token=f"samples-{base}")
    detector = registered()[name]()
    for index in range(-1, 4):  # before, during and after the rows: lookbacks reach back into them
        window = Window(base + index * WINDOW_S, base + (index + 1) * WINDOW_S)
        features = detector.features(store, window)
        if len(features):
            assert np.isfinite(detector.score(features)).all()
        detector.judge(store, window)  # features -> score -> findings, as the runner calls them
    runner = DetectionRunner([registered()[name]()])
    runner.run(store, base - WINDOW_S, base + SPAN_S + WINDOW_S)
    assert runner.failures == {}


@pytest.mark.parametrize("name", sorted(registered()))
def test_the_index_error_of_the_real_job_regression(name: str, store: Store) -> None:
    """The smallest input hypothesis found that raised, in slow_node, the IndexError ("cannot do a
    non-empty take from an empty axes") the real 16-node job raised in 44 windows: one node of a job in
    the window, its rows with and without phase times."""
    base = BASE + 7200
    row = StepRecord(ts=base, job="llm", rank=0, node="vela-001", step=0, duration_s=0.0)
    store.insert_steps([row, replace(row, compute_s=1e-9)], token="regression")
    runner = DetectionRunner([registered()[name]()])
    assert runner.run(store, base, base + WINDOW_S) == []
    assert runner.failures == {}

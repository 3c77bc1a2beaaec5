"""The fleet simulator: scenarios played through the real exporter, scraper, hub and store.

Simulated time starts yesterday at midnight (UTC): the store's retention drops older rows on insert.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from analytics.store import Store
from sim.node import SCRAPE_GAP_ERROR
from sim.offline import simulate_offline
from sim.online import simulate_online
from sim.scenario import Scenario, parse_scenario

EPOCH = (time.time() // 86_400 - 1) * 86_400

SMALL = {
    "seed": 11,
    "duration_s": 120,
    "interval_s": 10,
    "fleet": {"nodes": 3},
    "jobs": [{"name": "llm", "nodes": 3, "step_s": 2.0, "tp": 8}],
    "faults": [
        {"kind": "slow_node", "node": "vela-002", "start_s": 30, "end_s": 90, "severity": 0.2},
        {"kind": "link_flap", "node": "vela-003", "nic": 1, "start_s": 40, "flaps": 2, "period_s": 20},
        {"kind": "xid", "node": "vela-001", "gpu": 2, "code": 79, "start_s": 50},
    ],
    "confounders": [{"kind": "scrape_gap", "node": "vela-001", "start_s": 60, "end_s": 80}],
}

EVERY_KIND = {
    "seed": 5,
    "duration_s": 240,
    "interval_s": 10,
    "fleet": {"nodes": 6},
    "jobs": [{"name": "llm", "nodes": 6, "step_s": 2.0, "pp": 2, "tp": 8}],  # stage 0: vela-001..003
    "faults": [
        {"kind": "slow_node", "node": "vela-002", "start_s": 60, "end_s": 180, "severity": 0.2},
        {"kind": "thermal_throttle", "node": "vela-003", "gpu": 3, "start_s": 60, "end_s": 180},
        {"kind": "link_flap", "node": "vela-004", "nic": 2, "start_s": 60, "flaps": 3, "period_s": 20},
        {"kind": "link_down", "node": "vela-005", "nic": 0, "start_s": 100, "end_s": 160},
        {"kind": "dma_degraded", "node": "vela-006", "nic": 1, "start_s": 60, "end_s": 200, "mode": "no_gdr"},
        {"kind": "dma_degraded", "node": "vela-001", "gpu": 5, "start_s": 60, "mode": "pcie_downgrade"},
        {"kind": "gpu_lost", "node": "vela-003", "gpu": 6, "start_s": 150},
        {"kind": "xid", "node": "vela-001", "gpu": 2, "code": 48, "start_s": 90},
        {"kind": "xid_storm", "node": "vela-005", "start_s": 60, "end_s": 120, "events": 120},
        {"kind": "dbe_remap", "node": "vela-006", "gpu": 4, "start_s": 90, "end_s": 180},
        {"kind": "congestion", "node": "vela-002", "nic": 3, "start_s": 100, "end_s": 200},
    ],
    "confounders": [
        {"kind": "scrape_gap", "node": "vela-004", "start_s": 170, "end_s": 200},
        {"kind": "exporter_restart", "node": "vela-005", "at_s": 200},
        {"kind": "job_restart", "job": "llm", "at_s": 200, "down_s": 30},
    ],
}


def scenario(document: dict) -> Scenario:
    return parse_scenario(document, "test")


def open_store(chdb_dir: Path) -> Store:
    """Another database on the session's chDB, for a second run beside the `store` fixture's."""
    return Store.open(f"chdb://{chdb_dir}", database=f"test_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def other_store(chdb_dir: Path) -> Iterator[Store]:
    with open_store(chdb_dir) as opened:
        yield opened


@pytest.fixture(scope="module")
def every_kind(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """The store after one offline run of EVERY_KIND, shared by the tests that look at one effect each."""
    with open_store(chdb_dir) as opened:
        simulate_offline(scenario(EVERY_KIND), opened, tmp_path_factory.mktemp("every_kind"), EPOCH)
        yield opened


def all_rows(store: Store) -> dict[str, list[tuple]]:
    """Every stored sample and step, and every target row without its (real) duration."""
    queries = {
        "samples": "SELECT metric, node, labels, ts, value FROM metrics"
        " ORDER BY metric, node, toString(labels), ts",
        "steps": "SELECT * FROM steps ORDER BY ts, job, rank",
        "targets": "SELECT ts, target, node, up, samples, error FROM targets ORDER BY ts, node",
    }
    return {table: store.query(sql, max_rows=1_000_000).rows for table, sql in queries.items()}


def series(store: Store, metric: str, node: str, **labels: str) -> dict[float, float]:
    """One series as {simulated second: value}."""
    where = "".join(f" AND labels[{{k{i}:String}}] = {{v{i}:String}}" for i in range(len(labels)))
    parameters = {"metric": metric, "node": node, "epoch": EPOCH}
    for i, (name, value) in enumerate(labels.items()):
        parameters |= {f"k{i}": name, f"v{i}": value}
    rows = store.query(
        "SELECT toUnixTimestamp64Milli(ts) / 1000 - {epoch:Float64}, value FROM metrics"
        f" WHERE metric = {{metric:String}} AND node = {{node:String}}{where} ORDER BY ts",
        parameters=parameters,
    ).rows
    return dict(rows)


def during(values: dict[float, float], start: float, end: float) -> list[float]:
    return [value for t, value in values.items() if start <= t < end]


def increase(values: dict[float, float], start: float, end: float) -> float:
    inside = during(values, start, end)
    return inside[-1] - inside[0]


# -- the same rows online and offline, run after run ------------------------------------------------------


def test_online_and_offline_store_the_same_rows(store, other_store, tmp_path):
    online = simulate_online(scenario(SMALL), store, tmp_path, speed=0, epoch=EPOCH)
    offline = simulate_offline(scenario(SMALL), other_store, tmp_path, EPOCH)

    rows = all_rows(store)
    assert rows == all_rows(other_store)
    assert (online.ticks, online.samples, online.steps, online.targets_down) == (
        offline.ticks,
        offline.samples,
        offline.steps,
        offline.targets_down,
    )
    assert offline.ticks == 13 and offline.targets_down == 2
    assert len(rows["samples"]) == offline.samples > 13 * 3 * 500
    assert len(rows["steps"]) == offline.steps > 0
    assert {row[1] for row in rows["targets"]} == {"vela-001:9612", "vela-002:9612", "vela-003:9612"}
    assert store.query("SELECT max(value) FROM metrics WHERE metric LIKE '%collector_duration%'").rows == [
        (0.0,)
    ]


def test_the_same_scenario_gives_the_same_rows_however_many_worker_processes(store, other_store, tmp_path):
    simulate_offline(scenario(SMALL), store, tmp_path, EPOCH, workers=1)
    simulate_offline(scenario(SMALL), other_store, tmp_path, EPOCH, workers=2)

    assert all_rows(store) == all_rows(other_store)


def test_per_round_inserts_store_the_same_rows_each_round_in_a_part_of_its_own(store, other_store, tmp_path):
    """What bench/detect.py relies on for a store laid out as the hub's: one part per scrape round, until
    merges join ten of them; gathered rows land in fewer parts, many rounds each."""
    played = simulate_offline(scenario(SMALL), store, tmp_path, EPOCH, workers=1, per_round=True)
    simulate_offline(scenario(SMALL), other_store, tmp_path, EPOCH, workers=1)

    assert all_rows(store) == all_rows(other_store)
    rounds_per_part = "SELECT _part, uniqExact(ts) FROM samples GROUP BY _part ORDER BY _part"
    per_round, gathered = store.query(rounds_per_part).rows, other_store.query(rounds_per_part).rows
    assert sum(rounds for _, rounds in per_round) == played.ticks == 13
    assert len(per_round) >= 4 and all(rounds == 1 for part, rounds in per_round if part.endswith("_0"))
    assert gathered == [(gathered[0][0], played.ticks)]


# -- every fault and confounder shows in the stored rows ---------------------------------------------------


def test_link_flap_counts_each_flap_on_its_port(every_kind):
    downed = series(every_kind, "node_infiniband_link_downed_total", "vela-004", device="mlx5_2", port="1")
    assert increase(downed, 0, 170) == 3
    changes = series(every_kind, "node_network_carrier_changes_total", "vela-004", device="ens3f0np0")
    assert increase(changes, 0, 170) == 6
    other = series(every_kind, "node_infiniband_link_downed_total", "vela-004", device="mlx5_1", port="1")
    assert increase(other, 0, 170) == 0


def test_link_down_keeps_the_port_down_for_its_span(every_kind):
    state = series(every_kind, "node_infiniband_state_id", "vela-005", device="mlx5_0", port="1")
    assert {t for t, value in state.items() if value == 1} == {100, 110, 120, 130, 140, 150}
    assert set(state.values()) == {1, 4}


def test_slow_node_computes_slower_than_its_stage_peers_with_lower_clocks(every_kind):
    compute = dict(
        every_kind.query(
            "SELECT node, avg(compute_s) FROM steps WHERE node IN ('vela-001', 'vela-002')"
            " AND ts > {start:DateTime64(3)} AND ts <= {end:DateTime64(3)} GROUP BY node",
            parameters={"start": EPOCH + 70, "end": EPOCH + 180},
        ).rows
    )
    assert compute["vela-002"] / compute["vela-001"] == pytest.approx(1.2, abs=0.01)
    durations_per_step = every_kind.query("SELECT uniqExact(duration_s) FROM steps GROUP BY ts").rows
    assert {count for (count,) in durations_per_step} == {1}, "every rank of a step waits for the slowest"
    slow_clock = series(every_kind, "DCGM_FI_DEV_SM_CLOCK", "vela-002", gpu="0")
    peer_clock = series(every_kind, "DCGM_FI_DEV_SM_CLOCK", "vela-001", gpu="0")
    assert max(during(slow_clock, 60, 180)) < 0.9 * min(during(peer_clock, 60, 180))


def test_thermal_throttle_sets_thermal_reasons_on_that_gpu(every_kind):
    def reason(gpu: str) -> dict[float, float]:
        return series(
            every_kind,
            "fleetlens_gpu_clock_throttle_reason",
            "vela-003",
            gpu=gpu,
            reason="hw_thermal_slowdown",
        )

    assert set(during(reason("3"), 60, 180)) == {1} and set(during(reason("3"), 180, 200)) == {0}
    assert set(reason("2").values()) == {0}


def test_no_gdr_shows_in_nccl_logs_roce_traffic_and_pcie(every_kind):
    def gdr(gpu: str, status: str) -> dict[float, float]:
        return series(
            every_kind, "fleetlens_nccl_gpudirect_rdma_status", "vela-006", cuda_device=gpu, status=status
        )

    assert set(during(gdr("2", "no"), 60, 200)) == {1} and set(during(gdr("2", "yes"), 0, 60)) == {1}
    assert set(during(gdr("0", "yes"), 0, 200)) == {1}
    assert set(during(gdr("2", "yes"), 230, 240)) == {1}, "GPUDirect RDMA again once the job restarted"

    def received(nic: int) -> float:
        name = "node_infiniband_port_data_received_bytes_total"
        return increase(series(every_kind, name, "vela-006", device=f"mlx5_{nic}", port="1"), 60, 200)

    assert received(1) < 0.7 * received(0)
    pcie = {gpu: series(every_kind, "DCGM_FI_PROF_PCIE_TX_BYTES", "vela-006", gpu=gpu) for gpu in "02"}
    assert min(during(pcie["2"], 60, 200)) > 1.5 * max(during(pcie["0"], 60, 200))


def test_pcie_downgrade_lowers_the_link_and_grows_replays(every_kind):
    generation = series(every_kind, "fleetlens_gpu_pcie_link_generation", "vela-001", gpu="5")
    maximum = series(every_kind, "fleetlens_gpu_pcie_max_link_generation", "vela-001", gpu="5")
    assert max(during(generation, 60, 240)) < min(maximum.values()) == max(during(generation, 0, 60))
    replays = series(every_kind, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "vela-001", gpu="5")
    assert increase(replays, 0, 60) == 0 < increase(replays, 60, 240)


def test_gpu_faults_show_as_xids_and_a_lost_gpu(every_kind):
    xid = series(every_kind, "fleetlens_gpu_xid_errors_total", "vela-001", gpu="2", xid="48", source="nvml")
    assert min(xid) == 90 and set(xid.values()) == {1}
    up = series(every_kind, "fleetlens_gpu_up", "vela-003", gpu="6")
    assert {t for t, value in up.items() if value == 0} == {t for t in up if t >= 150}
    lost = series(every_kind, "fleetlens_gpu_xid_errors_total", "vela-003", gpu="6", xid="79", source="nvml")
    assert min(lost) == 150


def test_an_xid_storm_spreads_application_xids_over_the_gpus_within_its_span(every_kind):
    counts = {
        (gpu, xid): series(
            every_kind, "fleetlens_gpu_xid_errors_total", "vela-005", gpu=str(gpu), xid=str(xid)
        )
        for gpu in range(8)
        for xid in (13, 31, 43)
    }
    assert sum(max(values.values(), default=0) for values in counts.values()) == 120
    assert all(60 <= min(values) <= 120 for values in counts.values() if values)
    assert {xid for (_, xid), values in counts.items() if values} == {13, 31, 43}


def test_a_double_bit_error_shows_as_a_real_gpu_reported_it_until_the_reset(every_kind):
    xids = {
        xid: series(every_kind, "fleetlens_gpu_xid_errors_total", "vela-006", gpu="4", xid=str(xid))
        for xid in (48, 63, 94)
    }
    assert {xid: (min(values), max(values.values())) for xid, values in xids.items()} == {
        48: (90, 1),
        63: (90, 1),
        94: (90, 9),
    }
    for metric in ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"):
        values = series(every_kind, metric, "vela-006", gpu="4")
        assert (increase(values, 0, 90), increase(values, 80, 240)) == (0, 1), metric
    pending = series(every_kind, "fleetlens_gpu_row_remap_pending", "vela-006", gpu="4")
    assert {t for t, value in pending.items() if value == 1} == {t for t in pending if 90 <= t < 180}


def test_congestion_marks_packets_on_its_port(every_kind):
    name = "node_infiniband_np_ecn_marked_roce_packets_received_total"
    congested = series(every_kind, name, "vela-002", device="mlx5_3", port="1")
    calm = series(every_kind, name, "vela-002", device="mlx5_2", port="1")
    assert increase(congested, 100, 200) > 1000 * max(increase(calm, 100, 200), 1)


def test_scrape_gap_stores_down_targets_and_no_samples(every_kind):
    down = every_kind.query(
        "SELECT toUnixTimestamp64Milli(ts) / 1000 - {epoch:Float64}, node, error, samples FROM targets"
        " WHERE NOT up ORDER BY ts",
        parameters={"epoch": EPOCH},
    ).rows
    assert down == [(t, "vela-004", SCRAPE_GAP_ERROR, 0) for t in (170.0, 180.0, 190.0)]
    assert set(series(every_kind, "DCGM_FI_DEV_GPU_TEMP", "vela-004", gpu="0")).isdisjoint({170, 180, 190})


def test_exporter_restart_starts_the_counters_over(every_kind):
    received = series(
        every_kind, "node_infiniband_port_data_received_bytes_total", "vela-005", device="mlx5_1", port="1"
    )
    assert received[200] < received[190] / 10
    assert received[190] > received[180]


def test_job_restart_idles_the_fleet_and_pauses_steps(every_kind):
    ends = every_kind.query(
        "SELECT DISTINCT toUnixTimestamp64Milli(ts) / 1000 - {epoch:Float64} FROM steps",
        parameters={"epoch": EPOCH},
    ).rows
    assert not [t for (t,) in ends if 200 < t < 230]
    utilization = series(every_kind, "DCGM_FI_DEV_GPU_UTIL", "vela-001", gpu="0")
    assert set(during(utilization, 200, 230)) == {0} and set(during(utilization, 0, 200)) == {95}

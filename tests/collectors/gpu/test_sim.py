"""The simulated GPU backend: plausible against real captures, deterministic, and faults that show."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors import registry
from collectors.base import CollectorOptions, ReadErrors
from collectors.gpu.collector import GpuCollector
from collectors.gpu.model import GpuSample, XidEvent
from collectors.gpu.sim import ManualClock, SimBackend
from tests.support.exposition import samples_of


def capture_rows(fixtures: Path, gpu: str) -> dict[str, dict[str, str]]:
    """The idle and the load `nvidia-smi --query-gpu` row of an nvidia_gpu_exporter capture."""
    capture = fixtures / "nvidia_gpu_exporter" / f"linux-x86_64__nvidia-{gpu}__590.48.01.txt"
    lines = capture.read_text().splitlines()
    rows = {}
    for number, line in enumerate(lines):
        for phase in ("idle", "load"):
            if line.startswith(f"# {phase} :: query-gpu"):
                header, values = lines[number + 3], lines[number + 4]
                rows[phase] = dict(zip(header.split(", "), values.split(", "), strict=True))
    return rows


def number(text: str) -> float:
    return float(text.split()[0])


def sample(sim: SimBackend, gpu: int = 0) -> GpuSample:
    reading = sim.read()[gpu]
    assert reading.sample is not None
    return reading.sample


@pytest.mark.parametrize(("model", "capture"), [("h100", "h100-80gb-hbm3"), ("h200", "h200")])
def test_idle_and_busy_gpus_look_like_the_real_captures(fixtures, model, capture):
    sim = SimBackend(count=8, seed=5, model=model, clock=ManualClock())
    for phase, row in capture_rows(fixtures, capture).items():
        sim.set_load(None, 0.0 if phase == "idle" else 1.0)
        for gpu, reading in enumerate(sim.read()):
            got, where = reading.sample, (phase, gpu)
            assert reading.identity.model_name == row["name"]
            assert got.sm_clock_mhz == number(row["clocks.current.sm [MHz]"]), where
            assert got.memory_clock_mhz == number(row["clocks.current.memory [MHz]"]), where
            assert got.power_w == pytest.approx(number(row["power.draw [W]"]), rel=0.04), where
            assert got.gpu_temp_c == pytest.approx(number(row["temperature.gpu"]), abs=4), where
            assert got.memory_temp_c == pytest.approx(number(row["temperature.memory"]), abs=3), where
            assert got.gpu_util_percent == number(row["utilization.gpu [%]"]), where
            assert got.mem_copy_util_percent == number(row["utilization.memory [%]"]), where
            assert got.fb_used_mib == number(row["memory.used [MiB]"]), where
            assert got.fb_reserved_mib == number(row["memory.reserved [MiB]"]), where
            assert got.fb_free_mib == pytest.approx(number(row["memory.free [MiB]"]), abs=1), where
            assert got.clock_throttle_reasons == int(row["clocks_event_reasons.active"], 16), where
            assert got.pcie_link_gen == got.pcie_max_link_gen == number(row["pcie.link.gen.max"])
            assert got.pcie_link_width == got.pcie_max_link_width == number(row["pcie.link.width.max"])


def drive(sim: SimBackend, clock: ManualClock) -> list:
    """A short scripted day in a node's life; returns every reading along the way."""
    readings = [sim.read()]
    sim.set_load(None, 0.8)
    clock.advance(12.5)
    readings.append(sim.read())
    sim.set_fault(3, "thermal_throttle")
    sim.set_fault(5, "pcie_downgrade")
    clock.advance(7)
    readings.append(sim.read())
    sim.set_fault(6, "gpu_lost")
    sim.clear_fault(3, "thermal_throttle")
    clock.advance(30)
    readings.append(sim.read())
    return readings


def test_same_seed_same_readings_other_seed_other_gpus():
    runs = [
        drive(SimBackend(seed=seed, clock=clock), clock) for seed in (4, 4, 5) for clock in [ManualClock()]
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert {r.identity.uuid for r in runs[0][0]}.isdisjoint({r.identity.uuid for r in runs[2][0]})


def test_counters_grow_monotonically_and_energy_integrates_power():
    clock = ManualClock()
    sim = SimBackend(count=2, seed=1, clock=clock)
    sim.set_load(None, 1.0)
    sim.set_fault(1, "pcie_downgrade", replays_per_second=2.0)
    sim.set_fault(1, "ecc", sbe_per_second=1.0, dbe=0)
    before = sample(sim, 1)
    clock.advance(100)
    after = sample(sim, 1)
    assert after.energy_mj - before.energy_mj == pytest.approx(after.power_w * 100 * 1000, rel=0.03)
    assert after.pcie_replays - before.pcie_replays == 200
    assert after.ecc_sbe_volatile - before.ecc_sbe_volatile == 100
    assert after.nvlink_bandwidth_bytes > before.nvlink_bandwidth_bytes
    sim.set_load(None, 0.0)
    clock.advance(1)
    assert sample(sim, 1).energy_mj > after.energy_mj
    assert sample(sim, 0).pcie_replays == 0


def scrape(sim: SimBackend) -> dict[str, dict[str, float]]:
    """{metric: {gpu (or gpu/reason): value}} of one gpu collector scrape."""
    found: dict[str, dict[str, float]] = {}
    for name, samples in samples_of(GpuCollector(sim, "n", ReadErrors("gpu"))).items():
        for s in samples:
            key = "/".join(filter(None, (s.labels["gpu"], s.labels.get("reason"))))
            found.setdefault(name, {})[key] = s.value
    return found


def busy(count: int = 4) -> tuple[SimBackend, ManualClock]:
    clock = ManualClock()
    sim = SimBackend(count=count, seed=2, clock=clock)
    sim.set_load(None, 1.0)
    return sim, clock


def test_thermal_throttle_heats_one_gpu_cuts_its_clock_and_sets_thermal_reasons():
    sim, _ = busy()
    sim.set_fault(2, "thermal_throttle", temp_c=92)
    metrics = scrape(sim)
    assert metrics["DCGM_FI_DEV_GPU_TEMP"]["2"] >= 91
    assert max(metrics["DCGM_FI_DEV_GPU_TEMP"][gpu] for gpu in "013") < 70
    clocks = metrics["DCGM_FI_DEV_SM_CLOCK"]
    assert clocks["2"] < 0.7 * clocks["0"] and clocks["0"] == clocks["1"] == clocks["3"]
    active = {key for key, on in metrics["fleetlens_gpu_clock_throttle_reason"].items() if on}
    assert active == {"2/hw_slowdown", "2/hw_thermal_slowdown", "2/sw_thermal_slowdown"}

    sim.clear_fault(2, "thermal_throttle")
    assert not any(scrape(sim)["fleetlens_gpu_clock_throttle_reason"].values())


def test_a_slow_gpu_has_lower_clocks_and_power_but_reports_no_reason():
    sim, _ = busy()
    sim.set_fault(1, "slow", clock_factor=0.5)
    metrics = scrape(sim)
    assert metrics["DCGM_FI_DEV_SM_CLOCK"]["1"] == metrics["DCGM_FI_DEV_SM_CLOCK"]["0"] / 2
    assert metrics["DCGM_FI_DEV_POWER_USAGE"]["1"] < 0.7 * metrics["DCGM_FI_DEV_POWER_USAGE"]["0"]
    assert not any(metrics["fleetlens_gpu_clock_throttle_reason"].values())


def test_pcie_downgrade_shows_in_link_metrics_and_replays():
    sim, clock = busy()
    sim.set_fault(0, "pcie_downgrade", gen=3, width=4)
    clock.advance(10)
    metrics = scrape(sim)
    assert (
        metrics["fleetlens_gpu_pcie_link_generation"]["0"],
        metrics["fleetlens_gpu_pcie_link_width"]["0"],
    ) == (3, 4)
    assert metrics["fleetlens_gpu_pcie_max_link_generation"]["0"] == 5
    assert metrics["fleetlens_gpu_pcie_link_width"]["1"] == 16
    assert metrics["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == {"0": 50, "1": 0, "2": 0, "3": 0}


def test_host_staged_traffic_multiplies_pcie_bytes_until_cleared():
    sim, _ = busy()
    sim.set_fault(2, "host_staged", pcie_factor=2.5)
    metrics = scrape(sim)
    for name in ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"):
        assert metrics[name]["2"] == pytest.approx(2.5 * metrics[name]["0"], rel=1e-3)
    sim.clear_fault(2, "host_staged")
    assert scrape(sim)["DCGM_FI_PROF_PCIE_TX_BYTES"]["2"] == metrics["DCGM_FI_PROF_PCIE_TX_BYTES"]["0"]


def test_ecc_fault_counts_errors_and_remaps_rows_until_cleared():
    sim, clock = busy()
    sim.set_fault(3, "ecc", dbe=2, remap_failure=True)
    clock.advance(20)
    metrics = scrape(sim)
    assert metrics["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == {"0": 0, "1": 0, "2": 0, "3": 2}
    assert metrics["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"]["3"] == 10
    assert metrics["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"]["3"] == 2
    assert metrics["fleetlens_gpu_row_remap_pending"]["3"] == 1
    assert metrics["DCGM_FI_DEV_ROW_REMAP_FAILURE"]["3"] == 1
    sim.clear_fault(3, "ecc")
    cleared = scrape(sim)
    assert cleared["fleetlens_gpu_row_remap_pending"]["3"] == 0
    assert cleared["DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"]["3"] == 2


def test_a_lost_gpu_is_down_says_xid_79_and_comes_back_when_cleared():
    sim, _ = busy()
    heard: list[XidEvent] = []
    sim.watch_xids(heard.append, lambda where, problem: None)
    sim.set_fault(1, "gpu_lost")
    metrics = scrape(sim)
    assert metrics["fleetlens_gpu_up"] == {"0": 1, "1": 0, "2": 1, "3": 1}
    assert "1" not in metrics["DCGM_FI_DEV_POWER_USAGE"]
    assert heard == [XidEvent(sim.identities()[1].pci_bus_id, 79, "nvml")]
    sim.clear_fault(1, "gpu_lost")
    assert scrape(sim)["fleetlens_gpu_up"]["1"] == 1


def test_xid_fault_is_one_event_to_each_watcher_until_it_stops_watching():
    sim, _ = busy()
    first, second = [], []
    watch = sim.watch_xids(first.append, lambda where, problem: None)
    sim.watch_xids(second.append, lambda where, problem: None)
    sim.set_fault(2, "xid", code=48)
    watch.stop()
    sim.set_fault(2, "xid")
    assert [e.xid for e in first] == [48]
    assert [e.xid for e in second] == [48, 13]
    assert scrape(sim)["fleetlens_gpu_up"]["2"] == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda sim: sim.set_fault(0, "meltdown"), "unknown fault 'meltdown'"),
        (lambda sim: sim.set_fault(0, "slow", temp_c=90), r"fault slow takes \['clock_factor'\]"),
        (lambda sim: sim.set_fault(9, "slow"), "no GPU 9; this backend has 4"),
        (lambda sim: sim.set_load(None, 1.5), "load must be within 0..1"),
    ],
)
def test_bad_driving_is_refused_with_a_clear_message(call, message):
    with pytest.raises(ValueError, match=message):
        call(busy()[0])


def test_registry_builds_the_simulator_from_options():
    options = CollectorOptions(gpu_backend="sim", gpu_sim_count=3, gpu_sim_seed=9, node="sim-node")
    (gpu,) = registry.build(["gpu"], options)
    up = samples_of(gpu.collector)["fleetlens_gpu_up"]
    assert [(s.labels["gpu"], s.labels["Hostname"], s.value) for s in up] == [
        ("0", "sim-node", 1),
        ("1", "sim-node", 1),
        ("2", "sim-node", 1),
    ]
    gpu.collector.close()

"""Scenario runs end to end, spanning the packages: simulate into a store, detect, evaluate.

This is what `fleetlens sim run`, `fleetlens detect` and `fleetlens eval` do; it lives here because it
wires collectors (the simulator) to analytics (detectors, evaluation), which never import each other.
Each scenario of an evaluation runs in a worker process of its own: chDB opens one directory per
process, and two cores evaluate two scenarios at once.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from analytics.detectors import build
from analytics.detectors.runner import DetectionRunner, store_anomalies
from analytics.detectors.shared_faults import SharedFaults
from analytics.store import Store
from analytics.store.records import Anomaly
from analytics.store.schema import Retention
from sim.evaluation import ScenarioResult, evaluate
from sim.node import SCENARIO_EPOCH, SimSummary
from sim.offline import simulate_offline
from sim.online import simulate_online
from sim.scenario import Scenario, check_exporters, load_scenario, with_exporters

DEFAULT_WINDOW_S = 10.0
# evaluation stores hold scenarios stamped from SCENARIO_EPOCH on, which may be older than the default
# retention: keep everything for the life of the throwaway store
EVAL_RETENTION = Retention(raw_days=3650, rollup_days=3650, steps_days=3650, targets_days=3650)


def simulate(scenario: Scenario, store: Store, workdir: Path, *, offline: bool, speed: float) -> SimSummary:
    """Play `scenario` into `store`: straight in (offline), or over loopback HTTP through the hub's paths.

    Simulated time is placed where the store keeps it and readers look: offline runs end now, online
    runs start now."""
    now = time.time() // scenario.interval_s * scenario.interval_s
    if offline:
        return simulate_offline(scenario, store, workdir, epoch=now - scenario.duration_s)
    return simulate_online(scenario, store, workdir, speed=speed, epoch=now)


def detect_scenario(store: Store, scenario: Scenario, window_s: float = DEFAULT_WINDOW_S) -> list[Anomaly]:
    """Every detector over the whole simulated span, shared faults localized on the topology the store
    holds (none without one), anomalies closed at its end, written to the store: every row, updates
    included (sim.evaluation reads whether an anomaly was ever explained from them)."""
    runner = DetectionRunner(build(), window_s, shared_faults=SharedFaults())
    anomalies = runner.run(store, SCENARIO_EPOCH, SCENARIO_EPOCH + scenario.duration_s)
    rows = sorted([*anomalies, *runner.flush()], key=lambda a: (a.start, a.node, a.kind))  # stable: in order
    store_anomalies(store, rows)
    return rows


def evaluate_file(
    path: Path, window_s: float = DEFAULT_WINDOW_S, exporters: str | None = None
) -> ScenarioResult:
    """Simulate one scenario file offline into a throwaway store, detect, and score the detectors;
    `exporters` (a flavour of sim.scenario.EXPORTER_FLAVOURS) overrides the file's."""
    scenario = with_exporters(load_scenario(path), exporters)
    with tempfile.TemporaryDirectory(prefix=f"fleetlens-eval-{scenario.name}-", dir=scratch_dir()) as tmp:
        work = Path(tmp)
        with Store.open(f"chdb://{work / 'store'}", retention=EVAL_RETENTION) as store:
            simulate_offline(scenario, store, work / "sim", workers=1)  # scenarios run in parallel instead
            anomalies = detect_scenario(store, scenario, window_s)
    return evaluate(scenario, anomalies, SCENARIO_EPOCH, window_s)


def evaluate_files(
    paths: Sequence[Path], workers: int = 2, window_s: float = DEFAULT_WINDOW_S, exporters: str | None = None
) -> list[ScenarioResult]:
    """evaluate_file for each path, `workers` at a time, each in a fresh process; results in path order."""
    check_exporters(exporters)
    with ProcessPoolExecutor(max_workers=max(1, workers), max_tasks_per_child=1) as pool:
        return list(pool.map(evaluate_file, paths, [window_s] * len(paths), [exporters] * len(paths)))


def scratch_dir() -> str | None:
    """tmpfs for the simulated /sys trees when there is one: they are rewritten every tick."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None

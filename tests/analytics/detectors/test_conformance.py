"""Every registered detector keeps the contract of analytics.detectors.base: class attributes, scikit-learn
parameter conventions, scores and findings of the documented shape, and the same findings on the same data.

Parametrized over registered(), so a detector added to the package is checked without touching this file.
The data is one realistic fleet, made once for the module: 10 simulated nodes read by the real collectors,
with a fault of each kind the simulator knows on one node each, a counter reset and a scrape gap, and a
2-stage training job over all of them with one node computing slower.
"""

from __future__ import annotations

import inspect
import math
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from analytics.detectors import registered
from analytics.detectors.base import KEY_COLUMNS, SEVERITIES, Detector, Finding, Window
from analytics.evidence import EVIDENCE, from_json, to_json
from analytics.store import Store
from tests.analytics.detectors import SyncJob
from tests.support.fleetdata import SimulatedFleet

DETECTORS = registered()
COMPONENT = re.compile(r"(gpu:\d+|\w+:\d+)?")  # "", "gpu:3", or a NIC's "device:port" such as "mlx5_2:1"
NODES = 10
TICKS = 12

by_name = pytest.mark.parametrize("cls", DETECTORS.values(), ids=DETECTORS.keys())


@dataclass(frozen=True)
class FleetData:
    store: Store
    windows: list[Window]
    nodes: list[str]


def inject_faults(fleet: SimulatedFleet, tick: int) -> None:
    """Before tick `tick`: start (at 3) and end (a flap at 5, most at 9) a fault on each of several nodes."""
    if tick == 3:
        fleet["vela-001"].sysfs.set_link(0, up=False)
        for gpu in range(2):
            fleet["vela-003"].gpus.set_fault(gpu, "slow", clock_factor=0.8)
        fleet["vela-004"].sysfs.set_errors(1, 1.0)
        fleet["vela-005"].gpus.set_fault(0, "thermal_throttle")
        fleet["vela-006"].sysfs.set_link(1, up=False)
        fleet["vela-007"].sysfs.set_congestion(0, 1.0)
        fleet["vela-008"].gpus.set_fault(1, "pcie_downgrade")
        fleet["vela-009"].gpus.set_fault(0, "xid", code=79)
        fleet["vela-010"].gpus.set_fault(1, "gpu_lost")
        fleet.restart("vela-002")
    if tick == 5:
        fleet["vela-006"].sysfs.set_link(1, up=True)
    if tick == 9:
        fleet["vela-005"].gpus.clear_fault(0, "thermal_throttle")
        fleet["vela-007"].sysfs.set_congestion(0, 0.0)
        fleet["vela-004"].sysfs.set_errors(1, 0.0)


@pytest.fixture(scope="module")
def fleet_data(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetData]:
    with Store.open(f"chdb://{chdb_dir}", database=f"test_{uuid.uuid4().hex[:12]}") as store:
        with SimulatedFleet(store, tmp_path_factory.mktemp("fleet"), nodes=NODES, gpus=2, nics=2) as fleet:
            start = fleet.clock() + fleet.interval_s
            windows = []
            for tick in range(TICKS):
                inject_faults(fleet, tick)
                windows.append(fleet.tick(skip={"vela-004"} if tick in (6, 7) else ()))
        job = SyncJob(nodes=NODES, slowdown=lambda node, stage, t: 1.2 if node == "vela-003" else 1.0)
        store.insert_steps(job.steps(start, TICKS * fleet.interval_s), token="job")
        yield FleetData(store, windows, job.node_names)


@by_name
def test_class_attributes_are_set_and_persistence_is_sane(cls: type[Detector]) -> None:
    assert DETECTORS[cls.name] is cls and cls.version
    assert cls.kinds and all(isinstance(kind, str) and kind for kind in cls.kinds)
    assert 1 <= cls.min_windows <= cls.of_windows and cls.clear_windows >= 1


@by_name
def test_parameters_live_only_in_init_and_are_stored_unchanged(cls: type[Detector]) -> None:
    detector = cls()
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if name != "self"
    }
    assert vars(detector).keys() == detector.get_params().keys()
    assert detector.get_params() == defaults
    assert not [name for name in vars(detector) if name.endswith("_")], "learned state before fit()"
    assert type(detector)(**detector.get_params()).get_params() == detector.get_params()


@by_name
def test_an_empty_store_gives_no_findings(cls: type[Detector], store: Store) -> None:
    assert cls().detect(store, Window(0, 10)) == []


@by_name
def test_scores_and_findings_have_the_documented_shape(cls: type[Detector], fleet_data: FleetData) -> None:
    detector = cls()
    for window in fleet_data.windows:
        features = detector.features(fleet_data.store, window)
        if features.empty:
            continue
        assert set(KEY_COLUMNS) <= set(features.columns)
        scores = detector.score(features)
        assert scores.shape == (len(features),) and np.isfinite(scores).all()
        for finding in detector.findings(features, scores):
            assert_well_formed(cls, finding, fleet_data.nodes)


@by_name
def test_the_same_data_gives_the_same_findings(cls: type[Detector], fleet_data: FleetData) -> None:
    first, second = cls(), cls()
    found = [first.detect(fleet_data.store, window) for window in fleet_data.windows]
    assert [second.detect(fleet_data.store, window) for window in fleet_data.windows] == found
    assert any(found), f"{cls.name} found nothing in the conformance fleet: give it a fault it can see"


def assert_well_formed(cls: type[Detector], finding: Finding, nodes: list[str]) -> None:
    assert finding.kind in cls.kinds and finding.severity in SEVERITIES
    assert finding.node in nodes and isinstance(finding.job, str)
    assert COMPONENT.fullmatch(finding.component), finding.component
    assert isinstance(finding.score, float) and math.isfinite(finding.score)
    assert isinstance(finding.evidence, EVIDENCE[finding.kind])
    assert from_json(finding.kind, to_json(finding.evidence)) == finding.evidence  # crosses the store whole

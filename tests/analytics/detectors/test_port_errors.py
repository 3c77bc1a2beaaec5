"""port_errors on the error counters the real infiniband collector reads from simulated ports and from the
real sysfs trees of ../shared/fixtures, and on hostile series."""

from __future__ import annotations

import itertools
import math
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.detectors.base import Window
from analytics.detectors.port_errors import (
    ERROR_RATES,
    PORT_ERROR_METRICS,
    RECEIVED_PACKETS,
    PortErrors,
)
from analytics.store import Store
from analytics.store.records import ScrapeBatch
from collectors.base import ReadErrors
from collectors.infiniband import InfiniBandCollector
from collectors.textformat import render
from hub.expfmt import ExpositionParser
from tests.support.fleetdata import SimulatedFleet

INTERVAL_S = 10.0
HOSTILE_BASE = math.floor((time.time() - 7200) / INTERVAL_S) * INTERVAL_S
EXAMPLE = itertools.count()


def reported(store: Store, window: Window) -> set[tuple[str, str]]:
    return {(finding.node, finding.component) for finding in PortErrors().detect(store, window)}


def test_a_port_corrupting_packets_is_a_warning_naming_its_counters_and_ratio(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet.tick(2)
        fleet["vela-003"].sysfs.set_errors(1, 1.0)
        window = fleet.tick()

        [finding] = PortErrors().detect(store, window)
    assert (finding.kind, finding.node, finding.component) == ("port_errors", "vela-003", "mlx5_1:1")
    assert finding.severity == "warning"
    evidence = finding.evidence
    assert set(evidence.counters) == {"symbol_errors_per_s", "receive_errors_per_s"}
    assert evidence.receive_errors_per_s > 0 and evidence.symbol_errors_per_s > evidence.receive_errors_per_s
    assert evidence.received_packets_per_s > 1000 * evidence.receive_errors_per_s
    assert 400 < evidence.errors_per_million < 600  # one corrupt packet in 10,000, 4 symbol errors each
    assert finding.score == pytest.approx(evidence.errors_per_million, rel=1e-3)


def test_healthy_busy_ports_congestion_resets_and_gaps_are_no_port_errors(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        windows = [fleet.tick(3)]
        fleet["vela-001"].sysfs.set_congestion(0, 1.0)
        windows += [fleet.tick() for _ in range(2)]
        fleet.restart("vela-002")
        windows += [fleet.tick() for _ in range(2)]
        windows += [fleet.tick(skip={"vela-004"}) for _ in range(3)]
        windows.append(fleet.tick())

        assert [reported(store, window) for window in windows] == [set()] * len(windows)


def test_a_port_that_errs_while_quiet_must_pass_the_floor_and_the_ratio(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path, gpus=0) as fleet:
        fleet.tick(2)
        fleet["vela-002"].sysfs.set_errors(0, 1.0)
        fleet.set_load("vela-002", 1e-6)  # a few packets a second: its errors stay under the floor
        fleet["vela-003"].sysfs.set_errors(0, 0.001)  # busy, 0.5 errors per million: under the ratio
        window = fleet.tick()

        found = {(f.node, f.component): f for f in PortErrors(min_per_million=0.0).detect(store, window)}
        assert reported(store, window) == set()
    assert found[("vela-003", "mlx5_0:1")].evidence.errors_per_million < PortErrors().min_per_million
    assert ("vela-002", "mlx5_0:1") not in found or found[("vela-002", "mlx5_0:1")].score == 0


# -- real counters: prometheus/procfs's sysfs tree (hfi1_0, mlx4_0, mlx5_0), read by the real collector


def store_scrape(store: Store, sysfs_root: Path, node: str, ts: float) -> None:
    """One scrape of `sysfs_root` by the real infiniband collector, stored as the hub stores it."""
    errors = ReadErrors("infiniband")
    exposition = ExpositionParser().parse(render(InfiniBandCollector(sysfs_root, errors).collect()).decode())
    assert errors.count == 0
    batch = ScrapeBatch(f"{node}:9400", node, ts, exposition.names, exposition.labels, exposition.values)
    store.insert_samples([batch], token=f"real-{ts}")


def add_to_counter(sysfs_root: Path, device: str, name: str, amount: int) -> None:
    for counter in (sysfs_root / "class" / "infiniband" / device / "ports").glob(f"*/counters/{name}"):
        counter.write_text(f"{int(counter.read_text()) + amount}\n")


@pytest.fixture
def real_ports(procfs_sys: Path, tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(procfs_sys / "class" / "infiniband", root / "class" / "infiniband", symlinks=True)
    return root


def test_real_healthy_ports_carrying_traffic_are_no_port_errors_and_real_bad_optics_are(
    store: Store, real_ports: Path
):
    start = math.floor((time.time() - 1800) / INTERVAL_S) * INTERVAL_S
    windows = []
    for tick in range(6):
        if tick >= 1:  # a busy link: two million packets a scrape, the real counters' zero errors kept
            for device in ("hfi1_0", "mlx4_0", "mlx5_0"):
                add_to_counter(real_ports, device, "port_rcv_packets", 2_000_000)
        if tick >= 4:  # then mlx5_0's optic fails: 400 errors per million packets
            add_to_counter(real_ports, "mlx5_0", "port_rcv_errors", 160)
            add_to_counter(real_ports, "mlx5_0", "symbol_error", 640)
        store_scrape(store, real_ports, "real-001", start + tick * INTERVAL_S)
        windows.append(Window(start + tick * INTERVAL_S, start + (tick + 1) * INTERVAL_S))

    assert [reported(store, window) for window in windows[:4]] == [set()] * 4
    [finding] = PortErrors().detect(store, windows[4])
    assert (finding.node, finding.component) == ("real-001", "mlx5_0:1")
    assert finding.evidence.errors_per_million == pytest.approx(400, rel=0.01)


# -- hostile series: backwards, huge, NaN and infinite samples of every counter -------------------------

HOSTILE_VALUES = st.one_of(
    st.floats(min_value=0, max_value=1e6),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1.0, 0.0, 2.0**64]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(series=st.lists(st.lists(HOSTILE_VALUES, min_size=4, max_size=4), min_size=4, max_size=4))
def test_hostile_counters_raise_nothing_and_report_no_implausible_rate(
    store: Store, series: list[list[float]]
):
    """Four scrapes of one port whose four counters take any values, the packets rising steadily: a
    finding only where the error counters rose by a plausible count of errors, never from a reset,
    a non-finite value or a jump no link can make."""
    start = HOSTILE_BASE - next(EXAMPLE) * 3600  # an hour apart: no example sees another's rows
    labels = {"device": "mlx5_0", "port": "1"}
    batches = []
    for tick in range(4):
        values = [column[tick] for column in series]
        values[PORT_ERROR_METRICS.index(RECEIVED_PACKETS)] = 1e9 + tick * 1e7
        ts = start + tick * INTERVAL_S
        batches.append(ScrapeBatch("h:9400", "hostile", ts, list(PORT_ERROR_METRICS), [labels] * 4, values))
    store.insert_samples(batches, token=f"hostile-{start}")
    window = Window(start + 2 * INTERVAL_S, start + 4 * INTERVAL_S)  # the steps into ticks 2 and 3

    errors = [series[PORT_ERROR_METRICS.index(metric)] for metric in ERROR_RATES.values()]
    rose = any(values[tick] > values[tick - 1] for values in errors for tick in (2, 3))
    for finding in PortErrors().detect(store, window):
        assert rose and math.isfinite(finding.score)
        assert finding.evidence.errors_per_s <= len(errors) * 2e6 / INTERVAL_S  # values below 1e6 only

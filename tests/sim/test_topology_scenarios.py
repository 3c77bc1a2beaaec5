"""The shared-fault scenarios (tests/scenarios/topology) hold enough of each layer fault for a per-kind
recall to mean something: four or more of each kind, and of each leaf mode, on four or more parents."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from sim.scenario import LAYER_FAULT_KINDS, LEAF_MODES, load_scenario

TOPOLOGY_SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios" / "topology"
AT_LEAST = 4


def test_every_layer_fault_kind_and_leaf_mode_is_played_four_times_on_four_parents() -> None:
    parents: dict[str, set[tuple[str, str]]] = defaultdict(set)
    faults: dict[str, int] = defaultdict(int)
    for path in sorted(TOPOLOGY_SCENARIOS.glob("*.yaml")):
        for fault in load_scenario(path).layer_faults:
            for row in {fault.kind, f"{fault.kind}/{fault.params.get('mode')}"}:
                faults[row] += 1
                parents[row].add((path.name, fault.parent))
    rows = [*LAYER_FAULT_KINDS, *(f"leaf_degraded/{mode}" for mode in LEAF_MODES)]
    assert {row: faults[row] for row in rows if faults[row] < AT_LEAST} == {}
    assert {row: len(parents[row]) for row in rows if len(parents[row]) < AT_LEAST} == {}

"""The scenario format: the issue's example loads as written, and a wrong file says which file and key."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from sim.errors import ScenarioError
from sim.scenario import FleetSpec, load_scenario, random_faults, trace_faults

ISSUE_EXAMPLE = """\
seed: 7
duration_s: 3600
interval_s: 10                 # sampling interval in simulated time
fleet: {nodes: 32, gpus_per_node: 8, nics_per_node: 4, prefix: vela-}
jobs:
  - {name: llm-50b, nodes: 32, step_s: 4.0, dp: 8, pp: 4, tp: 8}   # nodes: a count or a list of names
faults:
  - {kind: slow_node, node: vela-007, start_s: 900, end_s: 1800, severity: 0.15}   # 15% slower compute
  - {kind: thermal_throttle, node: vela-011, gpu: 3, start_s: 600, end_s: 1500}
  - {kind: link_flap, node: vela-020, nic: 2, start_s: 1200, flaps: 3, period_s: 30}
  - {kind: link_down, node: vela-021, nic: 0, start_s: 2000, end_s: 2300}
  - {kind: dma_degraded, node: vela-003, nic: 1, start_s: 1000, end_s: 3000, mode: no_gdr}
  - {kind: gpu_lost, node: vela-015, gpu: 5, start_s: 2500}
  - {kind: xid, node: vela-016, gpu: 2, code: 79, start_s: 1700}
  - {kind: congestion, node: vela-030, nic: 3, start_s: 2600, end_s: 2900}
confounders:                   # must NOT be reported as node faults
  - {kind: job_stall, job: llm-50b, start_s: 1400, end_s: 1460}    # checkpoint: every rank slow at once
  - {kind: stage_imbalance, job: llm-50b, stage: 3, severity: 0.2}  # last pipeline stage slower by design
  - {kind: exporter_restart, node: vela-009, at_s: 1300}            # counters reset to zero
  - {kind: scrape_gap, node: vela-010, start_s: 2000, end_s: 2060}
  - {kind: job_restart, job: llm-50b, at_s: 3000}
"""

SMALL = """\
duration_s: 1200
fleet: {nodes: 8}
jobs:
  - {name: llm, nodes: 8, step_s: 4.0, pp: 2, tp: 8}
"""


def write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_issue_example_loads_as_written(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, ISSUE_EXAMPLE, "llm-50b.yaml"))
    assert (scenario.name, scenario.seed, scenario.duration_s, scenario.interval_s) == (
        "llm-50b",
        7,
        3600,
        10,
    )
    assert scenario.fleet.names[0] == "vela-001" and len(scenario.fleet.names) == 32
    (job,) = scenario.jobs
    assert (job.dp, job.pp, job.tp, len(job.nodes)) == (8, 4, 8, 32)
    assert [(f.kind, f.node, f.component) for f in scenario.faults] == [
        ("slow_node", "vela-007", ""),
        ("thermal_throttle", "vela-011", "gpu:3"),
        ("link_flap", "vela-020", "mlx5_2:1"),
        ("link_down", "vela-021", "mlx5_0:1"),
        ("dma_degraded", "vela-003", "mlx5_1:1"),
        ("gpu_lost", "vela-015", "gpu:5"),
        ("xid", "vela-016", "gpu:2"),
        ("congestion", "vela-030", "mlx5_3:1"),
    ]
    flap, lost = scenario.faults[2], scenario.faults[5]
    assert flap.end_s == 1200 + 3 * 30  # a flap lasts its flaps
    assert lost.end_s is None and lost.active(3599, scenario.duration_s)
    spans = {c.kind: (c.start_s, c.end_s) for c in scenario.confounders}
    assert spans == {
        "job_stall": (1400, 1460),
        "stage_imbalance": (0, 3600),  # by design: the whole run
        "exporter_restart": (1300, 1300),
        "scrape_gap": (2000, 2060),
        "job_restart": (3000, 3060),  # down for down_s, 60 s unless given
    }


def test_pipeline_stages_follow_the_rank_layout(tmp_path: Path) -> None:
    (job,) = load_scenario(write(tmp_path, SMALL)).jobs
    assert job.dp == 4  # inferred: 64 ranks / (pp 2 x tp 8)
    assert [job.stage_of_node(node, 8) for node in job.nodes] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_step_model_keys_are_optional_and_default_to_the_tidy_job(tmp_path: Path) -> None:
    (plain,) = load_scenario(write(tmp_path, SMALL)).jobs
    assert (plain.noise, plain.imbalance, plain.rank_offset, plain.warmup_steps) == ("tidy", None, None, 0)
    realistic = SMALL.replace(
        "tp: 8}", "tp: 8, noise: pai, imbalance: 0.08, rank_offset: 0.02, warmup_steps: 5}"
    )
    (job,) = load_scenario(write(tmp_path, realistic)).jobs
    assert (job.noise, job.imbalance, job.rank_offset, job.warmup_steps, job.warmup_slowdown) == (
        "pai",
        0.08,
        0.02,
        5,
        1.0,
    )
    assert job.dp == 4


def test_a_pcie_downgrade_is_reported_on_the_gpu(tmp_path: Path) -> None:
    faults = "faults:\n  - {kind: dma_degraded, node: vela-002, gpu: 6, start_s: 300, mode: pcie_downgrade}\n"
    (fault,) = load_scenario(write(tmp_path, SMALL + faults)).faults
    assert fault.component == "gpu:6"


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ("faults:\n  - {kind: meltdown, node: vela-001, start_s: 300}\n", "faults[0].kind", "'meltdown'"),
        ("faults:\n  - {kind: xid, node: vela-099, gpu: 1, start_s: 300}\n", "faults[0].node", "vela-099"),
        (
            "faults:\n  - {kind: slow_node, node: vela-001, start_s: 600, end_s: 300}\n",
            "faults[0].end_s",
            "not after start_s 600",
        ),
        ("faults:\n  - {kind: xid, node: vela-001, gpu: 8, start_s: 300}\n", "faults[0].gpu", "0..7"),
        (
            "faults:\n  - {kind: xid, node: vela-001, gpu: 1, start_s: 300, colour: red}\n",
            "faults[0]",
            "colour",
        ),
        (
            "confounders:\n  - {kind: job_stall, job: other, start_s: 1, end_s: 9}\n",
            "confounders[0].job",
            "llm",
        ),
        (
            "confounders:\n  - {kind: scrape_gap, node: vela-001, start_s: 60}\n",
            "confounders[0].end_s",
            "missing",
        ),
        ("exporters: dcgm\n", "exporters", "'dcgm' is not one of fleetlens, stock"),
    ],
)
def test_an_error_names_the_file_and_the_key(tmp_path: Path, extra: str, key: str, words: str) -> None:
    path = write(tmp_path, SMALL + extra, "broken.yaml")
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    assert str(error.value).startswith(f"{path}: {key}: ")
    assert words in str(error.value)


@pytest.mark.parametrize(
    ("keys", "key", "words"),
    [
        ("noise: wild", "jobs[0].noise", "not one of tidy, pai"),
        ("imbalance: 2", "jobs[0].imbalance", "outside 0..0.5"),
        ("warmup_steps: -1", "jobs[0].warmup_steps", "outside 0..100000"),
    ],
)
def test_a_bad_step_model_key_names_the_job(tmp_path: Path, keys: str, key: str, words: str) -> None:
    path = write(tmp_path, SMALL.replace("tp: 8}", f"tp: 8, {keys}}}"), "noisy.yaml")
    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    assert str(error.value).startswith(f"{path}: {key}: ")
    assert words in str(error.value)


def test_ranks_that_do_not_fill_the_job_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL.replace("pp: 2", "dp: 3, pp: 2"), "ranks.yaml")
    with pytest.raises(
        ScenarioError, match=r"ranks\.yaml: jobs\[0\]: dp x pp x tp = 3 x 2 x 8 must equal the job's 64"
    ):
        load_scenario(path)


def test_exporters_are_fleetlens_unless_the_file_says_stock(tmp_path: Path) -> None:
    assert load_scenario(write(tmp_path, SMALL)).exporters == "fleetlens"
    assert load_scenario(write(tmp_path, SMALL + "exporters: stock\n")).exporters == "stock"


def test_an_unknown_top_level_key_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL + "speed: 10\n", "extra.yaml")
    with pytest.raises(ScenarioError, match=r"extra\.yaml: unknown key\(s\) speed; known: confounders, "):
        load_scenario(path)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "fleet: {nodes: [1\n", "torn.yaml")
    with pytest.raises(ScenarioError, match=r"torn\.yaml: "):
        load_scenario(path)


def test_random_faults_follow_the_trace_mix(fixtures: Path) -> None:
    """Thousands of one-hour node schedules at 2 faults per node-day: the kinds drawn are the trace's."""
    fleet = FleetSpec(nodes=20_000)
    drawn = Counter(fault.kind for fault in random_faults(fleet, 3600, 2.0, seed=5, fixtures=fixtures))
    trace = Counter(fault.kind for fault in trace_faults(fixtures))
    total_drawn, total_trace = sum(drawn.values()), sum(trace.values())
    assert 1_400 < total_drawn < 1_950  # 20,000 x 2 / 24 = 1,667 expected
    assert set(drawn) == set(trace)
    for kind, count in trace.items():
        assert drawn[kind] / total_drawn == pytest.approx(count / total_trace, abs=0.04), kind


def test_random_faults_are_deterministic_per_seed(fixtures: Path, tmp_path: Path) -> None:
    text = SMALL + "faults: {random: {rate_per_node_day: 20, seed: 3}}\n"
    first = load_scenario(write(tmp_path, text, "a.yaml"), fixtures=fixtures).faults
    again = load_scenario(write(tmp_path, text, "b.yaml"), fixtures=fixtures).faults
    other = load_scenario(
        write(tmp_path, text.replace("seed: 3", "seed: 4"), "c.yaml"), fixtures=fixtures
    ).faults
    assert first and first == again
    assert other != first
    for fault in first:
        assert 0 <= fault.start_s < fault.end_s <= 1200


def test_random_faults_without_the_trace_name_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL + "faults: {random: {rate_per_node_day: 1}}\n")
    with pytest.raises(ScenarioError, match="FLEETLENS_FIXTURES"):
        load_scenario(path, fixtures=tmp_path / "nowhere")

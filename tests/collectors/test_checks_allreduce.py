"""The all-reduce bus bandwidth check: nccl-tests' formula, the verdicts on pairs and nodes, and a real
4-rank gloo run on loopback in which one rank made slow is named as the bad node."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectors.checks.allreduce import (
    CHECK,
    FAIL_FRACTION,
    Measurement,
    bus_bandwidth,
    finish_ranks,
    judge,
)
from collectors.checks.result import CheckResult, Status
from collectors.errors import TimingError
from tests.conftest import REPO
from tests.support.peers import free_port

SIZE = 4 << 20
HEALTHY_BUSBW = 10.0


def pair(a: str, b: str, busbw: float) -> Measurement:
    """A two-node measurement whose bus bandwidth is `busbw` GB/s."""
    return Measurement((a, b), SIZE, SIZE / busbw / 1e9)  # for two ranks busbw = algbw


def verdicts(results: list[CheckResult]) -> dict[str, Status]:
    return {result.target: result.status for result in results}


def test_bus_bandwidth_is_nccl_tests_all_reduce_formula() -> None:
    # PERFORMANCE.md: busbw = algbw * 2(n-1)/n; for 2 ranks that is algbw, for 8 ranks 1.75 algbw
    assert bus_bandwidth(4_000_000_000, 2.0, 2) == pytest.approx(2.0)
    assert bus_bandwidth(1_000_000_000, 1.0, 8) == pytest.approx(1.75)
    assert pair("a", "b", 7.5).busbw == pytest.approx(7.5)


noise = st.floats(min_value=0.85, max_value=1.0)  # healthy pairs within 15% of each other
slowdown = st.floats(min_value=0.01, max_value=0.4)  # a fault: well below half the healthy figure


Fleet = tuple[list[str], dict[tuple[str, str], float]]  # node names, and each pair's bus bandwidth


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    names = [f"vela-{index:03d}" for index in range(draw(st.integers(min_value=3, max_value=8)))]
    pairs = [(a, b) for position, a in enumerate(names) for b in names[position + 1 :]]
    return names, {key: HEALTHY_BUSBW * draw(noise) for key in pairs}


@given(fleets(), st.data(), slowdown)
def test_one_bad_pair_is_named_and_no_node_is(fleet: Fleet, data: st.DataObject, factor: float) -> None:
    _, busbw = fleet
    bad = data.draw(st.sampled_from(sorted(busbw)))
    busbw[bad] *= factor
    results = judge("vela-000", None, [pair(a, b, value) for (a, b), value in busbw.items()], 0.0, 1.0)
    expected = {f"peer:{a}+{b}": Status.FAIL if (a, b) == bad else Status.PASS for a, b in busbw}
    assert verdicts(results) == expected, "no node is named for one bad link"


@given(fleets(), st.data(), slowdown)
def test_a_bad_node_fails_every_pair_it_is_in_and_is_named(
    fleet: Fleet, data: st.DataObject, factor: float
) -> None:
    names, busbw = fleet
    bad = data.draw(st.sampled_from(names))
    for key in busbw:
        if bad in key:
            busbw[key] *= factor
    results = judge("vela-000", None, [pair(a, b, value) for (a, b), value in busbw.items()], 0.0, 1.0)
    expected = {f"peer:{a}+{b}": Status.FAIL if bad in (a, b) else Status.PASS for a, b in busbw}
    assert verdicts(results) == expected | {f"peer:{bad}": Status.FAIL}
    (node,) = [result for result in results if result.target == f"peer:{bad}"]
    assert node.check == CHECK and node.value == pytest.approx(max(v for k, v in busbw.items() if bad in k))
    assert len(node.evidence["every_pair_failed"]) == len(names) - 1


def test_thresholds_follow_a_stated_expectation_and_the_group_is_judged_by_it() -> None:
    pairs = [pair("a", "b", 9.0), pair("a", "c", 7.0), pair("b", "c", 3.0)]
    group = Measurement(("a", "b", "c"), SIZE, bus_bandwidth(SIZE, 1.0, 3) / 4.0)  # 4 GB/s
    results = judge("a", group, pairs, 0.0, 1.0, expected_busbw=10.0)
    assert verdicts(results) == {
        "peer:a+b+c": Status.FAIL,
        "peer:a+b": Status.PASS,
        "peer:a+c": Status.WARN,
        "peer:b+c": Status.FAIL,
    }
    assert {result.threshold for result in results} == {FAIL_FRACTION * 10.0}


def test_when_every_pair_fails_the_expectation_no_node_is_named() -> None:
    pairs = [pair("a", "b", 2.0), pair("a", "c", 2.5), pair("b", "c", 3.0)]
    results = judge("a", None, pairs, 0.0, 1.0, expected_busbw=10.0)
    assert verdicts(results) == dict.fromkeys(["peer:a+b", "peer:a+c", "peer:b+c"], Status.FAIL)


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan, math.inf])
def test_a_timing_that_is_not_a_positive_time_is_refused(seconds: float) -> None:
    with pytest.raises(TimingError, match=r"peer:a\+b: .* seconds per operation is not a positive time"):
        Measurement(("a", "b"), SIZE, seconds)


def test_without_an_expectation_the_group_is_recorded_and_two_nodes_cannot_be_judged() -> None:
    group = Measurement(("a", "b"), SIZE, 0.001)
    results = judge("a", group, [pair("a", "b", 0.001)], 0.0, 1.0)
    assert [(r.target, r.status, r.threshold) for r in results] == [
        ("peer:a+b", Status.PASS, None),
        ("peer:a+b", Status.ERROR, None),
    ]
    assert "expected bus bandwidth" in results[1].evidence["error"]


def run_module(args: list[str], rank: int, world_size: int, port: int, prelude: str = "") -> subprocess.Popen:
    environ = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    code = f"{prelude}import sys; from collectors.checks.allreduce import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.torch
@pytest.mark.timing  # a delayed rank against its peers' wall-clock times: run apart, on quiet cores
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_four_gloo_ranks_on_loopback_name_the_slow_node() -> None:
    slow_rank = 2  # late to every operation by 50 ms, over ten times a 4 MiB loopback all-reduce
    nodes = ["vela-001", "vela-002", "vela-003", "vela-004"]
    args = ["--nodes", ",".join(nodes), "--size-mb", "4", "--iterations", "20", "--timeout-s", "60"]
    port = free_port()
    processes = [
        run_module(args + (["--inject-delay-s", "0.05"] if rank == slow_rank else []), rank, 4, port)
        for rank in range(4)
    ]
    (status, out, err), *others = finish_ranks(processes, 120)
    assert [other[0] for other in others] == [0, 0, 0], others
    assert status == 1, err  # rank 0 reports: not all PASS
    results = [json.loads(line) for line in out.splitlines()]
    by_target = {result["target"]: result for result in results}
    slow = nodes[slow_rank]
    assert by_target[f"peer:{slow}"]["status"] == "FAIL", results
    for a, b in [(a, b) for position, a in enumerate(nodes) for b in nodes[position + 1 :]]:
        verdict = by_target[f"peer:{a}+{b}"]
        assert verdict["check"] == CHECK and verdict["node"] == nodes[0]
        assert (verdict["status"] == "FAIL") == (slow in (a, b)), verdict
    named = {target for target in by_target if target.count("+") == 0}
    assert named == {f"peer:{slow}"}, "only the slow node is named"
    assert by_target["peer:" + "+".join(nodes)]["evidence"]["ranks"] == 4


def test_without_torch_the_check_reports_error_not_pass() -> None:
    process = run_module(
        ["--nodes", "vela-001,vela-002"], 0, 2, free_port(), "import sys; sys.modules['torch'] = None; "
    )
    ((status, out, err),) = finish_ranks([process], 60)
    (result,) = [json.loads(line) for line in out.splitlines()]
    assert status == 1, err
    assert result["status"] == "ERROR" and "torch is not installed" in result["evidence"]["error"]


@pytest.mark.parametrize(
    ("nodes", "world_size", "complaint"),
    [
        ("vela-001,vela-002", 3, "WORLD_SIZE is 3"),
        ("vela-001,vela-001", 2, "named twice"),
        ("vela-001,$(reboot)", 2, "'$(reboot)' is not a node name"),
        ("vela-001,", 2, "name 2 '' is not a node name"),
        ("vela-001", 1, "needs at least two"),
    ],
)
def test_a_bad_node_list_or_environment_is_refused_before_anything_runs(
    nodes: str, world_size: int, complaint: str
) -> None:
    ((status, out, err),) = finish_ranks([run_module(["--nodes", nodes], 0, world_size, free_port())], 60)
    assert (status, out) == (2, "") and complaint in err


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_a_peer_that_never_joins_reads_error_within_the_timeout() -> None:
    process = run_module(["--nodes", "vela-001,vela-002,vela-003", "--timeout-s", "2"], 0, 3, free_port())
    ((status, out, err),) = finish_ranks([process], 60)
    (result,) = [json.loads(line) for line in out.splitlines()]
    assert status == 1, err
    assert (result["status"], result["target"]) == ("ERROR", "")
    assert result["evidence"]["error"].startswith("gloo rendezvous or all-reduce failed")


def test_a_rank_beyond_the_world_is_refused() -> None:
    ((status, out, err),) = finish_ranks(
        [run_module(["--nodes", "vela-001,vela-002"], 2, 2, free_port())], 60
    )
    assert (status, out) == (2, "") and "RANK 2 is not below WORLD_SIZE 2" in err

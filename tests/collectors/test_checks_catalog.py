"""The check catalog: names and sets as `checks run --checks` takes them, options a check needs, and the
all-reduce across one node's ranks (real gloo ranks on the CPU)."""

from __future__ import annotations

import importlib.util

import pytest

from collectors.checks.allreduce import CHECK, run_local
from collectors.checks.catalog import CATALOG, REPORTED_BY, SETS, CheckOptions, Weight, chosen
from collectors.checks.result import Status
from collectors.errors import CollectorConfigError


def test_sets_expand_in_order_and_each_check_runs_once() -> None:
    assert chosen("light") == list(SETS["light"])
    assert chosen("ping, light ,ping") == ["ping", *SETS["light"]]


def test_an_unknown_name_is_refused_naming_it_and_what_is_known() -> None:
    with pytest.raises(CollectorConfigError, match=r"unknown check 'pnig'.*ping.*light \(set\)"):
        chosen("light,pnig")


def test_every_set_names_only_catalogued_checks_and_light_holds_no_heavy_check() -> None:
    for name, members in SETS.items():
        assert set(members) <= set(CATALOG), name
    assert all(CATALOG[name].weight is Weight.LIGHT for name in SETS["light"])


def test_a_check_missing_its_peers_refuses_before_running() -> None:
    with pytest.raises(CollectorConfigError, match="iperf3 needs at least one peer"):
        CATALOG["iperf3"].run(CheckOptions(node="vela-001"))
    with pytest.raises(CollectorConfigError, match="ping needs a device"):
        CATALOG["ping"].run(CheckOptions(node="vela-001", peers={"b": "127.0.0.1"}))


def test_preflight_is_the_light_set_plus_the_gpu_performance_checks_which_are_heavy() -> None:
    assert SETS["preflight"] == (*SETS["light"], "pcie_bandwidth", "hbm_bandwidth", "gemm")
    assert {"pcie_bandwidth", "hbm_bandwidth", "gemm", "allreduce"} <= set(SETS["heavy"])
    assert all(CATALOG[name].weight is Weight.HEAVY for name in ("pcie_bandwidth", "hbm_bandwidth", "gemm"))
    assert CATALOG["allreduce"].weight is Weight.HEAVY


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_allreduce_on_a_node_without_gpus_is_an_error_naming_why() -> None:
    (result,) = CATALOG["allreduce"].run(CheckOptions(node="vela-001"))
    assert (result.node, result.target, result.status) == ("vela-001", "", Status.ERROR)
    assert "torch sees no CUDA GPU" in result.evidence["error"]


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_three_local_gloo_ranks_report_every_pair_as_this_nodes_gpus() -> None:
    results = run_local("vela-001", 3, size_bytes=1 << 20, iterations=5, timeout_s=60)
    by_target = {result.target: result for result in results}
    assert {"gpu:0+1+2", "gpu:0+1", "gpu:0+2", "gpu:1+2"} <= set(by_target), results
    assert all(result.node == "vela-001" and result.check == CHECK for result in results)
    assert by_target["gpu:0+1+2"].evidence["ranks"] == 3
    assert all(by_target[pair].value > 0 for pair in ("gpu:0+1", "gpu:0+2", "gpu:1+2"))


def test_fewer_than_two_local_ranks_is_an_error() -> None:
    (result,) = run_local("vela-001", 1)
    assert result.status is Status.ERROR and "needs at least two; this node has 1" in result.evidence["error"]


def test_a_name_results_carry_chooses_the_check_that_writes_it_once() -> None:
    """What the lifecycle waits for (result names) is what it asks a node to run."""
    assert chosen("dcgm_diag,remapped_rows,power_slowdown,allreduce_busbw") == [
        "dcgm_diag",
        "gpu_state",
        "allreduce",
    ]
    assert {REPORTED_BY[name] for name in CATALOG["gpu_state"].reports} == {"gpu_state"}

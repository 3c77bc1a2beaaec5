"""A real Slurm cluster on this one machine (fleetlens.demo.peers), or a skip naming what is missing."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from fleetlens.demo.peers import SlurmCluster, slurm_conf
from fleetlens.demo.peers import slurm_cluster as start_cluster
from tests.support.peers import require_binary

__all__ = ["SlurmCluster", "slurm_cluster", "slurm_conf"]


@contextlib.contextmanager
def slurm_cluster(
    tmp_path: Path, nodes: int = 4, names: Sequence[str] | None = None
) -> Iterator[SlurmCluster]:
    """Start slurmctld and one slurmd per node (`names`, default node01 .. node<nodes>) and yield once
    sinfo shows all idle."""
    slurmctld, slurmd = require_binary("slurmctld"), require_binary("slurmd")
    require_binary("sinfo")
    if os.geteuid() != 0:
        pytest.skip("a private Slurm cluster needs root: its daemons run as SlurmUser/SlurmdUser root")
    names = list(names or [f"node{index:02d}" for index in range(1, nodes + 1)])
    with start_cluster(tmp_path, names, slurmctld, slurmd) as cluster:
        yield cluster

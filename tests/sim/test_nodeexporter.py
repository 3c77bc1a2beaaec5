"""The stock flavour's node_exporter (sim.nodeexporter: Debian's binary on a simulated /sys tree) reads the
same values as fleetlens's own infiniband and netclass collectors, in every state the simulator puts a
port in, as DESIGN.md asks of our collectors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.errors import NodeExporterError
from sim.nodeexporter import NodeExporter
from sim.sysfs import SimSysfs
from tests.collectors.test_node_exporter_conformance import (
    NEWER_LABELS,
    assert_conforms,
    netclass_and_infiniband,
    ours,
)
from tests.support.exposition import parse_families
from tests.support.peers import require_binary

pytestmark = pytest.mark.integration


def test_node_exporter_on_a_simulated_tree_reads_what_our_collectors_read(tmp_path: Path):
    require_binary("prometheus-node-exporter")
    tree = SimSysfs(tmp_path / "sys", "vela-001", nics=4, seed=7)
    tree.write()
    exporter = NodeExporter(tree.root, tmp_path / "node_exporter.log").start()
    try:
        states = {
            "busy": lambda: tree.advance(30.0, load=0.95),
            "link down": lambda: tree.set_link(1, up=False),
            "congested": lambda: (tree.set_congestion(2, 1.0), tree.advance(10.0, load=0.95)),
            "host-staged": lambda: (tree.set_traffic(3, 0.6), tree.advance(10.0, load=0.95)),
            "link back": lambda: tree.set_link(1, up=True),
            "driver reloaded": tree.reload_driver,
        }
        for state, change in states.items():
            change()
            theirs = netclass_and_infiniband(parse_families(exporter.scrape().decode()))
            try:
                assert_conforms(ours(tree.root), theirs, NEWER_LABELS)
            except AssertionError as error:
                raise AssertionError(f"{state}: {error}") from None
    finally:
        exporter.stop()
    with pytest.raises(NodeExporterError, match="did not answer"):
        exporter.scrape()

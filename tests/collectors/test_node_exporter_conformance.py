"""Our infiniband and netclass collectors against node_exporter on the same /sys trees.

Two references: node_exporter's own e2e-output.txt for its fixture tree (written by a newer
node_exporter, run with the flags of its end-to-end-test.sh), and the Debian node_exporter 1.5 binary,
started here on both fixture trees. Every family node_exporter emits must come out of ours with the
same type, help, label sets and values; families only we emit (hw counters, fleetlens_*) are ours to add.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collectors.base import ReadErrors
from collectors.infiniband import InfiniBandCollector
from collectors.netclass import NetClassCollector
from tests.support.exposition import Family, SampleKey, node_exporter_exposition, parse_families, render

COMPARED = ("node_infiniband_", "node_network_")
# node_exporter's netdev collector (/proc/net/dev) also writes node_network_*; these are not netclass's
NETDEV_HELP = "Network device statistic"
# Labels that newer node_exporter added to a family 1.5 already had; dropped before comparing with 1.5
NEWER_LABELS = {"node_network_info": "adminstate"}


def netclass_and_infiniband(families: dict[str, Family]) -> dict[str, Family]:
    return {
        name: family
        for name, family in families.items()
        if name.startswith(COMPARED) and not family.help.startswith(NETDEV_HELP)
    }


def ours(sysfs_root: Path, **netclass_flags: object) -> dict[str, Family]:
    errors = ReadErrors("conformance")
    text = render(
        InfiniBandCollector(sysfs_root, errors), NetClassCollector(sysfs_root, errors, **netclass_flags)
    )
    assert errors.count == 0, "a fixture tree is good input: nothing may be skipped"
    return parse_families(text)


def without_labels(family: Family, label: str | None) -> dict[SampleKey, float]:
    return {
        (name, frozenset((k, v) for k, v in labels if k != label)): value
        for (name, labels), value in family.samples.items()
    }


def assert_conforms(
    mine: dict[str, Family], reference: dict[str, Family], newer_labels: dict[str, str]
) -> None:
    assert any(name.startswith("node_infiniband_") for name in reference), "vacuous: no InfiniBand"
    assert any(name.startswith("node_network_") for name in reference), "vacuous: no netclass"
    missing = sorted(set(reference) - set(mine))
    assert not missing, f"families node_exporter emits and we do not: {missing}"
    for name, expected in reference.items():
        got = mine[name]
        assert (got.type, got.help) == (expected.type, expected.help), name
        assert without_labels(got, newer_labels.get(name)) == expected.samples, name


def test_equal_to_node_exporter_e2e_output(fixtures, node_exporter_sys):
    reference = netclass_and_infiniband(
        parse_families((fixtures / "node_exporter" / "e2e-output.txt").read_text())
    )
    # the flags end-to-end-test.sh runs node_exporter with
    mine = ours(node_exporter_sys, ignored_devices="(dmz|int)", ignore_invalid_speed=True)
    assert_conforms(mine, reference, newer_labels={})


@pytest.mark.integration
@pytest.mark.parametrize("tree", ["node_exporter_sys", "procfs_sys"])
def test_equal_to_node_exporter_binary(tree, request):
    sysfs_root = request.getfixturevalue(tree)
    reference = netclass_and_infiniband(parse_families(node_exporter_exposition(sysfs_root)))
    assert_conforms(ours(sysfs_root), reference, NEWER_LABELS)

"""`fleetlens topology import` and `show` as an operator runs them (real CLI processes): on a chDB store,
and through a real hub that also watches the operator's inventory file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.hubserver import hub_process

RACK_A = """\
nodes:
  vela-001: {host: host-000, rails: [rail-0, rail-1]}
  vela-002: {host: host-001}
hosts:
  host-000: {leaf: leaf-00, rack: rack-00}
  host-001: {leaf: leaf-00, rack: rack-00}
leaves:
  leaf-00: {spine: spine-0}
"""
MOVED = RACK_A.replace("vela-002: {host: host-001}", "vela-002: {host: host-001, leaf: leaf-07}")
VELA_001 = {
    "node": "vela-001", "host": "host-000", "leaf": "leaf-00", "spine": "spine-0", "rack": "rack-00",
    "rail": ["rail-0", "rail-1"],
}  # fmt: skip
VELA_002 = {"node": "vela-002", "host": "host-001", "leaf": "leaf-00", "spine": "spine-0", "rack": "rack-00"}
VELA_002_MOVED = {"node": "vela-002", "host": "host-001", "leaf": "leaf-07", "rack": "rack-00"}


def fleetlens(*args: str) -> subprocess.CompletedProcess:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("FLEETLENS_")}
    return subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", *args], capture_output=True, text=True, timeout=300, env=clean
    )


def shown(*where: str) -> list[dict]:
    done = fleetlens("topology", "show", "--json", *where)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_import_and_show_on_a_store_the_topology_now_and_as_it_was(tmp_path: Path) -> None:
    store = ("--store", f"chdb://{tmp_path / 'store'}")
    (tmp_path / "a.yaml").write_text(RACK_A)
    (tmp_path / "moved.yaml").write_text(MOVED)
    first = fleetlens("topology", "import", str(tmp_path / "a.yaml"), "--format", "inventory", *store)
    assert first.stdout.strip().endswith("9 new, 0 ended, 0 unchanged"), first.stderr
    before_the_move = time.time()
    moved = fleetlens("topology", "import", str(tmp_path / "moved.yaml"), "--format", "inventory", *store)
    assert moved.stdout.strip().endswith("1 new, 0 ended, 9 unchanged"), moved.stderr
    assert shown(*store) == [VELA_001, VELA_002_MOVED]
    assert shown("--at", str(before_the_move), *store) == [VELA_001, VELA_002]
    table = fleetlens("topology", "show", *store).stdout.splitlines()
    assert table[0].split("\t") == ["node", "host", "leaf", "spine", "rack", "rail"]
    assert table[1].split("\t") == ["vela-001", "host-000", "leaf-00", "spine-0", "rack-00", "rail-0,rail-1"]


def test_a_bad_file_is_one_line_naming_file_line_and_key_and_stores_nothing(tmp_path: Path) -> None:
    store = ("--store", f"chdb://{tmp_path / 'store'}")
    bad = tmp_path / "bad.yaml"
    bad.write_text(RACK_A + "racks:\n  rack-00: {pdu: [pdu-0]}\n")
    done = fleetlens("topology", "import", str(bad), "--format", "inventory", *store)
    assert done.returncode == 1
    assert done.stderr == f"fleetlens: {bad}: line 10: racks.rack-00.pdu: expected a name, got a sequence\n"
    unknown = fleetlens("topology", "import", str(bad), "--format", "lldpp", *store)
    assert "format: 'lldpp': not a topology format; known: guest, host-agent, ibnetdiscover" in unknown.stderr
    assert shown(*store) == []


def test_through_a_hub_that_watches_the_inventory_file(tmp_path: Path) -> None:
    inventory = tmp_path / "topology.yaml"
    inventory.write_text(RACK_A)
    with hub_process(tmp_path, "--topology-file", str(inventory)) as hub:
        hub_flag = ("--hub", hub.url)
        deadline = time.monotonic() + 60
        while not (views := shown(*hub_flag)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert views == [VELA_001, VELA_002]
        (tmp_path / "moved.json").write_text(
            json.dumps({"nodes": {"vela-002": {"host": "host-001", "leaf": "leaf-07"}}})
        )
        done = fleetlens(
            "topology", "import", str(tmp_path / "moved.json"), "--format", "inventory", *hub_flag
        )
        assert done.stdout.strip().endswith("1 new, 8 ended, 1 unchanged"), done.stderr
        assert shown(*hub_flag) == [{"node": "vela-002", "host": "host-001", "leaf": "leaf-07"}]
        refused = fleetlens(
            "topology", "import", str(tmp_path / "absent.yaml"), "--format", "inventory", *hub_flag
        )
        assert refused.returncode == 1 and "absent.yaml" in refused.stderr

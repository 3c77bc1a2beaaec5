"""The live fleet (`fleetlens sim serve`): nodes that play the scenario to the moment they are scraped,
step records that wait for a hub that does not take them yet, and the API token they are posted with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import pytest
import yaml

from hub.app import Hub
from hub.auth import SCOPES, Tokens
from hub.expfmt import ExpositionParser
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from sim.live import LiveFleet
from sim.online import StepPoster
from sim.scenario import parse_scenario
from tests.support.clock import FakeClock
from tests.support.hubserver import on_loopback
from tests.support.loopback import LoopbackPostServer
from tests.support.peers import require_binary, stop

EPOCH = 1_800_000_000.0
SCENARIO = {
    "seed": 5,
    "duration_s": 120,
    "interval_s": 10,
    "fleet": {"nodes": 2, "gpus_per_node": 2, "nics_per_node": 2, "prefix": "live-"},
    "jobs": [{"name": "small", "nodes": 2, "step_s": 2.0, "dp": 2, "pp": 1, "tp": 2}],
    "faults": [{"kind": "link_down", "node": "live-002", "nic": 1, "start_s": 30, "end_s": 60}],
}


def port_states(address: str) -> dict[str, float]:
    """device:port -> node_infiniband_state_id as one scrape of the node shows them."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    parsed = ExpositionParser().parse(text)
    return {
        f"{labels['device']}:{labels['port']}": value
        for name, labels, value in zip(parsed.names, parsed.labels, parsed.values, strict=True)
        if name == "node_infiniband_state_id"
    }


def test_each_scrape_sees_its_node_as_the_scenario_has_it_at_that_moment(tmp_path: Path):
    clock = FakeClock(EPOCH + 5)
    fleet = LiveFleet(parse_scenario(SCENARIO, "live"), tmp_path, EPOCH, clock=clock).start()
    try:
        assert [group["labels"]["node"] for group in fleet.targets] == ["live-001", "live-002"]
        address = fleet.addresses["live-002"]
        assert port_states(address) == {"mlx5_0:1": 4, "mlx5_1:1": 4}
        clock.advance(30)  # 35 s: the link is down
        assert port_states(address) == {"mlx5_0:1": 4, "mlx5_1:1": 1}
        clock.advance(40)  # 75 s: back
        assert port_states(address)["mlx5_1:1"] == 4
        assert port_states(fleet.addresses["live-001"]) == {"mlx5_0:1": 4, "mlx5_1:1": 4}
    finally:
        fleet.close()


def test_step_records_a_hub_refused_are_sent_with_the_next_ones_and_none_twice(tmp_path: Path):
    answers, received = [503, 200, 200], []

    def hub(body: bytes, headers: Message) -> tuple[int, str, bytes]:
        status = answers.pop(0)
        if status == 200:
            received.extend(json.loads(line) for line in body.decode().splitlines())
        return status, "application/json", b"{}"

    clock = FakeClock(EPOCH + 20)
    fleet = LiveFleet(parse_scenario(SCENARIO, "live"), tmp_path, EPOCH, clock=clock)
    with LoopbackPostServer(hub) as server, StepPoster(server.url.removeprefix("http://")) as poster:
        fleet.post_steps(poster)  # refused: kept
        assert received == []
        clock.advance(20)
        fleet.post_steps(poster)  # the first 20 s and the next 20 s
        clock.advance(20)
        fleet.post_steps(poster)

    per_rank = {}
    for record in received:
        per_rank.setdefault((record["node"], record["rank"]), []).append(record["step"])
    assert len(per_rank) == 4  # 2 nodes x 2 GPUs
    for steps in per_rank.values():
        first = steps[0]  # every step once, in order, 2 s each over the 60 s
        assert steps == list(range(first, first + len(steps))) and len(steps) >= 25


@pytest.mark.integration
def test_stock_nodes_serve_dcgm_exporter_and_node_exporter_each_played_to_the_scrape(tmp_path: Path):
    require_binary("prometheus-node-exporter")
    stock = {
        **SCENARIO,
        "exporters": "stock",
        "confounders": [{"kind": "scrape_gap", "node": "live-002", "start_s": 80, "end_s": 100}],
    }
    clock = FakeClock(EPOCH + 5)
    fleet = LiveFleet(parse_scenario(stock, "live"), tmp_path, EPOCH, clock=clock).start()
    try:
        files = fleet.file_sd(tmp_path / "targets.json")
        names = ("live-001", "live-002")
        assert [path.name for path in files] == ["targets.dcgm-exporter.json", "targets.node-exporter.json"]
        dcgm, node = files.values()
        assert dcgm == [
            {"targets": [fleet.addresses[name]], "labels": {"instance": f"{name}:9400"}} for name in names
        ]
        assert node == [
            {
                "targets": [fleet.node_exporter_addresses[name]],
                "labels": {"node": name, "instance": f"{name}:9100"},
            }
            for name in names
        ]
        exporter = fleet.node_exporter_addresses["live-002"]
        assert port_states(exporter) == {"mlx5_0:1": 4, "mlx5_1:1": 4}
        clock.advance(30)  # 35 s: the link is down, and node_exporter reads it from the tree
        assert port_states(exporter) == {"mlx5_0:1": 4, "mlx5_1:1": 1}
        gpu_temps = scrape_names(fleet.addresses["live-002"])
        assert "DCGM_FI_DEV_GPU_TEMP" in gpu_temps and not any(n.startswith("fleetlens_") for n in gpu_temps)
        assert "node_scrape_collector_success" in scrape_names(exporter), "node_exporter's own answer"
        clock.advance(50)  # 85 s: a scrape gap takes both exporters away
        for address in (exporter, fleet.addresses["live-002"]):
            with pytest.raises(urllib.error.HTTPError, match="503"):
                scrape_names(address)
        clock.advance(20)  # 105 s: back, the link too
        assert port_states(exporter)["mlx5_1:1"] == 4
    finally:
        fleet.close()


def scrape_names(address: str) -> set[str]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return set(ExpositionParser().parse(response.read().decode()).names)


def test_sim_serve_posts_its_hosts_agent_reports_and_step_records_with_the_api_token(store, tmp_path: Path):
    """`fleetlens sim serve --hub` sends FLEETLENS_API_TOKEN, as every client of a hub does: a hub with
    tokens stores its jobs' step records, and the topology its hosts' agents and its operator report
    places each node where the scenario lays it out (`fleetlens topology show --hub`)."""
    hub = Hub(
        store,
        Writer(store, Spool(tmp_path / "spool", 1 << 20)),
        OtlpStepReceiver(),
        tokens=Tokens({"sim-token": frozenset(SCOPES)}),
    )
    scenario = tmp_path / "live.yaml"
    scenario.write_text(yaml.safe_dump({**SCENARIO, "interval_s": 1, "topology": {"vms_per_host": 2}}))
    token = {**os.environ, "FLEETLENS_API_TOKEN": "sim-token"}
    with on_loopback(hub) as url:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "fleetlens.cli", "sim", "serve", str(scenario)),
                *("--file-sd", str(tmp_path / "targets.json"), "--hub", url),
                *("--epoch", str(time.time() - 30)),
            ],
            env=token,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            while not stored_steps(store) and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            stop(process)
        assert stored_steps(store) > 0, process.stderr.read()[-2000:]
        shown = subprocess.run(
            [sys.executable, "-m", "fleetlens.cli", "topology", "show", "--hub", url, "--json"],
            env=token,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert hub.refused == {}
    assert shown.returncode == 0, shown.stderr
    place = {"host": "host-000", "leaf": "leaf-00", "spine": "spine-0", "rack": "rack-00"}
    assert json.loads(shown.stdout) == [
        {"node": node, **place, "rail": ["rail-0", "rail-1"]} for node in ("live-001", "live-002")
    ]


def stored_steps(store) -> int:
    return store.query("SELECT count() FROM steps WHERE job = 'small'").rows[0][0]

"""Debian's real Prometheus 2.42 remote-writes what it scrapes (a real fleetlens exporter with simulated
GPUs, a real node_exporter on procfs's /sys fixture) into the hub: the store then holds exactly the series
and values Prometheus's own API returns for the same timestamps; in agent mode, the exporters' series."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from analytics.store import Store
from hub.app import Hub
from hub.expfmt import ExpositionParser
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.support.exposition import scrape
from tests.support.hubserver import on_loopback
from tests.support.peers import fleetlens_exporter, free_port, node_exporter, peer, require_binary

pytestmark = pytest.mark.integration

NODE = "vela-001"


@contextmanager
def hub_on_loopback(store: Store, tmp_path: Path) -> Iterator[tuple[Hub, str]]:
    hub = Hub(store, Writer(store, Spool(tmp_path / "spool", 64 << 20)), OtlpStepReceiver())
    with on_loopback(hub) as url:
        yield hub, url


@contextmanager
def prometheus_writing_to(hub_url: str, tmp_path: Path, procfs_sys: Path, agent: bool) -> Iterator[dict]:
    """Exporters and a Prometheus scraping them every second and remote-writing to `hub_url`. The node
    exporter's target gets a `node` label (file_sd/static labels); the fleetlens exporter's series carry
    dcgm-exporter's Hostname."""
    binary = require_binary("prometheus")
    with ExitStack() as stack:
        gpu_args, gpu_url = fleetlens_exporter(
            "--gpu-backend",
            "sim",
            "--sysfs-root",
            str(procfs_sys),
            "--node",
            NODE,
            "--disable-collector",
            "infiniband",
            "--disable-collector",
            "netclass",
        )
        nic_args, nic_url = node_exporter(procfs_sys)
        stack.enter_context(peer(gpu_args, gpu_url))
        stack.enter_context(peer(nic_args, nic_url))
        gpu_target, nic_target = (
            url.removeprefix("http://").removesuffix("/metrics") for url in (gpu_url, nic_url)
        )
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {"job_name": "dcgm", "static_configs": [{"targets": [gpu_target]}]},
                {"job_name": "node", "static_configs": [{"targets": [nic_target], "labels": {"node": NODE}}]},
            ],
            "remote_write": [
                {
                    "url": f"{hub_url}/api/v1/write",
                    "queue_config": {
                        "batch_send_deadline": "1s",
                        "min_backoff": "100ms",
                        "max_backoff": "1s",
                    },
                }
            ],
        }
        if not agent:
            config["global"]["evaluation_interval"] = "1s"
        (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
        port = free_port()
        storage = (
            ["--enable-feature=agent", f"--storage.agent.path={tmp_path / 'wal'}"]
            if agent
            else [f"--storage.tsdb.path={tmp_path / 'tsdb'}"]
        )
        args = [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *storage,
        ]
        stack.enter_context(peer(args, f"http://127.0.0.1:{port}/-/ready"))
        yield {
            "api": f"http://127.0.0.1:{port}",
            "gpu": gpu_url,
            "nic": nic_url,
            "targets": (gpu_target, nic_target),
        }


def prometheus_query(api: str, expr: str, at: float) -> list[dict]:
    url = f"{api}/api/v1/query?{urllib.parse.urlencode({'query': expr, 'time': f'{at:.3f}'})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def wait_for_rows(store: Store, sql: str, want: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while store.query(sql).rows[0][0] < want:
        assert time.monotonic() < deadline, f"the hub never had {want} rows of: {sql}"
        time.sleep(0.5)


def hub_samples(store: Store, until_ms: int) -> dict[tuple, float]:
    """(metric, node, labels, ts ms) -> value of everything the hub stored up to `until_ms`."""
    rows = store.query(
        "SELECT metric, node, labels, toUnixTimestamp64Milli(ts), value FROM metrics "
        "WHERE toUnixTimestamp64Milli(ts) <= {until:Int64}",
        parameters={"until": until_ms},
    ).rows
    return {
        (metric, node, tuple(sorted(labels.items())), ts): value for metric, node, labels, ts, value in rows
    }


def exposed_series(*urls: str) -> dict[tuple[str, frozenset], float]:
    """Each exporter's series as Prometheus ingests them: the hub's own text-format parser, and labels
    with an empty value left out (Prometheus drops them)."""
    series = {}
    for url in urls:
        exposition = ExpositionParser().parse(scrape(url))
        for name, labels, value in zip(exposition.names, exposition.labels, exposition.values, strict=True):
            series[(name, frozenset((k, v) for k, v in labels.items() if v))] = value
    return series


def test_prometheus_remote_write_lands_the_same_series_and_values_its_api_returns(
    store, tmp_path, procfs_sys
):
    with (
        hub_on_loopback(store, tmp_path) as (_, hub_url),
        prometheus_writing_to(hub_url, tmp_path, procfs_sys, agent=False) as prometheus,
    ):
        wait_for_rows(store, "SELECT uniqExact(ts) FROM targets", 6)
        at = time.time() - 3  # what Prometheus has sent by now, with the hub's batching slack
        time.sleep(4)
        answer = prometheus_query(prometheus["api"], '{job=~"dcgm|node"}[30s]', at)

    expected: dict[tuple, float] = {}
    ups = []
    for series in answer:
        labels = dict(series["metric"])
        name = labels.pop("__name__")
        node = labels.pop("node", None) or NODE  # the exporter's own series: the node its others named
        for ts, value in series["values"]:
            ts_ms = round(float(ts) * 1000)
            if name == "up":
                ups.append((labels["instance"], ts_ms, float(value)))
            else:
                expected[(name, node, tuple(sorted(labels.items())), ts_ms)] = float(value)
    stored = hub_samples(store, round(at * 1000))
    assert {key[0] for key in expected} >= {
        "DCGM_FI_DEV_GPU_TEMP",
        "node_infiniband_port_data_received_bytes_total",
    }
    assert len(expected) > 500
    missing = {key for key in expected if key not in stored}
    assert not missing, (
        f"{len(missing)} of {len(expected)} Prometheus samples not in the hub, e.g. {sorted(missing)[:3]}"
    )
    assert {key: stored[key] for key in expected} == expected
    assert {key[1] for key in stored} == {NODE}  # GPU (Hostname) and NIC (node label) series meet

    targets = store.query(
        "SELECT target, toUnixTimestamp64Milli(ts), up, node FROM targets "
        "WHERE toUnixTimestamp64Milli(ts) <= {until:Int64}",
        parameters={"until": round(at * 1000)},
    ).rows
    assert sorted((target, ts, float(up)) for target, ts, up, _ in targets) == sorted(ups)
    assert {node for *_, node in targets} == {NODE}


def test_prometheus_in_agent_mode_sends_every_exporter_series(store, tmp_path, procfs_sys):
    with (
        hub_on_loopback(store, tmp_path) as (hub, hub_url),
        prometheus_writing_to(hub_url, tmp_path, procfs_sys, agent=True) as prometheus,
    ):
        wait_for_rows(store, "SELECT uniqExact(ts) FROM targets", 3)
        exposed = exposed_series(prometheus["gpu"], prometheus["nic"])
        time.sleep(2)

    stored = store.query("SELECT metric, labels, argMax(value, ts) FROM metrics GROUP BY metric, labels").rows
    stored_series = {
        (metric, frozenset((k, v) for k, v in labels.items() if k not in ("job", "instance"))): value
        for metric, labels, value in stored
    }
    exporter_series = set(exposed)
    assert exporter_series <= set(stored_series), sorted(exporter_series - set(stored_series))[:3]
    # the node_exporter's fixture tree does not change: its last stored values are the exposed ones
    for (name, labels), value in exposed.items():
        if name.startswith("node_infiniband_"):
            assert stored_series[(name, labels)] == value, name
    assert hub.remote_write.requests > 0

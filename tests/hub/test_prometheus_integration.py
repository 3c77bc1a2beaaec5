"""A real Prometheus (Debian's) scrapes a real fleetlens exporter: what an SRE sees in Prometheus."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

import pytest

from tests.support.peers import fleetlens_exporter, peer, prometheus

pytestmark = pytest.mark.integration


def query(base: str, expr: str) -> list[dict]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        answer = json.load(resp)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def wait_for(base: str, expr: str, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = query(base, expr)
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"Prometheus never returned {expr!r}")


def test_prometheus_scrapes_gpu_and_infiniband_series(procfs_sys, tmp_path):
    args, metrics_url = fleetlens_exporter(
        "--gpu-backend", "sim", "--sysfs-root", str(procfs_sys), "--node", "vela-001"
    )
    target = metrics_url.removeprefix("http://").removesuffix("/metrics")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: fleetlens\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    prometheus_args, base = prometheus(tmp_path)
    with peer(args, metrics_url), peer(prometheus_args, f"{base}/-/ready"):
        up = wait_for(base, 'up{job="fleetlens"} == 1')
        assert up[0]["metric"]["instance"] == target

        temps = wait_for(base, "DCGM_FI_DEV_GPU_TEMP")
        assert len(temps) == 8
        assert {series["metric"]["Hostname"] for series in temps} == {"vela-001"}
        assert all(series["metric"]["UUID"].startswith("GPU-") for series in temps)

        received = wait_for(base, 'node_infiniband_port_data_received_bytes_total{device="mlx5_0"}')
        assert received[0]["metric"]["port"] == "1"
        assert float(received[0]["value"][1]) > 0

        success = wait_for(base, "fleetlens_exporter_collector_success")
        assert {s["metric"]["collector"]: s["value"][1] for s in success}["infiniband"] == "1"

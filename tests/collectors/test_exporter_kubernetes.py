"""The exporter with --kubernetes: a scrape shows the pod, namespace and container on the DCGM_* series
of the GPU a pod holds, as the kubelet's PodResources API (a real gRPC server, tests/support/kubelet.py)
says, and none on a free GPU; a kubelet that cannot be asked leaves the scrape whole, without them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors import registry
from collectors.base import CollectorOptions
from collectors.exporter import Exporter, make_registry, scrape_body
from tests.support.kubelet import FakeKubelet, compile_proto, gpu_pod


@pytest.fixture(scope="module")
def server_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_proto(tmp_path_factory.mktemp("podresources-server"))


def scrape(socket: Path) -> dict[str, list[dict[str, str]]]:
    """One scrape of the exporter's gpu collector (two simulated GPUs) with --kubernetes on `socket`:
    the labels of every sample, by metric name."""
    options = CollectorOptions(
        gpu_backend="sim", gpu_sim_count=2, kubernetes=True, pod_resources_socket=socket
    )
    exporter = Exporter(registry.build(["gpu"], options))
    try:
        body, _ = scrape_body(make_registry(exporter, process_metrics=False))
    finally:
        exporter.close()
    return samples(body.decode())


def samples(text: str) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample.labels)
    return found


def uuids(socket: Path) -> list[str]:
    """The simulated GPUs' UUIDs, in index order (read from a scrape with no kubelet)."""
    return [
        labels["UUID"] for labels in sorted(scrape(socket)["DCGM_FI_DEV_GPU_TEMP"], key=lambda x: x["gpu"])
    ]


def test_the_held_gpus_series_carry_its_pod_and_the_free_ones_none(server_code: Path, tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    held, free = uuids(socket)
    with FakeKubelet(server_code, socket, [gpu_pod("bert-worker-0", "ml", "trainer", held)]):
        series = scrape(socket)
    pods = {
        (labels["UUID"], labels.get("pod"), labels.get("namespace"), labels.get("container"))
        for name, all_labels in series.items()
        if name.startswith("DCGM_")
        for labels in all_labels
    }
    assert pods == {(held, "bert-worker-0", "ml", "trainer"), (free, None, None, None)}
    assert all("pod" not in labels for labels in series["fleetlens_gpu_up"])


def test_a_kubelet_that_cannot_be_asked_leaves_the_scrape_whole_without_pod_labels(
    server_code: Path, tmp_path: Path
) -> None:
    socket = tmp_path / "kubelet.sock"
    with FakeKubelet(server_code, socket, [], serves_list=False):
        series = scrape(socket)
    assert len(series["DCGM_FI_DEV_GPU_TEMP"]) == 2
    assert not any("pod" in labels for all_labels in series.values() for labels in all_labels)


def test_fleetlens_collect_with_kubernetes_labels_the_held_gpu(server_code: Path, tmp_path: Path) -> None:
    socket = tmp_path / "kubelet.sock"
    held, free = uuids(socket)
    with FakeKubelet(server_code, socket, [gpu_pod("p", "ml", "main", held)]):
        answer = subprocess.run(
            [
                sys.executable,
                "-m",
                "fleetlens.cli",
                "collect",
                "--gpu-backend",
                "sim",
                "--gpu-sim-count",
                "2",
                "--kubernetes",
                "--pod-resources-kubelet-socket",
                str(socket),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={key: value for key, value in os.environ.items() if not key.startswith("FLEETLENS_")},
        )
    assert answer.returncode == 0, answer.stderr
    temps = samples(answer.stdout)["DCGM_FI_DEV_GPU_TEMP"]
    assert {labels["UUID"]: labels.get("pod") for labels in temps} == {held: "p", free: None}

"""Hostile /sys trees (`--sysfs-root` names any directory): files that would block a read, and text that
would break the exposition. The exporter must answer every scrape promptly, skip and count only what is
bad, and hand the hub label values it accepts.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collectors import registry, sysfs
from collectors.base import CollectorOptions
from collectors.exporter import Exporter, make_registry, serve
from collectors.infiniband import hw_counter_metric
from hub.expfmt import Exposition, ExpositionParser
from tests.support.exposition import SampleKey, key, parse_samples

IB_COUNTER = "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data"
NET_ATTRIBUTE = "class/net/eth0/mtu"
LOST = {  # what planting something at IB_COUNTER and NET_ATTRIBUTE costs, and nothing more
    key("node_infiniband_port_data_transmitted_bytes_total", device="mlx5_0", port="1"),
    key("node_network_mtu_bytes", device="eth0"),
}


@pytest.fixture
def tree(procfs_sys, tmp_path) -> Path:
    """A private copy of the procfs tree's class/infiniband and class/net; the sysfs root."""
    root = tmp_path / "sys"
    for directory in ("infiniband", "net"):
        shutil.copytree(procfs_sys / "class" / directory, root / "class" / directory, symlinks=True)
    return root


@pytest.fixture
def exporter_url(tree) -> Iterator[str]:
    """The /metrics URL of a real exporter (infiniband and netclass) serving `tree` on 127.0.0.1."""
    options = CollectorOptions(sysfs_root=tree, gpu_backend="none", node="hostile")
    exporter = Exporter(registry.build(("infiniband", "netclass"), options))
    server = serve(make_registry(exporter, process_metrics=False), "127.0.0.1", 0)
    server.block_on_close = False  # a scrape blocked by a regression must fail the test, not hang it
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/metrics"
    server.shutdown()
    server.server_close()


def body(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:  # a blocked scrape fails here, not hangs
        return response.read().decode()


def scrape(url: str) -> dict[SampleKey, float]:
    return parse_samples(body(url))


def read_errors(samples: dict[SampleKey, float], collector: str) -> float:
    return samples[key("fleetlens_exporter_read_errors_total", collector=collector)]


def without_exporter_metrics(samples: dict[SampleKey, float]) -> dict[SampleKey, float]:
    return {k: v for k, v in samples.items() if not k[0].startswith("fleetlens_exporter_")}


def settled_thread_count(at_most: int, timeout_s: float = 3.0) -> int:
    """The thread count once it is at most `at_most`, or whatever it is after `timeout_s`: a handler
    thread may still be closing its connection when the client has read the response."""
    deadline = time.monotonic() + timeout_s
    while threading.active_count() > at_most and time.monotonic() < deadline:
        time.sleep(0.02)
    return threading.active_count()


def as_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def as_unix_socket(path: Path) -> None:
    """A listening-less unix socket file; bound from its directory, as a sysfs path can pass the
    108-byte limit of socket addresses."""
    path.unlink()
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(path.name)
    finally:
        os.chdir(cwd)


def as_device_node(path: Path) -> None:
    """/dev/null's character device node (needs root, or CAP_MKNOD)."""
    path.unlink()
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root (CAP_MKNOD)")


@pytest.mark.parametrize("plant", [as_fifo, as_unix_socket, as_device_node], ids=["fifo", "socket", "device"])
def test_special_files_are_skipped_without_blocking(
    tree, exporter_url, caplog, plant: Callable[[Path], None]
):
    threads = threading.active_count()
    pristine = without_exporter_metrics(scrape(exporter_url))
    for relative in (IB_COUNTER, NET_ATTRIBUTE):
        plant(tree / relative)

    start = time.monotonic()
    for _ in range(10):
        scrape(exporter_url)
    assert time.monotonic() - start < 5

    for _ in range(10):
        samples = scrape(exporter_url)
    assert without_exporter_metrics(samples) == {k: v for k, v in pristine.items() if k not in LOST}
    assert read_errors(samples, "infiniband") == 20  # one skipped sample in each of 20 scrapes
    assert read_errors(samples, "netclass") == 20
    assert settled_thread_count(threads) <= threads
    for relative in (IB_COUNTER, NET_ATTRIBUTE):
        assert str(tree / relative) in caplog.text
    if plant is as_fifo:
        assert "not a regular file (fifo)" in caplog.text


def test_fifo_where_a_directory_belongs(tree, exporter_url, caplog):
    pristine = without_exporter_metrics(scrape(exporter_url))
    hw_counters = tree / "class/infiniband/mlx5_0/ports/1/hw_counters"
    hw_names = {hw_counter_metric(name).name for name in os.listdir(hw_counters)}
    shutil.rmtree(hw_counters)
    os.mkfifo(hw_counters)
    eth0 = tree / "class/net/eth0"
    shutil.rmtree(eth0)
    os.mkfifo(eth0)

    start = time.monotonic()
    samples = scrape(exporter_url)
    assert time.monotonic() - start < 5

    mlx5_port = frozenset({("device", "mlx5_0"), ("port", "1")})
    lost = {k for k in pristine if ("device", "eth0") in k[1] or (k[0] in hw_names and k[1] == mlx5_port)}
    assert len(lost) > 20  # eth0's samples, and mlx5_0's hw counters (not its counters/)
    assert without_exporter_metrics(samples) == {k: v for k, v in pristine.items() if k not in lost}
    assert read_errors(samples, "infiniband") == 1
    assert read_errors(samples, "netclass") == 1
    assert f"{hw_counters}: cannot list: Not a directory" in caplog.text


def labels_of(exposition: Exposition, name: str, device: str) -> dict[str, str]:
    [labels] = [
        labels
        for sample, labels in zip(exposition.names, exposition.labels, strict=True)
        if sample == name and labels["device"] == device
    ]
    return labels


CONTROL_AND_BULK = b"rack\x00 7\rrow\x1b[2J 3\x7f\xc2\x85 \xe2\x80\xa8\xff" + b"x" * 4096


def test_control_characters_and_bulk_never_reach_label_values(tree, exporter_url):
    (tree / "class/net/eth0/ifalias").write_bytes(CONTROL_AND_BULK)
    (tree / "class/infiniband/mlx5_0/board_id").write_bytes(CONTROL_AND_BULK)
    (tree / "class/infiniband/mlx5_0/fw_ver").write_bytes(b'12.1\\"x\n"} 1\nfake_metric 2')
    text = body(exporter_url)

    exposition = ExpositionParser().parse(text)  # the hub takes the whole scrape
    # NUL, CR, ESC, DEL, NEL (C1) and U+2028 dropped; bad UTF-8 replaced; 4 KB cut to 256 characters
    expected = ("rack 7row[2J 3 \ufffd" + "x" * 4096)[: sysfs.LABEL_VALUE_MAX_CHARS]
    assert labels_of(exposition, "node_network_info", "eth0")["ifalias"] == expected
    mlx5 = labels_of(exposition, "node_infiniband_info", "mlx5_0")
    assert mlx5["board_id"] == expected
    assert mlx5["firmware_version"] == '12.1\\"x"} 1fake_metric 2'  # escaped, so parsed back as it was
    assert "fake_metric" not in exposition.names
    assert len(parse_samples(text)) == len(exposition)  # prometheus_client's parser agrees


def test_entry_names_become_clean_labels(tree, exporter_url):
    (tree / "class/net/eth0").rename(tree / "class/net/eth\n0\x1b")
    (tree / "class/infiniband/mlx4_0").rename(tree / "class/infiniband/mlx4\r_0")
    labels = ExpositionParser().parse(body(exporter_url)).labels
    devices = {series["device"] for series in labels if "device" in series}
    assert {"eth0", "mlx4_0", "mlx5_0"} <= devices
    assert all(value.isprintable() for series in labels for value in series.values())


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("mlx5_0", "mlx5_0"),
        ("", ""),
        ("MT_0000000010 é ü\u00a0", "MT_0000000010 é ü\u00a0"),  # printable non-ASCII is kept
        ("a\tb\nc\x00d\x1fe\x7ff\x80g\x9fh", "abcdefgh"),
        ("x" * 300, "x" * sysfs.LABEL_VALUE_MAX_CHARS),
    ],
)
def test_label_value(text, label):
    assert sysfs.label_value(text) == label

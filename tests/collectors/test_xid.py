"""Xid errors: the kernel-log parser on gpud's real logs, log following, the counter fed by both sources."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from collectors import registry
from collectors.base import CollectorOptions, ReadErrors
from collectors.errors import LogParseError
from collectors.follow import FollowedFile
from collectors.gpu.model import normalize_pci_bus_id
from collectors.gpu.sim import ManualClock, SimBackend
from collectors.xid import KmsgReader, XidCollector, open_kernel_log, parse_xid_line
from tests.support.exposition import samples_of

# What each gpud fixture holds, read off the files: (PCI address, Xid) per Xid line.
GPUD_XIDS = {
    "dmesg-with-xid-119.log": [("00000000:9B:00.0", 119)] * 5,
    # one GPU's hard fault: a double-bit ECC error, its row marked for remapping, nine contained errors
    "dmesg.0.log": [("00000000:19:00.0", 48), ("00000000:19:00.0", 63)] + [("00000000:19:00.0", 94)] * 9,
}


def parse_file(path: Path) -> tuple[list[tuple[str, int]], int]:
    """The (PCI address, Xid) of every Xid line in `path`, and how many Xid-looking lines were malformed."""
    found, malformed = [], 0
    for number, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            event = parse_xid_line(text, f"{path.name}:{number}")
        except LogParseError:
            malformed += 1
            continue
        if event is not None:
            found.append((event.pci_bus_id, event.xid))
    return found, malformed


def test_every_gpud_log_parses_to_exactly_its_xids(fixtures):
    logs = sorted((fixtures / "gpud").iterdir())
    assert len(logs) >= 6
    for log in logs:
        assert parse_file(log) == (GPUD_XIDS.get(log.name, []), 0), log.name


def real_xid_messages(fixtures: Path) -> list[str]:
    """The kernel messages of gpud's dmesg Xid lines, without dmesg's `[timestamp] ` prefix."""
    lines = (fixtures / "gpud" / "dmesg-with-xid-119.log").read_text().splitlines()
    return [line.split("] ", 1)[1] for line in lines if "NVRM: Xid" in line]


def as_kmsg(messages: list[str]) -> str:
    """/dev/kmsg records (`prio,seq,usec,flags;message`), the format of gpud's kmsg fixtures."""
    return "".join(f"3,{4100 + n},{227996636 + n},-;{message}\n" for n, message in enumerate(messages))


def test_kmsg_records_parse_like_dmesg_lines(fixtures, tmp_path):
    kmsg = tmp_path / "kmsg.log"
    kmsg.write_text(as_kmsg(real_xid_messages(fixtures)))
    assert parse_file(kmsg) == (GPUD_XIDS["dmesg-with-xid-119.log"], 0)


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        (
            "NVRM: Xid (0000:af:00): 48, pid='<unknown>', name=<unknown>, Ch 00000008",
            ("00000000:AF:00.0", 48),
        ),
        (
            "kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
            ("00000000:3B:00.0", 79),
        ),
        ("NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d", None),
        (
            "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every 30).",
            None,
        ),
    ],
)
def test_older_xid_spellings_parse_and_other_nvrm_lines_are_ignored(line, parsed):
    event = parse_xid_line(line, "test")
    assert (event and (event.pci_bus_id, event.xid)) == parsed


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:9b:00): pid=2024380, name=nvidia-smi, Timeout after 6s",
        "NVRM: Xid (PCI:gpu4): 119, pid=2024380, name=nvidia-smi",
        "NVRM: Xid (PCI:0000:9b:00",
    ],
)
def test_xid_lines_without_a_code_or_address_are_errors_naming_the_line(line):
    with pytest.raises(LogParseError, match=r"kern\.log:7: .*Xid line"):
        parse_xid_line(line, "kern.log:7")


def test_pci_addresses_take_nvmls_spelling():
    assert normalize_pci_bus_id("0000:9b:00") == "00000000:9B:00.0"
    assert normalize_pci_bus_id("00000000:1A:00.0") == "00000000:1A:00.0"
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_pci_bus_id("9b:00")


def texts(log: FollowedFile | KmsgReader) -> list[str]:
    return [text for _, text in log.read_lines()]


def test_followed_log_returns_only_new_complete_lines(tmp_path):
    path = tmp_path / "kern.log"
    path.write_text("one\ntwo\n")
    log = FollowedFile(path)
    assert list(log.read_lines()) == [(1, "one"), (2, "two")]
    assert texts(log) == []
    with path.open("a") as out:
        out.write("three\nfou")
    assert list(log.read_lines()) == [(3, "three")]
    with path.open("a") as out:
        out.write("r\n")
    assert texts(log) == ["four"]
    log.close()


def test_followed_log_finishes_a_rotated_file_then_reads_its_successor(tmp_path):
    path = tmp_path / "kern.log"
    path.write_text("old 1\n")
    log = FollowedFile(path)
    assert texts(log) == ["old 1"]
    with path.open("a") as out:
        out.write("old 2\nold 3 unterminated")
    path.rename(tmp_path / "kern.log.1")
    assert texts(log) == ["old 2"]  # successor not there yet
    path.write_text("new 1\n")
    assert list(log.read_lines()) == [(3, "old 3 unterminated"), (1, "new 1")]
    log.close()


def test_followed_log_starts_over_after_truncation_in_place(tmp_path):
    path = tmp_path / "kern.log"
    path.write_text("a long first line\nanother\n")
    log = FollowedFile(path)
    assert len(texts(log)) == 2
    path.write_text("fresh\n")  # copytruncate: same inode, shorter
    assert texts(log) == ["fresh"]
    log.close()


def test_kmsg_reader_returns_records_without_waiting_for_more(tmp_path):
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    reader = KmsgReader(fifo)
    assert texts(reader) == []  # nothing written yet, and no writer: returns at once
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(writer, b"3,4100,227996636,-;NVRM: Xid (PCI:0000:9b:00): 119, pid=1\n SUBSYSTEM=pci\n")
        assert texts(reader) == [
            "3,4100,227996636,-;NVRM: Xid (PCI:0000:9b:00): 119, pid=1",
            " SUBSYSTEM=pci",
        ]
        assert texts(reader) == []  # writer still open: would block, so returns
    finally:
        os.close(writer)
        reader.close()


def test_the_real_dev_kmsg_is_read_as_records():
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    reader = open_kernel_log(Path("/dev/kmsg"))
    assert isinstance(reader, KmsgReader)
    records = [text for text in texts(reader) if not text.startswith(" ")]
    reader.close()
    assert records
    assert all(re.match(r"\d+,\d+,\d+,[^;]*;", record) for record in records)


def xid_totals(collector: XidCollector) -> dict[tuple[str, ...], float]:
    """{(gpu, pci_bus_id, xid, source): count} of one scrape."""
    samples = samples_of(collector).get("fleetlens_gpu_xid_errors_total", [])
    keys = ("gpu", "pci_bus_id", "xid", "source")
    return {tuple(s.labels[key] for key in keys): s.value for s in samples}


def test_kernel_log_xids_are_counted_as_the_log_grows_and_malformed_ones_skipped(fixtures, tmp_path):
    log = tmp_path / "kern.log"
    real = (fixtures / "gpud" / "dmesg-with-xid-119.log").read_text()
    log.write_text(real + "[Sun Feb 23 16:31:00 2025] NVRM: Xid (PCI:0000:9b:00): , pid=1\n")
    (built,) = registry.build(["xid"], CollectorOptions(gpu_backend="none", kernel_log=log, node="n"))
    assert xid_totals(built.collector) == {("", "00000000:9B:00.0", "119", "kernel_log"): 5}
    assert built.errors.count == 1
    with log.open("a") as out:
        out.write(real.splitlines()[2] + "\n")
    assert xid_totals(built.collector) == {("", "00000000:9B:00.0", "119", "kernel_log"): 6}
    built.collector.close()


def test_a_missing_kernel_log_is_reported_and_the_scrape_goes_on(tmp_path):
    errors = ReadErrors("xid")
    collector = XidCollector("n", errors, kernel_log=open_kernel_log(tmp_path / "absent.log"))
    assert list(collector.collect()) == []
    assert errors.count == 1


def test_xids_from_nvml_and_the_log_carry_the_gpus_labels_and_dcgms_last_xid(fixtures, tmp_path):
    sim = SimBackend(count=4, seed=8, clock=ManualClock())
    gpu3 = sim.identities()[3]
    log = tmp_path / "kern.log"
    message = real_xid_messages(fixtures)[0].replace("PCI:0000:9b:00", f"PCI:{gpu3.pci_bus_id[4:-2]}")
    log.write_text(as_kmsg([message]))
    collector = XidCollector("vela-003", ReadErrors("xid"), sim, FollowedFile(log))
    assert xid_totals(collector) == {("3", gpu3.pci_bus_id, "119", "kernel_log"): 1}
    sim.set_fault(3, "xid", code=48)
    sim.set_fault(3, "xid", code=48)
    assert xid_totals(collector) == {
        ("3", gpu3.pci_bus_id, "48", "nvml"): 2,
        ("3", gpu3.pci_bus_id, "119", "kernel_log"): 1,
    }
    (sample,) = [
        s for s in samples_of(collector)["fleetlens_gpu_xid_errors_total"] if s.labels["xid"] == "48"
    ]
    assert sample.labels["UUID"] == gpu3.uuid and sample.labels["device"] == "nvidia3"
    last = {s.labels["gpu"]: s.value for s in samples_of(collector)["DCGM_FI_DEV_XID_ERRORS"]}
    assert last == {"0": 0, "1": 0, "2": 0, "3": 48}
    collector.close()
    sim.set_fault(0, "xid", code=31)
    assert ("0", sim.identities()[0].pci_bus_id, "31", "nvml") not in xid_totals(collector)


def test_the_xid_counter_renders_with_total_in_both_formats():
    sim = SimBackend(count=2, clock=ManualClock())
    collector = XidCollector("n", ReadErrors("xid"), sim)
    sim.set_fault(1, "gpu_lost")
    collectors = CollectorRegistry(auto_describe=False)
    collectors.register(collector)
    pattern = r'^fleetlens_gpu_xid_errors_total\{.*gpu="1".*xid="79"\} 1\.0$'
    for render in (generate_latest, generate_openmetrics):
        text = render(collectors).decode()
        assert "# TYPE fleetlens_gpu_xid_errors" in text
        assert re.search(pattern, text, re.MULTILINE), render

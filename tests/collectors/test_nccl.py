"""The NCCL log parser and the nccl_log collector, on the real NCCL_DEBUG=INFO logs users posted in issues."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from collectors.base import CollectorOptions, ReadErrors
from collectors.nccl.collector import NcclLogCollector, nccl_log_collector
from collectors.nccl.parse import parse_line, parse_nccl_log, read_nccl_log
from collectors.nccl.records import GdrCheck, LogLine, NetDevice, Verdict
from collectors.nccl.verdict import EVIDENCE_PER_RANK, LogSummary, RankSummary, overall_verdict, summarize
from fleetlens.nccl_cli import main

# What PROVENANCE.md section 4 says of each log: healthy -> yes, degraded -> no, socket fallback -> no,
# initialisation and intra-node only -> unknown.
EXPECTED_VERDICTS = {
    "nccl-issue707-a100-ib-gdrdma.log": Verdict.YES,
    "nccl-issue429-ib-gdrdma-p2p-direct.log": Verdict.YES,
    "nccl-issue687-ib-gdrdma-p2p-ipc.log": Verdict.YES,
    "nv_peer_memory-issue56-ib-init.log": Verdict.UNKNOWN,
    "nv_peer_memory-issue56-ib-gdr-disabled-distance.log": Verdict.NO,
    "nccl-issue1537-roce-gdr-disabled-hca.log": Verdict.NO,
    "nccl-issue392-roce-no-gdr-ring.log": Verdict.NO,
    "nccl-mesh-plugin-issue56-ib-gdr0.log": Verdict.NO,
    "nccl-issue952-no-ib-socket-fallback.log": Verdict.NO,
    "nccl-issue1609-h800-shm.log": Verdict.UNKNOWN,
}


@pytest.fixture(scope="module")
def nccl_logs(fixtures: Path) -> Path:
    return fixtures / "nccl"


def ranks_of(log: Path) -> list[RankSummary]:
    return summarize(read_nccl_log(log).records)


def rank_by_pid(log: Path, pid: int | None) -> RankSummary:
    (rank,) = [rank for rank in ranks_of(log) if rank.key.pid == pid]
    return rank


def evidence_numbers(rank: RankSummary) -> list[int]:
    return [line.number for line in rank.evidence]


# ---------------------------------------------------------------------------------------------------------
# Verdicts on every real log


def test_every_fixture_log_has_an_expected_verdict(nccl_logs: Path) -> None:
    assert sorted(path.name for path in nccl_logs.iterdir()) == sorted(EXPECTED_VERDICTS)


@pytest.mark.parametrize(("name", "verdict"), EXPECTED_VERDICTS.items())
def test_fixture_verdict_is_proved_by_lines_of_that_log(nccl_logs: Path, name: str, verdict: Verdict) -> None:
    log = nccl_logs / name
    parsed = read_nccl_log(log)
    ranks = summarize(parsed.records)
    file_lines = log.read_text().splitlines()

    assert overall_verdict(ranks) == verdict
    assert parsed.malformed == ()
    for rank in ranks:
        if rank.gdr is not Verdict.UNKNOWN:
            assert rank.evidence, rank
        for line in rank.evidence:
            assert line.source == str(log)
            assert file_lines[line.number - 1] == line.text
        net_lines = [line.text for line in rank.evidence if "via NET/" in line.text]
        if rank.gdr is Verdict.YES:
            assert net_lines and all(text.endswith("/GDRDMA") for text in net_lines)
        if rank.gdr is Verdict.NO:
            assert not any("/GDRDMA" in text for text in net_lines)


def test_healthy_a100_ranks_each_prove_gdr_with_their_own_gdrdma_lines(nccl_logs: Path) -> None:
    log = nccl_logs / "nccl-issue707-a100-ib-gdrdma.log"
    lines = log.read_text().splitlines()
    ranks = ranks_of(log)

    assert [rank.key.device for rank in ranks] == [0, 1, 2, 3]  # one process, one thread per GPU
    for rank in ranks:
        assert rank.gdr is Verdict.YES
        assert rank.ranks == (rank.key.device,)  # receive lines name the peer first, yet the rank is local
        own_lines = [text for text in lines if f"[{rank.key.device}] NCCL INFO" in text]
        first_of_each_path = {}
        for text in own_lines:
            first_of_each_path.setdefault(text.rsplit(" [", 1)[1], text)  # "send] via NET/IB/0/GDRDMA"
        assert [line.text for line in rank.evidence] == list(first_of_each_path.values())
        assert rank.transports == ("IB",)


def test_two_node_job_has_gdr_verdicts_only_on_ranks_that_cross_nodes(nccl_logs: Path) -> None:
    ranks = ranks_of(nccl_logs / "nccl-issue429-ib-gdrdma-p2p-direct.log")

    first_rank = {"machine-1": 8, "machine-2": 0}
    assert all(rank.ranks == (first_rank[rank.key.host] + rank.key.device,) for rank in ranks)
    crossing = {(rank.key.host, rank.key.device) for rank in ranks if rank.gdr is Verdict.YES}
    assert crossing == {("machine-1", 6), ("machine-1", 7), ("machine-2", 7)}
    assert all(
        rank.gdr is Verdict.UNKNOWN for rank in ranks if (rank.key.host, rank.key.device) not in crossing
    )


def test_gdr_disabled_by_pci_distance_is_proved_by_the_disable_and_ring_lines(nccl_logs: Path) -> None:
    log = nccl_logs / "nv_peer_memory-issue56-ib-gdr-disabled-distance.log"
    master = rank_by_pid(log, 11717)
    secondary = rank_by_pid(log, 11791)

    assert (master.key.host, master.key.device, master.ranks, master.gdr) == (
        "master_node",
        2,
        (2,),
        Verdict.NO,
    )
    assert evidence_numbers(master) == [3, 4]
    assert master.evidence[0].text.endswith("GPU Direct RDMA Disabled for GPU 2[2] / HCA 0 (distance 3 >= 2)")
    assert master.evidence[1].text.endswith("Ring 00 : 6 -> 2 [receive] via NET/IB/0")
    assert secondary.gdr is Verdict.NO
    assert evidence_numbers(secondary) == [9, 10, 14]  # line 12 repeats line 9
    check = parse_line(master.evidence[0])
    assert isinstance(check, GdrCheck)
    assert (check.enabled, check.gpu, check.hca) == (False, "2", 0)


def test_roce_hcas_without_gdr_support_make_the_rank_no_without_any_connection(nccl_logs: Path) -> None:
    rank = rank_by_pid(nccl_logs / "nccl-issue1537-roce-gdr-disabled-hca.log", 25668)

    assert (rank.key.host, rank.key.device, rank.ranks) == ("hostname1", 0, (0,))
    assert rank.gdr is Verdict.NO
    assert rank.network == "IB"
    assert rank.net_devices == (
        NetDevice("IB", 0, "mlx5_0", 1, "RoCE"),
        NetDevice("IB", 1, "mlx5_1", 1, "RoCE"),
    )
    assert evidence_numbers(rank) == [5, 6]
    assert "GPU Direct RDMA Disabled for HCA 0 'mlx5_0'" in rank.evidence[0].text
    assert rank.connections == ()


def test_log_without_hostnames_still_names_roce_and_every_transport(nccl_logs: Path) -> None:
    (rank,) = ranks_of(nccl_logs / "nccl-issue392-roce-no-gdr-ring.log")

    assert (rank.key.host, rank.key.pid, rank.key.device) == (None, None, 0)
    assert rank.gdr is Verdict.NO
    assert rank.net_devices == (NetDevice("IB", 0, "mlx5_0", 1, "RoCE"),)
    assert rank.transports == ("RoCE",)
    counts = {(c.via.text, c.transport): c.count for c in rank.connections}
    assert counts == {("NET/IB/0", "RoCE"): 2, ("P2P/IPC", "P2P"): 2, ("direct shared memory", "SHM"): 1}
    assert evidence_numbers(rank) == [13]  # Ring 01 on line 16 is the same receive over NET/IB/0


def test_ring_summary_gdr_0_backs_up_the_net_lines_without_gdrdma(nccl_logs: Path) -> None:
    rank = rank_by_pid(nccl_logs / "nccl-mesh-plugin-issue56-ib-gdr0.log", 22901)

    assert rank.key.host is None  # the poster left `:pid:tid`
    assert rank.gdr is Verdict.NO
    assert evidence_numbers(rank) == [1, 2, 18]
    assert rank.evidence[2].text.endswith("Connected all rings, use ring PXN 0 GDR 0")
    assert {c.via.text: c.count for c in rank.connections} == {"NET/IB/4": 8, "NET/IB/5": 8}


def test_socket_fallback_is_no_with_transport_socket(nccl_logs: Path) -> None:
    log = nccl_logs / "nccl-issue952-no-ib-socket-fallback.log"
    crossing = rank_by_pid(log, 926)

    assert (crossing.key.host, crossing.ranks, crossing.gdr) == ("<cluster_name>", (15,), Verdict.NO)
    assert crossing.transports == ("Socket",)
    assert evidence_numbers(crossing) == [8]
    assert all(rank.gdr is Verdict.UNKNOWN for rank in ranks_of(log) if rank.key.pid != 926)


def test_intra_node_only_log_is_unknown_and_all_shm(nccl_logs: Path) -> None:
    ranks = ranks_of(nccl_logs / "nccl-issue1609-h800-shm.log")

    assert {rank.gdr for rank in ranks} == {Verdict.UNKNOWN}
    assert {c.transport for rank in ranks for c in rank.connections} == {"SHM"}
    assert all(rank.evidence == () for rank in ranks)


def test_init_log_reports_the_ib_device_announced_after_the_socket_one(nccl_logs: Path) -> None:
    log = nccl_logs / "nv_peer_memory-issue56-ib-init.log"
    rank = rank_by_pid(log, 11715)

    assert rank.network == "IB"
    assert rank.net_devices == (NetDevice("IB", 0, "mlx5_0", 1, "IB"),)
    assert rank.gdr is Verdict.UNKNOWN
    assert rank_by_pid(log, 11716).net_devices == (NetDevice("Socket", 0, "ib0", None, "Socket"),)


# ---------------------------------------------------------------------------------------------------------
# Parser on line forms the fixtures lack


def parse(*texts: str) -> list[RankSummary]:
    parsed = parse_nccl_log(texts, source="test.log")
    assert parsed.malformed == ()
    return summarize(parsed.records)


def test_rank_with_and_without_gdrdma_channels_is_partial() -> None:
    (rank,) = parse(
        "n1:7:8 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
        "n1:7:8 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/1",
    )

    assert rank.gdr is Verdict.PARTIAL
    assert evidence_numbers(rank) == [1, 2]


def test_job_with_yes_and_no_ranks_is_partial() -> None:
    ranks = parse(
        "n1:7:8 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
        "n2:9:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [receive] via NET/IB/0",
    )

    assert [rank.gdr for rank in ranks] == [Verdict.YES, Verdict.NO]
    assert overall_verdict(ranks) is Verdict.PARTIAL


def test_recent_nccl_forms_merged_devices_plugins_pxn_and_launcher_prefixes() -> None:
    # Forms seen in NCCL 2.19-2.23 logs: merged (virtual) NICs, the IBext plugin, a PXN proxy rank in
    # parentheses, the communicator appended to connection lines, and mpirun --tag-output prefixes.
    ranks = parse(
        "gpu1:5:6 [0] NCCL INFO NET/IB : Using [0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE} "
        "[1]={[2] mlx5_0:1/RoCE, [3] mlx5_1:1/RoCE} [RO]; OOB bond0:10.0.0.9<0>",
        "gpu1:5:6 [0] NCCL INFO Using network IBext_v8",
        "[1,0]<stdout>:gpu1:5:6 [0] NCCL INFO Channel 00/0 : 15[7] -> 0[0] [receive] "
        "via NET/IBext_v8/1(8)/GDRDMA/Shared comm 0x55d0c0 nRanks 16",
        "gpu1:5 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read comm 0x55d0c0 nRanks 16",
        "gpu1:5:6 [0] NCCL INFO comm 0x7f00a0 rank 4 nRanks 8 nNodes 1 localRanks 8 localRank 4 MNNVL 0",
    )

    (rank,) = ranks
    assert rank.ranks == (0, 4)  # rank 0 of the 16-rank communicator, rank 4 of an 8-rank one
    assert rank.network == "IBext_v8"
    assert [(d.index, d.name, d.transport) for d in rank.net_devices] == [
        (0, "mlx5_2", "RoCE"),
        (0, "mlx5_3", "RoCE"),
        (1, "mlx5_0", "RoCE"),
        (1, "mlx5_1", "RoCE"),
    ]
    assert rank.gdr is Verdict.YES
    assert rank.transports == ("RoCE",)
    assert {c.via.text: c.transport for c in rank.connections} == {
        "NET/IBext_v8/1(8)/GDRDMA/Shared": "RoCE",
        "P2P/CUMEM/read": "P2P",
    }


def test_socket_fallback_after_no_ib_device_names_the_missing_device_as_evidence() -> None:
    (rank,) = parse(
        "n1:7:8 [0] NCCL INFO NET/IB : No device found.",
        "n1:7:8 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
        "n1:7:8 [0] NCCL INFO Using network Socket",
        "n1:7:8 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    )

    assert (rank.gdr, rank.network, rank.transports) == (Verdict.NO, "Socket", ("Socket",))
    assert rank.net_devices == (NetDevice("Socket", 0, "eth0", None, "Socket"),)
    assert evidence_numbers(rank) == [1, 4]


def test_malformed_nccl_lines_are_skipped_and_named_while_other_text_is_ignored() -> None:
    parsed = parse_nccl_log(
        [
            "Traceback (most recent call last):",
            "NCCL version 2.4.7+cuda10.0",
            "n1:7:8 [0] NCCL INFO Channel 00/02 :    0   1   2   3",  # a ring's order, not a connection
            "n1:7:8 [0] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] vi",  # cut off
            "n1:7:8 [0] NCCL INFO NET/IB : Using mlx5_0",
            "n1:7:8 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/x",
            "n1:7:8 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] [send] via NET/IB/1/GDRDMA",
        ],
        source="job.log",
    )

    assert [problem.split(":")[:2] for problem in parsed.malformed] == [
        ["job.log", "4"],
        ["job.log", "5"],
        ["job.log", "6"],
    ]
    (record,) = parsed.records
    assert record.line.number == 7


def test_evidence_per_rank_is_bounded_however_long_the_log() -> None:
    summary = LogSummary()
    for number in range(1, 1001):
        text = f"n1:7:8 [0] NCCL INFO GPU Direct RDMA Disabled for GPU {number} / HCA 0 (distance 5 > 4)"
        summary.add(parse_line(LogLine("big.log", number, text)))

    (rank,) = summary.ranks()
    assert evidence_numbers(rank) == list(range(1, EVIDENCE_PER_RANK + 1))


# ---------------------------------------------------------------------------------------------------------
# Collector


def scrape(collector: NcclLogCollector) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    body = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def statuses(samples: dict[tuple[str, tuple], float]) -> dict[tuple[str, str, str], str]:
    """(log name, pid, cuda_device) -> the status whose series reads 1."""
    found = {}
    for (name, labels), value in samples.items():
        label = dict(labels)
        if name == "fleetlens_nccl_gpudirect_rdma_status" and value == 1:
            found[(Path(label["log"]).name, label["pid"], label["cuda_device"])] = label["status"]
    return found


def series(samples: dict[tuple[str, tuple], float], name: str) -> list[dict[str, str]]:
    return [dict(labels) | {"value": value} for (found, labels), value in samples.items() if found == name]


@pytest.fixture
def errors() -> ReadErrors:
    return ReadErrors("nccl_log")


def test_idle_without_a_glob(errors: ReadErrors) -> None:
    assert list(nccl_log_collector(CollectorOptions(), errors).collect()) == []


def test_exports_each_ranks_status_devices_and_connections(nccl_logs: Path, errors: ReadErrors) -> None:
    collector = nccl_log_collector(CollectorOptions(nccl_logs=str(nccl_logs / "*.log")), errors)
    samples = scrape(collector)

    found = statuses(samples)
    for log in nccl_logs.iterdir():
        for rank in ranks_of(log):
            key = (log.name, "" if rank.key.pid is None else str(rank.key.pid), str(rank.key.device))
            assert found[key] == rank.gdr.value
    assert found[("nccl-issue1537-roce-gdr-disabled-hca.log", "25668", "0")] == "no"
    assert {
        (d["device"], d["port"], d["transport"])
        for d in series(samples, "fleetlens_nccl_net_device_info")
        if d["pid"] == "25668"
    } == {("mlx5_0", "1", "RoCE"), ("mlx5_1", "1", "RoCE")}
    (socket,) = [c for c in series(samples, "fleetlens_nccl_connections") if c["transport"] == "Socket"]
    assert (socket["pid"], socket["rank"], socket["via"], socket["value"]) == ("926", "15", "NET/Socket/3", 2)
    assert errors.count == 0


def test_each_scrape_yields_fresh_families_and_counts_nothing_twice(
    nccl_logs: Path, errors: ReadErrors
) -> None:
    collector = NcclLogCollector(str(nccl_logs / "*.log"), errors)

    first, second = list(collector.collect()), list(collector.collect())

    assert not {id(family) for family in first} & {id(family) for family in second}
    assert [family.samples for family in first] == [family.samples for family in second]


def write(path: Path, data: bytes, mode: str = "wb") -> None:
    with open(path, mode) as handle:
        handle.write(data)


def test_reads_only_what_was_appended(nccl_logs: Path, tmp_path: Path, errors: ReadErrors) -> None:
    lines = (nccl_logs / "nccl-issue392-roce-no-gdr-ring.log").read_bytes().splitlines(keepends=True)
    log = tmp_path / "rank0.log"
    collector = NcclLogCollector(str(tmp_path / "*.log"), errors)

    write(log, b"".join(lines[:12]))  # initialisation only
    assert statuses(scrape(collector)) == {("rank0.log", "", "0"): "unknown"}

    write(
        log, b"".join(lines[12:]) + b"[0] NCCL INFO Ring 02 : 15[41000] -> 0[1b000] [receive] via NET", "ab"
    )
    samples = scrape(collector)
    assert statuses(samples) == {("rank0.log", "", "0"): "no"}
    counts = {c["via"]: c["value"] for c in series(samples, "fleetlens_nccl_connections")}
    assert counts == {"NET/IB/0": 2, "P2P/IPC": 2, "direct shared memory": 1}  # the half line waits

    write(log, b"/IB/0/GDRDMA\n", "ab")
    samples = scrape(collector)
    assert statuses(samples) == {("rank0.log", "", "0"): "partial"}
    assert {c["via"]: c["value"] for c in series(samples, "fleetlens_nccl_connections")}["NET/IB/0"] == 2
    assert errors.count == 0


def test_backlog_is_caught_up_over_several_scrapes(
    nccl_logs: Path, tmp_path: Path, errors: ReadErrors
) -> None:
    log = tmp_path / "job.log"
    write(log, (nccl_logs / "nccl-issue392-roce-no-gdr-ring.log").read_bytes())  # 1140 bytes
    collector = NcclLogCollector(str(tmp_path / "*.log"), errors, read_limit=100)

    seen = [statuses(scrape(collector)).get(("job.log", "", "0")) for _ in range(12)]

    assert seen[0] is None and seen[-1] == "no"
    samples = scrape(collector)
    counts = {c["via"]: c["value"] for c in series(samples, "fleetlens_nccl_connections")}
    assert counts == {"NET/IB/0": 2, "P2P/IPC": 2, "direct shared memory": 1}  # no line cut at a chunk edge
    assert errors.count == 0


def test_line_numbers_stay_right_after_an_endless_line(
    tmp_path: Path, errors: ReadErrors, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "job.log"
    collector = NcclLogCollector(str(tmp_path / "*.log"), errors, read_limit=64 << 10)
    write(log, b"launcher: starting 16 ranks\n")
    scrape(collector)
    for _ in range(4):
        write(log, b"x" * (64 << 10), "ab")
        scrape(collector)

    write(log, b"\nn1:7:8 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via\n", "ab")
    with caplog.at_level(logging.WARNING, logger="fleetlens.collectors"):
        scrape(collector)

    assert errors.count == 1
    assert f"{log}:3:" in caplog.text


def truncate_and_rewrite(log: Path, data: bytes) -> None:
    write(log, data)


def rewrite_in_place(log: Path, data: bytes) -> None:
    with open(log, "r+b") as handle:
        handle.write(data)


def rotate(log: Path, data: bytes) -> None:
    log.rename(log.with_suffix(".log.1"))
    write(log, data)


@pytest.mark.parametrize("replace", [truncate_and_rewrite, rewrite_in_place, rotate])
def test_replaced_file_is_read_from_its_start(
    nccl_logs: Path, tmp_path: Path, errors: ReadErrors, replace: Callable[[Path, bytes], None]
) -> None:
    log = tmp_path / "job.log"
    collector = NcclLogCollector(str(tmp_path / "*.log"), errors)
    write(log, (nccl_logs / "nccl-issue1537-roce-gdr-disabled-hca.log").read_bytes())  # 569 bytes
    assert statuses(scrape(collector)) == {("job.log", "25668", "0"): "no"}

    # 1242 bytes: longer than the old file, so only a new inode or a changed start betrays the rewrite
    replace(log, (nccl_logs / "nccl-issue707-a100-ib-gdrdma.log").read_bytes())

    expected = {("job.log", "120890", str(device)): "yes" for device in range(4)}
    assert statuses(scrape(collector)) == expected


def test_shorter_rewrite_drops_what_the_old_file_said(
    nccl_logs: Path, tmp_path: Path, errors: ReadErrors
) -> None:
    log = tmp_path / "job.log"
    collector = NcclLogCollector(str(tmp_path / "*.log"), errors)
    write(log, (nccl_logs / "nccl-issue707-a100-ib-gdrdma.log").read_bytes())
    scrape(collector)

    write(log, (nccl_logs / "nccl-issue1537-roce-gdr-disabled-hca.log").read_bytes())

    assert statuses(scrape(collector)) == {("job.log", "25668", "0"): "no"}


def test_file_cut_back_to_its_first_lines_shows_only_those(
    nccl_logs: Path, tmp_path: Path, errors: ReadErrors
) -> None:
    log = tmp_path / "job.log"
    lines = (nccl_logs / "nccl-issue707-a100-ib-gdrdma.log").read_bytes().splitlines(keepends=True)
    collector = NcclLogCollector(str(tmp_path / "*.log"), errors)
    write(log, b"".join(lines))
    assert len(statuses(scrape(collector))) == 4

    os.truncate(
        log, len(b"".join(lines[:3]))
    )  # over 256 bytes: the start is unchanged, only the length tells

    assert {device for _, _, device in statuses(scrape(collector))} == {"0", "1", "3"}


def test_unreadable_entries_are_reported_and_the_rest_exported(
    nccl_logs: Path, tmp_path: Path, errors: ReadErrors, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "a-directory.log").mkdir()
    os.symlink(tmp_path / "missing", tmp_path / "b-dangling.log")
    os.mkfifo(tmp_path / "b-fifo.log")  # opening it would block the scrape
    write(tmp_path / "c-good.log", (nccl_logs / "nccl-issue1537-roce-gdr-disabled-hca.log").read_bytes())
    collector = NcclLogCollector(str(tmp_path / "*.log"), errors)

    with caplog.at_level(logging.WARNING, logger="fleetlens.collectors"):
        found = statuses(scrape(collector))

    assert found == {("c-good.log", "25668", "0"): "no"}
    assert errors.count == 3
    for name in ("a-directory.log", "b-dangling.log", "b-fifo.log"):
        assert str(tmp_path / name) in caplog.text


def test_vanished_file_is_forgotten(nccl_logs: Path, tmp_path: Path, errors: ReadErrors) -> None:
    log = tmp_path / "job.log"
    write(log, (nccl_logs / "nccl-issue1537-roce-gdr-disabled-hca.log").read_bytes())
    collector = NcclLogCollector(str(tmp_path / "*.log"), errors)
    scrape(collector)

    log.unlink()

    assert statuses(scrape(collector)) == {}
    assert errors.count == 0


def test_garbage_bytes_and_malformed_lines_lose_only_themselves(
    tmp_path: Path, errors: ReadErrors, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "job.log"
    write(
        log,
        b"\xff\xfe\x00 binary noise \x80\x81\n"
        b"n\xe9ud1:7:8 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"
        b"n2:9:9 [1] NCCL INFO Channel 00/0 : 9[1] -> 1[1] [send] via\n"
        b"n2:9:9 [1] NCCL INFO Channel 01/0 : 9[1] -> 1[1] [send] via NET/IB/1\r\n",
    )
    collector = NcclLogCollector(str(tmp_path / "*.log"), errors)

    with caplog.at_level(logging.WARNING, logger="fleetlens.collectors"):
        samples = scrape(collector)

    assert statuses(samples) == {("job.log", "7", "0"): "yes", ("job.log", "9", "1"): "no"}
    assert {s["host"] for s in series(samples, "fleetlens_nccl_connections")} == {"n\ufffdud1", "n2"}
    assert errors.count == 1
    assert f"{log}:3" in caplog.text


# ---------------------------------------------------------------------------------------------------------
# Command line


def test_cli_prints_each_ranks_verdict_devices_and_proving_lines(
    nccl_logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = nccl_logs / "nccl-issue1537-roce-gdr-disabled-hca.log"

    status = main([str(log), str(tmp_path / "missing.log")])

    out, err = capsys.readouterr()
    assert status == 1
    assert f"{log}: GPUDirect RDMA no" in out
    assert "hostname1 pid 25668 cuda 0 rank 0: GPUDirect RDMA no" in out
    assert "[0] mlx5_0 port 1 RoCE, [1] mlx5_1 port 1 RoCE" in out
    assert (
        "line 5: hostname1:25668:27396 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'"
        in out
    )
    assert "missing.log" in err

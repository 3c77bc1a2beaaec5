"""gpu_fault and gpu_app_error on rows the real gpu and xid collectors read: from simulated GPUs, and from
gpud's real dmesg logs followed as a node's kernel log, stored and read back as the hub does."""

from __future__ import annotations

import math
from collections import Counter
from contextlib import closing
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alerts.policy import DrainPolicy
from alerts.rules import DEFAULT_RULES
from analytics.detectors.base import SEVERITIES, Finding, Window
from analytics.detectors.gpu_fault import XID_COUNTER, GpuFault
from analytics.detectors.runner import DetectionRunner
from analytics.evidence import from_json, to_json
from analytics.reports.remedy import ACTION_TEXT
from analytics.store import Store
from analytics.store.records import Anomaly, ScrapeBatch
from analytics.xid_catalog import Action, lookup
from collectors.base import CollectorOptions
from collectors.gpu.backend import open_backend
from collectors.gpu.model import GpuBackend
from collectors.gpu.sim import SimBackend
from collectors.xid import parse_xid_line
from tests.analytics.detectors.test_hostile_inputs import BASE, EXAMPLES, VALUES, XID_LABELS, examples
from tests.support.fleetdata import SimulatedFleet

APPLICATION_XIDS = (13, 31, 43)  # graphics engine exception, MMU fault, a channel stopped by the app


def reported(store: Store, window: Window) -> set[tuple[str, str]]:
    """The GPUs gpu_fault reports in `window`, by node and component."""
    return {(finding.node, finding.component) for finding in GpuFault().detect(store, window)}


def drain_rule_for(finding: Finding) -> object:
    """The default drain policy's rule for an alert on `finding`, as the drain controller asks it."""
    return DrainPolicy().rule_for(finding.kind, finding.severity, None, finding.evidence.action)


def alerted(finding: Finding) -> bool:
    """Whether a default alert rule covers an anomaly of `finding`."""
    anomaly = Anomaly("a", 0.0, None, finding.kind, finding.node, finding.component, finding.job,
                      finding.severity, finding.score, "{}", "gpu_fault", "2")  # fmt: skip
    return any(rule.covers(anomaly) for rule in DEFAULT_RULES)


def xid_lines(path: Path) -> Counter[tuple[str, int]]:
    """(PCI address, Xid) of every Xid line of a kernel log, by the xid collector's own parser."""
    events = (parse_xid_line(line, path.name) for line in path.read_text().splitlines())
    return Counter((event.pci_bus_id, event.xid) for event in events if event is not None)


def store_gpu_scrapes(
    store: Store, base: float, series: list[tuple[str, dict[str, str]]], ticks: list[list[float]]
) -> None:
    """Scrapes of vela-001's GPU 0 (at 19:00), 10 s apart from `base`: each of `series` (a metric and its
    labels besides the GPU's) taking, per scrape, the value at its position in `ticks`."""
    gpu = {"gpu": "0", "pci_bus_id": "00000000:19:00.0"}
    names, labels = [name for name, _ in series], [{**gpu, **extra} for _, extra in series]
    batches = [
        ScrapeBatch("vela-001:9400", "vela-001", base + 10 * tick, names, labels, values)
        for tick, values in enumerate(ticks)
    ]
    store.insert_samples(batches, token=f"gpu-scrapes-{base}")


def follow_log(
    store: Store,
    tmp_path: Path,
    lines: str,
    *,
    gpus: int = 4,
    job: str = "",
    real_gpus: GpuBackend | None = None,
) -> Window:
    """One node whose xid collector follows a kernel log, scraped twice before `lines` reach the log and
    once after; the window of that last scrape. `real_gpus`: the node's GPUs, instead of simulated ones."""
    log = tmp_path / "kern.log"
    log.touch()
    real = {"vela-001": real_gpus} if real_gpus is not None else {}
    with SimulatedFleet(
        store, tmp_path, nodes=1, gpus=gpus, kernel_logs={"vela-001": log}, real_gpus=real
    ) as fleet:
        fleet["vela-001"].job = job
        fleet.tick(2)
        with log.open("a") as kernel:
            kernel.write(lines)
        return fleet.tick()


def test_the_real_double_bit_ecc_sequence_is_one_critical_fault_to_reset_the_gpu_and_drain(
    store: Store, tmp_path: Path, fixtures: Path
):
    dmesg = fixtures / "gpud" / "dmesg.0.log"
    in_log = xid_lines(dmesg)
    assert in_log[("00000000:19:00.0", 94)] == 9  # nine contained errors after the DBE and the remap
    window = follow_log(store, tmp_path, dmesg.read_text())

    [finding] = GpuFault().detect(store, window)
    assert (finding.kind, finding.severity, finding.node) == ("gpu_fault", "critical", "vela-001")
    assert finding.component == ""  # no GPU of this node's NVML has that address: the labels name none
    assert finding.evidence.pci_bus_id == "00000000:19:00.0"
    assert finding.evidence.xid_codes == (48, 63, 94)
    assert finding.evidence.xid_counts == {str(xid): count for (_, xid), count in in_log.items()}
    assert finding.evidence.xid_counts == {"48": 1, "63": 1, "94": 9}
    assert finding.evidence.xid_causes == {"48": "hardware", "63": "hardware", "94": "hardware"}
    assert finding.evidence.xid_mnemonics["48"] == lookup(48).mnemonic
    assert (finding.evidence.action, finding.evidence.action_text) == (
        "reset_gpu",
        ACTION_TEXT[Action.RESET_GPU],
    )
    assert drain_rule_for(finding) is not None and alerted(finding)


def test_the_real_sequence_on_gpuds_real_h100_node_names_the_gpu_its_address_belongs_to(
    store: Store, tmp_path: Path, fixtures: Path
):
    """The same project's nvidia-smi capture of 8 H100s has GPU 0 at 19:00: replayed through the real NVML
    code as the node's GPUs, the kernel log's address meets NVML's and the fault lands on gpu:0."""
    capture = fixtures / "gpud" / "nvidia-smi-query.535.161.08.out.0.valid"
    with closing(open_backend(CollectorOptions(gpu_backend=f"replay:{capture}"))) as h100s:
        window = follow_log(store, tmp_path, (fixtures / "gpud" / "dmesg.0.log").read_text(), real_gpus=h100s)

    [finding] = GpuFault().detect(store, window)
    assert (finding.kind, finding.severity, finding.component) == ("gpu_fault", "critical", "gpu:0")
    assert finding.evidence.pci_bus_id == "00000000:19:00.0"
    assert finding.evidence.xid_counts == {"48": 1, "63": 1, "94": 9}
    assert finding.evidence.action == "reset_gpu" and drain_rule_for(finding) is not None


def test_gsp_rpc_timeouts_are_a_fault_with_the_catalogs_action(store: Store, tmp_path: Path, fixtures: Path):
    window = follow_log(store, tmp_path, (fixtures / "gpud" / "dmesg-with-xid-119.log").read_text())

    [finding] = GpuFault().detect(store, window)
    assert (finding.kind, finding.evidence.pci_bus_id) == ("gpu_fault", "00000000:9B:00.0")
    assert finding.evidence.xid_counts == {"119": 5}
    assert finding.evidence.xid_causes == {"119": lookup(119).cause.value}
    info = lookup(119)
    assert (finding.severity, finding.evidence.action) == (info.severity, info.action.value)
    assert (drain_rule_for(finding) is not None) == (info.action.drains and info.severity == "critical")


def test_a_storm_of_application_xids_is_one_app_error_per_gpu_with_its_counts_and_no_drain(
    store: Store, tmp_path: Path
):
    storm = [(index % 8, APPLICATION_XIDS[index * len(APPLICATION_XIDS) // 500]) for index in range(500)]
    addresses = [gpu.pci_bus_id[4:-2] for gpu in SimBackend(count=8).identities()]  # as the kernel writes
    lines = "".join(
        f"[Mon Mar  3 10:00:{n % 60:02d} 2025] NVRM: Xid (PCI:{addresses[gpu]}): {xid}, pid=4242, "
        "name=python3, Ch 00000008\n"
        for n, (gpu, xid) in enumerate(storm)
    )
    window = follow_log(store, tmp_path, lines, gpus=8, job="llm")

    found = GpuFault().detect(store, window)
    assert {finding.kind for finding in found} == {"gpu_app_error"}
    assert sorted(finding.component for finding in found) == [f"gpu:{gpu}" for gpu in range(8)]
    for finding in found:
        gpu = int(finding.component.removeprefix("gpu:"))
        expected = Counter(xid for on, xid in storm if on == gpu)
        assert finding.evidence.xid_counts == {str(xid): count for xid, count in sorted(expected.items())}
        assert (finding.severity, finding.job, finding.evidence.action) == ("info", "llm", "restart_job")
        assert set(finding.evidence.xid_causes.values()) == {"application"}
        assert drain_rule_for(finding) is None and not alerted(finding)
    assert sum(sum(f.evidence.xid_counts.values()) for f in found) == 500


def test_xids_a_lost_gpu_and_a_failed_row_remap_are_each_reported_on_their_gpu(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet.tick(2)
        fleet["vela-001"].gpus.set_fault(2, "xid", code=13)
        fleet["vela-002"].gpus.set_fault(1, "gpu_lost")
        fleet["vela-003"].gpus.set_fault(0, "ecc", dbe=2, remap_failure=True)
        fleet["vela-004"].gpus.set_fault(3, "ecc", dbe=1)
        fleet["vela-004"].gpus.set_fault(3, "xid", code=31)  # the job's MMU fault on a GPU with a DBE
        onset = fleet.tick()
        later = fleet.tick()

        found = {(f.node, f.component): f for f in GpuFault().detect(store, onset)}
        app = found.pop(("vela-001", "gpu:2"))
        assert (app.kind, app.severity, app.evidence.xid_counts) == ("gpu_app_error", "info", {"13": 1})
        assert {where: (f.kind, f.severity) for where, f in found.items()} == {
            ("vela-002", "gpu:1"): ("gpu_fault", "critical"),
            ("vela-003", "gpu:0"): ("gpu_fault", "critical"),
            ("vela-004", "gpu:3"): ("gpu_fault", "critical"),
        }
        assert {where: (f.evidence.signals, f.evidence.action) for where, f in found.items()} == {
            ("vela-002", "gpu:1"): (("lost", "xid"), "reboot_node"),
            ("vela-003", "gpu:0"): (("ecc_dbe", "row_remap_failure"), "drain_for_inspection"),
            ("vela-004", "gpu:3"): (("ecc_dbe",), "reset_gpu"),
        }
        assert found[("vela-002", "gpu:1")].evidence.lost == "fleetlens_gpu_up 0"
        assert found[("vela-003", "gpu:0")].evidence.ecc_dbe_errors == 2
        assert found[("vela-004", "gpu:3")].evidence.xid_causes == {"31": "application"}  # listed too
        # the Xid was a moment; the lost GPU and the failed remap last
        assert reported(store, later) == {("vela-002", "gpu:1"), ("vela-003", "gpu:0")}


def test_an_xid_both_nvml_and_the_kernel_log_saw_counts_once(store: Store, tmp_path: Path):
    log = tmp_path / "kern.log"
    log.touch()
    with SimulatedFleet(store, tmp_path, nodes=1, kernel_logs={"vela-001": log}) as fleet:
        fleet.tick(2)
        for _ in range(3):
            fleet["vela-001"].gpus.set_fault(1, "xid", code=48)
        address = fleet["vela-001"].gpus.identities()[1].pci_bus_id[4:-2]
        log.write_text(f"NVRM: Xid (PCI:{address}): 48, pid='<unknown>', name=<unknown>, DBE\n" * 3)
        [finding] = GpuFault().detect(store, fleet.tick())

    assert (finding.component, finding.evidence.xid_counts) == ("gpu:1", {"48": 3})


def test_xids_already_in_the_log_when_a_node_is_first_scraped_are_history_not_news(
    store: Store, tmp_path: Path, fixtures: Path
):
    log = tmp_path / "kern.log"
    log.write_text((fixtures / "gpud" / "dmesg.0.log").read_text())
    with SimulatedFleet(store, tmp_path, nodes=1, kernel_logs={"vela-001": log}) as fleet:
        first = fleet.tick()
        assert GpuFault().detect(store, first) == []
        assert GpuFault().detect(store, fleet.tick()) == []


def test_a_gpu_missing_after_a_reboot_is_lost_while_its_node_reports(store: Store, tmp_path: Path):
    with SimulatedFleet(store, tmp_path) as fleet:
        fleet.tick(3)
        fleet.restart("vela-003", gpus=3)
        window = fleet.tick()

        [finding] = GpuFault().detect(store, window)
        assert (finding.node, finding.component, finding.evidence.action) == (
            "vela-003",
            "gpu:3",
            "reboot_node",
        )
        assert finding.evidence.lost == "no series while the node reports"
        assert reported(store, fleet.tick(skip={"vela-003"})) == set()


def test_the_runner_keeps_a_lost_gpu_open_while_it_is_lost(store: Store, tmp_path: Path):
    runner = DetectionRunner([GpuFault()])
    with SimulatedFleet(store, tmp_path, nodes=2) as fleet:
        fleet.tick()
        fleet["vela-001"].gpus.set_fault(0, "gpu_lost")
        [opened] = runner.step(store, fleet.tick())
        lost = [runner.step(store, fleet.tick()) for _ in range(8)]

    assert (opened.node, opened.component, opened.severity, opened.end) == (
        "vela-001",
        "gpu:0",
        "critical",
        None,
    )
    assert all(anomaly.end is None for changed in lost for anomaly in changed)


def test_each_xid_is_judged_as_the_catalog_says(store: Store, tmp_path: Path):
    codes = (13, 43, 48, 79, 94, 119, 4242)  # 4242: no such Xid
    with SimulatedFleet(store, tmp_path, nodes=1, gpus=len(codes)) as fleet:
        fleet.tick(2)
        for gpu, code in enumerate(codes):
            fleet["vela-001"].gpus.set_fault(gpu, "xid", code=code)
        found = {f.component: f for f in GpuFault().detect(store, fleet.tick())}

    for gpu, code in enumerate(codes):
        finding, info = found[f"gpu:{gpu}"], lookup(code)
        kind, severity = ("gpu_app_error", "info") if info.by_application else ("gpu_fault", info.severity)
        assert (finding.kind, finding.severity, finding.evidence.action) == (
            kind,
            severity,
            info.action.value,
        )
        assert finding.evidence.xid_mnemonics == {str(code): info.mnemonic}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(
    counters=st.lists(st.tuples(XID_LABELS, st.sampled_from(["nvml", "kernel_log", ""]), VALUES), max_size=5),
    last_xids=st.lists(VALUES, min_size=3, max_size=3),
)
def test_any_xid_label_count_or_last_xid_gives_well_formed_findings(
    store: Store, counters: list[tuple[str, str, float]], last_xids: list[float]
):
    """A GPU reported three times, its Xid counters (any `xid` label, any value, growing) and dcgm's
    last-Xid gauge taking any values: findings of the two kinds, with evidence JSON can carry."""
    base = BASE - next(examples) * 7200 - 3600  # apart from the hostile suite's examples and each other's
    series = [
        ("fleetlens_gpu_up", {}),
        ("DCGM_FI_DEV_XID_ERRORS", {}),
        *((XID_COUNTER, {"xid": xid, "source": source}) for xid, source, _ in counters),
    ]
    store_gpu_scrapes(
        store,
        base,
        series,
        [[1.0, last_xids[tick], *(value * tick for _, _, value in counters)] for tick in range(3)],
    )
    for index in range(4):
        for finding in GpuFault().detect(store, Window(base + 10 * index, base + 10 * (index + 1))):
            assert finding.kind in GpuFault.kinds and finding.severity in SEVERITIES
            assert from_json(finding.kind, to_json(finding.evidence)).action in set(Action)


def test_an_infinite_row_remap_failure_is_a_fault_whose_evidence_json_can_carry(store: Store):
    """Regression (found by the hostile-input suite): a gauge reading +Inf made evidence JSON refused."""
    base = BASE - 3 * 3600
    series = [("fleetlens_gpu_up", {}), ("DCGM_FI_DEV_ROW_REMAP_FAILURE", {})]
    store_gpu_scrapes(store, base, series, [[1.0, math.inf]] * 2)

    [finding] = GpuFault().detect(store, Window(base + 10, base + 20))
    assert finding.evidence.signals == ("row_remap_failure",)
    assert from_json(finding.kind, to_json(finding.evidence)).row_remap_failure is None

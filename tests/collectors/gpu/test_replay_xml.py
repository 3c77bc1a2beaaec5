"""Replay of `nvidia-smi -q -x` (XML) captures: the real H200 one answers NVML's calls as its text twin does,
and replaying either through the real NVML path gives what the real NVML path exported on that GPU.

Captures: ../shared/fixtures/h200-passthrough (one H200 passed through to a VM, driver 580.159.04):
nvidia-smi-q-x.idle.xml and nvidia-smi-q.idle.txt a second apart, and fleetlens-collect.nvml.idle.prom,
`fleetlens collect --gpu-backend nvml` right after them; PROVENANCE.md, section h200-passthrough.
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from collectors import registry
from collectors.base import CollectorOptions
from collectors.errors import GpuBackendError
from collectors.gpu.replay import MAX_CAPTURE_BYTES, ReplayNvml, load_capture
from tests.collectors.gpu.test_replay import HOSTILE, opens_or_names_file_and_line
from tests.support.exposition import render

H200 = "h200-passthrough"
XML = f"{H200}/nvidia-smi-q-x.idle.xml"
TEXT = f"{H200}/nvidia-smi-q.idle.txt"
REAL_NVML = f"{H200}/fleetlens-collect.nvml.idle.prom"
HOST = "vm"  # the Hostname label of the real run

# --- every call, XML against text ---------------------------------------------------------------------

# Each NVML call the stand-in answers for a GPU, with its arguments (a GPU handle first).
GPU_CALLS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "uuid": ("nvmlDeviceGetUUID", ()),
    "name": ("nvmlDeviceGetName", ()),
    "minor number": ("nvmlDeviceGetMinorNumber", ()),
    "pci info": ("nvmlDeviceGetPciInfo", ()),
    **{
        f"clock {clock}": ("nvmlDeviceGetClockInfo", (getattr(pynvml, f"NVML_CLOCK_{clock}"),))
        for clock in ("GRAPHICS", "SM", "MEM", "VIDEO")
    },
    **{
        f"max clock {clock}": ("nvmlDeviceGetMaxClockInfo", (getattr(pynvml, f"NVML_CLOCK_{clock}"),))
        for clock in ("GRAPHICS", "SM", "MEM", "VIDEO")
    },
    "temperature": ("nvmlDeviceGetTemperature", (pynvml.NVML_TEMPERATURE_GPU,)),
    "memory temperature": ("nvmlDeviceGetFieldValues", ([pynvml.NVML_FI_DEV_MEMORY_TEMP],)),
    "power usage": ("nvmlDeviceGetPowerUsage", ()),
    "power limit": ("nvmlDeviceGetEnforcedPowerLimit", ()),
    "energy": ("nvmlDeviceGetTotalEnergyConsumption", ()),
    "utilization": ("nvmlDeviceGetUtilizationRates", ()),
    "memory": ("nvmlDeviceGetMemoryInfo", ()),
    "memory v2": ("nvmlDeviceGetMemoryInfo", (pynvml.nvmlMemory_v2,)),
    "pcie replays": ("nvmlDeviceGetPcieReplayCounter", ()),
    "pcie tx": ("nvmlDeviceGetPcieThroughput", (pynvml.NVML_PCIE_UTIL_TX_BYTES,)),
    "pcie rx": ("nvmlDeviceGetPcieThroughput", (pynvml.NVML_PCIE_UTIL_RX_BYTES,)),
    "pcie generation": ("nvmlDeviceGetCurrPcieLinkGeneration", ()),
    "pcie max generation": ("nvmlDeviceGetMaxPcieLinkGeneration", ()),
    "pcie width": ("nvmlDeviceGetCurrPcieLinkWidth", ()),
    "pcie max width": ("nvmlDeviceGetMaxPcieLinkWidth", ()),
    "clock event reasons": ("nvmlDeviceGetCurrentClocksEventReasons", ()),
    "clock throttle reasons": ("nvmlDeviceGetCurrentClocksThrottleReasons", ()),
    **{
        f"ecc {kind} {counter}": (
            "nvmlDeviceGetTotalEccErrors",
            (getattr(pynvml, f"NVML_MEMORY_ERROR_TYPE_{kind}"), getattr(pynvml, f"NVML_{counter}_ECC")),
        )
        for kind in ("CORRECTED", "UNCORRECTED")
        for counter in ("VOLATILE", "AGGREGATE")
    },
    "remapped rows": ("nvmlDeviceGetRemappedRows", ()),
    "mig mode": ("nvmlDeviceGetMigMode", ()),
    "max mig devices": ("nvmlDeviceGetMaxMigDeviceCount", ()),
    "mig device 0": ("nvmlDeviceGetMigDeviceHandleByIndex", (0,)),
    "gpu instance id": ("nvmlDeviceGetGpuInstanceId", ()),
    "attributes": ("nvmlDeviceGetAttributes", ()),
    "register events": ("nvmlDeviceRegisterEvents", (0, None)),
}
# What changed in the second between the two captures (nvidia-smi -q -x first), and how far apart they
# may be: the average power draw (80.23 W, then 80.22 W) and the PCIe rates of an idle GPU (1921 then 1861
# KB/s out, 526 then 600 KB/s in).
INSTANTANEOUS_CALLS = {"power usage": 0.01, "pcie tx": 0.2, "pcie rx": 0.2}


def plain(answer: Any) -> Any:
    """An NVML answer as comparable values: a ctypes struct as its fields, an array as a list of them."""
    if isinstance(answer, ctypes.Array):
        return [plain(entry) for entry in answer]
    if isinstance(answer, ctypes.Structure):
        return {name: plain(getattr(answer, name)) for name, *_ in answer._fields_}
    if isinstance(answer, ctypes.Union):
        return bytes(answer)
    return answer


def answer(nv: ReplayNvml, call: str, args: tuple[Any, ...]) -> Any:
    """The stand-in's answer for the first GPU, or the NVML error code it raised."""
    try:
        return plain(getattr(nv, call)(nv.nvmlDeviceGetHandleByIndex(0), *args))
    except pynvml.NVMLError as error:
        return ("NVMLError", error.value)


@pytest.fixture
def both(fixtures: Path) -> Iterator[tuple[ReplayNvml, ReplayNvml]]:
    xml, text = load_capture(fixtures / XML), load_capture(fixtures / TEXT)
    xml.nvmlInit()
    text.nvmlInit()
    yield xml, text
    xml.nvmlShutdown()
    text.nvmlShutdown()


def test_every_gpu_call_of_the_stand_in_is_compared():
    """A call the stand-in grows must be added to GPU_CALLS (or this test fails)."""
    answered = {name for name in vars(ReplayNvml) if name.startswith("nvmlDevice")}
    not_per_gpu = {"nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"}
    assert answered - not_per_gpu == {call for call, _ in GPU_CALLS.values()}


@pytest.mark.parametrize("name", GPU_CALLS)
def test_the_xml_capture_answers_each_call_as_its_text_twin(both, name):
    xml, text = both
    call, args = GPU_CALLS[name]
    from_xml, from_text = answer(xml, call, args), answer(text, call, args)
    if name in INSTANTANEOUS_CALLS:
        assert from_xml != from_text  # what moved in the second between the captures
        assert from_xml == pytest.approx(from_text, rel=INSTANTANEOUS_CALLS[name])
    else:
        assert from_xml == from_text


def test_the_xml_capture_is_read_for_what_it_says(both):
    xml, _ = both
    handle = xml.nvmlDeviceGetHandleByIndex(0)
    assert xml.nvmlDeviceGetCount() == 1
    assert xml.nvmlDeviceGetPciInfo(handle).busId == "00000000:00:06.0"
    assert xml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) == 345
    assert xml.nvmlDeviceGetCurrentClocksEventReasons(handle) == pynvml.nvmlClocksEventReasonGpuIdle
    assert xml.nvmlDeviceGetPowerUsage(handle) == 80230
    assert xml.nvmlDeviceGetMigMode(handle) == [0, 0]


# --- through the real NVML path, against the real NVML path's output ----------------------------------

# Instantaneous series: present, with plausible values, not equal.
POWER = "DCGM_FI_DEV_POWER_USAGE"
PCIE_RATES = {"DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"}
# The one series the real exporter had that replay cannot: no capture prints an energy counter.
REPLAY_CANNOT = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
# Newer than the real run's exporter: how old the read values are, by cadence.
AGES = "fleetlens_gpu_reading_age_seconds"

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def gpu_series(text: str) -> Series:
    """Every series of a GPU (those labelled with a UUID), by name and labels."""
    return {
        (family.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "UUID" in sample.labels
    }


def replayed(capture: Path) -> Series:
    """The GPU series of the gpu and xid collectors as `fleetlens collect --gpu-backend replay:FILE`
    builds them (the xid collector exports the last Xid of each GPU)."""
    built = registry.build(["gpu", "xid"], CollectorOptions(gpu_backend=f"replay:{capture}", node=HOST))
    try:
        assert [collector.errors.count for collector in built] == [0, 0]
        return gpu_series("".join(render(collector.collector) for collector in built))
    finally:
        for collector in built:
            collector.collector.close()


@pytest.mark.parametrize("capture", [XML, TEXT])
def test_replay_exports_what_the_real_nvml_path_did_on_that_gpu(fixtures, capture):
    real = gpu_series((fixtures / REAL_NVML).read_text())
    replay = replayed(fixtures / capture)
    ages = {key: replay.pop(key) for key in list(replay) if key[0] == AGES}
    assert sorted(dict(labels)["cadence"] for _, labels in ages) == ["polled", "sampled"]
    cannot = {key for key in real if key[0] == REPLAY_CANNOT}
    assert cannot, "the real exporter read the energy counter"
    assert replay.keys() == real.keys() - cannot, "same series by name and labels, energy aside"
    for key, value in replay.items():
        name = key[0]
        if name == POWER:
            assert value == pytest.approx(real[key], rel=0.05)
        elif name in PCIE_RATES:
            assert value >= 0
        else:
            assert value == real[key], name
    assert len(replay) >= 38


def test_energy_stays_unanswered_as_no_capture_prints_it(fixtures):
    for capture in (XML, TEXT):
        assert not re.search(r"energy", (fixtures / capture).read_text(), re.IGNORECASE)


# --- hostile XML ----------------------------------------------------------------------------------------


def write(tmp_path: Path, content: str | bytes) -> Path:
    path = tmp_path / "capture.xml"
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


@HOSTILE
@given(
    data=st.binary(),
    start=st.sampled_from([b"<?xml", b"\xef\xbb\xbf \n<nvidia_smi_log", b"<nvidia_smi_log>"]),
)
def test_arbitrary_bytes_after_an_xml_start_open_or_fail_naming_the_file(tmp_path, data, start):
    content = start + data
    lines = content.count(b"\n") + content.count(b"\r") + 1  # expat counts a lone CR as a line end
    opens_or_names_file_and_line(write(tmp_path, content), lines)


def cut(text: str, data: st.DataObject) -> str:
    return text[: data.draw(st.integers(0, len(text)))]


def junk_value(text: str, data: st.DataObject) -> str:
    values = list(re.finditer(r">([^<>\n]+)<", text))
    spot = values[data.draw(st.integers(0, len(values) - 1))]
    junk = data.draw(
        st.one_of(st.text(max_size=12), st.sampled_from(["N/A", "-1 MHz", "1e9 W", "9" * 30, "&amp;", "&x;"]))
    )
    return text[: spot.start(1)] + junk + text[spot.end(1) :]


def swapped_lines(text: str, data: st.DataObject) -> str:
    lines = text.split("\n")
    first, second = data.draw(st.integers(0, len(lines) - 1)), data.draw(st.integers(0, len(lines) - 1))
    lines[first], lines[second] = lines[second], lines[first]
    return "\n".join(lines)


def dropped_line(text: str, data: st.DataObject) -> str:
    lines = text.split("\n")
    del lines[data.draw(st.integers(0, len(lines) - 1))]
    return "\n".join(lines)


XML_MUTATIONS: dict[str, Callable[[str, st.DataObject], str]] = {
    "cut": cut,
    "junk value": junk_value,
    "swapped lines": swapped_lines,
    "dropped line": dropped_line,
}


@HOSTILE
@given(mutation=st.sampled_from(list(XML_MUTATIONS)), data=st.data())
def test_mutated_xml_opens_or_fails_naming_file_and_line(fixtures, tmp_path, mutation, data):
    mutated = XML_MUTATIONS[mutation]((fixtures / XML).read_text(), data)
    opens_or_names_file_and_line(write(tmp_path, mutated), mutated.count("\n") + 1)


LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [\n <!ENTITY lol0 "lol">\n'
    + "".join(f' <!ENTITY lol{n} "{f"&lol{n - 1};" * 10}">\n' for n in range(1, 10))
    + ']>\n<nvidia_smi_log><gpu id="0000:01:00.0"><product_name>&lol9;</product_name></gpu>'
    + "</nvidia_smi_log>\n"
)


def test_a_billion_laughs_is_refused_at_its_first_entity(tmp_path):
    path = write(tmp_path, LAUGHS)
    with pytest.raises(GpuBackendError, match=rf"^{re.escape(str(path))}:3: refused .*lol0"):
        load_capture(path)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A local port that would see a fetch: nothing may connect to it."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        yield server
        with pytest.raises(BlockingIOError):
            server.accept()


def test_an_external_entity_is_refused_and_never_fetched(tmp_path, listener):
    secret = write(tmp_path, "SECRET-BYTES")
    port = listener.getsockname()[1]
    path = tmp_path / "xxe.xml"
    path.write_text(
        '<?xml version="1.0"?>\n'
        f'<!DOCTYPE nvidia_smi_log [ <!ENTITY a SYSTEM "file://{secret}">'
        f' <!ENTITY b SYSTEM "http://127.0.0.1:{port}/"> ]>\n'
        '<nvidia_smi_log><gpu id="0000:01:00.0"><product_name>&a;&b;</product_name></gpu></nvidia_smi_log>\n'
    )
    with pytest.raises(GpuBackendError, match=rf"^{re.escape(str(path))}:2: refused ") as raised:
        load_capture(path)
    assert "SECRET-BYTES" not in str(raised.value)


def test_the_dtd_a_capture_names_is_accepted_and_never_fetched(fixtures, tmp_path, listener):
    port = listener.getsockname()[1]
    real = (fixtures / XML).read_text()
    assert '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">' in real
    path = write(tmp_path, real.replace("nvsmi_device_v13.dtd", f"http://127.0.0.1:{port}/nvsmi.dtd"))
    nv = load_capture(path)
    nv.nvmlInit()
    assert nv.nvmlDeviceGetCount() == 1


BAD_XML = {
    "not well formed": (
        '<?xml version="1.0"?>\n<nvidia_smi_log>\n<gpu id="0000:01:00.0">\n</nvidia_smi_log>',
        4,
    ),
    "no gpu": ("<nvidia_smi_log><timestamp>now</timestamp></nvidia_smi_log>", 0),
    "another root": ('<?xml version="1.0"?>\n<svg/>', 2),
    "a value of the wrong unit": (
        '<nvidia_smi_log>\n<gpu id="0000:01:00.0">\n<clocks><sm_clock>345 W</sm_clock></clocks>'
        "</gpu></nvidia_smi_log>",
        3,
    ),
    "a duplicated bus id": (
        '<nvidia_smi_log>\n<gpu id="0000:01:00.0"/>\n<gpu id="00000000:01:00.0"/>\n</nvidia_smi_log>',
        3,
    ),
    "a gpu without a bus id": ("<nvidia_smi_log>\n<gpu/></nvidia_smi_log>", 2),
    "nested past any capture": ("<nvidia_smi_log>" + "<a>" * 100_000, 1),
}


@pytest.mark.parametrize(("content", "line"), BAD_XML.values(), ids=BAD_XML.keys())
def test_bad_xml_is_named_by_file_and_line(tmp_path, content, line):
    path = write(tmp_path, content)
    where = f"{path}:{line}" if line else str(path)
    with pytest.raises(GpuBackendError, match=rf"^{re.escape(where)}: \S"):
        load_capture(path)


def test_an_xml_capture_holds_one_snapshot(fixtures):
    with pytest.raises(
        GpuBackendError, match=r"nvidia-smi-q-x.idle.xml: no nvidia-smi -q snapshot #2: it holds 1$"
    ):
        load_capture(fixtures / XML, 2)


def test_xml_that_is_not_utf8_is_named_by_its_line(tmp_path):
    path = write(tmp_path, b'<nvidia_smi_log>\n<gpu id="0000:01:00.0">\xff</gpu></nvidia_smi_log>')
    with pytest.raises(GpuBackendError, match=rf"^{re.escape(str(path))}:2: not UTF-8 text \(byte 0xff\)$"):
        load_capture(path)


def test_xml_past_the_size_limit_is_refused_unread(tmp_path):
    path = write(tmp_path, "<?xml")
    os.truncate(path, MAX_CAPTURE_BYTES + 1)
    with pytest.raises(GpuBackendError, match=rf"^{re.escape(str(path))}: larger than 64 MiB"):
        load_capture(path)


# --- MIG, in the DTD's shape (no real MIG XML capture is at hand) -------------------------------------

MIG_DEVICE = """
      <mig_device>
        <index>{index}</index>
        <gpu_instance_id>{instance}</gpu_instance_id>
        <compute_instance_id>0</compute_instance_id>
        <device_attributes><shared>
          <multiprocessor_count>{sms}</multiprocessor_count><copy_engine_count>3</copy_engine_count>
          <encoder_count>0</encoder_count><decoder_count>2</decoder_count>
          <ofa_count>0</ofa_count><jpg_count>0</jpg_count>
        </shared></device_attributes>
        <fb_memory_usage>
          <total>{total} MiB</total><reserved>0 MiB</reserved><used>{used} MiB</used><free>{free} MiB</free>
        </fb_memory_usage>
      </mig_device>"""


def test_mig_devices_answer_their_instance_engines_and_framebuffer(tmp_path):
    migs = MIG_DEVICE.format(
        index=0, instance=2, sms=60, total=40448, used=13, free=40435
    ) + MIG_DEVICE.format(index=1, instance=1, sms=16, total=9984, used=5, free=9979)
    path = write(
        tmp_path,
        '<nvidia_smi_log><gpu id="00000000:19:00.0"><mig_mode><current_mig>Enabled</current_mig>'
        f"<pending_mig>Enabled</pending_mig></mig_mode><mig_devices>{migs}</mig_devices></gpu></nvidia_smi_log>",
    )
    nv = load_capture(path)
    nv.nvmlInit()
    gpu = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetMigMode(gpu) == [1, 1]
    assert nv.nvmlDeviceGetMaxMigDeviceCount(gpu) == 2
    first, second = (nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index) for index in (0, 1))
    assert [nv.nvmlDeviceGetGpuInstanceId(mig) for mig in (first, second)] == [2, 1]
    memory = nv.nvmlDeviceGetMemoryInfo(second, version=pynvml.nvmlMemory_v2)
    assert (memory.total, memory.used // 2**20, memory.free // 2**20) == (9984 * 2**20, 4, 9978)
    with pytest.raises(pynvml.NVMLError) as raised:  # no nvidia-smi -L listing gives its slices
        nv.nvmlDeviceGetAttributes(first)
    assert raised.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED

"""A pynvml that answers from a real `nvidia-smi -q` capture, so that the real NVML path runs without a GPU.

Why it exists: the exporter's NVML code (collectors.gpu.nvml.NvmlBackend, the gpu collector after it)
needs a driver, and the machines that build and test fleetlens have none; hand-written fakes only say what
their author believed NVML says. A capture is what a driver did say. `load_capture` parses one and returns
a stand-in for the pynvml module that NvmlBackend takes as its `nvml` argument, so the same backend and
collector code run unchanged on real values: `--gpu-backend replay:FILE[#N]` in the exporter, and the
comparisons in tests/collectors/gpu/test_replay.py.

The stand-in answers as the driver did when nvidia-smi printed the capture: a value nvidia-smi shows as
N/A, or does not show, raises NVMLError(NVML_ERROR_NOT_SUPPORTED); an NVML error string in its place
("Unknown Error", "GPU is lost") raises that error; a capture in the pre-R535 spelling ("Clocks Throttle
Reasons") has no nvmlDeviceGetCurrentClocksEventReasons (NVML_ERROR_FUNCTION_NOT_FOUND), as those drivers
had none. Its event set never delivers an event. nvidia-smi -q does not print the profile of a MIG
device; an `nvidia-smi -L` listing in the same file does, and nvmlDeviceGetAttributes answers from it.

The text: every `==============NVSMI LOG==============` block of a file is one snapshot (a bare
`nvidia-smi -q` capture has one; nvidia_gpu_exporter's capture files have an idle and a load one), each a
tree of `Key : Value` lines nested by indentation, one `GPU <PCI bus id>` section per device in NVML's
index order. R535's and R590's spellings, and the older ECC ones, are read.

The XML: a file that begins (after a BOM and blanks) with `<?xml` or `<nvidia_smi_log` is one `nvidia-smi
-q -x` snapshot (nvsmi_log DTD v12/v13). Its allowlisted elements become the tree the text would give
(`pci/tx_util` is `PCI/Tx Throughput`), so one table, FACTS, reads both; other elements are ignored.
defusedxml parses it: the DTD it names is never fetched, entities are refused. Its <mig_device> shape is
the DTD's, not checked against a real MIG capture. nvidia-smi rounds framebuffer MiB to the nearest,
NVML's bytes are exact: the stand-in answers the low edge (see _part_bytes).

Bad input is a GpuBackendError naming the file, and the line where there is one; nothing else escapes.
"""

from __future__ import annotations

import codecs
import functools
import inspect
import operator
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree.ElementTree import ParseError

import pynvml
from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

from collectors.errors import GpuBackendError, SysfsError
from collectors.gpu.model import MIB, normalize_pci_bus_id
from collectors.gpu.nvml import handle_address
from collectors.sysfs import read_regular_file

BANNER = "==============NVSMI LOG=============="
MAX_CAPTURE_BYTES = 64 * MIB  # a 64-GPU capture is under 1 MiB; past this it is no capture

KeyPath = tuple[str, ...]


@dataclass(frozen=True)
class Unanswered:
    """What NVML says instead of a value: the error `code` the stand-in raises."""

    code: int


NOT_SHOWN = Unanswered(pynvml.NVML_ERROR_NOT_SUPPORTED)
Answer = int | float | str | Unanswered

# What nvidia-smi prints where NVML answered an error (N/A: not supported), by that error.
NVML_ERROR_TEXT = {
    "n/a": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "not supported": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "insufficient permissions": pynvml.NVML_ERROR_NO_PERMISSION,
    "gpu is lost": pynvml.NVML_ERROR_GPU_IS_LOST,
    "gpu requires restart": pynvml.NVML_ERROR_RESET_REQUIRED,
    "requested functionality has been deprecated": pynvml.NVML_ERROR_DEPRECATED,
    "unknown error": pynvml.NVML_ERROR_UNKNOWN,
}
FLAG_TEXT = {"yes": 1, "no": 0, "enabled": 1, "disabled": 0, "active": 1, "not active": 0}
NUMBER = re.compile(r"(?P<number>-?\d{1,20}(?:\.\d{1,9})?) ?(?P<unit>\S*)")
MAX_LISTED_LINE = 512  # an `nvidia-smi -L` line is under 120 characters; longer ones are not matched
LISTED_GPU = re.compile(r"GPU \d+: .* \(UUID: (?P<uuid>[^)]+)\)")
LISTED_MIG = re.compile(
    r"\s+MIG (?:(?P<compute>\d{1,2})c\.)?(?P<gpu>\d{1,2})g\.\d{1,5}gb\S*\s+Device\s+(?P<index>\d{1,3}): .*"
)


class _CaptureProblem(GpuBackendError):
    """Bad capture text at `line` (from 1; 0: the file as a whole)."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line = line


@dataclass
class Entry:
    """One `Key : Value` line, or a section header (value None), with the lines indented under it."""

    key: str
    value: str | None
    line: int
    children: list[Entry] = field(default_factory=list)

    def find(self, path: KeyPath) -> Entry | None:
        """The first entry at `path` under this one; keys match whatever their case (R535's `Gpu` is
        R590's `GPU`)."""
        entry: Entry | None = self
        for key in path:
            wanted = key.casefold()
            entry = next((child for child in entry.children if child.key.casefold() == wanted), None)
            if entry is None:
                return None
        return entry

    def named(self, key: str) -> list[Entry]:
        """The children called `key` (a section may repeat one: `MIG Device`)."""
        return [child for child in self.children if child.key.casefold() == key.casefold()]

    def descendants(self) -> Iterator[Entry]:
        """Every entry under this one, depth first (without recursion: hostile input nests deep)."""
        pending = list(reversed(self.children))
        while pending:
            entry = pending.pop()
            yield entry
            pending.extend(reversed(entry.children))


@dataclass
class _OpenSection:
    indent: int
    entry: Entry
    child_indent: int | None = None


def parse_entries(lines: Sequence[str], first_line: int) -> Entry:
    """The tree of one snapshot's lines (`lines[0]` is line `first_line` of the file), under a root entry."""
    root = Entry("", None, first_line - 1)
    open_sections = [_OpenSection(-1, root)]
    for number, text in enumerate(lines, first_line):
        if not text.strip():
            continue
        indent = len(text) - len(text.lstrip(" "))
        if text[indent].isspace():
            raise _CaptureProblem(number, "indented with something other than spaces")
        while open_sections[-1].indent >= indent:
            open_sections.pop()
        parent = open_sections[-1]
        if parent.child_indent is None:
            parent.child_indent = indent
        elif parent.child_indent != indent:
            raise _CaptureProblem(
                number, f"indented by {indent}, where the lines beside it are by {parent.child_indent}"
            )
        entry = _entry(text.strip(), number)
        parent.entry.children.append(entry)
        open_sections.append(_OpenSection(indent, entry))
    return root


def _entry(text: str, line: int) -> Entry:
    """`Key   : Value` (nvidia-smi pads keys with spaces to the colon), else a section header."""
    key, colon, value = text.partition(" :")
    return Entry(key.rstrip(), value.strip(), line) if colon else Entry(text, None, line)


def _value(entry: Entry, unit: str) -> Answer:
    """The value of a `Key : Value` line, expected in `unit` ("MHz", "" for a count, "text", "flag")."""
    text = entry.value
    if text is None:
        raise _CaptureProblem(entry.line, f"{entry.key}: a section where a value belongs")
    if text.casefold() in NVML_ERROR_TEXT:
        return Unanswered(NVML_ERROR_TEXT[text.casefold()])
    if unit == "text":
        return text
    if unit == "flag":
        if text.casefold() not in FLAG_TEXT:
            raise _CaptureProblem(entry.line, f"{entry.key}: expected Yes/No or (Not) Active, got {text!r}")
        return FLAG_TEXT[text.casefold()]
    match = NUMBER.fullmatch(text)
    if match is None or match["unit"] != unit:
        expected = f"a number in {unit}" if unit else "a number"
        raise _CaptureProblem(entry.line, f"{entry.key}: expected {expected}, got {text!r}")
    number = match["number"]
    return float(number) if "." in number else int(number)


@dataclass(frozen=True)
class Fact:
    """One NVML answer and where nvidia-smi prints it: `spellings` are the alternatives (one driver's,
    an older one's), the first that the section holds wins; a spelling of several lines is their sum."""

    unit: str
    spellings: tuple[tuple[KeyPath, ...], ...]

    def answer(self, section: Entry) -> Answer:
        for spelling in self.spellings:
            entries = [section.find(path) for path in spelling]
            if all(entry is not None for entry in entries):
                values = [_value(entry, self.unit) for entry in entries if entry is not None]
                unanswered = [value for value in values if isinstance(value, Unanswered)]
                if unanswered:
                    return unanswered[0]
                return values[0] if len(values) == 1 else sum(values)
        return _section_error(section, self.spellings[0][0])


def _section_error(section: Entry, path: KeyPath) -> Unanswered:
    """Why a value is not in the capture: the error its section prints in place of its lines (`Remapped
    Rows : N/A` in MIG mode), else NOT_SUPPORTED: nvidia-smi -q omits what the driver does not support."""
    for depth in range(1, len(path)):
        entry = section.find(path[:depth])
        if entry is None:
            break
        if entry.value is not None and not entry.children:
            return _unanswered(entry)
    return NOT_SHOWN


def _at(unit: str, *paths: KeyPath) -> Fact:
    """A fact printed on one line, at the first of `paths` that the section holds."""
    return Fact(unit, tuple((path,) for path in paths))


def _ecc(counter: str, *spellings: tuple[str, ...]) -> Fact:
    """ECC errors under `ECC Errors/<counter>`: the sum of a spelling's lines (`a/b`: b under a)."""
    return Fact(
        "",
        tuple(tuple(("ECC Errors", counter, *line.split("/")) for line in lines) for lines in spellings),
    )


CLOCKS = {
    pynvml.NVML_CLOCK_GRAPHICS: "Graphics",
    pynvml.NVML_CLOCK_SM: "SM",
    pynvml.NVML_CLOCK_MEM: "Memory",
    pynvml.NVML_CLOCK_VIDEO: "Video",
}
ECC_COUNTERS = {pynvml.NVML_VOLATILE_ECC: "Volatile", pynvml.NVML_AGGREGATE_ECC: "Aggregate"}
ECC_TYPES = {
    pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: "corrected",
    pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "uncorrected",
}
FB_PARTS = ("Total", "Reserved", "Used", "Free")
POWER_SECTIONS = ("GPU Power Readings", "Power Readings")  # R535 and later; before

# Every fact a GPU or MIG device section may hold, by the name the stand-in asks for it.
FACTS: dict[str, Fact] = {
    "name": _at("text", ("Product Name",)),
    "uuid": _at("text", ("GPU UUID",)),
    "minor number": _at("", ("Minor Number",)),
    **{f"clock {name}": _at("MHz", ("Clocks", name)) for name in CLOCKS.values()},
    **{f"max clock {name}": _at("MHz", ("Max Clocks", name)) for name in CLOCKS.values()},
    "gpu temperature": _at("C", ("Temperature", "GPU Current Temp")),
    "memory temperature": _at("C", ("Temperature", "Memory Current Temp")),
    "power draw": _at(
        "W", *((section, key) for section in POWER_SECTIONS for key in ("Power Draw", "Average Power Draw"))
    ),
    "power limit": _at(
        "W",
        *(
            (section, key)
            for section in POWER_SECTIONS
            for key in ("Current Power Limit", "Enforced Power Limit")
        ),
    ),
    "gpu utilization": _at("%", ("Utilization", "GPU")),
    "memory utilization": _at("%", ("Utilization", "Memory")),
    # a MIG device's own framebuffer is `Shared FB Memory Usage` (R590) or `FB Memory Usage` (before)
    **{
        f"fb {part.lower()}": _at("MiB", ("Shared FB Memory Usage", part), ("FB Memory Usage", part))
        for part in FB_PARTS
    },
    "pcie replays": _at("", ("PCI", "Replays Since Reset")),
    "pcie tx": _at("KB/s", ("PCI", "Tx Throughput")),
    "pcie rx": _at("KB/s", ("PCI", "Rx Throughput")),
    "pcie generation": _at("", ("PCI", "GPU Link Info", "PCIe Generation", "Current")),
    "pcie max generation": _at("", ("PCI", "GPU Link Info", "PCIe Generation", "Max")),
    "pcie width": _at("x", ("PCI", "GPU Link Info", "Link Width", "Current")),
    "pcie max width": _at("x", ("PCI", "GPU Link Info", "Link Width", "Max")),
    # NVML's totals: R535 splits SRAM and DRAM, R470 to R525 too without the parity/SEC-DED split, older
    # drivers (and GPUs without HBM still) print Single Bit and Double Bit per memory with a Total.
    **{
        f"ecc corrected {counter}": _ecc(
            counter, ("SRAM Correctable", "DRAM Correctable"), ("Single Bit/Total",)
        )
        for counter in ECC_COUNTERS.values()
    },
    **{
        f"ecc uncorrected {counter}": _ecc(
            counter,
            ("SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED", "DRAM Uncorrectable"),
            ("SRAM Uncorrectable", "DRAM Uncorrectable"),
            ("Double Bit/Total",),
        )
        for counter in ECC_COUNTERS.values()
    },
    "remapped correctable": _at("", ("Remapped Rows", "Correctable Error")),
    "remapped uncorrectable": _at("", ("Remapped Rows", "Uncorrectable Error")),
    "remap pending": _at("flag", ("Remapped Rows", "Pending")),
    "remap failure": _at("flag", ("Remapped Rows", "Remapping Failure Occurred")),
    "mig mode": _at("flag", ("MIG Mode", "Current")),
    "mig mode pending": _at("flag", ("MIG Mode", "Pending")),
    # a MIG device section's
    "mig index": _at("", ("Index",)),
    "gpu instance id": _at("", ("GPU Instance ID",)),
    **{
        f"shared {engine}": _at("", ("Device Attributes", "Shared", f"{engine} count"))
        for engine in ("Multiprocessor", "Copy Engine", "Decoder", "Encoder", "JPG", "OFA")
    },
}

# The reasons NVML's clock reason bitmask holds, by their line in `Clocks Event Reasons` (R535 and later)
# or `Clocks Throttle Reasons` (before); nvidia-smi nests the HW Slowdown causes under HW Slowdown.
CLOCK_REASON_BITS = {
    "idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications clocks setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw power cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw thermal slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw thermal slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw power brake slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display clock setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}
CLOCK_REASON_SECTIONS = {
    "Clocks Event Reasons": "clock event reasons",
    "Clocks Throttle Reasons": "clock throttle reasons",
}


def _clock_reasons(gpu: Entry) -> dict[str, Answer]:
    """The active reasons as NVML's bitmask, under the name of the function this capture's driver had."""
    for section_key, answer_name in CLOCK_REASON_SECTIONS.items():
        section = gpu.find((section_key,))
        if section is not None:
            return {answer_name: _reason_mask(section)}
    return {}


def _reason_mask(section: Entry) -> Answer:
    states = [
        (CLOCK_REASON_BITS[entry.key.casefold()], _value(entry, "flag"))
        for entry in section.descendants()
        if entry.key.casefold() in CLOCK_REASON_BITS
    ]
    if not states:  # `Clocks Event Reasons : N/A`, or a section without a reason NVML has a bit for
        return NOT_SHOWN if section.value is None else _unanswered(section)
    answered = [(bit, state) for bit, state in states if not isinstance(state, Unanswered)]
    if not answered:  # every reason N/A: the error NVML gave
        return states[0][1]
    return functools.reduce(operator.or_, (bit for bit, state in answered if state), 0)


def _unanswered(entry: Entry) -> Unanswered:
    """The NVML error a line prints in place of a value that is no `Key : Value` value."""
    answer = _value(entry, "text")
    if not isinstance(answer, Unanswered):
        raise _CaptureProblem(entry.line, f"{entry.key}: expected the lines under it, or N/A; got {answer!r}")
    return answer


@dataclass(frozen=True)
class ReplayDevice:
    """What a capture says of one GPU, or one MIG device of it, by FACTS' names."""

    answers: Mapping[str, Answer]
    mig_devices: tuple[ReplayDevice, ...] = ()
    slices: tuple[int, int] | None = None  # a MIG device's GPU and compute instance slices (nvidia-smi -L)


def _devices(root: Entry, listed_slices: Mapping[tuple[str, int], tuple[int, int]]) -> list[ReplayDevice]:
    """The GPU sections of a snapshot, in order; `listed_slices` by (GPU UUID, MIG device index)."""
    devices: list[ReplayDevice] = []
    first_seen: dict[str, int] = {}
    for section in root.children:
        if not section.key.startswith("GPU ") or section.value is not None:
            continue
        try:
            bus_id = normalize_pci_bus_id(section.key.removeprefix("GPU "))
        except ValueError:
            raise _CaptureProblem(section.line, f"{section.key!r} is not `GPU <PCI bus id>`") from None
        if bus_id in first_seen:
            raise _CaptureProblem(section.line, f"GPU {bus_id} again (first at line {first_seen[bus_id]})")
        first_seen[bus_id] = section.line
        devices.append(_gpu(section, bus_id, listed_slices))
    return devices


def _gpu(
    section: Entry, bus_id: str, listed_slices: Mapping[tuple[str, int], tuple[int, int]]
) -> ReplayDevice:
    answers: dict[str, Answer] = {name: fact.answer(section) for name, fact in FACTS.items()}
    answers.update(_clock_reasons(section))
    answers["bus id"] = bus_id
    holder = section.find(("MIG Devices",))  # before R590 the MIG Device sections are under MIG Devices
    migs = section.named("MIG Device") + (holder.named("MIG Device") if holder else [])
    return ReplayDevice(answers, tuple(_mig(mig, answers["uuid"], listed_slices) for mig in migs))


def _mig(
    section: Entry, gpu_uuid: Answer, listed_slices: Mapping[tuple[str, int], tuple[int, int]]
) -> ReplayDevice:
    answers = {name: fact.answer(section) for name, fact in FACTS.items()}
    index = answers["mig index"]
    slices = (
        listed_slices.get((gpu_uuid, index)) if isinstance(gpu_uuid, str) and isinstance(index, int) else None
    )
    return ReplayDevice(answers, slices=slices)


def _listed_slices(lines: Sequence[str]) -> dict[tuple[str, int], tuple[int, int]]:
    """(GPU instance slices, compute instance slices) of each MIG device an `nvidia-smi -L` listing in
    the file names ("MIG 3g.40gb Device 0", "MIG 1c.3g.40gb Device 1"), by (GPU UUID, MIG device index)."""
    slices: dict[tuple[str, int], tuple[int, int]] = {}
    uuid = None
    for line in (line for line in lines if len(line) < MAX_LISTED_LINE):
        if gpu := LISTED_GPU.fullmatch(line):
            uuid = gpu["uuid"]
        elif (mig := LISTED_MIG.fullmatch(line)) and uuid is not None:
            gpu_slices = int(mig["gpu"])
            slices[uuid, int(mig["index"])] = (gpu_slices, int(mig["compute"] or gpu_slices))
    return slices


def _snapshot_spans(lines: Sequence[str]) -> list[tuple[int, int]]:
    """(first, end) line indexes of each snapshot's lines: after its banner, up to the next banner, the
    next `#` section header of a multi-section capture, or the end of the file."""
    starts = [index + 1 for index, line in enumerate(lines) if line.strip() == BANNER]
    ends = [
        next(
            (i for i in range(start, len(lines)) if lines[i].startswith("#") or lines[i].strip() == BANNER),
            len(lines),
        )
        for start in starts
    ]
    return list(zip(starts, ends, strict=True))


# --- nvidia-smi -q -x ------------------------------------------------------------------------------------

XML_START = re.compile(r"\s*<(?:\?xml|nvidia_smi_log)\b")
MAX_XML_DEPTH = 32  # nvidia-smi nests 7 deep; past this a document is no capture (and costs depth per tag)


def _xml_keys(leaves: Mapping[str, KeyPath]) -> dict[tuple[str, ...], KeyPath]:
    """Each allowlisted element path (tags below a <gpu> or <mig_device>) and the sections above it, by
    the text capture's key path that prints the same value; an element path nests as deep as its keys."""
    keys: dict[tuple[str, ...], KeyPath] = {}
    for element, key_path in leaves.items():
        tags = tuple(element.split("/"))
        for depth in range(1, len(tags) + 1):
            keys[tags[:depth]] = key_path[:depth]
    return keys


def _same_lines(section: str, key: str, tags: Mapping[str, str]) -> dict[str, KeyPath]:
    """The elements `tags` of the XML section `section`, printed as their lines under `key` in text."""
    return {f"{section}/{tag}": (key, line) for tag, line in tags.items()}


CLOCK_TAGS = {"graphics_clock": "Graphics", "sm_clock": "SM", "mem_clock": "Memory", "video_clock": "Video"}
FB_TAGS = {part.lower(): part for part in FB_PARTS}
POWER_TAGS = {
    "power_draw": "Power Draw",
    "average_power_draw": "Average Power Draw",
    "current_power_limit": "Current Power Limit",
    "enforced_power_limit": "Enforced Power Limit",
}
ECC_TAGS = {
    "sram_correctable": ("SRAM Correctable",),
    "sram_uncorrectable": ("SRAM Uncorrectable",),
    "sram_uncorrectable_parity": ("SRAM Uncorrectable Parity",),
    "sram_uncorrectable_secded": ("SRAM Uncorrectable SEC-DED",),
    "dram_correctable": ("DRAM Correctable",),
    "dram_uncorrectable": ("DRAM Uncorrectable",),
    "single_bit/total": ("Single Bit", "Total"),
    "double_bit/total": ("Double Bit", "Total"),
}
REASON_TAGS = {
    "gpu_idle": "Idle",
    "applications_clocks_setting": "Applications Clocks Setting",
    "sw_power_cap": "SW Power Cap",
    "hw_slowdown": "HW Slowdown",
    "hw_thermal_slowdown": "HW Thermal Slowdown",
    "hw_power_brake_slowdown": "HW Power Brake Slowdown",
    "sync_boost": "Sync Boost",
    "sw_thermal_slowdown": "SW Thermal Slowdown",
    "display_clocks_setting": "Display Clock Setting",
}
PCI_LINK = ("PCI", "GPU Link Info")

# The allowlist: the elements of a <gpu> (nvsmi_log DTD v12/v13, and the older spellings FACTS read in
# text) whose values FACTS ask for, by the key path the text capture prints them under. Others are ignored.
GPU_XML_KEYS = _xml_keys(
    {
        "product_name": ("Product Name",),
        "uuid": ("GPU UUID",),
        "minor_number": ("Minor Number",),
        "mig_mode/current_mig": ("MIG Mode", "Current"),
        "mig_mode/pending_mig": ("MIG Mode", "Pending"),
        "pci/replay_counter": ("PCI", "Replays Since Reset"),
        "pci/tx_util": ("PCI", "Tx Throughput"),
        "pci/rx_util": ("PCI", "Rx Throughput"),
        "pci/pci_gpu_link_info/pcie_gen/max_link_gen": (*PCI_LINK, "PCIe Generation", "Max"),
        "pci/pci_gpu_link_info/pcie_gen/current_link_gen": (*PCI_LINK, "PCIe Generation", "Current"),
        "pci/pci_gpu_link_info/link_widths/max_link_width": (*PCI_LINK, "Link Width", "Max"),
        "pci/pci_gpu_link_info/link_widths/current_link_width": (*PCI_LINK, "Link Width", "Current"),
        **{
            f"{section}/{section[:-1]}_{tag}": (key, line)
            for section, key in (
                ("clocks_event_reasons", "Clocks Event Reasons"),
                ("clocks_throttle_reasons", "Clocks Throttle Reasons"),
            )
            for tag, line in REASON_TAGS.items()
        },
        **_same_lines("fb_memory_usage", "FB Memory Usage", FB_TAGS),
        "utilization/gpu_util": ("Utilization", "GPU"),
        "utilization/memory_util": ("Utilization", "Memory"),
        **{
            f"ecc_errors/{counter.lower()}/{tags}": ("ECC Errors", counter, *lines)
            for counter in ECC_COUNTERS.values()
            for tags, lines in ECC_TAGS.items()
        },
        **_same_lines(
            "remapped_rows",
            "Remapped Rows",
            {
                "remapped_row_corr": "Correctable Error",
                "remapped_row_unc": "Uncorrectable Error",
                "remapped_row_pending": "Pending",
                "remapped_row_failure": "Remapping Failure Occurred",
            },
        ),
        "temperature/gpu_temp": ("Temperature", "GPU Current Temp"),
        "temperature/memory_temp": ("Temperature", "Memory Current Temp"),
        **_same_lines("gpu_power_readings", "GPU Power Readings", POWER_TAGS),
        **_same_lines("power_readings", "Power Readings", POWER_TAGS),
        **_same_lines("clocks", "Clocks", CLOCK_TAGS),
        **_same_lines("max_clocks", "Max Clocks", CLOCK_TAGS),
    }
)
# A <mig_device> under <mig_devices>, in the shape nvidia-smi's DTD gives it (no real MIG XML capture was
# at hand): its index, GPU instance, shared engines and framebuffer.
MIG_XML_KEYS = _xml_keys(
    {
        "index": ("Index",),
        "gpu_instance_id": ("GPU Instance ID",),
        **{
            f"device_attributes/shared/{tag}_count": ("Device Attributes", "Shared", f"{engine} count")
            for tag, engine in (
                ("multiprocessor", "Multiprocessor"),
                ("copy_engine", "Copy Engine"),
                ("decoder", "Decoder"),
                ("encoder", "Encoder"),
                ("jpg", "JPG"),
                ("ofa", "OFA"),
            )
        },
        **_same_lines("fb_memory_usage", "FB Memory Usage", FB_TAGS),
    }
)


@dataclass
class _OpenElement:
    tag: str
    line: int
    text: list[str] = field(default_factory=list)
    has_children: bool = False


@dataclass
class _XmlSection:
    """A <gpu> or <mig_device> being read: its Entry, how deep its element is, and its allowlist."""

    entry: Entry
    depth: int
    keys: Mapping[tuple[str, ...], KeyPath]


class _XmlCapture:
    """expat's target: builds the Entry tree the text parser builds for the same capture, from the
    allowlisted elements only, each at the line its start tag is on."""

    def __init__(self, line: Callable[[], int]) -> None:
        self._line = line
        self.root = Entry("", None, 0)
        self._open: list[_OpenElement] = []
        self._sections: list[_XmlSection] = []

    def start(self, tag: str, attributes: Mapping[str, str]) -> None:
        line = self._line()
        if self._open:
            self._open[-1].has_children = True
        elif tag != "nvidia_smi_log":
            raise _CaptureProblem(line, f"<{tag}> where nvidia-smi -q -x output begins with <nvidia_smi_log>")
        if len(self._open) >= MAX_XML_DEPTH:
            raise _CaptureProblem(line, f"<{tag}> nested deeper than {MAX_XML_DEPTH} elements")
        self._open.append(_OpenElement(tag, line))
        tags = [element.tag for element in self._open]
        if tags == ["nvidia_smi_log", "gpu"]:
            gpu = Entry(f"GPU {attributes.get('id', '')}", None, line)
            self.root.children.append(gpu)
            self._sections.append(_XmlSection(gpu, len(tags), GPU_XML_KEYS))
        elif tags[1:] == ["gpu", "mig_devices", "mig_device"]:
            mig = Entry("MIG Device", None, line)
            self._sections[-1].entry.children.append(mig)
            self._sections.append(_XmlSection(mig, len(tags), MIG_XML_KEYS))

    def data(self, text: str) -> None:
        if self._open:
            self._open[-1].text.append(text)

    def end(self, tag: str) -> None:
        tags = tuple(element.tag for element in self._open)
        element = self._open.pop()
        if not self._sections:
            return
        section = self._sections[-1]
        if len(tags) == section.depth:
            self._sections.pop()
            return
        key_path = section.keys.get(tags[section.depth :])
        if key_path is not None:
            value = None if element.has_children else "".join(element.text).strip()
            _place(section.entry, key_path, value, element.line)

    def close(self) -> Entry:
        if not self.root.children:
            raise _CaptureProblem(0, "no <gpu> in the nvidia-smi -q -x output")
        return self.root


def _place(section: Entry, key_path: KeyPath, value: str | None, line: int) -> None:
    """Put a value (None: a section) at `key_path` under `section`, with the sections above it. A child
    element ends before its parent, so a section may already be there; a value is always a new line."""
    parent = section
    for key in key_path[:-1]:
        child = parent.find((key,))
        if child is None:
            child = Entry(key, None, line)
            parent.children.append(child)
        parent = child
    if value is not None or parent.find(key_path[-1:]) is None:
        parent.children.append(Entry(key_path[-1], value, line))


def _xml_snapshot(text: str, snapshot: int) -> Entry:
    """The Entry tree of an `nvidia-smi -q -x` document. Its DOCTYPE names nvidia-smi's DTD, which is
    never fetched; an entity declaration or an external reference is refused, nothing is expanded."""
    _check_snapshot(snapshot, 1)
    parser: DefusedXMLParser
    capture = _XmlCapture(lambda: parser.parser.CurrentLineNumber)
    parser = DefusedXMLParser(target=capture, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    try:
        parser.feed(text)
        return parser.close()
    except ParseError as error:
        line, _ = error.position
        problem = str(error).partition(": line")[0]
        raise _CaptureProblem(line, f"not well-formed XML ({problem})") from None
    except DefusedXmlException as error:
        raise _CaptureProblem(
            parser.parser.CurrentLineNumber, f"refused {error!r}: nvidia-smi declares no entities"
        ) from None


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, up to one past the limit; a FIFO or device is refused without waiting on it."""
    try:
        return read_regular_file(path, MAX_CAPTURE_BYTES)
    except SysfsError:
        raise _CaptureProblem(0, "not a regular file") from None
    except OSError as error:
        raise _CaptureProblem(0, f"cannot read the capture: {error.strerror or error}") from None


def _read_text(path: Path) -> str:
    """The file's text, without a UTF-8 byte order mark and with `\n` line ends."""
    data = _read_bytes(path)
    if len(data) > MAX_CAPTURE_BYTES:
        raise _CaptureProblem(0, f"larger than {MAX_CAPTURE_BYTES // MIB} MiB: not an nvidia-smi capture")
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise _CaptureProblem(line, f"not UTF-8 text (byte {data[error.start]:#04x})") from None
    return text.replace("\r\n", "\n")


def load_capture(path: Path, snapshot: int = 1) -> ReplayNvml:
    """A pynvml stand-in for NvmlBackend that answers from the `snapshot`th (from 1) `nvidia-smi -q`
    snapshot in the file at `path`, or from its `nvidia-smi -q -x` document (one snapshot). Raises
    GpuBackendError naming the file, and the line where one is at fault, when the file cannot be read,
    holds no such snapshot or a line or element that is not nvidia-smi's."""
    try:
        text = _read_text(path)
        if XML_START.match(text):
            root, listed = _xml_snapshot(text, snapshot), {}
        else:
            lines = text.split("\n")
            root, listed = _text_snapshot(lines, snapshot), _listed_slices(lines)
        devices = _devices(root, listed)
    except _CaptureProblem as problem:
        where = f"{path}:{problem.line}" if problem.line else str(path)
        raise GpuBackendError(f"{where}: {problem}") from None
    return ReplayNvml(devices)


def _text_snapshot(lines: Sequence[str], snapshot: int) -> Entry:
    spans = _snapshot_spans(lines)
    if not spans:
        raise _CaptureProblem(0, f"no nvidia-smi -q output in it (no {BANNER} line)")
    _check_snapshot(snapshot, len(spans))
    first, end = spans[snapshot - 1]
    return parse_entries(lines[first:end], first + 1)


def _check_snapshot(snapshot: int, held: int) -> None:
    if not 1 <= snapshot <= held:
        raise _CaptureProblem(0, f"no nvidia-smi -q snapshot #{snapshot}: it holds {held}")


class ReplayNvml:
    """pynvml as a driver would have answered when the capture was taken: the calls NvmlBackend makes,
    under pynvml's names and parameters, with pynvml's constants, structs and NVMLError."""

    def __init__(self, gpus: Sequence[ReplayDevice]) -> None:
        self._targets: list[Any] = []  # what the handles point at, kept alive with them
        self._devices: dict[int | None, ReplayDevice] = {}
        self._gpu_handles = [self._new_handle(gpu) for gpu in gpus]
        self._mig_handles = {
            handle_address(handle): [self._new_handle(mig) for mig in gpu.mig_devices]
            for handle, gpu in zip(self._gpu_handles, gpus, strict=True)
        }
        self._initialized = 0

    def __getattr__(self, name: str) -> Any:
        """pynvml's constants, structs and NVMLError; never one of its functions, which would ask a driver."""
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            raise AttributeError(f"the replay does not answer pynvml.{name}")
        return value

    def _new_handle(self, device: ReplayDevice) -> Any:
        target = pynvml.struct_c_nvmlDevice_t()
        self._targets.append(target)
        handle = pynvml.c_nvmlDevice_t(target)
        self._devices[handle_address(handle)] = device
        return handle

    def _device(self, handle: Any) -> ReplayDevice:
        if not self._initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        device = self._devices.get(handle_address(handle))
        if device is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return device

    def _answer(self, handle: Any, name: str) -> Any:
        answer = self._device(handle).answers.get(name, NOT_SHOWN)
        if isinstance(answer, Unanswered):
            raise pynvml.NVMLError(answer.code)
        return answer

    def _int(self, handle: Any, name: str) -> int:
        return int(self._answer(handle, name))

    def _part_bytes(self, handle: Any, name: str) -> int:
        """A framebuffer part in bytes. nvidia-smi rounds each part to the nearest MiB (on an H200 its
        Reserved 616 + Used 0 + Free 143156 pass its Total 143771), where NVML's bytes floored to MiB read
        615 and 143155 on the same GPU: so the low edge of what rounds to the printed MiB, never below 0."""
        return max(self._int(handle, name) * MIB - MIB // 2, 0)

    def _milli(self, handle: Any, name: str) -> int:
        return round(self._answer(handle, name) * 1000)

    def nvmlInit(self) -> None:
        self._initialized += 1

    def nvmlShutdown(self) -> None:
        if not self._initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        self._initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        if not self._initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self._gpu_handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < self.nvmlDeviceGetCount():
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpu_handles[index]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._answer(handle, "uuid")

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._answer(handle, "name")

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._int(handle, "minor number")

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        bus_id = self._answer(handle, "bus id")
        domain, bus, device = (int(part, 16) for part in re.split(r"[:.]", bus_id)[:3])
        return pynvml.nvmlPciInfo_t(busId=bus_id.encode(), domain=domain, bus=bus, device=device)

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        return self._int(handle, f"clock {CLOCKS.get(type)}")

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        return self._int(handle, f"max clock {CLOCKS.get(type)}")

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._int(handle, "gpu temperature")

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: Sequence[int | tuple[int, int]]) -> Any:
        """Only the memory temperature: nvidia-smi -q prints no other field NvmlBackend asks for."""
        device = self._device(handle)
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for entry, requested in zip(values, fieldIds, strict=True):
            entry.fieldId, entry.scopeId = requested if isinstance(requested, tuple) else (requested, 0)
            memory_temperature = (entry.fieldId, entry.scopeId) == (pynvml.NVML_FI_DEV_MEMORY_TEMP, 0)
            answer = device.answers["memory temperature"] if memory_temperature else NOT_SHOWN
            if isinstance(answer, Unanswered):
                entry.nvmlReturn = answer.code
            else:
                entry.nvmlReturn = pynvml.NVML_SUCCESS
                entry.valueType = pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG
                entry.value.sllVal = int(answer)
        return values

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._milli(handle, "power draw")

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return self._milli(handle, "power limit")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        """nvidia-smi -q does not print it."""
        self._device(handle)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu, memory = self._int(handle, "gpu utilization"), self._int(handle, "memory utilization")
        return pynvml.c_nvmlUtilization_t(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        total = self._int(handle, "fb total") * MIB
        free, used, reserved = (
            self._part_bytes(handle, f"fb {part}") for part in ("free", "used", "reserved")
        )
        if not version:
            return pynvml.c_nvmlMemory_t(total=total, free=free, used=used)
        return pynvml.c_nvmlMemory_v2_t(version=version, total=total, reserved=reserved, free=free, used=used)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._int(handle, "pcie replays")

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        directions = {pynvml.NVML_PCIE_UTIL_TX_BYTES: "pcie tx", pynvml.NVML_PCIE_UTIL_RX_BYTES: "pcie rx"}
        if counter not in directions:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._int(device, directions[counter])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._int(handle, "pcie generation")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._int(handle, "pcie max generation")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._int(handle, "pcie width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._int(handle, "pcie max width")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        answers = self._device(handle).answers
        if "clock throttle reasons" in answers:  # a driver before R535: no such function
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._int(handle, "clock event reasons")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        answers = self._device(handle).answers
        return self._int(
            handle, "clock throttle reasons" if "clock throttle reasons" in answers else "clock event reasons"
        )

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        if errorType not in ECC_TYPES or counterType not in ECC_COUNTERS:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._int(handle, f"ecc {ECC_TYPES[errorType]} {ECC_COUNTERS[counterType]}")

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        names = ("remapped correctable", "remapped uncorrectable", "remap pending", "remap failure")
        correctable, uncorrectable, pending, failure = (self._int(device, name) for name in names)
        return correctable, uncorrectable, pending, failure

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        return [self._int(device, "mig mode"), self._int(device, "mig mode pending")]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        """As many as the capture shows (a driver says how many the GPU could hold, 7 on an H100)."""
        self._answer(device, "mig mode")
        return len(self._device(device).mig_devices)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        self._device(device)
        handles = self._mig_handles.get(handle_address(device), [])
        if not 0 <= index < len(handles):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return handles[index]

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._int(device, "gpu instance id")

    def nvmlDeviceGetAttributes(self, device: Any) -> Any:
        """A MIG device's, where an `nvidia-smi -L` listing in the capture gives its slices."""
        slices = self._device(device).slices
        if slices is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.c_nvmlDeviceAttributes(
            multiprocessorCount=self._int(device, "shared Multiprocessor"),
            sharedCopyEngineCount=self._int(device, "shared Copy Engine"),
            sharedDecoderCount=self._int(device, "shared Decoder"),
            sharedEncoderCount=self._int(device, "shared Encoder"),
            sharedJpegCount=self._int(device, "shared JPG"),
            sharedOfaCount=self._int(device, "shared OFA"),
            gpuInstanceSliceCount=slices[0],
            computeInstanceSliceCount=slices[1],
            memorySizeMB=self._int(device, "fb total"),
        )

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: object) -> None:
        self._device(handle)

    def nvmlEventSetWait(self, eventSet: object, timeoutms: int) -> Any:
        """A capture holds no events: the wait times out, as on a quiet driver, after as long."""
        time.sleep(max(timeoutms, 0) / 1000)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, eventSet: object) -> None:
        """Nothing to free."""

"""Xid errors counted from the kernel log (`NVRM: Xid (PCI:0000:9b:00): 119, ...`) and NVML events.

dcgm-exporter exports only the last Xid as a gauge (DCGM_FI_DEV_XID_ERRORS, also exported here), which
hides repeats and two Xids between scrapes; `fleetlens_gpu_xid_errors_total` counts every one. A
`source` label says who saw it, NVML's critical-Xid events or the kernel log: the same Xid usually
reaches both, so do not add the sources up.

The kernel log is CollectorOptions.kernel_log: /dev/kmsg, or a file followed like `tail -F` (rotation,
truncation and rewrites included: collectors.follow). Both are read from their first line, then
incrementally on each scrape, so a restarted exporter counts the history still in the log again and the
counter does not jump.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from collectors.base import CollectorOptions, ReadErrors
from collectors.errors import LogParseError
from collectors.follow import FollowedFile, Line
from collectors.gpu.backend import lease_backend
from collectors.gpu.model import LABELS, GpuBackend, GpuIdentity, XidEvent, normalize_pci_bus_id
from collectors.registry import register

XID_MARKER = "NVRM: Xid"
# Older drivers wrote the address without "PCI:".
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[^)]*)\): (?P<xid>\d+)\b")


def parse_xid_line(text: str, where: str) -> XidEvent | None:
    """The Xid one kernel-log line reports (dmesg or /dev/kmsg format alike); None for other lines.

    Raises LogParseError for a line that mentions an Xid but does not say which, or for which GPU.
    """
    if XID_MARKER not in text:
        return None
    match = XID_LINE.search(text)
    if match is None:
        raise LogParseError(f"{where}: malformed Xid line {text!r}")
    try:
        pci_bus_id = normalize_pci_bus_id(match["pci"])
    except ValueError:
        raise LogParseError(f"{where}: bad PCI address in Xid line {text!r}") from None
    return XidEvent(pci_bus_id=pci_bus_id, xid=int(match["xid"]), source="kernel_log")


class LogSource(Protocol):
    name: str

    def read_lines(self) -> Iterable[Line]: ...

    def close(self) -> None: ...


class KmsgReader:
    """/dev/kmsg: each call yields the records the kernel logged since the last one, every record still in
    its ring buffer on the first. Each read() returns one record; the descriptor is non-blocking, so
    running out of records ends the call instead of waiting."""

    def __init__(self, path: Path = Path("/dev/kmsg")) -> None:
        self.name = str(path)
        self._path = path
        self._fd: int | None = None
        self._line_number = 0

    def read_lines(self) -> Iterator[Line]:
        if self._fd is None:
            self._fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK)
        while True:
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                return
            except BrokenPipeError:
                continue  # the ring buffer overwrote records before we read them; go on with the next
            if not record:
                return
            for line in record.decode(errors="replace").splitlines():
                self._line_number += 1
                yield self._line_number, line

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_kernel_log(path: Path) -> LogSource:
    """/dev/kmsg (any character device) or a regular file, followed; a path not there yet is a file."""
    try:
        is_device = stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        is_device = False
    return KmsgReader(path) if is_device else FollowedFile(path)


class XidCollector:
    """Counts Xids from the kernel log, read on each scrape, and from the GPU backend's event listener."""

    def __init__(
        self,
        node: str,
        errors: ReadErrors,
        backend: GpuBackend | None = None,
        kernel_log: LogSource | None = None,
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self._node = node
        self._errors = errors
        self._log = kernel_log
        self._release = release
        known = backend.identities() if backend else []
        self._identities = {gpu.pci_bus_id: gpu for gpu in known if gpu.pci_bus_id}
        self._counts: Counter[tuple[str, int, str]] = Counter()
        self._last: dict[str, int] = {}
        self._lock = threading.Lock()
        self._watch = backend.watch_xids(self._record, errors.report) if backend else None

    def _record(self, event: XidEvent) -> None:
        with self._lock:
            self._counts[event.pci_bus_id, event.xid, event.source] += 1
            self._last[event.pci_bus_id] = event.xid

    def _read_log(self) -> None:
        if self._log is None:
            return
        try:
            for number, text in self._log.read_lines():
                if XID_MARKER in text:  # cheap test first: most lines are about something else
                    self._count_line(text, f"{self._log.name}:{number}")
        except OSError as error:
            self._errors.report(self._log.name, str(error))

    def _count_line(self, text: str, where: str) -> None:
        try:
            event = parse_xid_line(text, where)
        except LogParseError as error:
            self._errors.report(where, str(error))
            return
        if event is not None:
            self._record(event)

    def _labels(self, pci_bus_id: str) -> list[str]:
        identity = self._identities.get(pci_bus_id, GpuIdentity(index=None, pci_bus_id=pci_bus_id))
        return list(identity.labels(self._node).values())

    def collect(self) -> Iterator[Metric]:
        self._read_log()
        with self._lock:
            counts = sorted(self._counts.items())
            last = dict(self._last)
        total = CounterMetricFamily(
            "fleetlens_gpu_xid_errors",
            "Xid errors of the GPU by Xid code and by who saw them (nvml events or kernel_log lines).",
            labels=(*LABELS, "xid", "source"),
        )
        for (pci_bus_id, xid, source), count in counts:
            total.add_metric([*self._labels(pci_bus_id), str(xid), source], count)
        last_xid = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=LABELS
        )
        for pci_bus_id in {**dict.fromkeys(self._identities), **dict.fromkeys(last)}:
            last_xid.add_metric(self._labels(pci_bus_id), last.get(pci_bus_id, 0))
        if total.samples:
            yield total
        if last_xid.samples:
            yield last_xid

    def close(self) -> None:
        """Stop the NVML listener, close the log, give the shared backend back; safe to call twice."""
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._log is not None:
            self._log.close()
            self._log = None
        release, self._release = self._release, lambda: None
        release()


@register("xid")
def build_xid_collector(options: CollectorOptions, errors: ReadErrors) -> XidCollector:
    backend, release = lease_backend(options, errors)
    kernel_log = open_kernel_log(options.kernel_log) if options.kernel_log else None
    return XidCollector(options.node, errors, backend, kernel_log, release)

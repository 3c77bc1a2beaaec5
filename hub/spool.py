"""The hub's durable on-disk spool: batches the store could not take, kept in order until it can.

    spool = Spool("/var/lib/fleetlens/spool", max_bytes=1 << 30)
    spool.put(kind, token, rows)     # durably, behind every batch put before; False if dropped instead
    spool.replay(insert)             # oldest first, each file deleted once its insert returned

One file per batch, `<sequence>-<kind>-<rows>.spool`, its 20-digit sequence growing across restarts so
that the names sort in the order the batches were put; `rejected/` and `corrupt/` hold files set aside.
A file is a 16-byte header (magic, payload length) and zlib of compact JSON (the layout: docs/hub.md),
which decodes only to strings, numbers, lists and dicts for the record constructors, inflated at most
MAX_DECODED_BYTES: a planted or damaged file is at worst set aside or refused by the store.

Failure policy. StoreUnavailable: the batch stays pending and is replayed when the store is back.
StoreRejected: retrying would fail again, so the batch moves to rejected/ for an operator, never
replayed and never blocking the batches behind it. A torn file (shorter than its header says, or a
`.tmp` left by a crash) is set aside in corrupt/ when the spool opens, one whose payload fails to decode
when it is replayed; both are counted, neither stops the hub. A batch of samples carries its scrapes'
target statuses: the replay inserts them after the samples (token `<token>/targets`) and deletes the
file only once both are in, so a scrape's row is never lost while its samples are stored (hub.rounds).

Durability: temp file, write, flush, fsync, atomic rename, fsync of the directory, so a pending file is
whole or absent after a power cut. A deletion is not fsynced: a file a crash brings back is sent again
with the same token, and the store drops the repeat.

Bound: `max_bytes` covers every file, set-aside ones included. To make room, set-aside files are deleted
first, then the oldest pending ones (dropped: counted in entries and rows); the one being replayed is
spared, so the directory may exceed the bound by that file. A batch larger than the bound is dropped.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from analytics.errors import StoreRejected, StoreUnavailable
from analytics.store.records import ScrapeBatch, TargetStatus
from collectors.steprecord import StepRecord
from hub.errors import SettingError, SpoolEntryError

log = logging.getLogger("fleetlens.hub.spool")

Kind = Literal["samples", "targets", "steps"]
Row = ScrapeBatch | TargetStatus | StepRecord
# (kind, rows, token[, keep_until=seconds for kept step batches]): raises a StoreError on failure
Insert = Callable[..., object]

ROW_TYPES: dict[str, type[Row]] = {"samples": ScrapeBatch, "targets": TargetStatus, "steps": StepRecord}
FORMAT_VERSION = 1
HEADER = struct.Struct(">8sQ")  # magic, payload length
MAGIC = b"FLSPOOL1"
ZLIB_LEVEL = 6
MAX_DECODED_BYTES = 1 << 30
REJECTED = "rejected"
CORRUPT = "corrupt"

_FIELDS = {kind: tuple(field.name for field in fields(row_type)) for kind, row_type in ROW_TYPES.items()}
_PENDING_NAME = re.compile(rf"(?P<seq>\d{{20}})-(?P<kind>{'|'.join(ROW_TYPES)})-(?P<rows>\d+)\.spool")
_SEQUENCE = re.compile(r"(\d{20})-")  # every file the spool writes starts so, temp and set-aside ones too


@dataclass(frozen=True)
class Entry:
    """One spooled batch, decoded: `statuses` go with a batch of samples (see the module docstring)."""

    kind: Kind
    token: str
    rows: list[Row]
    keep_until: float | None = None
    statuses: list[TargetStatus] = field(default_factory=list)


def row_count(kind: Kind, rows: Sequence[Row]) -> int:
    """The rows the store writes for `rows`: one per sample of a scrape batch, one per record otherwise."""
    if kind == "samples":
        return sum(len(batch) for batch in rows)
    return len(rows)


def encode_entry(
    kind: Kind,
    token: str,
    rows: Sequence[Row],
    keep_until: float | None = None,
    statuses: Sequence[TargetStatus] = (),
) -> bytes:
    """One spool file's bytes: header, then zlib of the JSON document (see the module docstring)."""
    if kind not in _FIELDS:
        raise SpoolEntryError(f"unknown spool kind {kind!r}; known: {', '.join(_FIELDS)}")
    if statuses and kind != "samples":
        raise SpoolEntryError(f"target statuses go with a batch of samples, not of {kind}")
    document = {"v": FORMAT_VERSION, "kind": kind, "token": token, "rows": _encoded_rows(kind, rows)}
    if keep_until is not None:
        document["keep_until"] = keep_until
    if statuses:
        document["statuses"] = _encoded_rows("targets", statuses)
    payload = zlib.compress(json.dumps(document, separators=(",", ":")).encode(), ZLIB_LEVEL)
    return HEADER.pack(MAGIC, len(payload)) + payload


def _encoded_rows(kind: Kind, rows: Sequence[Row]) -> list[list]:
    names = _FIELDS[kind]
    return [[getattr(row, name) for name in names] for row in rows]


def decode_entry(data: bytes) -> Entry:
    """The entry of one spool file's bytes; SpoolEntryError when they are not one whole entry."""
    if not _is_whole(data[: HEADER.size], len(data)):
        raise SpoolEntryError("torn or not a spool file: its length does not match its header")
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(data[HEADER.size :], MAX_DECODED_BYTES)
    except zlib.error as error:
        raise SpoolEntryError(f"payload does not inflate: {error}") from error
    if inflater.unconsumed_tail or not inflater.eof:
        raise SpoolEntryError(f"payload incomplete or larger than {MAX_DECODED_BYTES} bytes once inflated")
    try:
        document = json.loads(text)
    except ValueError as error:
        raise SpoolEntryError(f"payload is not JSON: {error}") from error
    try:
        if document["v"] != FORMAT_VERSION:
            raise SpoolEntryError(f"format version {document['v']!r}, this hub reads {FORMAT_VERSION}")
        kind = document["kind"]
        row_type = ROW_TYPES[kind]
        keep_until = document.get("keep_until")
        if keep_until is not None and not _seconds(keep_until):
            raise SpoolEntryError(f"keep_until {keep_until!r} is not unix seconds")
        rows = [row_type(*values) for values in document["rows"]]
        statuses = [TargetStatus(*values) for values in document.get("statuses", ())]
        if statuses and kind != "samples":
            raise SpoolEntryError(f"target statuses in a batch of {kind}")
        return Entry(kind, str(document["token"]), rows, keep_until, statuses)
    except (KeyError, TypeError) as error:
        raise SpoolEntryError(f"not a spool document: {error!r}") from error


def _seconds(value: object) -> bool:
    """Whether a decoded JSON value is a number of seconds (JSON's true and false are not)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class _Pending:
    """A pending file, as its name and size describe it."""

    seq: int
    kind: Kind
    rows: int
    size: int
    path: Path


class Spool:
    """Batches waiting for the store, one durable file each, replayed oldest first.

    Thread-safe: the scrape loop and receivers put while a replay thread replays. The lock guards only
    the index and counters, and is never held while the store is called, so a slow insert never stalls
    a put. Opening indexes what an earlier run left; a directory that cannot be created or listed
    raises OSError there, as a misconfigured hub should. After that no disk error escapes: a put that
    cannot be written is dropped and counted.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        if max_bytes <= 0:
            raise SettingError(f"spool max_bytes must be positive, not {max_bytes}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.dropped_total = 0
        self.dropped_rows_total = 0
        self.replayed_total = 0
        self._set_aside_total = {CORRUPT: 0, REJECTED: 0}
        self._pending: dict[int, _Pending] = {}  # by sequence, oldest first
        self._pending_bytes = 0
        self._aside: dict[Path, int] = {}  # set-aside files and their sizes, oldest first
        self._aside_bytes = 0
        self._in_flight: int | None = None  # the sequence being replayed: never dropped to make room
        self._dropping = False  # in a run of drops only the first is a warning; a put needing none ends it
        self._lock = threading.Lock()
        self._replay_lock = threading.Lock()
        for where in (REJECTED, CORRUPT):
            (self.directory / where).mkdir(parents=True, exist_ok=True)
        self._next_seq = self._open() + 1

    @property
    def pending_entries(self) -> int:
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def set_aside_bytes(self) -> int:
        return self._aside_bytes

    @property
    def corrupt_total(self) -> int:
        return self._set_aside_total[CORRUPT]

    @property
    def rejected_total(self) -> int:
        return self._set_aside_total[REJECTED]

    def put(
        self,
        kind: Kind,
        token: str,
        rows: Sequence[Row],
        keep_until: float | None = None,
        statuses: Sequence[TargetStatus] = (),
    ) -> bool:
        """Append a batch to be replayed after every batch put before it; False if it was dropped instead.
        `keep_until` goes with a batch of step records kept past the steps retention, `statuses` (their
        scrapes' target statuses) with a batch of samples."""
        return self._write(Entry(kind, token, list(rows), keep_until, list(statuses)), self.directory)

    def reject(
        self,
        kind: Kind,
        token: str,
        rows: Sequence[Row],
        reason: str,
        keep_until: float | None = None,
        statuses: Sequence[TargetStatus] = (),
    ) -> bool:
        """Keep a batch the store refused in rejected/ for an operator; it is never replayed."""
        with self._lock:
            self._set_aside_total[REJECTED] += 1
        log.warning(
            "spool: a %s batch of %d rows was refused by the store: %s", kind, row_count(kind, rows), reason
        )
        entry = Entry(kind, token, list(rows), keep_until, list(statuses))
        return self._write(entry, self.directory / REJECTED)

    def replay(self, insert: Insert) -> int:
        """Hand pending batches to `insert(kind, rows, token)` oldest first (and `keep_until=` with a kept
        batch of steps; a batch of samples' statuses then as `insert("targets", statuses,
        f"{token}/targets")`); returns how many it took.

        Each file is deleted only after its insert returned. Stops at the first StoreUnavailable, that
        batch and the rest left in order. A batch the store refuses moves to rejected/, an unreadable
        file to corrupt/, and the replay goes on. Batches put meanwhile are replayed in the same call.
        Any other exception propagates with its batch still pending. One replay runs at a time.
        """
        replayed = 0
        with self._replay_lock:
            try:
                while (entry := self._claim_oldest()) is not None:
                    try:
                        batch = decode_entry(entry.path.read_bytes())
                    except (OSError, SpoolEntryError) as error:
                        self._retire(entry, CORRUPT, f"unreadable: {error}")
                        continue
                    kept = {} if batch.keep_until is None else {"keep_until": batch.keep_until}
                    try:
                        insert(batch.kind, batch.rows, batch.token, **kept)
                        if batch.statuses:
                            insert("targets", batch.statuses, f"{batch.token}/targets")
                    except StoreUnavailable:
                        break
                    except StoreRejected as error:
                        self._retire(entry, REJECTED, f"refused by the store: {error}")
                        continue
                    self._retire(entry)
                    replayed += 1
            finally:
                with self._lock:
                    self._in_flight = None
        return replayed

    def collect(self) -> Iterator[Metric]:
        """The spool's metrics for the hub's /metrics, fresh on each call."""
        with self._lock:
            entries = GaugeMetricFamily(
                "fleetlens_hub_spool_entries",
                "Batches in the spool waiting for the store.",
                len(self._pending),
            )
            size = GaugeMetricFamily(
                "fleetlens_hub_spool_bytes",
                "Bytes of spool files: pending replay, or set aside in rejected/ and corrupt/.",
                labels=["state"],
            )
            size.add_metric(["pending"], self._pending_bytes)
            size.add_metric(["set_aside"], self._aside_bytes)
            limit = GaugeMetricFamily(
                "fleetlens_hub_spool_max_bytes", "The bound on the spool directory's files.", self.max_bytes
            )
            dropped = CounterMetricFamily(
                "fleetlens_hub_spool_dropped_entries",
                "Batches lost because the spool was full or its disk failed.",
                self.dropped_total,
            )
            dropped_rows = CounterMetricFamily(
                "fleetlens_hub_spool_dropped_rows",
                "Rows (samples, target statuses, steps) in the dropped batches.",
                self.dropped_rows_total,
            )
            replayed = CounterMetricFamily(
                "fleetlens_hub_spool_replayed_entries",
                "Spooled batches that reached the store.",
                self.replayed_total,
            )
            set_aside = CounterMetricFamily(
                "fleetlens_hub_spool_set_aside",
                "Batches moved out of the replay order: refused by the store, or torn and unreadable.",
                labels=["reason"],
            )
            for reason, count in self._set_aside_total.items():
                set_aside.add_metric([reason], count)
        yield from (entries, size, limit, dropped, dropped_rows, replayed, set_aside)

    def _open(self) -> int:
        """Index what an earlier run left, setting torn files aside; returns the highest sequence seen."""
        last = 0
        aside = [path for where in (REJECTED, CORRUPT) for path in (self.directory / where).iterdir()]
        for path in sorted(aside, key=lambda path: path.name):
            if match := _SEQUENCE.match(path.name):
                self._note_aside(path, path.stat().st_size)
                last = max(last, int(match[1]))
        for path in sorted(self.directory.iterdir()):
            if not (match := _SEQUENCE.match(path.name)) or not path.is_file():
                continue  # not a spool file
            last = max(last, int(match[1]))
            if (entry := _whole_pending_file(path)) is not None:
                self._pending[entry.seq] = entry
                self._pending_bytes += entry.size
            else:
                self._set_aside_total[CORRUPT] += 1
                self._set_aside(path, CORRUPT)
                log.warning("spool: %s is torn (a crash while writing it?); set aside in %s/", path, CORRUPT)
        return last

    def _write(self, entry: Entry, folder: Path) -> bool:
        kind = entry.kind
        # outside the lock: the costly part
        data = encode_entry(kind, entry.token, entry.rows, entry.keep_until, entry.statuses)
        count = row_count(kind, entry.rows) + len(entry.statuses)
        with self._lock:
            if len(data) > self.max_bytes:
                self._drop(count, f"a {kind} batch of {len(data)} bytes exceeds the spool's {self.max_bytes}")
                return False
            room_made_by_dropping = self._make_room(len(data))
            seq, self._next_seq = self._next_seq, self._next_seq + 1
            path = folder / f"{seq:020d}-{kind}-{count}.spool"
            try:
                write_durably(path, data)
            except OSError as error:
                self._drop(count, f"cannot write {path}: {error}")
                return False
            if folder == self.directory:
                self._pending[seq] = _Pending(seq, kind, count, len(data), path)
                self._pending_bytes += len(data)
            else:
                self._note_aside(path, len(data))
            if not room_made_by_dropping:
                self._dropping = False
        return True

    def _make_room(self, size: int) -> bool:
        """Delete set-aside files, then drop the oldest pending ones, until `size` more bytes fit.

        Called with the lock held; returns whether any pending batch was dropped.
        """
        while self._aside and self._pending_bytes + self._aside_bytes + size > self.max_bytes:
            path = next(iter(self._aside))
            self._aside_bytes -= self._aside.pop(path)
            _unlink(path)
        dropped = False
        for entry in list(self._pending.values()):
            if self._pending_bytes + self._aside_bytes + size <= self.max_bytes:
                break
            if entry.seq == self._in_flight:
                continue
            del self._pending[entry.seq]
            self._pending_bytes -= entry.size
            _unlink(entry.path)
            self._drop(
                entry.rows, f"spool full ({self.max_bytes} bytes): dropped the oldest, {entry.path.name}"
            )
            dropped = True
        return dropped

    def _drop(self, rows: int, why: str) -> None:
        """Count a lost batch; the first of a run of drops is a warning, the rest debug."""
        self.dropped_total += 1
        self.dropped_rows_total += rows
        log.log(logging.DEBUG if self._dropping else logging.WARNING, "spool: %s", why)
        self._dropping = True

    def _claim_oldest(self) -> _Pending | None:
        with self._lock:
            entry = next(iter(self._pending.values()), None)
            self._in_flight = entry.seq if entry else None
            return entry

    def _retire(self, entry: _Pending, aside: str | None = None, why: str = "") -> None:
        """Take a replayed batch out of the order: deleted once stored, else set aside in `aside`/."""
        with self._lock:
            del self._pending[entry.seq]
            self._pending_bytes -= entry.size
            if aside is None:
                self.replayed_total += 1
                _unlink(entry.path)
            else:
                self._set_aside_total[aside] += 1
                self._set_aside(entry.path, aside)
        if aside is not None:
            log.warning("spool: %s set aside in %s/: %s", entry.path.name, aside, why)

    def _set_aside(self, path: Path, where: str) -> None:
        target = self.directory / where / path.name
        try:
            size = path.stat().st_size
            os.replace(path, target)
        except OSError as error:
            log.error("spool: cannot move %s to %s/: %s", path, where, error)
            return
        self._note_aside(target, size)

    def _note_aside(self, path: Path, size: int) -> None:
        self._aside[path] = size
        self._aside_bytes += size


def _is_whole(head: bytes, size: int) -> bool:
    """Whether a file of `size` bytes that starts with `head` is as long as its header says."""
    if len(head) < HEADER.size:
        return False
    magic, length = HEADER.unpack_from(head)
    return magic == MAGIC and HEADER.size + length == size


def _whole_pending_file(path: Path) -> _Pending | None:
    """The pending entry at `path`, or None when it is a temp file, torn, or unreadable."""
    match = _PENDING_NAME.fullmatch(path.name)
    if match is None:
        return None
    try:
        with open(path, "rb") as file:
            head = file.read(HEADER.size)
            size = os.fstat(file.fileno()).st_size
    except OSError:
        return None
    if not _is_whole(head, size):
        return None
    return _Pending(int(match["seq"]), match["kind"], int(match["rows"]), size, path)


def write_durably(path: Path, data: bytes) -> None:
    """Write `data` so that after a crash `path` holds all of it or does not exist; OSError otherwise."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:
        _unlink(temporary)
        _unlink(path)
        raise


def _unlink(path: Path) -> None:
    """Delete a spool file; one that cannot be comes back on the next start, which its token makes safe."""
    try:
        path.unlink(missing_ok=True)
    except OSError as error:
        log.error("spool: cannot delete %s: %s", path, error)

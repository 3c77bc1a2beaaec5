"""Numeric columns out of ClickHouse's Native format, zero-copy, and LowCardinality(String) columns as
integer codes into their distinct texts: what a read of many numbers (the detectors' tapes) takes instead
of Arrow, which chDB writes at more CPU and pandas converts once more.

    columns = numbers(body, {"series_id": np.uint64, "t": np.int64, "value": np.float64})
    columns = numbers(body, {"t": np.int64, "job": TEXT})   # columns["job"]: a Coded

Native, as ClickHouse writes it over HTTP and as chDB returns it: blocks, each the count of its columns
and of its rows (unsigned LEB128 varints), then per column its name, its type (a varint length and the
text) and its values, one after another, little-endian, for the fixed-width types here. A
LowCardinality(String) column is its serialization version (a UInt64, 1), its index type (a UInt64: the
width of an index in the low byte, flags above it), the block's dictionary (a UInt64 count, then each
text as a varint length and its bytes), the rows (a UInt64) and an index into the dictionary per row. An
empty result is no block at all. Anything else (another type, another column, a block cut short, an index
past its dictionary) is an error naming what and where: the body is the store's answer, read as untrusted
bytes all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analytics.errors import NativeError

# the ClickHouse types read here, as numpy types (the values are little-endian, as numpy's on x86 and arm)
NUMERIC_TYPES = {
    "UInt8": np.dtype("<u1"),
    "UInt16": np.dtype("<u2"),
    "UInt32": np.dtype("<u4"),
    "UInt64": np.dtype("<u8"),
    "Int8": np.dtype("<i1"),
    "Int16": np.dtype("<i2"),
    "Int32": np.dtype("<i4"),
    "Int64": np.dtype("<i8"),
    "Float32": np.dtype("<f4"),
    "Float64": np.dtype("<f8"),
}
MAX_VARINT_BYTES = 10  # a UInt64's at most
TEXT = "LowCardinality(String)"  # a column read as a Coded
KEYS_VERSION = 1  # LowCardinality's serialization: shared dictionaries with additional keys (per block)
INDEX_WIDTHS = [np.dtype("<u1"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8")]  # by the type's low byte
HAS_ADDITIONAL_KEYS = 1 << 9  # the block carries its dictionary
NEEDS_UPDATE_DICTIONARY = 1 << 10  # ... which replaces the one before it (always, in Native)


@dataclass(frozen=True)
class Coded:
    """A LowCardinality(String) column: per row (`codes`, int64) its place in `texts`, the column's distinct
    texts, sorted (an object array of str), so that codes order as their texts do."""

    codes: np.ndarray
    texts: np.ndarray

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, rows: slice) -> Coded:
        return Coded(self.codes[rows], self.texts)


def numbers(body: bytes, columns: Mapping[str, npt.DTypeLike]) -> dict[str, np.ndarray | Coded]:
    """Each of `columns` (name -> numpy type, or TEXT; in the result's order) as one read-only array of
    its values in `body`, a Native result, arrays over the body's own bytes where it is one block; a TEXT
    column as a Coded."""
    wanted = {name: TEXT if is_text(kind) else np.dtype(kind) for name, kind in columns.items()}
    parts: dict[str, list] = {name: [] for name in wanted}
    view = memoryview(body)
    at, block = 0, 0
    while at < len(body):
        where = f"block {block} at byte {at}"
        count, at = _varint(view, at, where)
        rows, at = _varint(view, at, where)
        if count != len(wanted):
            raise NativeError(f"{where}: {count} columns, expected {len(wanted)} ({', '.join(wanted)})")
        for name, dtype in wanted.items():
            found, at = _text(view, at, where)
            kind, at = _text(view, at, where)
            if found != name or (kind != TEXT if dtype is TEXT else NUMERIC_TYPES.get(kind) != dtype):
                raise NativeError(f"{where}: column {found!r} of type {kind!r}, expected {name!r} of {dtype}")
            if dtype is TEXT:
                part, at = _coded_block(body, view, at, rows, f"{where}, column {name!r}")
            else:
                part, at = _fixed(body, at, rows, dtype, f"{where}: column {name!r}")
            parts[name].append(part)
        block += 1
    found = {
        name: _joined_codes(chunks) if wanted[name] is TEXT else _joined(chunks, wanted[name])
        for name, chunks in parts.items()
    }
    for column in found.values():
        (column.codes if isinstance(column, Coded) else column).flags.writeable = False
    return found


def is_text(kind: npt.DTypeLike) -> bool:
    """Whether a column's kind, as numbers() takes it, is TEXT."""
    return isinstance(kind, str) and kind == TEXT


def _fixed(body: bytes, at: int, rows: int, dtype: np.dtype, where: str) -> tuple[np.ndarray, int]:
    """`rows` values of `dtype` at `at`, over the body's bytes, and where they end."""
    size = rows * dtype.itemsize
    if at + size > len(body):
        raise NativeError(f"{where} has {len(body) - at} bytes of {size}")
    return np.frombuffer(body, dtype, rows, at), at + size


def _joined(chunks: list[np.ndarray], dtype: np.dtype) -> np.ndarray:
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks or [np.empty(0, dtype)])


def _coded_block(
    body: bytes, view: memoryview, at: int, rows: int, where: str
) -> tuple[tuple[np.ndarray, list[str]], int]:
    """A block's LowCardinality(String) column at `at`: its indexes, its dictionary, and where it ends."""
    version, at = _uint64(view, at, where)
    flags, at = _uint64(view, at, where)
    if version != KEYS_VERSION:
        raise NativeError(f"{where}: serialization version {version}, expected {KEYS_VERSION}")
    width = flags & 0xFF
    if width >= len(INDEX_WIDTHS) or flags & ~0xFF & ~(HAS_ADDITIONAL_KEYS | NEEDS_UPDATE_DICTIONARY):
        # a dictionary shared across blocks (bit 8) or any other flag: never written to Native
        raise NativeError(f"{where}: index type {flags:#x}, expected a width and a dictionary of its own")
    texts: list[str] = []
    if flags & HAS_ADDITIONAL_KEYS:
        keys, at = _uint64(view, at, where)
        if keys > len(view) - at:  # each text takes a byte at least
            raise NativeError(f"{where}: {keys} texts in {len(view) - at} bytes")
        for _ in range(keys):
            text, at = _text(view, at, where)
            texts.append(text)
    stated, at = _uint64(view, at, where)
    if stated != rows:
        raise NativeError(f"{where}: {stated} indexes in a block of {rows} rows")
    indexes, at = _fixed(body, at, rows, INDEX_WIDTHS[width], f"{where}: indexes")
    if rows and int(indexes.max()) >= len(texts):
        raise NativeError(f"{where}: index {int(indexes.max())} past a dictionary of {len(texts)}")
    return (indexes, texts), at


def _joined_codes(blocks: list[tuple[np.ndarray, list[str]]]) -> Coded:
    """The blocks' indexes as codes into the texts they point to, distinct and sorted, of all blocks (a
    dictionary may hold texts no row has: ClickHouse's default, "", comes first in each)."""
    texts = np.array([text for _, block_texts in blocks for text in block_texts], dtype=object)
    places, offset = [np.empty(0, np.int64)], 0  # per row: its text's place in `texts`
    for indexes, block_texts in blocks:
        places.append(indexes.astype(np.int64) + offset)
        offset += len(block_texts)
    at = np.concatenate(places)
    used = np.flatnonzero(np.bincount(at, minlength=len(texts)))
    distinct, codes = np.unique(texts[used], return_inverse=True)
    place = np.zeros(len(texts), np.int64)
    place[used] = codes
    return Coded(place[at], distinct)


def _uint64(view: memoryview, at: int, where: str) -> tuple[int, int]:
    """The little-endian UInt64 at `at`, and where it ends."""
    if at + 8 > len(view):
        raise NativeError(f"{where}: the body ends inside a UInt64")
    return int.from_bytes(view[at : at + 8], "little"), at + 8


def _varint(view: memoryview, at: int, where: str) -> tuple[int, int]:
    """The unsigned LEB128 number at `at`, and where it ends."""
    number = 0
    for shift in range(0, 7 * MAX_VARINT_BYTES, 7):
        if at >= len(view):
            raise NativeError(f"{where}: the body ends inside a number")
        byte = view[at]
        at += 1
        number |= (byte & 0x7F) << shift
        if byte < 0x80:
            return number, at
    raise NativeError(f"{where}: a number longer than {MAX_VARINT_BYTES} bytes")


def _text(view: memoryview, at: int, where: str) -> tuple[str, int]:
    """The length-prefixed UTF-8 text at `at` (a column's name or type), and where it ends."""
    length, at = _varint(view, at, where)
    if at + length > len(view):
        raise NativeError(f"{where}: the body ends inside a name of {length} bytes")
    try:
        return bytes(view[at : at + length]).decode(), at + length
    except UnicodeDecodeError as error:
        raise NativeError(f"{where}: a name that is not UTF-8 ({error.reason})") from None

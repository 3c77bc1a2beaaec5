"""Numeric columns out of ClickHouse's Native format, zero-copy: what a read of many numbers (the
detectors' tape) takes instead of Arrow, which chDB writes at more CPU and pandas converts once more.

    columns = numbers(body, {"series_id": np.uint64, "t": np.int64, "value": np.float64})

Native, as ClickHouse writes it over HTTP and as chDB returns it: blocks, each the count of its columns
and of its rows (unsigned LEB128 varints), then per column its name, its type (a varint length and the
text) and its values, one after another, little-endian, for the fixed-width types here. An empty result
is no block at all. Anything else (another type, another column, a block cut short) is an error naming
what and where: the body is the store's answer, read as untrusted bytes all the same.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

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


class NativeError(ValueError):
    """A Native body that is not the numeric columns asked for; the message says what and where."""


def numbers(body: bytes, columns: Mapping[str, npt.DTypeLike]) -> dict[str, np.ndarray]:
    """Each of `columns` (name -> numpy type, in the result's order) as one read-only array of its
    values in `body`, a Native result; arrays over the body's own bytes where it is one block."""
    wanted = {name: np.dtype(dtype) for name, dtype in columns.items()}
    parts: dict[str, list[np.ndarray]] = {name: [] for name in wanted}
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
            if found != name or NUMERIC_TYPES.get(kind) != dtype:
                raise NativeError(f"{where}: column {found!r} of type {kind!r}, expected {name!r} of {dtype}")
            size = rows * dtype.itemsize
            if at + size > len(body):
                raise NativeError(f"{where}: column {name!r} has {len(body) - at} bytes of {size}")
            parts[name].append(np.frombuffer(body, dtype, rows, at))
            at += size
        block += 1
    found = {
        name: chunks[0] if len(chunks) == 1 else np.concatenate(chunks or [np.empty(0, wanted[name])])
        for name, chunks in parts.items()
    }
    for column in found.values():
        column.flags.writeable = False
    return found


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

"""Read and parse sysfs attribute files, one value per file, with errors that name the file.

Paths are plain strings and files are read with os.open/os.read: a scrape reads hundreds of these tiny
files, and pathlib and buffered text IO would cost more than the reads themselves.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Collection, Iterable
from typing import TypeVar

from collectors.base import ReadErrors
from collectors.errors import SysfsError

T = TypeVar("T")
Parser = Callable[[str, str], T | None]  # (text, path) -> value; raises SysfsError naming path

# The kernel answers a read with these when the attribute has no value right now (the speed of a link
# that is down, the netdev of an InfiniBand GID): no sample, but no bad input either.
_NO_VALUE_ERRNOS = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.ENODATA})
_PAGE = 4096  # a sysfs attribute is at most one page


def read_text(path: str, *, missing_ok: bool = False) -> str | None:
    """The file's text without surrounding whitespace; None when the kernel has no value for it.

    A missing file is an error (callers read what they listed, so it vanished) unless `missing_ok`.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.read(fd, _PAGE)
        finally:
            os.close(fd)
    except FileNotFoundError:
        _raise_unless_absent(path, missing_ok)
        return None
    except OSError as exc:
        if exc.errno in _NO_VALUE_ERRNOS:
            return None
        raise SysfsError(f"{path}: cannot read: {exc.strerror}") from exc
    return data.decode(errors="replace").strip()


def list_dir(path: str, *, missing_ok: bool = False, skip_files: bool = False) -> list[str] | None:
    """The sorted entry names of a directory; None when it is missing and `missing_ok` (absent hardware).

    `skip_files` leaves out regular files, such as bonding_masters among the interfaces in class/net.
    """
    try:
        if skip_files:
            with os.scandir(path) as entries:
                return sorted(entry.name for entry in entries if not entry.is_file(follow_symlinks=False))
        return sorted(os.listdir(path))  # without DirEntry objects: several times faster
    except FileNotFoundError:
        _raise_unless_absent(path, missing_ok)
        return None
    except OSError as exc:
        raise SysfsError(f"{path}: cannot list: {exc.strerror}") from exc


def _raise_unless_absent(path: str, missing_ok: bool) -> None:
    """Accept a missing path if allowed; a dangling link never is: what it named has vanished."""
    if os.path.lexists(path):
        raise SysfsError(f"{path}: dangling link (device removed?)")
    if not missing_ok:
        raise SysfsError(f"{path}: vanished (device removed?)")


def parse_uint(text: str, path: str) -> int:
    """An unsigned 64-bit integer, decimal or 0x-hex, as Go's strconv.ParseUint(text, 0, 64) reads it."""
    value = _parse_int(text, path)
    if not 0 <= value < 1 << 64:
        raise SysfsError(f"{path}: {text!r} is not an unsigned 64-bit integer")
    return value


def parse_int(text: str, path: str) -> int:
    """A signed 64-bit integer, decimal or 0x-hex, as Go's strconv.ParseInt(text, 0, 64) reads it."""
    value = _parse_int(text, path)
    if not -(1 << 63) <= value < 1 << 63:
        raise SysfsError(f"{path}: {text!r} is not a signed 64-bit integer")
    return value


def _parse_int(text: str, path: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise SysfsError(f"{path}: {text!r} is not an integer") from None


def read_texts(directory: str, files: Iterable[str], present: Collection[str]) -> list[str]:
    """The texts of `files` in `directory`, "" for those not `present` (listed) or without a value."""
    return [(read_text(f"{directory}/{file}") or "") if file in present else "" for file in files]


def read_sample(path: str, parse: Parser[T], errors: ReadErrors, sample: str) -> T | None:
    """Read and parse one value; on bad input report that `sample` was skipped and return None."""
    try:
        text = read_text(path)
        return None if text is None else parse(text, path)
    except SysfsError as exc:
        errors.report(sample, str(exc))
        return None

"""Read and parse sysfs attribute files, one value per file, with errors that name the file.

Paths are plain strings and files are read with os.open/os.read: a scrape reads hundreds of these tiny
files, and pathlib and buffered text IO would cost more than the reads themselves.

The tree may be hostile (`--sysfs-root` names any directory): a FIFO, socket or device node where an
attribute should be is refused without blocking, and text that becomes a label value goes through
`label_value` first.
"""

from __future__ import annotations

import errno
import os
import stat
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
# O_NONBLOCK: opening a FIFO would otherwise wait for a writer, and the scrape with it, forever
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
_FILE_KINDS = {
    stat.S_IFIFO: "fifo",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFDIR: "directory",
}

LABEL_VALUE_MAX_CHARS = 256
"""The longest label value taken from sysfs; the rest is cut off.

The longest real one is an interface alias (ifalias: at most 255 bytes, IFALIASZ); device names, board
ids and firmware versions are far shorter. A longer value is bad input, and a label of kilobytes would
make the hub refuse the whole scrape (its parser's max_label_length).
"""
# C0, DEL and C1 controls, and the two separators that str.splitlines also breaks lines at: dropped
_NOT_IN_LABELS = dict.fromkeys((*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029))


def label_value(text: str) -> str:
    """`text` (file contents or an entry name) fit to be a label value: no control characters, and at
    most LABEL_VALUE_MAX_CHARS. Real values pass unchanged; NUL, CR or ESC in a file must not reach
    the exposition, where they would make the hub (or a terminal reading it) choke."""
    if not text.isprintable():  # cheap test first: nearly every value is printable
        text = text.translate(_NOT_IN_LABELS)
    return text[:LABEL_VALUE_MAX_CHARS]


def read_text(path: str, *, missing_ok: bool = False) -> str | None:
    """The file's text without surrounding whitespace; None when the kernel has no value for it.

    A missing file is an error (callers read what they listed, so it vanished) unless `missing_ok`, and
    so is anything but a regular file: sysfs attributes are regular files, a FIFO or device is planted.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
        try:
            _require_regular(fd, path)
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


def read_regular_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """Up to `limit` + 1 bytes of the file at `path` (one past the limit tells the caller it is too long).
    Opened without blocking and refused unless a regular file (SysfsError): a FIFO named where a file
    belongs would wait for a writer, and whoever reads it with it. OSError when it cannot be read."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        _require_regular(fd, str(path))
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(limit + 1)
    finally:
        os.close(fd)


def _require_regular(fd: int, path: str) -> None:
    """Refuse an open file that is not a regular file, before reading it could block or mislead."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        kind = _FILE_KINDS.get(stat.S_IFMT(mode), "special file")
        raise SysfsError(f"{path}: not a regular file ({kind})")


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


def read_labels(directory: str, files: Iterable[str], present: Collection[str]) -> list[str]:
    """The texts of `files` in `directory` as label values, "" for those not `present` (listed) or
    without a value."""
    return [label_value(read_text(f"{directory}/{file}") or "") if file in present else "" for file in files]


def read_sample(path: str, parse: Parser[T], errors: ReadErrors, sample: str) -> T | None:
    """Read and parse one value; on bad input report that `sample` was skipped and return None."""
    try:
        text = read_text(path)
        return None if text is None else parse(text, path)
    except SysfsError as exc:
        errors.report(sample, str(exc))
        return None

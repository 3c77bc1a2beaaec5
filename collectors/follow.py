"""Log files followed like `tail -F`, for the collectors that read a log a bit further on each scrape.

Each read returns the lines completed since the last one, numbered from the first line of their file.
The follower notices when the path names another file (rotation), when the file got shorter
(truncation, copytruncate) and when its first bytes changed (rewritten in place to the same length or
longer), and then reads the file from its start again. Bytes that are not UTF-8 become U+FFFD, so a
corrupt stretch costs the lines it is on, never the read.
"""

from __future__ import annotations

import os
from typing import BinaryIO

MAX_LINE_BYTES = 64 << 10  # kept of a line: an endless unterminated line must not grow memory
HEAD_BYTES = 256  # the start of a file, compared on each read to notice a rewrite in place

Line = tuple[int, str]  # (line number in its file, from 1; the text without its newline)


class FollowedFile:
    """The file at `path`, read a bit further on each call to read_lines.

    With `finish_rotated` the file stays open between reads, so that once another file takes the path,
    the rest of the old one, its unterminated last line included, is returned before the new file's
    lines. That costs a descriptor per followed file. Without it each read opens the path afresh and the
    unread tail of a rotated file is lost, which suits a caller that sums up only the file there now.

    `read_limit` bounds the bytes one read takes, so a long backlog is caught up over several reads.
    After each read, `restarted` says whether it began the file at the path from its first byte (the
    first read, or after rotation, truncation or a rewrite): a caller summing up the file starts over.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        finish_rotated: bool = True,
        read_limit: int | None = None,
    ) -> None:
        self.name = os.fspath(path)
        self.restarted = False
        self._path = path
        self._finish_rotated = finish_rotated
        self._read_limit = read_limit
        self._file: BinaryIO | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file being read
        self._offset = 0
        self._head = b""
        self._pending = b""  # the unterminated last line, completed by a later write
        self._line_number = 0

    def read_lines(self) -> list[Line]:
        """The lines completed since the last read; an unterminated last line waits for its end.

        Raises OSError when the path cannot be read: FileNotFoundError when it names nothing and no
        earlier file is still open to read from.
        """
        self.restarted = False
        limit = self._read_limit
        finished: list[Line] = []
        if self._file is None:
            self._file = open(self._path, "rb")  # noqa: SIM115 -- closed below, or held with finish_rotated
        elif (successor := self._successor()) is not None:
            before = self._offset
            finished = self._read(limit)
            if limit is not None:
                limit -= self._offset - before
                if limit == 0:  # the rest of the old file comes first, on the next read
                    successor.close()
                    return finished
            finished += self._end_pending_line()
            self._file.close()
            self._file = successor
        try:
            self._start_over_if_replaced()
            return finished + self._read(limit)
        finally:
            if not self._finish_rotated:
                self.close()

    def close(self) -> None:
        """Let go of the open file, if any; the next read opens the path again and goes on where it was."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def _successor(self) -> BinaryIO | None:
        """The file the path names now, opened, when that is no longer the file being read."""
        assert self._file is not None
        try:
            successor = open(self._path, "rb")  # noqa: SIM115 -- handed to the caller
        except FileNotFoundError:
            return None  # rotated away, its successor not created yet: the old file may still grow
        if _identity(os.fstat(successor.fileno())) == _identity(os.fstat(self._file.fileno())):
            successor.close()
            return None
        return successor

    def _start_over_if_replaced(self) -> None:
        """Read from the start a file new to us, one cut shorter, or one whose first bytes changed."""
        assert self._file is not None
        info = os.fstat(self._file.fileno())
        if (
            _identity(info) != self._identity
            or info.st_size < self._offset
            or os.pread(self._file.fileno(), len(self._head), 0) != self._head
        ):
            self._identity = _identity(info)
            self._offset, self._head, self._pending, self._line_number = 0, b"", b"", 0
            self.restarted = True

    def _read(self, limit: int | None) -> list[Line]:
        assert self._file is not None
        self._file.seek(self._offset)
        data = self._file.read(-1 if limit is None else limit)
        self._offset += len(data)
        if len(self._head) < HEAD_BYTES:
            self._head = (self._head + data)[:HEAD_BYTES]
        *complete, rest = (self._pending + data).split(b"\n")
        self._pending = rest[:MAX_LINE_BYTES]
        return self._numbered(complete)

    def _end_pending_line(self) -> list[Line]:
        """The unterminated last line of a file that will not grow any more, as a line of its own."""
        rest, self._pending = self._pending, b""
        return self._numbered([rest]) if rest else []

    def _numbered(self, lines: list[bytes]) -> list[Line]:
        first = self._line_number + 1
        self._line_number += len(lines)
        return [
            (number, line[:MAX_LINE_BYTES].decode(errors="replace"))
            for number, line in enumerate(lines, first)
        ]


def _identity(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino

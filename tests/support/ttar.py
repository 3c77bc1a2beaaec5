"""Extract ttar archives (the plain-text tree format of prometheus/node_exporter and procfs fixtures).

The format is described in ../shared/fixtures/PROVENANCE.md. The archive is read as bytes because
fixture files contain NUL bytes and carriage returns that must survive unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path


class TtarError(ValueError):
    """The archive does not follow the ttar format; the message names the line."""


def _decode_line(raw: bytes) -> bytes:
    """Turn one content line back into file bytes (without deciding on the final newline)."""
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw.startswith(b"\\NULLBYTE", i):
            out += b"NULLBYTE"
            i += len(b"\\NULLBYTE")
        elif raw.startswith(b"\\EOF", i):
            out += b"EOF"
            i += len(b"\\EOF")
        elif raw.startswith(b"NULLBYTE", i):
            out += b"\x00"
            i += len(b"NULLBYTE")
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def _content(line: bytes) -> bytes:
    if line.endswith(b"EOF") and not line.endswith(b"\\EOF"):
        return _decode_line(line[: -len(b"EOF")])
    return _decode_line(line) + b"\n"


def extract(archive: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Extract `archive` below `dest` and return `dest`."""
    dest = Path(dest)
    lines = Path(archive).read_bytes().split(b"\n")
    i = 0

    def field(prefix: bytes) -> bytes:
        if i >= len(lines) or not lines[i].startswith(prefix):
            raise TtarError(f"{archive}:{i + 1}: expected {prefix.decode()!r}")
        return lines[i][len(prefix) :]

    while i < len(lines):
        line = lines[i]
        if not line or line.startswith(b"#"):
            i += 1
            continue
        if line.startswith(b"Directory: "):
            (dest / line[len(b"Directory: ") :].decode()).mkdir(parents=True, exist_ok=True)
            i += 2  # Mode line
            continue
        if not line.startswith(b"Path: "):
            raise TtarError(f"{archive}:{i + 1}: unexpected line {line[:60]!r}")
        path = dest / line[len(b"Path: ") :].decode()
        path.parent.mkdir(parents=True, exist_ok=True)
        i += 1
        if lines[i].startswith(b"SymlinkTo: "):
            os.symlink(field(b"SymlinkTo: ").decode(), path)
            i += 1
            continue
        count = int(field(b"Lines: "))
        i += 1
        path.write_bytes(b"".join(_content(raw) for raw in lines[i : i + count]))
        i += count
        os.chmod(path, int(field(b"Mode: "), 8))
        i += 1
    return dest

"""Text from outside (request paths, sysfs paths, messages quoting them) made fit for one log line.

A client's `%0A` in a path, or a file named with a newline in a hostile /sys tree, must not forge a log
line: C0, DEL and C1 control characters become \\xNN, and the backslash is doubled so that a literal
"\\x0a" in the text cannot pass for an escape.
"""

from __future__ import annotations

_ESCAPES = str.maketrans({c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {ord("\\"): "\\\\"})


def printable(text: str) -> str:
    """`text` with control characters escaped and backslashes doubled."""
    return text.translate(_ESCAPES)

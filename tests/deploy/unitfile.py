"""A small reader of systemd unit files, for tests that check what a unit sets.

configparser keeps one value per key, but a unit may repeat a directive (SystemCallFilter= twice adds
both lists), so this keeps every value, in order: {section: {directive: [value, ...]}}.
"""

from __future__ import annotations

from pathlib import Path

Unit = dict[str, dict[str, list[str]]]


class UnitSyntaxError(ValueError):
    """A line of a unit file that is neither a section, a directive, a comment nor blank."""


def read_unit(path: Path) -> Unit:
    """The unit's directives by section; continuation lines (a trailing backslash) are joined."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    pending = ""
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        if not sep or section is None or not key.strip():
            raise UnitSyntaxError(f"{path}:{number}: expected [Section] or Directive=value, got {raw!r}")
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def last_value(unit: Unit, section: str, directive: str) -> str | None:
    """What systemd applies for a single-valued directive: its last assignment, None if unset."""
    values = unit.get(section, {}).get(directive)
    return values[-1] if values else None

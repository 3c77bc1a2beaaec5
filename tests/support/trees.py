"""Ways to break a copied /sys tree in bad-input tests, as failing hardware and drivers do."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path


def as_directory(path: Path) -> None:
    """A file that is now a directory: reading it fails with EISDIR, even as root."""
    path.unlink()
    path.mkdir()


def as_dangling_link(path: Path) -> None:
    """A file or directory that vanished behind its link, as when a device is unplugged mid-scrape."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.symlink_to("vanished")


def containing(text: str) -> Callable[[Path], None]:
    """A breaker that overwrites the file with `text`."""
    return lambda path: path.write_text(text + "\n")

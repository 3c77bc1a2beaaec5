"""Ways to break a copied /sys tree in bad-input tests, as failing hardware and drivers do."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


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


def assert_breaking_loses_only(
    scrape: Callable[[Path], tuple[dict, Any]],
    tree: Path,
    path: Path,
    breaks: Callable[[Path], None],
    lost: Callable[[dict], set],
    logged: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Break `path` inside `tree` and scrape `tree` again: exactly the `lost` samples are gone, one error
    is counted, one warning names the path and what was lost, and every other sample is unchanged."""
    pristine, _ = scrape(tree)
    breaks(path)
    samples, errors = scrape(tree)
    expected_lost = lost(pristine)
    assert expected_lost
    assert samples == {k: v for k, v in pristine.items() if k not in expected_lost}
    assert errors.count == 1
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert str(path) in record.getMessage()
    assert logged in record.getMessage()

"""Size on disk per role: a fresh virtual environment with `pip install fleetlens` (the exporter and the
step SDK) next to one per extra (`[hub]`, `[ui]`, `[all]`), from one wheel built in the same run.
Reported: each environment's size and package count, and its ratio to the base install.

    .venv/bin/python bench/install_size.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXTRAS = ("", "hub", "ui", "all")  # "" is the base install


def tree_bytes(root: Path) -> int:
    """Bytes of the regular files under `root` (links not followed), as `du --apparent-size` counts."""
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if not path.is_symlink():
                total += path.stat().st_size
    return total


def install(wheel: Path, extra: str, venv: Path) -> tuple[int, int]:
    """A fresh venv with the wheel (and `extra`); its size in bytes and its number of packages."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    requirement = f"{wheel}[{extra}]" if extra else str(wheel)
    subprocess.run([python, "-m", "pip", "install", "--quiet", requirement], check=True)
    listing = subprocess.run(
        [python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True
    )
    return tree_bytes(venv), len(json.loads(listing.stdout))


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="fleetlens-install-size-") as tmp:
        work = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(work), str(REPO)],
            check=True,
        )
        (wheel,) = work.glob("fleetlens-*.whl")
        sizes = {extra or "base": install(wheel, extra, work / (extra or "base")) for extra in EXTRAS}
    base = sizes["base"][0]
    for role, (size, count) in sizes.items():
        print(f"{role:5} {size / 1e6:8.0f} MB  {count:3d} packages  {size / base:5.1f}x the base install")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Exposition parsing: hub.expfmt next to prometheus_client's text parser, same bodies, same run.

Bodies: our exporter's (`fleetlens collect`, 8 simulated GPUs on procfs's /sys tree: mlx4, mlx5 and
hfi1 ports) and node_exporter's e2e-output.txt fixture. Ours is measured cold (a fresh parser: the
first scrape of a target, every line fully parsed) and warm (the same parser again: every later scrape,
series from the cache). Reported: samples/s on one core, ratios to prometheus_client, and the share of
one core that parsing a Vela-sized fleet (192 nodes, one of our bodies each per second) takes.

    .venv/bin/python bench/parser.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client.parser import text_string_to_metric_families

from hub.expfmt import ExpositionParser
from tests.conftest import fixtures_dir
from tests.support import ttar

VELA_NODES = 192


def exporter_body(sysfs: Path) -> str:
    """One `fleetlens collect` with 8 simulated GPUs on `sysfs`."""
    command = ["collect", "--gpu-backend", "sim", "--sysfs-root", str(sysfs), "--node", "vela-001"]
    done = subprocess.run([sys.executable, "-m", "fleetlens.cli", *command], capture_output=True, text=True)
    done.check_returncode()
    return done.stdout


def samples_per_second(parse: Callable[[], int], repeat: int) -> float:
    """Best of `repeat` timings, each at least 0.2 s of back-to-back parses."""
    samples = parse()
    timer = timeit.Timer(parse)
    number, _ = timer.autorange()
    best = min(timer.repeat(repeat=repeat, number=number))
    return samples * number / best


def prometheus_client_parse(text: str) -> Callable[[], int]:
    return lambda: sum(len(family.samples) for family in text_string_to_metric_families(text))


def cold_parse(text: str) -> Callable[[], int]:
    return lambda: len(ExpositionParser().parse(text))


def warm_parse(text: str) -> Callable[[], int]:
    parser = ExpositionParser()
    return lambda: len(parser.parse(text))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        sysfs = ttar.extract(fixtures_dir() / "procfs" / "fixtures.ttar", Path(tmp)) / "fixtures" / "sys"
        bodies = {
            "fleetlens exporter, 8 sim GPUs": exporter_body(sysfs),
            "node_exporter e2e-output.txt": (fixtures_dir() / "node_exporter" / "e2e-output.txt").read_text(),
        }

    print(f"samples/s on one core, best of {args.repeat}; ratio = ours / prometheus_client.parser")
    header = ("samples", "prom_client/s", "ours cold/s", "cold ratio", "ours warm/s", "warm ratio")
    print(f"{'body':32} " + " ".join(f"{column:>13}" for column in header))
    for name, text in bodies.items():
        peer = samples_per_second(prometheus_client_parse(text), args.repeat)
        cold = samples_per_second(cold_parse(text), args.repeat)
        warm = samples_per_second(warm_parse(text), args.repeat)
        count = len(ExpositionParser().parse(text))
        rates = f"{peer:13.0f} {cold:13.0f} {cold / peer:13.1f} {warm:13.0f} {warm / peer:13.1f}"
        print(f"{name:32} {count:13d} {rates}")
        if name.startswith("fleetlens"):
            fleet = VELA_NODES * count
            print(
                f"{'':32} Vela fleet at 1 s: {fleet} samples/s = {fleet / warm:.0%} of one core warm "
                f"(prometheus_client: {fleet / peer:.0%})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

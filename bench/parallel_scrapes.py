"""Parallel scrapes of one exporter: ours next to node_exporter, on the same large /sys tree, same run.

The tree holds `--interfaces` network interfaces (copies of node_exporter's fixture eth0, each with its
own name, address and index, on tmpfs). Each exporter serves it with its netclass collector alone;
`--parallel` clients scrape it at once, `--bursts` times. Reported per exporter: when the first and the
last answer of a burst came (the worst burst), how many answers were 200, how many distinct bodies a
burst got (scrapes that share a collection get one), and the CPU the exporter spent per burst.

    .venv/bin/python bench/parallel_scrapes.py [--interfaces 10000] [--parallel 20] [--bursts 3]

The fleetlens exporter is the code on PYTHONPATH (`fleetlens.cli`), so a checkout can be measured by
putting it first there.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.exporter import cpu_seconds
from tests.conftest import fixtures_dir
from tests.support import ttar
from tests.support.peers import fleetlens_exporter, free_port, peer

OTHER_COLLECTORS = ("gpu", "infiniband", "nccl_log", "xid")


def node_exporter_netclass(sysfs: Path) -> tuple[list[str], str]:
    """Debian's prometheus-node-exporter on `sysfs` with its netclass collector alone, and its URL."""
    port = free_port()
    command = [
        shutil.which("prometheus-node-exporter") or "prometheus-node-exporter",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--path.sysfs={sysfs}",
        "--collector.disable-defaults",
        "--collector.netclass",
    ]
    return command, f"http://127.0.0.1:{port}/metrics"


def build_tree(root: Path, interfaces: int) -> Path:
    """A sysfs root whose class/net holds `interfaces` copies of the fixture's eth0."""
    fixture = ttar.extract(fixtures_dir() / "node_exporter" / "sys.ttar", root / "fixture") / "sys"
    eth0 = {path.name: path.read_text() for path in (fixture / "class" / "net" / "eth0").iterdir()}
    net = root / "sys" / "class" / "net"
    for index in range(interfaces):
        device = net / f"bench{index}"
        device.mkdir(parents=True)
        files = {
            **eth0,
            "address": f"02:00:{index >> 16 & 255:02x}:{index >> 8 & 255:02x}:{index & 255:02x}:01\n",
            "ifindex": f"{index + 2}\n",
            "iflink": f"{index + 2}\n",
        }
        for name, text in files.items():
            (device / name).write_text(text)
    shutil.rmtree(root / "fixture")
    return root / "sys"


@dataclass
class Burst:
    first_s: float
    last_s: float
    ok: int
    bodies: int
    cpu_s: float


def fetch(url: str) -> tuple[int, bytes, float]:
    """Status, body and when the answer was complete (time.monotonic)."""
    try:
        with urllib.request.urlopen(url, timeout=600) as response:
            return response.status, response.read(), time.monotonic()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), time.monotonic()


def burst(url: str, pid: int, parallel: int) -> Burst:
    """`parallel` scrapes sent at once; when each was answered, counted from the burst's start."""
    cpu0 = cpu_seconds(pid)
    with ThreadPoolExecutor(parallel) as pool:
        start = time.monotonic()
        answers = list(pool.map(fetch, [url] * parallel))
    done = sorted(at - start for _, _, at in answers)
    ok = [body for status, body, _ in answers if status == 200]
    return Burst(done[0], done[-1], len(ok), len(set(ok)), cpu_seconds(pid) - cpu0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interfaces", type=int, default=10_000)
    parser.add_argument("--parallel", type=int, default=20)
    parser.add_argument("--bursts", type=int, default=3)
    args = parser.parse_args()
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        sysfs = build_tree(Path(tmp), args.interfaces)
        disabled = [flag for name in OTHER_COLLECTORS for flag in ("--disable-collector", name)]
        contenders = {
            "node_exporter (netclass)": node_exporter_netclass(sysfs),
            "fleetlens (netclass)": fleetlens_exporter(
                "--sysfs-root", str(sysfs), "--gpu-backend", "none", "--node", "bench", *disabled
            ),
        }
        results: dict[str, list[Burst]] = {}
        for name, (command, url) in contenders.items():
            with peer(command, url.removesuffix("metrics")) as process:  # ready: its landing page
                fetch(url)  # the first scrape (imports, first reads) is not the burst's
                results[name] = [burst(url, process.pid, args.parallel) for _ in range(args.bursts)]

    print(
        f"{args.parallel} scrapes at once, {args.bursts} bursts, {args.interfaces} interfaces "
        f"(tmpfs); the worst burst of each exporter"
    )
    columns = ("first s", "last s", "answers 200", "bodies", "CPU s/burst", "last vs peer")
    print(f"{'exporter':26} " + " ".join(f"{c:>12}" for c in columns))
    peer_worst = max(results["node_exporter (netclass)"], key=lambda b: b.last_s)
    for name, bursts in results.items():
        worst = max(bursts, key=lambda b: b.last_s)
        print(
            f"{name:26} {worst.first_s:12.2f} {worst.last_s:12.2f} {worst.ok:12d} {worst.bodies:12d} "
            f"{worst.cpu_s:12.2f} {worst.last_s / peer_worst.last_s:11.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

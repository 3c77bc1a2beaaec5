"""Does a hostile read cost ingest anything? A hub scraping a simulated fleet every second and taking step
records, measured over a quiet window (its peer: the same hub, the same load, no attack), then over a
window of the same length while the read attacks of issue 37 run through its query API again and again:
one huge value (range(1e8)), a huge aggregate state (groupArray of 8e7 numbers), four big values at once
(range(1.5e7)), and a client holding its query slots with long queries while a second client asks
SELECT 1 and the first asks a third query.

Per window: scrape intervals lost (each target should have one stored scrape per tick) and the longest
gap, the hub's RSS growth (its peak, sampled and VmHWM, over its RSS at the window's start), step POST
latency (p50, p99, max) and the hub's CPU; then what each attack got and how long it took, and the
goal (0 intervals lost, RSS growth <= 1 GiB, step POST p99 < 1 s). `--hub-code DIR` runs the hub from
another checkout (e.g. the code before a change, from `git archive`; that code may not know every
setting this bench passes), so both can be measured on the same machine in one sitting.

    .venv/bin/python bench/query_vs_ingest.py [--nodes 16] [--seconds 60] [--query-seconds 10]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analytics.store import Store
from bench.exporter import cpu_seconds
from sim.fleet import SimFleet
from tests.support.peers import free_port, stop, wait_http
from tests.support.queryattacks import (
    BIG_VALUE,
    CONCURRENT_BIG_VALUES,
    HUGE_STATE,
    HUGE_VALUE,
    LONG_QUERY,
)

INTERVAL_S = 1.0
STEP_EVERY_S = 0.2  # a step POST this often, as a training job's ranks would send them
RSS_EVERY_S = 0.05
ATTACKER, BYSTANDER, WRITER = "attacker-token", "bystander-token", "writer-token"
MiB = 1 << 20


@dataclass
class Window:
    """What one window measured."""

    name: str
    start: float = 0.0
    end: float = 0.0
    rss_start: int = 0
    rss_peak: int = 0
    hwm_start: int = 0
    hwm_end: int = 0
    cpu_s: float = 0.0
    step_latencies: list[float] = field(default_factory=list)
    step_failures: int = 0
    attacks: dict[str, list[tuple[int, float, str]]] = field(default_factory=dict)

    @property
    def rss_growth(self) -> int:
        return max(self.rss_peak, self.hwm_end if self.hwm_end > self.hwm_start else 0) - self.rss_start


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid`, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        return {
            line.split(":")[0]: int(line.split()[1]) * 1024
            for line in status
            if line.startswith(("VmRSS:", "VmHWM:"))
        }


def ask(url: str, sql: str, token: str) -> tuple[int, float, str]:
    """(status, seconds, the error or the rows, cut short) of one query."""
    body = json.dumps({"sql": sql}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url + "/api/v1/sql", data=body, headers=headers, method="POST")
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            answer = response.read()
            return response.status, time.monotonic() - started, answer[:80].decode(errors="replace")
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        with_retry = f" (Retry-After {error.headers['Retry-After']})" if error.code == 429 else ""
        return error.code, time.monotonic() - started, text[:160] + with_retry


def post_steps(url: str, step: int) -> None:
    lines = [
        {
            "ts": time.time(),
            "job": "bench",
            "rank": rank,
            "node": f"rank-{rank}",
            "step": step,
            "duration_s": 1,
        }
        for rank in range(8)
    ]
    body = "\n".join(json.dumps(line) for line in lines).encode() + b"\n"
    headers = {"Content-Type": "application/x-ndjson", "Authorization": f"Bearer {WRITER}"}
    request = urllib.request.Request(url + "/api/v1/steps", data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def in_parallel(*calls: Callable[[], None]) -> None:
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def attack_round(url: str, noted: Callable[[str, tuple[int, float, str]], None]) -> None:
    """The issue's attacks, one after another: each noted under its name with its outcome."""
    noted("range(1e8)", ask(url, HUGE_VALUE, ATTACKER))
    noted("groupArray of 8e7", ask(url, HUGE_STATE, ATTACKER))
    in_parallel(*[lambda: noted("4 x range(1.5e7)", ask(url, BIG_VALUE, ATTACKER))] * CONCURRENT_BIG_VALUES)

    def hold() -> None:
        noted("slot holder's long query", ask(url, LONG_QUERY, ATTACKER))

    def meanwhile() -> None:
        time.sleep(1.0)  # the holder's two queries hold their slots by now
        in_parallel(
            lambda: noted("holder's third query", ask(url, "SELECT 1", ATTACKER)),
            lambda: noted("another client's SELECT 1", ask(url, "SELECT 1", BYSTANDER)),
        )

    in_parallel(hold, hold, meanwhile)


def measure(window: Window, pid: int, url: str, seconds: float, attack: bool) -> None:
    """Run one window of `seconds`: steps posted and memory sampled throughout, attacks if `attack`."""
    stopping = threading.Event()
    lock = threading.Lock()

    def noted(name: str, outcome: tuple[int, float, str]) -> None:
        with lock:
            window.attacks.setdefault(name, []).append(outcome)

    def steps() -> None:
        for step in itertools.count():
            started = time.monotonic()
            try:
                post_steps(url, step)
                window.step_latencies.append(time.monotonic() - started)
            except OSError:
                window.step_failures += 1
            if stopping.wait(max(0.0, STEP_EVERY_S - (time.monotonic() - started))):
                return

    def sample_rss() -> None:
        while not stopping.wait(RSS_EVERY_S):
            window.rss_peak = max(window.rss_peak, memory(pid)["VmRSS"])

    def attacks() -> None:
        while not stopping.is_set():
            attack_round(url, noted)

    start = memory(pid)
    window.rss_start, window.rss_peak, window.hwm_start = start["VmRSS"], start["VmRSS"], start["VmHWM"]
    cpu0, window.start = cpu_seconds(pid), time.time()
    threads = [threading.Thread(target=run) for run in (steps, sample_rss, *([attacks] if attack else []))]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    window.end = time.time()
    stopping.set()
    for thread in threads:
        thread.join()  # an attack round under way finishes: its queries end by the hub's time limit
    window.cpu_s = cpu_seconds(pid) - cpu0
    window.hwm_end = memory(pid)["VmHWM"]


def lost_intervals(store_dir: Path, start: float, end: float) -> tuple[int, int, float]:
    """Over [start, end): ticks expected of all targets, ticks with no stored scrape, longest gap (s)."""
    with Store.open(f"chdb://{store_dir}") as store:
        rows = store.query(
            "SELECT target, toUnixTimestamp64Milli(ts) / 1000 FROM targets WHERE up ORDER BY target, ts",
            max_rows=1_000_000,
        ).rows
    per_target: dict[str, list[float]] = {}
    for target, ts in rows:
        per_target.setdefault(target, [])
        if start <= ts < end:
            per_target[target].append(ts)
    expected = int((end - start) // INTERVAL_S)
    missing, longest = 0, 0.0
    for stamps in per_target.values():
        missing += expected - len({int(ts // INTERVAL_S) for ts in stamps})
        longest = max(longest, *(b - a for a, b in itertools.pairwise([start, *stamps, end])))
    return expected * len(per_target), missing, longest


def percentile(values: list[float], share: float) -> float:
    return statistics.quantiles(values, n=100)[int(share * 100) - 1] if len(values) > 1 else float("nan")


def report(windows: list[Window], lost: list[tuple[int, int, float]], args: argparse.Namespace) -> None:
    quiet, attacked = windows
    print(
        f"hub from {args.hub_code or 'this checkout'}: {args.nodes} simulated nodes scraped every "
        f"{INTERVAL_S:g} s, 8 step records posted every {STEP_EVERY_S:g} s, queries of at most "
        f"{args.query_seconds:g} s; two windows of {args.seconds:g} s; {os.cpu_count()} cores, load "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} (1, 5, 15 min) at the end"
    )
    rows = [
        ("scrape intervals lost", *(f"{m} of {e}" for e, m, _ in lost)),
        ("longest scrape gap (s)", *(f"{gap:.1f}" for _, _, gap in lost)),
        ("hub RSS growth (MiB)", *(f"{w.rss_growth / MiB:.0f}" for w in windows)),
        ("hub RSS at the start (MiB)", *(f"{w.rss_start / MiB:.0f}" for w in windows)),
        *(
            (
                f"step POST {name} (ms)",
                *(f"{percentile(w.step_latencies, share) * 1000:.0f}" for w in windows),
            )
            for name, share in (("p50", 0.5), ("p99", 0.99))
        ),
        ("step POST max (ms)", *(f"{max(w.step_latencies, default=0) * 1000:.0f}" for w in windows)),
        ("step POSTs (failed)", *(f"{len(w.step_latencies)} ({w.step_failures})" for w in windows)),
        ("hub CPU (s)", *(f"{w.cpu_s:.1f}" for w in windows)),
    ]
    print(f"{'':28}{'quiet (peer)':>16}{'attacked':>16}")
    for name, *values in rows:
        print(f"{name:28}{values[0]:>16}{values[1]:>16}")
    ratio = percentile(attacked.step_latencies, 0.99) / percentile(quiet.step_latencies, 0.99)
    print(f"step POST p99, attacked / quiet: {ratio:.2f}")
    print("the attacks (status x count, the slowest answer, what the last one said):")
    for name, outcomes in attacked.attacks.items():
        statuses = ", ".join(
            f"{status} x {sum(s == status for s, _, _ in outcomes)}"
            for status in sorted({s for s, _, _ in outcomes})
        )
        slowest = max(seconds for _, seconds, _ in outcomes)
        print(f"  {name}: {statuses}; slowest {slowest:.2f} s; {outcomes[-1][2]!r}")
    goals = {
        "0 scrape intervals lost": lost[1][1] == 0,
        "hub RSS growth <= 1 GiB": attacked.rss_growth <= 1 << 30,
        "step POST p99 < 1 s": percentile(attacked.step_latencies, 0.99) < 1.0,
    }
    print(
        "goal (issue 37, item 3), while attacked: "
        + "; ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in goals.items())
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0, help="each window")
    parser.add_argument("--query-seconds", type=float, default=10.0, help="the hub's query_max_seconds")
    parser.add_argument("--settle-seconds", type=float, default=15.0, help="scraping before the first window")
    parser.add_argument("--hub-code", help="a checkout to run the hub from (default: this one)")
    args = parser.parse_args()

    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with (
        tempfile.TemporaryDirectory() as tmp,
        tempfile.TemporaryDirectory(dir=shm) as trees,
        ExitStack() as stack,
    ):
        work = Path(tmp)
        fleet = stack.enter_context(SimFleet(args.nodes, Path(trees), cache_s=5.0))
        fleet.write_file_sd(work / "targets.json")
        tokens = work / "tokens"
        tokens.write_text(f"read {ATTACKER}\nread {BYSTANDER}\nwrite {WRITER}\n")
        tokens.chmod(0o600)
        port = free_port()
        env = {**os.environ, "FLEETLENS_HUB_QUERY_MAX_SECONDS": f"{args.query_seconds:g}"}
        if args.hub_code:
            env["PYTHONPATH"] = args.hub_code
        hub_args = [
            *(sys.executable, "-m", "fleetlens.cli", "--log-level", "WARNING", "hub"),
            *("--store", f"chdb://{work}/store", "--targets", str(work / "targets.json")),
            *("--listen", f"127.0.0.1:{port}", "--interval-s", f"{INTERVAL_S:g}", "--detectors", "none"),
            *("--token-file", str(tokens)),
        ]
        log = stack.enter_context((work / "hub.log").open("w"))
        hub = subprocess.Popen(hub_args, cwd=work, env=env, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}"
        windows = [Window("quiet"), Window("attacked")]
        try:
            wait_http(f"{url}/healthz", hub, timeout=60)
            time.sleep(args.settle_seconds)
            for window in windows:
                measure(window, hub.pid, url, args.seconds, attack=window.name == "attacked")
            time.sleep(3 * INTERVAL_S)  # the window's last rounds on their way in
        finally:
            stop(hub, timeout_s=60)
        # the last rounds of a window may still be on their way in when it ends
        lost = [lost_intervals(work / "store", w.start, w.end - 2 * INTERVAL_S) for w in windows]
    report(windows, lost, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

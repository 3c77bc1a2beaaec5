"""Network checks a node runs against its peers: a ping mesh over one netdev and iperf3 pair bandwidth.

`ping_mesh` pings each peer `count` times (`ping -c N -i 0.2 -W 1 -I <dev>`) and gives one CheckResult
per peer (check "ping", target "peer:<name>"). `iperf3_pair` runs `iperf3 -c <peer> -J -t T` against a
server the caller started on the peer (`iperf3 -s -1 -J`) and judges the rate the server received
(end.sum_received.bits_per_second) against the rate the pair should reach.

Thresholds and why:
- ping, any loss FAILs: a RoCE fabric is lossless (PFC) and an idle one drops nothing, so a lost echo
  means a bad cable, optic or port, which is what IBM Autopilot's ping check fails a node on;
- ping, p99 RTT over `warn_p99_ms` (1 ms) WARNs: a few switch hops in one data centre answer in tens of
  microseconds even through ping's user-space timing, so a millisecond means queues building (congestion,
  PFC pause storms) or a slow path;
- iperf3, under `warn_fraction` (0.9) of the expected rate WARNs: TCP goodput on a healthy link reaches
  about 94% of line rate at MTU 1500, so an expected goodput leaves 10% for the noise of one run;
- iperf3, under `fail_fraction` (0.5) of it FAILs: half the rate is a link trained down (a 400G port at
  200G, lanes lost) or a path through a congested or wrong uplink, not noise.

Failure policy: the tool's output is hostile. Anything the parser does not know (a line of no known
shape, counts that disagree, a missing or non-numeric field) gives ERROR naming what was wrong, never
PASS; a missing binary, a timeout or a tool's own error gives ERROR saying so. Arguments that would put
an option where an address belongs raise CollectorConfigError. Commands run through a `Runner` (the seam
tests use to run them inside a network namespace). Standard library only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from collectors import commands
from collectors.checks.result import CheckResult, Status
from collectors.commands import Completed
from collectors.errors import CheckOutputError, CollectorConfigError, CommandError
from collectors.logtext import printable

PING_INTERVAL_S = 0.2  # the shortest interval iputils ping allows an unprivileged user
PING_REPLY_WAIT_S = 1
MAX_OUTPUT_CHARS = 1 << 20  # far above what either tool prints for one run
MAX_PARALLEL_PEERS = 16


Runner = Callable[[Sequence[str], float], Completed]
"""Runs argv with a timeout in seconds; raises a CommandError when the tool is missing, runs past the
timeout or prints past the bound."""


def run_local(argv: Sequence[str], timeout_s: float) -> Completed:
    """Run `argv` on this node (no shell), its output bounded by MAX_OUTPUT_CHARS bytes per stream."""
    return commands.run(argv, timeout_s, max_output_bytes=MAX_OUTPUT_CHARS)


@dataclass(frozen=True)
class PingStats:
    """One peer's pings: echoes sent, replies received, and each reply's RTT in ms (duplicates once)."""

    transmitted: int
    received: int
    rtts_ms: tuple[float, ...]

    @property
    def loss_pct(self) -> float:
        return 100.0 * (self.transmitted - self.received) / self.transmitted


_NUMBER = r"\d+(?:\.\d+)?"
_REPLY = re.compile(rf"\d+ bytes from \S+: icmp_seq=(\d+) ttl=\d+ time=({_NUMBER}) ms( \(DUP!\))?")
_SUMMARY = re.compile(
    rf"(\d+) packets transmitted, (\d+) received(?:, \+\d+ duplicates)?(?:, \+\d+ errors)?, "
    rf"({_NUMBER})% packet loss(?:, time \d+ms)?"
)
# Lines ping prints that carry nothing the verdict needs: the header, ICMP errors from a router or the
# kernel ("From 10.0.0.1 icmp_seq=3 Destination Host Unreachable"), the statistics banner and the RTT
# summary (recomputed here from the replies).
_OTHER_LINES = re.compile(
    r"PING \S+ \(\S+\)(?: from \S+ \S+:)? \d+\(\d+\) bytes of data\."
    r"|From \S+( \(\S+\))? icmp_seq=\d+ [A-Za-z ]+"
    r"|--- \S+ ping statistics ---"
    rf"|rtt min/avg/max/mdev = {_NUMBER}/{_NUMBER}/{_NUMBER}/{_NUMBER} ms(, .*)?"
    r"|"
)


def parse_ping(stdout: str, count: int) -> PingStats:
    """iputils ping's output for `count` echoes, every line of a known shape and the summary agreeing
    with the replies listed; raises CheckOutputError naming the first line or count that does not."""
    if len(stdout) > MAX_OUTPUT_CHARS:
        raise CheckOutputError(f"ping printed {len(stdout)} characters, over {MAX_OUTPUT_CHARS}")
    rtts: dict[int, float] = {}
    summaries: list[tuple[int, int, float]] = []
    for number, line in enumerate(stdout.splitlines(), start=1):
        if reply := _REPLY.fullmatch(line):
            seq, rtt = int(reply[1]), float(reply[2])
            if (reply[3] is None) == (seq in rtts):
                raise CheckOutputError(
                    f"line {number}: a DUP mark on a first reply, or a second reply without one"
                )
            rtts.setdefault(seq, rtt)
        elif summary := _SUMMARY.fullmatch(line):
            summaries.append((int(summary[1]), int(summary[2]), float(summary[3])))
        elif not _OTHER_LINES.fullmatch(line):
            raise CheckOutputError(f"line {number}: not a line ping prints: {printable(line[:200])!r}")
    if len(summaries) != 1:
        raise CheckOutputError(f"{len(summaries)} 'packets transmitted' summary lines, expected one")
    transmitted, received, _ = summaries[0]
    if transmitted != count:
        raise CheckOutputError(f"summary: {transmitted} packets transmitted, {count} asked for")
    if received != len(rtts) or received > transmitted:
        raise CheckOutputError(
            f"summary: {received} received of {transmitted} transmitted, {len(rtts)} replies listed"
        )
    return PingStats(transmitted, received, tuple(rtts.values()))


def percentile(values: Sequence[float], pct: float) -> float:
    """The nearest-rank `pct` percentile of non-empty `values` (p99 of ten is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


_NETDEV = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}")  # the kernel's IFNAMSIZ, no option lookalike
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")


def _checked_address(address: str) -> str:
    """`address` if it is an IP address or a host name, so it can never reach a tool as an option."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        if _HOSTNAME.fullmatch(address):
            return address
    raise CollectorConfigError(
        f"peer address {printable(address)!r} is neither an IP address nor a host name"
    )


def _checked_source(device: str) -> str:
    """`device` if it is an interface name or a source IP address (what `ping -I` takes)."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(device))
    if not _NETDEV.fullmatch(device):
        raise CollectorConfigError(f"ping source {printable(device)!r} is neither a netdev nor an IP address")
    return device


def _run(runner: Runner, argv: Sequence[str], timeout_s: float) -> Completed:
    """The command's result; raises CheckOutputError saying why it did not run (binary missing, timeout,
    too much output)."""
    try:
        return runner(argv, timeout_s)
    except CommandError as error:
        raise CheckOutputError(str(error)) from None


@dataclass(frozen=True)
class _Verdict:
    """Makes the CheckResult of one check on one target, timed from `started`, carrying `evidence`."""

    node: str
    check: str
    target: str
    evidence: dict[str, Any]
    started: float

    def __call__(
        self, status: Status, value: float | None = None, unit: str = "", threshold: float | None = None
    ) -> CheckResult:
        duration_s = time.time() - self.started
        return CheckResult(
            self.node,
            self.check,
            self.target,
            status,
            value,
            unit,
            threshold,
            self.started,
            duration_s,
            self.evidence,
        )

    def error(self, error: CheckOutputError) -> CheckResult:
        self.evidence["error"] = str(error)
        return self(Status.ERROR)


def ping_peer(
    node: str,
    name: str,
    address: str,
    device: str,
    count: int = 10,
    warn_p99_ms: float = 1.0,
    runner: Runner = run_local,
) -> CheckResult:
    """Ping `address` (peer `name`) `count` times over `device` (a netdev or a source address): FAIL on
    any loss (value: loss %), WARN when the p99 RTT is over `warn_p99_ms` (value: p99 ms), ERROR when
    ping could not judge."""
    if count < 1:
        raise CollectorConfigError(f"ping count {count} is below 1")
    argv = ["ping", "-n", "-c", str(count), "-i", str(PING_INTERVAL_S), "-W", str(PING_REPLY_WAIT_S)]
    argv += ["-I", _checked_source(device), _checked_address(address)]
    verdict = _Verdict(node, "ping", f"peer:{name}", {"address": address, "device": device}, time.time())
    try:
        ran = _run(runner, argv, count * PING_INTERVAL_S + PING_REPLY_WAIT_S + 10)
        # ping exits 1 when no reply came (a verdict), 2 on its own errors (no such device, unknown host)
        if ran.returncode not in (0, 1):
            raise CheckOutputError(f"ping exited {ran.returncode}: {printable(ran.stderr.strip()[:300])}")
        stats = parse_ping(ran.stdout, count)
    except CheckOutputError as error:
        return verdict.error(error)
    verdict.evidence.update(transmitted=stats.transmitted, received=stats.received, loss_pct=stats.loss_pct)
    if stats.received < stats.transmitted:
        return verdict(Status.FAIL, stats.loss_pct, "%", 0.0)
    p99 = percentile(stats.rtts_ms, 99)
    verdict.evidence.update(p50_ms=percentile(stats.rtts_ms, 50), p99_ms=p99, max_ms=max(stats.rtts_ms))
    return verdict(Status.WARN if p99 > warn_p99_ms else Status.PASS, p99, "ms", warn_p99_ms)


def ping_mesh(
    node: str,
    peers: Mapping[str, str],
    device: str,
    count: int = 10,
    warn_p99_ms: float = 1.0,
    runner: Runner = run_local,
) -> list[CheckResult]:
    """`ping_peer` for each peer name -> address in `peers`, up to MAX_PARALLEL_PEERS at once (so a
    large mesh takes about as long as one peer's pings), in the order of `peers`."""

    def one(peer: tuple[str, str]) -> CheckResult:
        return ping_peer(node, peer[0], peer[1], device, count, warn_p99_ms, runner)

    with ThreadPoolExecutor(max_workers=MAX_PARALLEL_PEERS) as pool:
        return list(pool.map(one, peers.items()))


def parse_iperf3(stdout: str) -> dict[str, float]:
    """From `iperf3 -c ... -J` output: bits_per_second and seconds of end.sum_received, and
    end.sum_sent.retransmits where present; raises CheckOutputError naming the field that is missing, not a
    number, or iperf3's own "error"."""
    if len(stdout) > MAX_OUTPUT_CHARS:
        raise CheckOutputError(f"iperf3 printed {len(stdout)} characters, over {MAX_OUTPUT_CHARS}")
    try:
        report = json.loads(stdout)
    except (json.JSONDecodeError, RecursionError) as error:
        raise CheckOutputError(f"iperf3 output is not JSON: {error}") from None
    if not isinstance(report, dict):
        raise CheckOutputError(f"iperf3 output is a JSON {type(report).__name__}, not an object")
    if "error" in report:
        raise CheckOutputError(f"iperf3: {printable(str(report['error'])[:300])}")
    received = _field(report, "end", "sum_received")
    measured = {name: _number(received, "end.sum_received", name) for name in ("bits_per_second", "seconds")}
    if measured["seconds"] <= 0:
        raise CheckOutputError(f"end.sum_received.seconds is {measured['seconds']}, not a duration")
    sent = report["end"].get("sum_sent")
    if isinstance(sent, dict) and "retransmits" in sent:
        measured["retransmits"] = _number(sent, "end.sum_sent", "retransmits")
    return measured


def _field(report: dict[str, Any], *path: str) -> dict[str, Any]:
    node: Any = report
    for depth, key in enumerate(path):
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise CheckOutputError(f"iperf3 JSON has no object {'.'.join(path[: depth + 1])}")
    return node


def _number(parent: dict[str, Any], where: str, key: str) -> float:
    value = parent.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise CheckOutputError(
            f"iperf3 JSON {where}.{key} is {printable(repr(value)[:80])}, not a number >= 0"
        )
    return float(value)


def iperf3_pair(
    node: str,
    name: str,
    address: str,
    expected_bps: float,
    seconds: int = 2,
    port: int = 5201,
    warn_fraction: float = 0.9,
    fail_fraction: float = 0.5,
    runner: Runner = run_local,
) -> CheckResult:
    """TCP bandwidth from this node to peer `name` at `address`, where the caller runs `iperf3 -s -1 -J`
    on `port`: the rate received (bit/s) judged against `expected_bps`, WARN under `warn_fraction` of
    it, FAIL under `fail_fraction`, ERROR when iperf3 could not judge (its own error included)."""
    if (
        not 0 < fail_fraction <= warn_fraction <= 1
        or expected_bps <= 0
        or seconds < 1
        or not 0 < port < 65536
    ):
        raise CollectorConfigError(
            f"iperf3 check needs 0 < fail {fail_fraction} <= warn {warn_fraction} <= 1, "
            f"expected rate {expected_bps} > 0, seconds {seconds} >= 1 and port {port} in 1..65535"
        )
    argv = ["iperf3", "-c", _checked_address(address), "-p", str(port), "-J", "-t", str(seconds)]
    warn_below, fail_below = warn_fraction * expected_bps, fail_fraction * expected_bps
    evidence = {"address": address, "port": port, "expected_bps": expected_bps}
    verdict = _Verdict(node, "iperf3", f"peer:{name}", evidence, time.time())
    try:
        ran = _run(runner, argv, seconds + 20)
        measured = parse_iperf3(ran.stdout)
        if ran.returncode != 0:
            raise CheckOutputError(f"iperf3 exited {ran.returncode}: {printable(ran.stderr.strip()[:300])}")
    except CheckOutputError as error:
        return verdict.error(error)
    evidence |= measured | {"warn_below_bps": warn_below, "fail_below_bps": fail_below}
    rate = measured["bits_per_second"]
    if rate < fail_below:
        return verdict(Status.FAIL, rate, "bit/s", fail_below)
    return verdict(Status.WARN if rate < warn_below else Status.PASS, rate, "bit/s", warn_below)

"""All-reduce bus bandwidth between nodes with torch.distributed, for the whole group and for every pair
alone, naming the pair or the node whose bandwidth is far below what healthy nodes reach.

Run one process per node as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK):
`python -m collectors.checks.allreduce --nodes vela-001,vela-002,...` (rank i is the i-th node); rank 0
prints one JSON line per CheckResult. NCCL on a GPU (the rank's LOCAL_RANK GPU, so one rank per node
measures the path between nodes through that GPU's NIC), gloo on CPUs. torch is optional: without it the
check reports ERROR, never PASS.

Bandwidth is nccl-tests' bus bandwidth for all-reduce (NVIDIA/nccl-tests doc/PERFORMANCE.md, "AllReduce"):
algbw = S / t and busbw = algbw * 2(n-1)/n, in GB/s of 1e9 bytes as nccl-tests prints them; it is
independent of the rank count, so a pair and the whole group read on one scale. t is the median of the
timed operations (each the slower of the ranks' own timings), so one descheduled operation does not read as
a slow link, while a slow link or node slows every operation.

Pairwise mode runs every pair (all n(n-1)/2, not a ring): each pair runs alone while the other ranks wait
at a barrier, so no pair shares links or CPUs with another. All pairs, because a bad node must be told from
a bad pair: a node is bad when every one of its n-1 pairs fails; a ring gives each node only two pairs, so
two bad links next to each other would read as a bad node. The cost is n(n-1)/2 short measurements, meant
for a drained node against a few known-good peers, not a whole fleet at once.

Thresholds: the reference is `expected_busbw` when the caller states one (the hardware's peak), else the
median over nodes of each node's best pair. Not the median of all pairs: with 4 nodes a bad node is in 3 of
the 6 pairs and would drag that median halfway down; a node's best pair is healthy unless the node itself
is bad, so the median of those holds while fewer than half the nodes are bad. A pair FAILs below
FAIL_FRACTION of the reference and WARNs below WARN_FRACTION; a node whose every pair (at least two) FAILs
is reported FAIL itself, unless every pair in the run failed: then the fault is shared (the fabric, the
expectation), and naming every node would point nowhere. Without `expected_busbw` two nodes cannot be
judged against each other (ERROR), and the whole-group figure is recorded (PASS, no threshold): pairs carry
the relative verdict.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from collectors.checks.result import CheckResult, Status
from collectors.errors import CollectorConfigError, TimingError

CHECK = "allreduce_busbw"
UNIT = "GB/s"
FAIL_FRACTION = 0.5  # half of what healthy nodes reach: far outside run-to-run noise, an unmistakable fault
WARN_FRACTION = 0.8  # a fifth below: worth a look, as Autopilot's WARN
WARMUP_OPERATIONS = 3  # connection set-up and first allocations, never timed
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


@dataclass(frozen=True)
class Measurement:
    """An all-reduce of `size_bytes` among `nodes`: the median seconds one operation took, a positive
    finite number (TimingError otherwise: a NaN would compare as no slower than the reference)."""

    nodes: tuple[str, ...]
    size_bytes: int
    seconds: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise TimingError(f"{self.target}: {self.seconds!r} seconds per operation is not a positive time")

    @property
    def busbw(self) -> float:
        return bus_bandwidth(self.size_bytes, self.seconds, len(self.nodes))

    @property
    def target(self) -> str:
        return "peer:" + "+".join(self.nodes)


def error_result(node: str, why: str, started: float, **evidence: Any) -> CheckResult:
    """The check's ERROR for the whole of `node`: it could not measure, for `why`."""
    duration_s = time.time() - started
    return CheckResult(
        node, CHECK, "", Status.ERROR, None, UNIT, None, started, duration_s, {"error": why, **evidence}
    )


def bus_bandwidth(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s: size / time * 2(n-1)/n."""
    return size_bytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def node_names(text: str) -> list[str]:
    """The comma-separated node names of `--nodes`: at least two, each a hostname-like name, none twice."""
    names = text.split(",")
    if len(names) < 2:
        raise CollectorConfigError(f"--nodes {text!r}: an all-reduce between nodes needs at least two")
    for position, name in enumerate(names, 1):
        if not _NODE_NAME.fullmatch(name):
            raise CollectorConfigError(f"--nodes: name {position} {name!r} is not a node name")
    if len(set(names)) != len(names):
        raise CollectorConfigError(f"--nodes: a node is named twice in {text!r}")
    return names


def judge(
    node: str,
    group: Measurement | None,
    pairs: Sequence[Measurement],
    started: float,
    duration_s: float,
    expected_busbw: float | None = None,
) -> list[CheckResult]:
    """CheckResults for the whole group, every pair, and every node all of whose pairs failed (module doc)."""

    def result(
        target: str, status: Status, value: float | None, threshold: float | None, **evidence: Any
    ) -> CheckResult:
        return CheckResult(node, CHECK, target, status, value, UNIT, threshold, started, duration_s, evidence)

    results = []
    if group is not None:
        results.append(_judged(result, group, expected_busbw, "stated expectation"))
    if not pairs:
        return results
    if expected_busbw is None and len({name for pair in pairs for name in pair.nodes}) < 3:
        why = "two nodes cannot be judged against each other: state the expected bus bandwidth"
        results += [result(pair.target, Status.ERROR, pair.busbw, None, error=why) for pair in pairs]
        return results
    reference, basis = (
        (expected_busbw, "stated expectation") if expected_busbw is not None else _median_of_best(pairs)
    )
    judged = [_judged(result, pair, reference, basis) for pair in pairs]
    by_node: dict[str, list[tuple[Measurement, CheckResult]]] = {}
    for pair, verdict in zip(pairs, judged, strict=True):
        for name in pair.nodes:
            by_node.setdefault(name, []).append((pair, verdict))
    if all(verdict.status is Status.FAIL for verdict in judged):
        return results + judged
    for name, verdicts in by_node.items():
        if len(verdicts) >= 2 and all(verdict.status is Status.FAIL for _, verdict in verdicts):
            failed = {pair.target: round(pair.busbw, 6) for pair, _ in verdicts}
            best = max(pair.busbw for pair, _ in verdicts)
            threshold = FAIL_FRACTION * reference
            judged.append(result(f"peer:{name}", Status.FAIL, best, threshold, every_pair_failed=failed))
    return results + judged


def _median_of_best(pairs: Sequence[Measurement]) -> tuple[float, str]:
    best: dict[str, float] = {}
    for pair in pairs:
        for name in pair.nodes:
            best[name] = max(best.get(name, 0.0), pair.busbw)
    return statistics.median(best.values()), "median over nodes of each node's best pair"


def _judged(
    result: Callable[..., CheckResult], measured: Measurement, reference: float | None, basis: str
) -> CheckResult:
    evidence = {
        "size_bytes": measured.size_bytes,
        "seconds_per_op": measured.seconds,
        "ranks": len(measured.nodes),
    }
    if reference is None:
        return result(measured.target, Status.PASS, measured.busbw, None, **evidence, judged="no reference")
    if measured.busbw < FAIL_FRACTION * reference:
        status = Status.FAIL
    elif measured.busbw < WARN_FRACTION * reference:
        status = Status.WARN
    else:
        status = Status.PASS
    evidence |= {"reference_busbw": reference, "reference": basis}
    return result(measured.target, status, measured.busbw, FAIL_FRACTION * reference, **evidence)


def measure(
    nodes: Sequence[str], size_bytes: int, iterations: int, delay_s: float = 0.0
) -> tuple[Measurement, list[Measurement]]:
    """In an initialized default process group of len(nodes) ranks: time the whole group, then every pair
    alone; every rank gets the same figures. `delay_s` is a test hook: this rank sleeps that long before each
    timed operation, as a node late to every collective would be."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    payload = torch.ones(size_bytes // 4, dtype=torch.float32, device=device)
    pairs = list(itertools.combinations(range(len(nodes)), 2))
    groups = [dist.new_group(list(pair)) for pair in pairs]  # every rank creates every group, in one order
    timings = torch.zeros(len(pairs) + 1, iterations, dtype=torch.float64, device=device)

    def time_operations(group: Any) -> list[float]:
        for _ in range(WARMUP_OPERATIONS):
            dist.all_reduce(payload, group=group)
        durations = []
        for _ in range(iterations):
            time.sleep(delay_s)
            start = time.perf_counter()
            dist.all_reduce(payload, group=group)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            durations.append(time.perf_counter() - start)
        return durations

    timings[0] = torch.tensor(time_operations(None), dtype=torch.float64)
    for row, (pair, group) in enumerate(zip(pairs, groups, strict=True), 1):
        if rank in pair:
            timings[row] = torch.tensor(time_operations(group), dtype=torch.float64)
        dist.barrier()
    dist.all_reduce(timings, op=dist.ReduceOp.MAX)  # per operation, the slower rank's timing
    medians = timings.median(dim=1).values.tolist()
    group_measurement = Measurement(tuple(nodes), payload.numel() * 4, medians[0])
    pair_measurements = [
        Measurement((nodes[a], nodes[b]), payload.numel() * 4, seconds)
        for (a, b), seconds in zip(pairs, medians[1:], strict=True)
    ]
    return group_measurement, pair_measurements


def run(
    nodes: Sequence[str],
    size_bytes: int = 8 << 20,
    iterations: int = 20,
    expected_busbw: float | None = None,
    timeout_s: float = 300.0,
    delay_s: float = 0.0,
) -> list[CheckResult]:
    """This rank's part of the check (torchrun's environment names the rank and the rendezvous); rank 0
    returns the results, other ranks []. A missing torch or a failed collective is an ERROR result; an
    environment that does not match `nodes` raises CollectorConfigError before anything runs."""
    if (world_size := _environment_integer("WORLD_SIZE")) != len(nodes):
        raise CollectorConfigError(f"--nodes names {len(nodes)} nodes but WORLD_SIZE is {world_size}")
    if (rank := _environment_integer("RANK")) >= world_size:
        raise CollectorConfigError(f"RANK {rank} is not below WORLD_SIZE {world_size}")
    started = time.time()

    def failure(why: str) -> list[CheckResult]:
        return [error_result(nodes[rank], why, started)]

    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        return failure(f"torch is not installed ({error}): install the torch extra to run {CHECK}")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    try:
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
        )
        group, pairs = measure(nodes, size_bytes, iterations, delay_s)
    except (RuntimeError, TimingError) as error:  # torch's DistError and a peer's timeout are RuntimeErrors
        return failure(f"{backend} rendezvous or all-reduce failed: {error}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank != 0:
        return []
    return judge(nodes[rank], group, pairs, started, time.time() - started, expected_busbw)


def run_local(
    node: str,
    ranks: int,
    size_bytes: int = 8 << 20,
    iterations: int = 20,
    timeout_s: float = 300.0,
) -> list[CheckResult]:
    """The pairwise check across one node's `ranks` GPUs, each a process of this module on loopback (rank
    i on GPU i, NCCL over NVLink or PCIe; gloo ranks on the CPU where torch sees no GPU), judged against
    each other. Rank 0's results,
    with `node` as the node and each rank as gpu:I; a rank that prints no result is an ERROR naming it."""
    started = time.time()
    names = [f"gpu{rank}" for rank in range(ranks)]
    if ranks < 2:
        why = f"an all-reduce between local GPUs needs at least two; this node has {ranks}"
        return [error_result(node, why, started)]
    with socket.socket() as probe:  # a free loopback port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    arguments = ["--nodes", ",".join(names), "--size-mb", str(size_bytes / (1 << 20))]
    arguments += ["--iterations", str(iterations), "--timeout-s", str(timeout_s)]
    environment = os.environ | {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(ranks),
    }
    environment.setdefault("GLOO_SOCKET_IFNAME", "lo")
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "collectors.checks.allreduce", *arguments],
            env=environment | {"RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(ranks)
    ]
    outputs = finish_ranks(processes, timeout_s + 60)
    try:
        results = [_local_result(node, json.loads(line)) for line in outputs[0][1].splitlines()]
    except (ValueError, KeyError, TypeError) as error:
        results = []
        problem = f"rank 0 printed what is not a result: {error}"
    else:
        problem = "rank 0 printed no result"
    if results:
        return results
    failed = {
        f"gpu{rank}": f"exit {status}: {err.strip()[-400:]}" for rank, (status, _, err) in enumerate(outputs)
    }
    return [error_result(node, problem, started, ranks=failed)]


def finish_ranks(
    processes: Sequence[subprocess.Popen[str]], timeout_s: float
) -> list[tuple[int | None, str, str]]:
    """Each process's exit status, stdout and stderr; those still running at the deadline are killed."""
    deadline = time.monotonic() + timeout_s
    outputs: list[tuple[str, str]] = []
    try:
        for process in processes:
            try:
                outputs.append(process.communicate(timeout=max(deadline - time.monotonic(), 1)))
            except subprocess.TimeoutExpired:
                process.kill()
                outputs.append(process.communicate())
    finally:
        for process in processes:  # a rank that died leaves the others waiting in a collective
            if process.poll() is None:
                process.kill()
                process.wait()
    return [(process.returncode, *output) for process, output in zip(processes, outputs, strict=True)]


def _local_result(node: str, printed: dict[str, Any]) -> CheckResult:
    """A result rank 0 printed, as this node's: "peer:gpu0+gpu3" becomes "gpu:0+3"."""
    target = printed["target"]
    if target:
        ranks = target.removeprefix("peer:").split("+")
        if not all(re.fullmatch(r"gpu[0-9]{1,4}", name) for name in ranks):
            raise ValueError(f"target {target!r} names no local GPU")
        target = "gpu:" + "+".join(name.removeprefix("gpu") for name in ranks)
    return CheckResult(**(printed | {"node": node, "target": target, "status": Status(printed["status"])}))


def _environment_integer(name: str) -> int:
    """torchrun's variable `name`: a whole number."""
    text = os.environ.get(name, "")
    if not (text.isascii() and text.isdigit()):
        raise CollectorConfigError(f"environment {name}={text!r}: not a whole number")
    return int(text)


def _positive(text: str) -> float:
    """An argparse type: a finite number above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not above zero")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Run this rank's part; rank 0 prints a JSON line per result. Exit 1 when any result is not PASS,
    2 on a bad argument or environment."""
    parser = argparse.ArgumentParser(prog="python -m collectors.checks.allreduce", description=__doc__)
    parser.add_argument("--nodes", required=True, help="node of rank 0,1,...; comma-separated")
    parser.add_argument("--size-mb", type=_positive, default=8.0, help="all-reduce size in MiB (default 8)")
    parser.add_argument("--iterations", type=int, default=20, help="timed operations per measurement")
    parser.add_argument("--expected-busbw", type=_positive, help="the hardware's bus bandwidth in GB/s")
    parser.add_argument("--timeout-s", type=_positive, default=300.0, help="how long to wait for a peer")
    parser.add_argument(
        "--inject-delay-s",
        type=_positive,
        help="test hook: this rank sleeps so long before each timed operation, a node made slow for real",
    )
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error(f"--iterations {args.iterations}: at least one timed operation")
    try:
        nodes = node_names(args.nodes)
        size_bytes = max(4, int(args.size_mb * (1 << 20)))
        results = run(
            nodes,
            size_bytes,
            args.iterations,
            args.expected_busbw,
            args.timeout_s,
            args.inject_delay_s or 0.0,
        )
    except CollectorConfigError as error:
        parser.error(str(error))
    for result in results:
        print(json.dumps(asdict(result)), flush=True)
    return int(any(result.status is not Status.PASS for result in results))


if __name__ == "__main__":
    sys.exit(main())

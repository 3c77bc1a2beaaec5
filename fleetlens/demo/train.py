"""A tiny data-parallel training job (PyTorch DDP, gloo, CPU) that reports its step times with StepTracker.

Run it under torchrun from the repository root (torchrun provides RANK, WORLD_SIZE, MASTER_ADDR, ...):

    python -m torch.distributed.run --nproc-per-node 4 -m tests.support.ddp_job \\
        --steps 40 --out-jsonl 'steps-{rank}.jsonl' --otlp-endpoint http://127.0.0.1:4318 \\
        --node-of-rank node-a,node-a,node-b,node-b --slow-rank 2 --slow-from-step 20 --slow-factor 4

Phases: "data" makes the batch, "compute" is forward, backward and the optimizer step, "comm" is the
gradient all-reduce. DDP normally overlaps its all-reduce with backward, which would hide comm inside
compute; this job runs backward under `no_sync()` and all-reduces the gradients itself as one flat
buffer: the same communication without the overlap, so that each phase is timed on its own. Because the
all-reduce waits for every rank, the healthy ranks' comm time includes waiting for a straggler.

--slow-rank makes that rank run forward and backward --slow-factor times per step from --slow-from-step
on, and between --slow-from-s and --slow-until-s seconds after it started (same batch, so the same
gradients): real extra compute, as a throttled or degraded GPU would cause.

--pace-s gives each step at least that long: the data phase waits for its turn as a rank waits on an
input pipeline, so that the job leaves CPU to the other processes of a demo on a small machine.
"""

from __future__ import annotations

import argparse
import itertools
import math
import socket
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from collectors.steps import StepTracker

WIDTH = 256
BATCH = 256
CLASSES = 10


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, help="steps to run (default: until the job is stopped)")
    parser.add_argument("--job", default="ddp-demo")
    parser.add_argument("--out-jsonl", help="step records file per rank; '{rank}' is replaced by the rank")
    parser.add_argument("--otlp-endpoint", help="OTLP/HTTP base URL; default: OTEL_EXPORTER_OTLP_ENDPOINT")
    parser.add_argument("--node-of-rank", help="comma-separated node names, one per rank; default: host name")
    parser.add_argument("--slow-rank", type=int, help="the rank that computes --slow-factor times as much")
    parser.add_argument("--slow-from-step", type=int, default=0)
    parser.add_argument("--slow-factor", type=int, default=4)
    parser.add_argument("--slow-from-s", type=float, default=0.0, help="slow only this long after the start")
    parser.add_argument("--slow-until-s", type=float, default=math.inf, help="... and until this long after")
    parser.add_argument("--pace-s", type=float, default=0.0, help="shortest step (waited in data)")
    args = parser.parse_args(argv)
    if args.out_jsonl and "{rank}" not in args.out_jsonl:
        parser.error("--out-jsonl must contain '{rank}': each rank writes its own file")
    if args.slow_factor < 1:
        parser.error("--slow-factor must be at least 1")
    return args


def node_of(rank: int, world_size: int, mapping: str | None) -> str:
    if mapping is None:
        return socket.gethostname()
    nodes = mapping.split(",")
    if len(nodes) != world_size:
        raise SystemExit(f"--node-of-rank names {len(nodes)} nodes for {world_size} ranks")
    return nodes[rank]


def all_reduce_mean(gradients: list[torch.Tensor], world_size: int) -> None:
    """Average gradients across ranks in one collective, as DDP's gradient buckets do."""
    flat = torch.cat([gradient.reshape(-1) for gradient in gradients])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for gradient in gradients:
        gradient.copy_(flat[offset : offset + gradient.numel()].view_as(gradient))
        offset += gradient.numel()


def train(args: argparse.Namespace) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(
            nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, CLASSES)
        )
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    batches = torch.Generator().manual_seed(rank)
    tracker = StepTracker(
        args.job,  # rank comes from torchrun's RANK
        node=node_of(rank, world_size, args.node_of_rank),
        dp_rank=rank,
        pp_stage=0,
        tp_rank=0,
        jsonl_path=args.out_jsonl.format(rank=rank) if args.out_jsonl else None,
        otlp_endpoint=args.otlp_endpoint,
    )
    started = time.monotonic()
    with tracker:
        for step in range(args.steps) if args.steps is not None else itertools.count():
            step_started = time.monotonic()
            elapsed = step_started - started
            slow = (
                rank == args.slow_rank
                and step >= args.slow_from_step
                and args.slow_from_s <= elapsed < args.slow_until_s
            )
            with tracker.step():
                with tracker.phase("data"):
                    inputs = torch.randn(BATCH, WIDTH, generator=batches)
                    labels = torch.randint(CLASSES, (BATCH,), generator=batches)
                    time.sleep(max(0.0, step_started + args.pace_s - time.monotonic()))
                with tracker.phase("compute"):
                    for _ in range(args.slow_factor if slow else 1):
                        optimizer.zero_grad()
                        with model.no_sync():
                            loss_fn(model(inputs), labels).backward()
                with tracker.phase("comm"):
                    all_reduce_mean([parameter.grad for parameter in model.parameters()], world_size)
                with tracker.phase("compute"):
                    optimizer.step()


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)  # ranks share the machine's cores
    dist.init_process_group("gloo")
    try:
        train(args)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""What the 1-minute rollup costs the hub: fed by a materialized view on every insert, or rolled up from
raw samples once a minute (Store.roll_up_minutes).

Rounds of a Vela-sized fleet (192 nodes x 656 samples, ~126k samples, one scrape each) go into a fresh
chDB store twice: one with the schema as it was before migration 7 (the view samples_1m_mv on samples),
one as it is. Reported: the CPU of this process (chDB runs in it, background merges included) per sample
inserted, the median of the rounds, in each store; then, in the store without the view, once its merges
are done, the CPU of rolling up each whole minute of those rounds (Store.roll_up_minutes), per sample
rolled. The view's cost per sample is the difference of the first two; the roll-up's is the third.

    .venv/bin/python bench/rollup.py [--nodes 192] [--minutes 2] [--interval-s 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import clickhouse_connect

from analytics.store import Store, schema
from analytics.store.records import ScrapeBatch
from analytics.store.schema import Layout
from bench.settle import settle
from sim.pipeline import scratch_dir

GPUS, PORTS = 8, 4
GPU_METRICS = 52  # per GPU; with PORT_METRICS per port, 656 samples per node as bench/ingest.py's fleet
PORT_METRICS = (656 - GPUS * GPU_METRICS) // PORTS


def node_round(node: int, at: float) -> ScrapeBatch:
    """One scrape of a node: every GPU's and port's series, values that move from scrape to scrape."""
    names, labels = [], []
    for gpu in range(GPUS):
        names += [f"DCGM_FI_DEV_FIELD_{m}" for m in range(GPU_METRICS)]
        labels += [{"gpu": str(gpu), "Hostname": f"vela-{node:03d}"}] * GPU_METRICS
    for port in range(PORTS):
        names += [f"node_infiniband_counter_{m}_total" for m in range(PORT_METRICS)]
        labels += [{"device": f"mlx5_{port}", "port": "1"}] * PORT_METRICS
    values = [(at * (i + 1) + node) % 9973 / 7 for i in range(len(names))]
    return ScrapeBatch(f"vela-{node:03d}:9400", f"vela-{node:03d}", at, names, labels, values)


def cpu(call: Callable[[], object]) -> float:
    """The CPU seconds of this process (chDB's threads included) that `call` took."""
    started = time.process_time()
    call()
    return time.process_time() - started


def insert_rounds(store: Store, nodes: int, first: float, rounds: int, interval_s: float) -> list[float]:
    """CPU seconds per sample of each round's insert (the batches built beforehand, not timed)."""
    costs = []
    for r in range(rounds):
        at = first + r * interval_s
        batches = [node_round(node, at) for node in range(nodes)]
        samples = sum(len(batch) for batch in batches)
        costs.append(cpu(lambda b=batches, r=r: store.insert_samples(b, token=f"round-{r}")) / samples)
    return costs


def with_the_view(path: str, database: str) -> Store:
    """A store as before migration 7: the materialized view samples_1m_mv fills samples_1m on every insert."""
    store = Store.open(f"chdb://{path}", database=database)
    client = clickhouse_connect.get_client(interface="chdb", path=path)
    try:
        for statement in schema.SAMPLES_1M_MV.create(Layout(database)):
            client.command(statement)
    finally:
        client.close()
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=192)
    parser.add_argument("--minutes", type=int, default=2)
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args()
    rounds = int(args.minutes * 60 / args.interval_s)
    # whole minutes that ended long enough ago to be rolled up at once
    first = (time.time() // 60 - args.minutes) * 60 - schema.ROLL_UP_MINUTES_AFTER_S - 60
    with tempfile.TemporaryDirectory(prefix="fleetlens-bench-rollup-", dir=scratch_dir()) as tmp:
        view_store = with_the_view(tmp, "with_view")
        viewed = insert_rounds(view_store, args.nodes, first, rounds, args.interval_s)
        view_store.close()
        store = Store.open(f"chdb://{tmp}", database="rolled")
        plain = insert_rounds(store, args.nodes, first, rounds, args.interval_s)
        samples = sum(len(node_round(node, first)) for node in range(args.nodes)) * rounds
        settle(tmp)  # the rounds' merges: the roll-up's CPU is its own
        rolled = []
        while True:
            spent = time.process_time()
            minutes = store.roll_up_minutes(most=1)
            if not minutes:
                break
            rolled.append(time.process_time() - spent)
        store.close()
    per_round = samples / rounds
    print(f"{args.nodes} nodes, {per_round:.0f} samples a round, {rounds} rounds {args.interval_s:g} s apart")
    print(f"  insert with the view      {statistics.median(viewed) * 1e6:6.2f} us CPU per sample")
    print(f"  insert without the view   {statistics.median(plain) * 1e6:6.2f} us CPU per sample")
    print(
        f"  the view's share          {(statistics.median(viewed) - statistics.median(plain)) * 1e6:6.2f} us"
    )
    per_minute = samples / max(1, len(rolled))
    print(
        f"  roll-up of a minute       {statistics.median(rolled) * 1e3:6.0f} ms CPU, "
        f"{statistics.median(rolled) / per_minute * 1e6:.3f} us per sample ({len(rolled)} minutes)"
    )


if __name__ == "__main__":
    main()

"""Bytes per stored sample for candidate sample layouts and codecs, all holding the same data, same run.

The data is what a fleet's exporters serve: per node, 8 simulated busy GPUs (collectors.gpu.sim driven by
a manual clock, 1 s apart) and the procfs fixture's InfiniBand/RoCE and netclass families, whose
traffic counters are made to grow as a busy NIC's would; scrape times carry a few ms of jitter. The
samples go in through Store.insert_samples (the chosen layout); the peers are filled from it with
INSERT ... SELECT; every table is merged (OPTIMIZE FINAL), then system.parts and system.columns are read.

    wide      one row per sample with metric, node and labels (Map) in it: the OpenTelemetry Collector's
              ClickHouse exporter layout, ordered by (metric, node, labels, ts); its codecs
    signoz    series table + samples (metric, series_id, ts, value) ordered by (metric, series_id, ts),
              with SigNoz samples_v4's codecs: ts DoubleDelta, value Gorilla
    ids       series table + samples (series_id, ts, value) ordered by (series_id, ts); the chosen codecs
    chosen    series table + samples (metric, node, series_id, ts, value), as analytics/store/schema.py does:
              ordered by (metric, node, series_id, ts), ts Delta, value FPC

    .venv/bin/python bench/storage_layout.py [--nodes 8] [--scrapes 900]
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import clickhouse_connect

from analytics.store import Store
from analytics.store.records import ScrapeBatch
from collectors.base import ReadErrors
from collectors.gpu.collector import GpuCollector
from collectors.gpu.sim import ManualClock, SimBackend
from fleetlens.config import ExporterConfig
from fleetlens.exporter_cli import build_exporter
from tests.conftest import fixtures_dir
from tests.support import ttar

CODECS = {  # column of bench.codecs -> (type, codec)
    "ts_doubledelta": ("DateTime64(3, 'UTC')", "DoubleDelta, ZSTD(1)"),
    "ts_delta": ("DateTime64(3, 'UTC')", "Delta, ZSTD(1)"),
    "ts_delta_zstd3": ("DateTime64(3, 'UTC')", "Delta, ZSTD(3)"),
    "value_gorilla": ("Float64", "Gorilla, ZSTD(1)"),
    "value_fpc": ("Float64", "FPC, ZSTD(1)"),
    "value_fpc_zstd3": ("Float64", "FPC, ZSTD(3)"),
    "value_zstd1": ("Float64", "ZSTD(1)"),
    "value_zstd3": ("Float64", "ZSTD(3)"),
}
TRAFFIC = re.compile(r"bytes|packets|data|octets")  # counters that grow on a busy NIC; the rest stay flat
PEERS = {  # table -> (CREATE, filled from the chosen layout by)
    "wide": (
        """CREATE TABLE bench.wide (
            metric LowCardinality(String) CODEC(ZSTD(1)),
            node LowCardinality(String) CODEC(ZSTD(1)),
            labels Map(LowCardinality(String), String) CODEC(ZSTD(1)),
            ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
            value Float64 CODEC(ZSTD(1))
        ) ENGINE = MergeTree ORDER BY (metric, node, labels, ts)
        SETTINGS allow_suspicious_types_in_order_by = 1""",
        "SELECT metric, node, labels, ts, value FROM bench.metrics",
    ),
    "signoz": (
        """CREATE TABLE bench.signoz (
            metric LowCardinality(String),
            series_id UInt64 CODEC(Delta, ZSTD(1)),
            ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
            value Float64 CODEC(Gorilla, ZSTD(1))
        ) ENGINE = MergeTree ORDER BY (metric, series_id, ts)""",
        "SELECT metric, series_id, ts, value FROM bench.samples",
    ),
    "ids": (
        """CREATE TABLE bench.ids (
            series_id UInt64,
            ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
            value Float64 CODEC(FPC, ZSTD(1))
        ) ENGINE = MergeTree ORDER BY (series_id, ts)""",
        "SELECT series_id, ts, value FROM bench.samples",
    ),
    "codecs": (
        f"""CREATE TABLE bench.codecs (
            metric LowCardinality(String), node LowCardinality(String), series_id UInt64,
            {", ".join(f"{name} {kind} CODEC({codec})" for name, (kind, codec) in CODECS.items())}
        ) ENGINE = MergeTree ORDER BY (metric, node, series_id, ts_delta)
        SETTINGS min_bytes_for_wide_part = 0""",
        # each codec column takes the samples' ts or value, as its name says
        f"SELECT metric, node, series_id, {', '.join(c.split('_')[0] for c in CODECS)} FROM bench.samples",
    ),
}
LAYOUTS = {  # layout -> the tables it takes
    "wide": ("wide",),
    "signoz": ("signoz", "series"),
    "ids": ("ids", "series"),
    "chosen": ("samples", "series"),
}


class SimulatedNode:
    """One VM's scrapes: simulated GPUs read afresh each second, NIC families from the fixture tree with
    their traffic counters advanced by a seeded per-series rate."""

    def __init__(self, index: int, sysfs: Path, clock: ManualClock) -> None:
        self.name = f"vela-{index:03d}"
        self.rng = random.Random(index)
        sim = SimBackend(count=8, seed=index, clock=clock)
        sim.set_load(None, 0.9)
        self.gpus = GpuCollector(sim, self.name, ReadErrors("gpu"))
        exporter = build_exporter(
            ExporterConfig(gpu_backend="none", sysfs_root=sysfs, node=self.name, disable_collectors=("gpu",))
        )
        self.nic = [(s.name, s.labels, s.value) for family in exporter.collect() for s in family.samples]
        self.rates = [
            self.rng.lognormvariate(18, 2) if TRAFFIC.search(name) else 0.0 for name, _, _ in self.nic
        ]
        self.counters = [value for _, _, value in self.nic]

    def scrape(self, ts: float) -> ScrapeBatch:
        gpu = [(s.name, s.labels, s.value) for family in self.gpus.collect() for s in family.samples]
        for i, rate in enumerate(self.rates):
            self.counters[i] += round(rate * self.rng.uniform(0.8, 1.2))
        names = [name for name, _, _ in gpu] + [name for name, _, _ in self.nic]
        labels = [labels for _, labels, _ in gpu] + [labels for _, labels, _ in self.nic]
        values = [value for _, _, value in gpu] + self.counters
        return ScrapeBatch(f"{self.name}:9400", self.name, ts, names, labels, list(values))


def ingest(store: Store, nodes: list[SimulatedNode], clock: ManualClock, scrapes: int) -> tuple[int, float]:
    """Scrape every node once a simulated second and store each round; returns (samples, seconds)."""
    start = time.time() - scrapes
    jitter = random.Random(0)
    stored, spent = 0, 0.0
    for tick in range(scrapes):
        clock.advance(1)
        batches = [node.scrape(start + tick + jitter.uniform(0, 0.02)) for node in nodes]
        began = time.perf_counter()
        stored += store.insert_samples(batches, token=f"round-{tick}")
        spent += time.perf_counter() - began
    return stored, spent


def measure(client: clickhouse_connect.driver.Client) -> tuple[dict, dict]:
    """(rows, compressed bytes, bytes on disk) per table, and compressed bytes per column of `codecs`."""
    tables = {
        name: (rows, compressed, on_disk)
        for name, rows, compressed, on_disk in client.query(
            "SELECT table, sum(rows), sum(data_compressed_bytes), sum(bytes_on_disk) FROM system.parts"
            " WHERE database = 'bench' AND active GROUP BY table"
        ).result_rows
    }
    columns = dict(
        client.query(
            "SELECT column, sum(column_data_compressed_bytes) FROM system.parts_columns"
            " WHERE database = 'bench' AND table = 'codecs' AND active GROUP BY column"
        ).result_rows
    )
    return tables, columns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=900)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        sysfs = ttar.extract(fixtures_dir() / "procfs" / "fixtures.ttar", tmp) / "fixtures" / "sys"
        clock = ManualClock()
        nodes = [SimulatedNode(index, sysfs, clock) for index in range(args.nodes)]
        with Store.open(f"chdb://{tmp}/chdb", database="bench") as store:
            samples, seconds = ingest(store, nodes, clock, args.scrapes)
            client = clickhouse_connect.get_client(interface="chdb", path=f"{tmp}/chdb")
            for name, (create, select) in PEERS.items():
                client.command(create)
                client.command(f"INSERT INTO bench.{name} {select}")
            for table in ("series", "samples", *PEERS):
                client.command(f"OPTIMIZE TABLE bench.{table} FINAL")
            tables, columns = measure(client)
            client.close()

    series = samples // (args.nodes * args.scrapes)
    print(f"{args.nodes} nodes x {series} series x {args.scrapes} scrapes = {samples} samples")
    held = {table: tables[table][0] for layout in LAYOUTS.values() for table in layout if table != "series"}
    assert set(held.values()) == {samples}, f"every layout must hold every sample: {held}"
    print(f"Store.insert_samples: {samples / seconds:,.0f} samples/s (one round of all nodes per call)")
    wide_on_disk = tables["wide"][2]
    print(f"{'layout':8} {'bytes/sample (columns)':>24} {'on disk':>10} {'ratio to wide':>14}")
    for layout, parts in LAYOUTS.items():
        compressed = sum(tables[table][1] for table in parts)
        on_disk = sum(tables[table][2] for table in parts)
        ratio = on_disk / wide_on_disk
        print(f"{layout:8} {compressed / samples:24.3f} {on_disk / samples:10.3f} {ratio:14.2f}")
    print("codecs, compressed bytes/sample:")
    for name, (_, codec) in CODECS.items():
        print(f"  {name:16} {codec:22} {columns[name] / samples:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

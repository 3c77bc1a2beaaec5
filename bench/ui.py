"""How long each page of the UI takes to render on a week of a 64-node fleet sampled every 10 s.

The store is seeded inside ClickHouse (INSERT ... SELECT FROM numbers(); building 200 M rows in Python
would take hours), with a subset of each node's series: 8 GPUs x 4 DCGM metrics (temperature, SM clock,
power, utilization) and 4 RoCE ports x 6 series (state, link_downed, bytes received and sent, CNPs sent
and handled): 56 series per node. Besides: a scrape row per node every 10 s, one step row per node every
10 s (one job, 4 pipeline stages; one node slower for the last two hours), and a week of anomalies,
alert changes and drain decisions. The first FLAPPING nodes' scrapes fail every 10 minutes, so that a
job's postmortem over the week lists thousands of target gaps. The raw samples are rolled up into the
1-minute rollup up to the last minutes (read from raw samples, as on a live hub), which is merged
(OPTIMIZE FINAL), as background merges leave a week-old store, and its whole hours rolled up into
samples_1h.

Each page then runs under Streamlit's AppTest against the store, with each of the sidebar's ranges
ending at the data's end (1 h reads raw samples, 24 h the 1-minute rollup, 7 d mostly the hourly one;
the Postmortem page once about node vela-007, once about the job on every node): the whole page script,
its queries, frames and charts, but not the browser's drawing. Reported: the median of `--repeat` reruns
per page and range, next to a peer measured in the same run on the same ranges: `SELECT count() FROM
metrics` (one scan of the range's samples) and, up to a day, the raw samples of one metric on every
node into pandas (what a page that aggregated in Python would start with). Last, the Fleet page again
with a topology of TOPOLOGY_VMS VMs imported as an inventory (8 per host, TOPOLOGY_LEAVES leaves, 8
rails; the fleet's nodes among them) and a shared fault open on one leaf: what its heat map adds.

    .venv/bin/python bench/ui.py [--nodes 64] [--days 7] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import clickhouse_connect
from streamlit.testing.v1 import AppTest

from analytics.detectors.base import frame
from analytics.evidence import (
    CongestionEvidence,
    DmaDegradedEvidence,
    GpuThrottleEvidence,
    LinkDownEvidence,
    LinkFlapEvidence,
    SharedFaultEvidence,
    SlowNodeEvidence,
    to_json,
)
from analytics.store import Store, schema
from analytics.store.records import ActionRow, AlertChange, Anomaly
from analytics.store.schema import Layout
from analytics.topology import inventory
from analytics.topology.model import Source
from sim.pipeline import scratch_dir
from ui import source, window
from ui.environment import APP

INTERVAL_S = 10
GPU_METRICS = {  # metric -> its value at tick t of GPU `idx` of node `node_idx`; `jitter` is noise in [0, 1)
    "DCGM_FI_DEV_GPU_TEMP": "55 + 8 * sin(t / 90 + idx) + 3 * jitter",
    "DCGM_FI_DEV_SM_CLOCK": "1980 - if(node_idx = 11 AND idx = 3 AND t % 8640 > 6000, 600, 0) - 30 * jitter",
    "DCGM_FI_DEV_POWER_USAGE": "520 + 60 * sin(t / 70 + idx) + 20 * jitter",
    "DCGM_FI_DEV_GPU_UTIL": "92 + 8 * jitter",
}
PORT_METRICS = {  # counters grow with t; node 20's port 2 goes down now and then
    "node_infiniband_state_id": "if(node_idx = 20 AND idx = 2 AND t % 3000 < 3, 1, 4)",
    "node_infiniband_link_downed_total": "if(node_idx = 20 AND idx = 2, intDiv(t + 2997, 3000), 0)",
    "node_infiniband_port_data_received_bytes_total": "t * 10 * 1.2e10 * (0.9 + 0.02 * idx) + jitter",
    "node_infiniband_port_data_transmitted_bytes_total": "t * 10 * 1.2e10 * (0.9 + 0.02 * idx) + jitter",
    "node_infiniband_np_cnp_packets_sent_total": "t * 10 * 40 + intDiv(t, 7)",
    "node_infiniband_rp_cnp_packets_handled_total": "t * 10 * 35 + intDiv(t, 9)",
}
# anomaly kind -> its component, for the kinds whose series the store holds (no XID or gpu_up: no gpu_fault)
KINDS = {  # the anomalies seeded: each kind's component and the evidence its detector would write
    "slow_node": ("", SlowNodeEvidence(
        ratio=1.2, signal="compute_s", value=1.2, peer_median=1.0, z=6.1, consistency=0.9, peers=63,
        steps=30, stage=0, job_step_s=1.0, job_gpus=512, lookback_s=60.0, job_slowdown=0.17, windows=3)),
    "gpu_throttle": ("gpu:3", GpuThrottleEvidence(
        reasons=("hw_thermal_slowdown",), reason_names=("HW thermal slowdown",), look_at=("cooling",),
        peers="busy GPUs", sm_clock_mhz=1410.0, peers_sm_clock_mhz=1980.0, clock_drop=0.29, windows=3)),
    "link_flap": ("mlx5_2:1", LinkFlapEvidence(downs=3.0, state=4.0, physical_state=5.0, lookback_s=60.0)),
    "link_down": ("mlx5_2:1", LinkDownEvidence(down_s=10.0, state=1.0, physical_state=3.0, windows=3)),
    "dma_degraded": ("mlx5_1:1", DmaDegradedEvidence(
        signals=("pcie",), pcie_link="gen4 x8", pcie_max_link="gen4 x16", windows=3)),
    "congestion": ("mlx5_0:1", CongestionEvidence(
        signal="ecn_marks", ecn_marks_per_s=5e4, fleet_median_per_s=100.0, robust_z=12.0, windows=3)),
}  # fmt: skip
RANGES = ("1 h", "24 h", "7 d")  # the sidebar's choices: raw samples, then the rollup
PEER_METRIC = "DCGM_FI_DEV_GPU_TEMP"
PEER_ROWS_MAX_S = 86400  # a week of one metric's raw rows in pandas would take tens of GB
IN_RANGE = "ts >= toDateTime64({start:Float64}, 3, 'UTC') AND ts < toDateTime64({end:Float64}, 3, 'UTC')"
JOB = "llm-64"
TOPOLOGY_VMS, TOPOLOGY_LEAVES, VMS_PER_HOST, RAILS = 2000, 64, 8, 8
FLAPPING = 3  # nodes whose scrapes fail every 10 minutes, 1 to 3 in a row: thousands of target gaps a week
PAGES = {  # title -> the page, and the session state its widgets start with
    "Fleet": ("", {}),
    "Node": ("views/node.py", {}),
    "Anomalies and alerts": ("views/anomalies.py", {}),
    "Actions": ("views/actions.py", {}),
    "Postmortem, node vela-007": ("views/postmortem.py", {}),
    f"Postmortem, job {JOB}": ("views/postmortem.py", {"postmortem.scope": "job"}),
}


def tick_time(first: int) -> str:
    """The time of tick `t` of a store whose data starts at `first` (unix seconds), as DateTime64(3)."""
    return f"fromUnixTimestamp64Milli(toInt64(({first} + t * {INTERVAL_S}) * 1000))"


def node_name(index: int) -> str:
    return f"vela-{index + 1:03d}"


def series_rows(nodes: int) -> list[list]:
    """One row per series: id, metric, node, labels, node index, and GPU or port index."""
    rows = []
    for node_idx in range(nodes):
        node = node_name(node_idx)
        for idx in range(8):
            rows += [
                [metric, node, {"gpu": str(idx), "Hostname": node}, node_idx, idx] for metric in GPU_METRICS
            ]
        for idx in range(4):
            rows += [
                [metric, node, {"device": f"mlx5_{idx}", "port": "1"}, node_idx, idx]
                for metric in PORT_METRICS
            ]
    return [[position + 1, *row] for position, row in enumerate(rows)]


def seed_samples(client: clickhouse_connect.driver.Client, db: str, nodes: int, first: int, days: int) -> int:
    """The series table, then every sample, a day per INSERT ... SELECT; returns the samples stored."""
    rows = series_rows(nodes)
    client.command(
        f"CREATE TABLE {db}.bench_series (series_id UInt64, metric String, node String,"
        " labels Map(String, String), node_idx UInt32, idx UInt32) ENGINE = Memory"
    )
    client.insert(
        f"{db}.bench_series", rows, column_names=["series_id", "metric", "node", "labels", "node_idx", "idx"]
    )
    client.command(
        f"INSERT INTO {db}.series SELECT series_id, metric, node, labels,"
        f" fromUnixTimestamp64Milli(toInt64({first} * 1000)) FROM {db}.bench_series"
    )
    formulas = {**GPU_METRICS, **PORT_METRICS}
    value = "multiIf(" + ", ".join(f"metric = '{m}', {f}" for m, f in formulas.items()) + ", 0)"
    ticks = 86400 // INTERVAL_S
    for day in range(days):
        client.command(
            f"INSERT INTO {db}.samples (metric, node, series_id, ts, value)"
            f" SELECT metric, node, series_id, {tick_time(first)}, {value}"
            " FROM (SELECT *, number AS t, (cityHash64(series_id, number) % 1000) / 1000 AS jitter"
            f" FROM {db}.bench_series AS s, numbers({day * ticks}, {ticks}) AS n)",
            settings={"max_insert_threads": 2},
        )
    return len(rows) * ticks * days


def seed_scrapes_and_steps(
    client: clickhouse_connect.driver.Client, db: str, nodes: int, first: int, days: int
) -> None:
    """A scrape row per node every interval (the last node's scrapes failing for the last 10 minutes, the
    first FLAPPING nodes' failing 1 to 3 times in a row every 10 minutes, with one of two errors), and a
    step row per node (4 pipeline stages of one job; node 7 slower by 15% for the last two hours)."""
    ticks = days * 86400 // INTERVAL_S
    at = tick_time(first)
    flapping = f"n < {FLAPPING} AND t % 60 <= intDiv(t, 60) % 3"
    client.command(
        f"INSERT INTO {db}.targets (ts, target, node, up, duration_s, samples, error)"
        f" SELECT {at}, concat(node, ':9400'), node, up, 0.02, if(up, 500, 0),"
        " if(up, '', if(t % 120 < 60, 'timeout', 'connection refused'))"
        f" FROM (SELECT number % {nodes} AS n, intDiv(number, {nodes}) AS t,"
        f" concat('vela-', leftPad(toString(n + 1), 3, '0')) AS node,"
        f" NOT ((n = {nodes - 1} AND t > {ticks - 60}) OR ({flapping})) AS up FROM numbers({ticks * nodes}))"
    )
    client.command(
        f"INSERT INTO {db}.steps (ts, job, rank, node, step, duration_s, compute_s, pp_stage, steps, source)"
        f" SELECT {at}, '{JOB}', n, node, t, compute + 1, compute, n % 4, 1, 'jsonl'"
        f" FROM (SELECT number % {nodes} AS n, intDiv(number, {nodes}) AS t,"
        f" concat('vela-', leftPad(toString(n + 1), 3, '0')) AS node,"
        f" (3 + (cityHash64(number) % 100) / 1000) * if(n = 6 AND t > {ticks - 720}, 1.15, 1) AS compute"
        f" FROM numbers({ticks * nodes}))"
    )


def target_gaps(client: clickhouse_connect.driver.Client, db: str) -> tuple[int, int]:
    """The failed scrapes stored, and the gaps they make (runs of them per target)."""
    [(failed, gaps)] = client.query(
        "SELECT countIf(up = 0), countIf(up = 0 AND before = 1) FROM (SELECT up, lagInFrame(up, 1, 1)"
        f" OVER (PARTITION BY target ORDER BY ts ROWS 1 PRECEDING) AS before FROM {db}.targets)"
    ).result_rows
    return failed, gaps


def seed_events(store: Store, nodes: int, first: float, last: float, count: int) -> None:
    """`count` anomalies over the week (a few still open), alert changes for each, drain decisions."""
    pick = random.Random(7)
    anomalies, changes, decisions = [], [], []
    for number in range(count):
        start = pick.uniform(first, last - 600)
        still_open = number % 97 == 0 and start > last - 86400
        kind, node = pick.choice(list(KINDS)), node_name(pick.randrange(nodes))
        severity = "critical" if kind == "link_down" else pick.choice(("warning", "info"))
        end = None if still_open else start + pick.uniform(30, 1800)
        anomalies.append(
            Anomaly(
                f"a{number}",
                start,
                end,
                kind,
                node,
                KINDS[kind][0],
                "llm-64",
                severity,
                2.0,
                to_json(KINDS[kind][1]),
                kind,
                "1",
            )
        )
        labels = {"node": node, "kind": kind, "severity": severity, "component": KINDS[kind][0]}
        changes.append(
            AlertChange(start + 30, f"f{number}", kind, "firing", labels, {"summary": kind}, start, None)
        )
        if end is not None:
            changes.append(
                AlertChange(end, f"f{number}", kind, "resolved", labels, {"summary": kind}, start, end)
            )
        if severity == "critical":
            outcome = "pending" if still_open else pick.choice(("done", "dry-run", "refused"))
            reason = f"fleetlens: {kind} f{number}"
            decisions.append(
                ActionRow(start + 60, "drain", node, "llm-64", reason, "approve", outcome, f"d{number}")
            )
    store.insert_anomalies(anomalies, token="bench-anomalies")
    store.insert_alert_changes(changes, token="bench-alerts")
    store.insert_actions(decisions, token="bench-actions")


def seconds(action: Callable[[], object], repeat: int) -> float:
    """The median wall time of `action` over `repeat` runs."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def page_seconds(
    store: Store, page: tuple[str, dict[str, str]], length: str, until: float, node: str, repeat: int
) -> float:
    """The median time of a rerun of `page` (its path and the session state it starts with) as a refresh
    or a click reruns it, on `store`, its range `length` ending at `until`, about `node` or JOB. The
    first run is left out: AppTest then scans the installed packages for components, as a server does
    once when it starts."""
    path, state = page
    test = AppTest.from_file(APP, default_timeout=120)
    test.session_state[source.SESSION_KEY] = store
    test.session_state[window.LENGTH_KEY] = length
    test.session_state[window.UNTIL_KEY] = datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%d %H:%M:%S")
    for key, value in state.items():
        test.session_state[key] = value
    test.query_params["node"] = node
    test.query_params["job"] = JOB
    if path:
        test.switch_page(path)
    test.run()
    if test.exception or test.error:
        raise RuntimeError(f"{path or 'Fleet'}: {[e.value for e in (*test.exception, *test.error)]}")
    return seconds(test.run, repeat)


def peer_scan(store: Store, start: float, end: float) -> float:
    """The peer: one count() over the `metrics` view's samples in [start, end)."""
    sql = f"SELECT count() FROM metrics WHERE {IN_RANGE}"
    return seconds(lambda: store.query(sql, parameters={"start": start, "end": end}), 3)


def peer_rows(store: Store, start: float, end: float) -> float:
    """The peer: one metric's raw samples on every node in [start, end) into pandas."""
    sql = f"SELECT ts, node, labels['gpu'] AS gpu, value FROM metrics WHERE metric = '{PEER_METRIC}'"
    sql += f" AND {IN_RANGE}"
    bounds = {"start": start, "end": end}
    return seconds(lambda: frame(store.query(sql, parameters=bounds, max_rows=100_000_000)), 3)


def report(store: Store, until: float, repeat: int) -> None:
    """The table: each page's seconds by the length of its range (ending at `until`), then the peer's."""
    print(f"seconds per page run (median of {repeat}) by the length of its range, ending at the data's end")
    print(f"  {'':<38}" + "".join(f"{length:>8}" for length in RANGES))
    for title, page in PAGES.items():
        figures = [page_seconds(store, page, length, until, "vela-007", repeat) for length in RANGES]
        print(f"  {title:<38}" + "".join(f"{figure:8.2f}" for figure in figures))
    spans = [window.LENGTHS_S[length] for length in RANGES]
    scans = [f"{peer_scan(store, until - span, until):8.2f}" for span in spans]
    print(f"  {'peer: count() over the metrics view':<38}" + "".join(scans))
    rows = [
        f"{peer_rows(store, until - span, until):8.2f}" if span <= PEER_ROWS_MAX_S else f"{'-':>8}"
        for span in spans
    ]
    print(f"  {'peer: one metric raw into pandas':<38}" + "".join(rows))


def topology_inventory(vms: int, leaves: int) -> str:
    """An inventory as an operator writes it: VMS_PER_HOST VMs a host, hosts spread over `leaves` leaves
    (two spines), each VM on RAILS rails, a rack per leaf."""
    hosts = -(-vms // VMS_PER_HOST)
    rails = ", ".join(f"rail-{rail}" for rail in range(RAILS))
    lines = ["nodes:"]
    lines += [
        f"  {node_name(vm)}: {{host: host-{vm // VMS_PER_HOST:03d}, rails: [{rails}]}}" for vm in range(vms)
    ]
    lines += ["hosts:"]
    under = [h * leaves // hosts for h in range(hosts)]  # each host's leaf and rack
    lines += [f"  host-{h:03d}: {{leaf: leaf-{at:02d}, rack: rack-{at:02d}}}" for h, at in enumerate(under)]
    lines += ["leaves:", *(f"  leaf-{leaf:02d}: {{spine: spine-{leaf % 2}}}" for leaf in range(leaves))]
    return "\n".join(lines) + "\n"


def seed_topology(store: Store, first: float, last: float) -> None:
    """The TOPOLOGY_VMS-VM inventory from the data's start, and leaf-00's shared fault open at its end."""
    text = topology_inventory(TOPOLOGY_VMS, TOPOLOGY_LEAVES)
    store.replace_links(Source.INVENTORY, inventory.parse(text, "bench-topology.yaml"), first)
    evidence = SharedFaultEvidence(
        layer="leaf", parent="leaf-00", n=32, k=8, fleet_nodes=TOPOLOGY_VMS, fleet_anomalous=9, p_value=1e-9,
        log10_p_value=-9.0, tested=TOPOLOGY_LEAVES, p_corrected=6.4e-8, children=(), anomalous_children=(),
        explains=(), kinds={"link_flap": 8}, dominant_kind="link_flap",
        check="leaf-00: link flaps on 8 of 32 nodes; check optics and switch logs")  # fmt: skip
    fault = Anomaly("bench-fault", last - 600, None, "shared_fault", "leaf-00", "leaf", "", "warning", 9.0,
                    to_json(evidence), "shared_fault", "1")  # fmt: skip
    store.insert_anomalies([fault], token="bench-topology")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetlens-bench-ui-", dir=scratch_dir()) as tmp:
        store = Store.open(f"chdb://{tmp}/chdb", database="bench")
        client = clickhouse_connect.get_client(interface="chdb", path=f"{tmp}/chdb")
        last = int(time.time()) // INTERVAL_S * INTERVAL_S
        first = last - args.days * 86400
        started = time.perf_counter()
        samples = seed_samples(client, "bench", args.nodes, first, args.days)
        seed_scrapes_and_steps(client, "bench", args.nodes, first, args.days)
        seed_events(store, args.nodes, first, last, count=200 * args.days)
        client.command(schema.roll_up_minutes(Layout("bench")))  # as the store's owner does now and then
        client.command("OPTIMIZE TABLE bench.samples_1m FINAL")
        client.command(schema.roll_up_hours(Layout("bench")))
        failed, gaps = target_gaps(client, "bench")
        print(
            f"seeded {samples / 1e6:.0f} M samples of {args.nodes} nodes over {args.days} days"
            f" in {time.perf_counter() - started:.0f} s; {failed} failed scrapes in {gaps} target gaps"
        )
        report(store, float(last), args.repeat)
        seed_topology(store, first, last)
        figures = [
            page_seconds(store, PAGES["Fleet"], length, last, "vela-007", args.repeat) for length in RANGES
        ]
        title = f"Fleet, {TOPOLOGY_VMS:,}-VM topology ({TOPOLOGY_LEAVES} leaves)"
        print(f"  {title:<38}" + "".join(f"{figure:8.2f}" for figure in figures))
        store.close()
        client.close()


if __name__ == "__main__":
    main()

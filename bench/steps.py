"""Per-step cost of StepTracker next to a bare loop and the raw OpenTelemetry histogram record, same run.

The goal is under 20 us per recorded step on the training thread. The tracker only queues a step for
OpenTelemetry; the exporting thread feeds the SDK histograms later, so that cost is reported on its own
line ("deferred"), measured as the time close() takes to record and send everything queued. The last
line runs the exporter every 50 ms during the loop: in this pure-Python loop the exporting thread
competes for the GIL, which a real training step (mostly in kernels that release it) hides.

    .venv/bin/python bench/steps.py [--steps 10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from collectors.steps import StepTracker
from tests.support.otlp import OtlpReceiver

IDENTITY = {"job": "bench", "rank": 0, "node": "bench-node", "dp_rank": 0, "pp_stage": 0, "tp_rank": 0}
REPEATS = 3

Contender = Callable[[int], tuple[float, float | None]]  # steps -> ns per step: in the loop, deferred


def ns_per_step(loop: Callable[[int], None], steps: int) -> float:
    start = time.perf_counter_ns()
    loop(steps)
    return (time.perf_counter_ns() - start) / steps


def peer(loop: Callable[[int], None]) -> Contender:
    return lambda steps: (ns_per_step(loop, steps), None)


def bare_loop(steps: int) -> None:
    for _ in range(steps):
        pass


def raw_record() -> Callable[[int], None]:
    """One SDK histogram record per step with the tracker's attributes: what a tracker would pay inline."""
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()], shutdown_on_exit=False)
    histogram = provider.get_meter("bench").create_histogram("bench.step.duration", unit="s")

    def loop(steps: int) -> None:
        for _ in range(steps):
            histogram.record(0.1, IDENTITY)

    return loop


def steps_only(tracker: StepTracker, steps: int) -> None:
    for _ in range(steps):
        with tracker.step():
            pass


def steps_with_phases(tracker: StepTracker, steps: int) -> None:
    for _ in range(steps):
        with tracker.step():
            with tracker.phase("data"):
                pass
            with tracker.phase("compute"):
                pass
            with tracker.phase("comm"):
                pass


def tracked(loop: Callable[[StepTracker, int], None], **options: object) -> Contender:
    """A fresh tracker per run; with OTLP on, its close() time per step is the deferred work."""

    def measure(steps: int) -> tuple[float, float | None]:
        tracker = StepTracker(**IDENTITY, environ={}, **options)
        loop_ns = ns_per_step(lambda n: loop(tracker, n), steps)
        start = time.perf_counter_ns()
        tracker.close()
        return loop_ns, (time.perf_counter_ns() - start) / steps if tracker.otlp_url else None

    return measure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, OtlpReceiver() as receiver:
        jsonl = Path(tmp) / "steps.jsonl"
        otlp = {"otlp_endpoint": receiver.url, "export_interval_s": 3600.0}
        contenders: dict[str, Contender] = {
            "peer: bare loop": peer(bare_loop),
            "peer: raw OpenTelemetry histogram.record": peer(raw_record()),
            "step, no output": tracked(steps_only),
            "step + 3 phases, no output": tracked(steps_with_phases),
            "step + 3 phases, JSONL": tracked(steps_with_phases, jsonl_path=jsonl),
            "step + 3 phases, JSONL + OTLP": tracked(steps_with_phases, jsonl_path=jsonl, **otlp),
            "  same, exporting every 50 ms meanwhile": tracked(
                steps_with_phases, jsonl_path=jsonl, otlp_endpoint=receiver.url, export_interval_s=0.05
            ),
        }
        results = {
            name: min(measure(args.steps) for _ in range(REPEATS)) for name, measure in contenders.items()
        }
        exports = len(receiver.requests)

    raw_ns = results["peer: raw OpenTelemetry histogram.record"][0]
    print(
        f"{args.steps} steps per run, best of {REPEATS}; {exports} OTLP requests reached the local receiver"
    )
    print(f"{'loop':44} {'ns/step':>10} {'vs raw record':>14} {'deferred ns/step':>17}")
    for name, (loop_ns, deferred_ns) in results.items():
        deferred = "" if deferred_ns is None else f"{deferred_ns:17.0f}"
        print(f"{name:44} {loop_ns:10.0f} {loop_ns / raw_ns:14.2f} {deferred}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A hub and a real Prometheus holding the same samples, each written by remote write, and the means to
ask both the same PromQL through `promtool query instant|range` and compare the answers: what every PromQL
test file builds on (tests/hub/test_promql*.py)."""

from __future__ import annotations

import json
import math
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from analytics.store import Store
from hub.app import Hub
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.support import remote_write
from tests.support.hubserver import on_loopback
from tests.support.peers import peer, prometheus, require_binary

Point = tuple[Mapping[str, str], int, float]  # labels with __name__, time in ms, value
MINUTE_MS = 60_000
T0_MS = (int(time.time()) - 2 * 3600) // 60 * MINUTE_MS  # inside both stores' windows, on a whole minute


@contextmanager
def hub_and_prometheus(
    series: Sequence[remote_write.Series], chdb_dir: Path, work: Path
) -> Iterator[dict[str, Any]]:
    """A hub (on a fresh database in `chdb_dir`) and a Prometheus (in `work`) holding `series`: their URLs
    ("hub", "prometheus") and the hub itself ("hub_app")."""
    require_binary("promtool")
    args, prometheus_url = prometheus(work)
    body = remote_write.snappy(remote_write.encode(series))
    with (
        Store.open(f"chdb://{chdb_dir}", database=f"test_{uuid.uuid4().hex[:12]}") as store,
        peer([*args, "--web.enable-remote-write-receiver"], f"{prometheus_url}/-/ready"),
    ):
        hub = Hub(store, Writer(store, Spool(work / "spool", 64 << 20)), OtlpStepReceiver())
        with on_loopback(hub) as hub_url:
            for url in (hub_url, prometheus_url):
                status, answer = remote_write.post(url, body)
                assert status == 204, (url, answer)
            yield {"hub": hub_url, "prometheus": prometheus_url, "hub_app": hub}


def promtool(kind: str, flags: list[str], server: str, query: str) -> object:
    """What `promtool query KIND FLAGS -o json -- SERVER QUERY` prints, parsed (`--`: a query may start
    with "-"); it fails the test when promtool does."""
    done = subprocess.run(
        ["promtool", "query", kind, *flags, "-o", "json", "--", server, query],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (kind, flags, server, query, done.stderr)
    return json.loads(done.stdout)


def comparable(result: object) -> dict:
    """A promtool result as {label set: [(time, value), ...]}, whatever its type."""
    if isinstance(result, list) and len(result) == 2 and not isinstance(result[0], dict):  # a scalar
        result = [{"metric": {}, "value": result}]
    rows = {}
    for series in result:
        points = series["values"] if "values" in series else [series["value"]]
        rows[frozenset(series["metric"].items())] = [(round(float(t) * 1000), float(v)) for t, v in points]
    return rows


def assert_same(ours: dict, theirs: dict, what: str) -> None:
    """The same label sets, the same times, and values within 1e-9 relative (NaN equal to NaN)."""
    assert set(ours) == set(theirs), (what, sorted(map(sorted, ours)), sorted(map(sorted, theirs)))
    for labels, points in theirs.items():
        mine = ours[labels]
        assert [t for t, _ in mine] == [t for t, _ in points], (what, labels)
        for (_, a), (_, b) in zip(mine, points, strict=True):
            assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=0), (
                what,
                labels,
                a,
                b,
            )


def compare_instant(peers: dict[str, Any], query: str, times_ms: Sequence[int]) -> int:
    """Ask both peers `query` at each of `times_ms` and assert the same answers; how many series were
    compared in all."""
    compared = 0
    for at in times_ms:
        ours, theirs = (
            comparable(promtool("instant", [f"--time={at / 1000}"], peers[side], query))
            for side in ("hub", "prometheus")
        )
        assert_same(ours, theirs, f"{query} at {at}")
        compared += len(theirs)
    return compared


def compare_range(peers: dict[str, Any], query: str, start_ms: int, end_ms: int, step: str) -> int:
    """Ask both peers `query` over [start_ms, end_ms] every `step` (a Prometheus duration) and assert the
    same answers; how many series were compared."""
    window = [f"--start={start_ms / 1000}", f"--end={end_ms / 1000}", f"--step={step}"]
    ours, theirs = (
        comparable(promtool("range", window, peers[side], query)) for side in ("hub", "prometheus")
    )
    assert_same(ours, theirs, query)
    return len(theirs)


def get(url: str, path: str, parameters: dict[str, str]) -> tuple[int, dict]:
    """The status and JSON answer of GET `url``path`?`parameters`, errors included."""
    try:
        with urllib.request.urlopen(
            f"{url}{path}?{urllib.parse.urlencode(parameters)}", timeout=30
        ) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@contextmanager
def hub_filled_and_prometheus(
    fill: Callable[[Store], None], points: Iterable[Point], chdb_dir: Path, work: Path
) -> Iterator[dict[str, Any]]:
    """hub_and_prometheus with the hub's store filled by `fill` (rows of a table the hub reads as series:
    steps, targets) and Prometheus holding `points`, the same values as plain series."""
    with hub_and_prometheus([], chdb_dir, work) as both:
        fill(both["hub_app"].store)
        status, answer = remote_write.post(
            both["prometheus"], remote_write.snappy(remote_write.encode(plain_series(points)))
        )
        assert status == 204, answer
        yield both


def plain_series(points: Iterable[Point]) -> list[remote_write.Series]:
    """`points` (labels with __name__, time in ms, value) as series, each its points in the given order."""
    series: dict[tuple, list[tuple[int, float]]] = {}
    for labels, ts_ms, value in points:
        series.setdefault(tuple(sorted(labels.items())), []).append((ts_ms, value))
    return [(dict(key), samples) for key, samples in series.items()]


def quoted(text: str) -> str:
    """`text` as the body of a PromQL double-quoted string."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def compare_catalog(peers: dict[str, Any], path: str, parameters: dict[str, str]) -> None:
    """Ask both peers catalog endpoint `path` with `parameters` and assert the same, non-empty, answers
    (in any order)."""
    ours, theirs = (get(peers[side], path, parameters) for side in ("hub", "prometheus"))
    assert ours[0] == theirs[0] == 200
    key = (lambda one: sorted(one.items())) if path == "/api/v1/series" else None
    assert sorted(ours[1]["data"], key=key) == sorted(theirs[1]["data"], key=key)
    assert ours[1]["data"]


def minutes(m: float) -> int:
    """The time `m` minutes after T0_MS, in milliseconds."""
    return T0_MS + round(m * MINUTE_MS)

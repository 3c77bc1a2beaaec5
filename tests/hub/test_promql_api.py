"""The hub's series, labels and label values equal Prometheus's own on the same samples (remote-written to
both), for several match[] sets, GET and POST; bad parameters answer bad_data in Prometheus's envelope as
Prometheus does; metadata names the stored metrics; buildinfo carries the package's version."""

from __future__ import annotations

import importlib.metadata
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hub.app import Hub
from hub.auth import Tokens
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.support import remote_write
from tests.support.promqlpeers import get, hub_and_prometheus
from tests.support.wsgi import wsgi_post

pytestmark = pytest.mark.integration

MINUTE_MS = 60_000
T0_MS = (int(time.time()) - 2 * 3600) // 60 * MINUTE_MS  # inside both stores' windows
HOSTILE = "a\"b\\c'; DROP TABLE samples; --"


def samples(first_minute: int, last_minute: int, value: float) -> list[tuple[int, float]]:
    return [(T0_MS + minute * MINUTE_MS, value + minute) for minute in range(first_minute, last_minute)]


SERIES: list[remote_write.Series] = [
    ({"__name__": "fl_up", "node": "n1", "instance": "n1:9100", "job": "api"}, samples(0, 60, 1)),
    ({"__name__": "fl_up", "node": "n2", "instance": "n2:9100", "job": "batch"}, samples(0, 20, 1)),
    (
        {"__name__": "fl_temp", "node": "n1", "instance": "n1:9400", "job": "dcgm", "gpu": "0"},
        samples(0, 60, 30),
    ),
    (
        {
            "__name__": "fl_temp",
            "node": "n2",
            "instance": "n2:9400",
            "job": "dcgm",
            "gpu": "1",
            "model": HOSTILE,
        },
        samples(30, 60, 40),
    ),
    ({"__name__": "fl_errors_total", "node": "n3", "instance": "n3:9100", "job": "api"}, samples(40, 60, 0)),
]
WINDOWS = {  # name -> start, end (None: the endpoint's default)
    "all": (None, None),
    "first half hour": (T0_MS, T0_MS + 29 * MINUTE_MS),
    "last ten minutes": (T0_MS + 50 * MINUTE_MS, T0_MS + 60 * MINUTE_MS),
    "before any sample": (T0_MS - 60 * MINUTE_MS, T0_MS - MINUTE_MS),
}
MATCHES = [
    ["fl_up"],
    ['{job="api"}'],
    ['fl_temp{gpu=~"0|1"}', 'fl_up{job!="api"}'],
    ['{__name__=~"fl_.*", node!="n1"}'],
    ['fl_temp{model="a\\"b\\\\c\'; DROP TABLE samples; --"}'],
    ['{__name__=~".+", job!~"dcgm|api"}'],
    ["fl_none"],
]


@pytest.fixture(scope="module")
def peers(chdb_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    with hub_and_prometheus(SERIES, chdb_dir, tmp_path_factory.mktemp("promql-api")) as both:
        yield both


def times(window: str) -> dict[str, str]:
    start, end = WINDOWS[window]
    return {} if start is None else {"start": str(start / 1000), "end": str(end / 1000)}


def ask(url: str, path: str, pairs: list[tuple[str, str]], method: str) -> tuple[int, dict]:
    """The status and JSON answer of `path` with `pairs`, in the query string (GET) or a form body."""
    encoded = urllib.parse.urlencode(pairs)
    if method == "GET":
        request = urllib.request.Request(f"{url}{path}?{encoded}")
    else:
        request = urllib.request.Request(
            f"{url}{path}",
            data=encoded.encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            method="POST",
        )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def both(peers: dict[str, Any], path: str, pairs: list[tuple[str, str]], method: str = "GET") -> dict:
    """The hub's answer to `path`, asserted equal to Prometheus's."""
    ours, theirs = (ask(peers[side], path, pairs, method) for side in ("hub", "prometheus"))
    assert ours == theirs, (path, pairs)
    return ours[1]


def labels_and_values(peers: dict[str, Any], pairs: list[tuple[str, str]], window: str) -> None:
    """Ask both peers for label names and a few labels' values. Over a whole block of Prometheus's (all
    time, or none of it) the answers are the same; over part of one, Prometheus names every series of
    the block whereas the hub names those with a sample in the window: then the hub's answer is what
    Prometheus's own /api/v1/series says of the window, and within Prometheus's."""
    names = ["job", "node", "__name__", "model"]
    paths = ["/api/v1/labels", *(f"/api/v1/label/{name}/values" for name in names)]
    if window in ("all", "before any sample"):
        for path in paths:
            both(peers, path, pairs, "POST" if path.endswith("labels") else "GET")
        return
    matches = (
        pairs if any(name == "match[]" for name, _ in pairs) else [*pairs, ("match[]", '{__name__=~".+"}')]
    )
    series = ask(peers["prometheus"], "/api/v1/series", matches, "GET")[1]["data"]
    for path, name in zip(paths, [None, *names], strict=True):
        ours, theirs = (ask(peers[side], path, pairs, "GET")[1]["data"] for side in ("hub", "prometheus"))
        exact = (
            {label for one in series for label in one}
            if name is None
            else {one[name] for one in series if name in one}
        )
        assert ours == sorted(exact) and set(ours) <= set(theirs), (path, pairs)


@pytest.mark.parametrize("window", sorted(WINDOWS))
@pytest.mark.parametrize("match", MATCHES, ids=" ".join)
def test_series_labels_and_values_answer_as_prometheus_does(peers, window, match):
    pairs = [("match[]", text) for text in match] + sorted(times(window).items())
    series = both(peers, "/api/v1/series", pairs)
    labels_and_values(peers, pairs, window)
    if window == "all" and match != ["fl_none"]:
        assert series["data"], "nothing compared"


@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_labels_and_values_without_match_answer_as_prometheus_does(peers, window):
    labels_and_values(peers, sorted(times(window).items()), window)


@pytest.mark.parametrize(
    ("path", "pairs"),
    [
        ("/api/v1/series", []),
        ("/api/v1/series", [("match[]", "fl_up{")]),
        ("/api/v1/series", [("match[]", "{}")]),
        ("/api/v1/series", [("match[]", "fl_up"), ("start", "yesterday")]),
        ("/api/v1/series", [("match[]", "fl_up"), ("end", "1x")]),
        ("/api/v1/labels", [("match[]", 'fl_up{job=~"("}')]),
        ("/api/v1/series", [("match[]", "fl_up @ 123")]),
        ("/api/v1/series", [("match[]", "fl_up @ start()")]),
        ("/api/v1/series", [("match[]", 'fl_up{job=~"a{1001}"}')]),
        ("/api/v1/query", [("query", 'fl_up{job=~"a{1001}"}')]),
        (
            "/api/v1/query_range",
            [("query", 'fl_up{job!~"(?i)x{2000}"}'), ("start", "0"), ("end", "60"), ("step", "15")],
        ),
        ("/api/v1/label/1bad/values", []),
        ("/api/v1/label/a-b/values", []),
        ("/api/v1/metadata", [("limit", "ten")]),
    ],
)
def test_bad_parameters_answer_bad_data_as_prometheus_does(peers, path, pairs):
    for side in ("hub", "prometheus"):
        status, answer = ask(peers[side], path, pairs, "GET")
        assert (status, answer["status"], answer["errorType"]) == (400, "error", "bad_data"), (side, answer)


def test_a_selector_with_more_than_matchers_is_refused_naming_match(peers):
    status, answer = get(peers["hub"], "/api/v1/series", {"match[]": "rate(fl_up[5m])"})
    assert (status, answer["errorType"]) == (400, "bad_data")
    assert 'invalid parameter "match[]"' in answer["error"]


@pytest.mark.parametrize(
    ("path", "parameters", "named"),
    [
        ("/api/v1/series", {"match[]": "fl_up @ 123"}, "'fl_up @ 123' is not a series selector"),
        ("/api/v1/series", {"match[]": 'fl_up{job=~"a{1001}"}'}, 'in matcher job=~"a{1001}"'),
        ("/api/v1/query", {"query": 'sum(fl_up{node!~"n{1,1001}"})'}, 'in matcher node!~"n{1,1001}"'),
    ],
)
def test_what_prometheus_refuses_in_a_selector_is_named(peers, path, parameters, named):
    status, answer = get(peers["hub"], path, parameters)
    assert (status, answer["errorType"]) == (400, "bad_data")
    assert named in answer["error"]


def test_metadata_names_the_stored_metrics_with_unknown_types(peers):
    status, answer = get(peers["hub"], "/api/v1/metadata", {})
    unknown = [{"type": "unknown", "help": "", "unit": ""}]
    assert status == 200
    assert answer["data"] == {name: unknown for name in ("fl_errors_total", "fl_temp", "fl_up")}
    assert get(peers["hub"], "/api/v1/metadata", {"metric": "fl_temp"})[1]["data"] == {"fl_temp": unknown}
    assert list(get(peers["hub"], "/api/v1/metadata", {"limit": "2"})[1]["data"]) == [
        "fl_errors_total",
        "fl_temp",
    ]
    assert get(peers["hub"], "/api/v1/metadata", {"metric": "fl_none"})[1]["data"] == {}


def test_buildinfo_has_prometheus_fields_and_the_package_version(peers):
    ours, theirs = (get(peers[side], "/api/v1/status/buildinfo", {}) for side in ("hub", "prometheus"))
    assert ours[0] == theirs[0] == 200
    assert set(ours[1]["data"]) == set(theirs[1]["data"])
    assert ours[1]["data"]["version"] == importlib.metadata.version("fleetlens")


@pytest.mark.parametrize(
    "path", ["/api/v1/series", "/api/v1/labels", "/api/v1/label/job/values", "/api/v1/metadata"]
)
def test_the_catalog_needs_a_read_token_and_takes_get_or_post(peers, tmp_path, path):
    store = peers["hub_app"].store
    tokens = Tokens({"reader": frozenset({"read"}), "writer": frozenset({"write"})})
    hub = Hub(store, Writer(store, Spool(tmp_path / "spool", 1 << 20)), OtlpStepReceiver(), tokens=tokens)
    form = urllib.parse.urlencode({"match[]": "fl_up"}).encode()

    def status(method: str, token: str) -> tuple[int, bytes]:
        remote = {"REQUEST_METHOD": method, "REMOTE_ADDR": "10.0.0.7", "HTTP_AUTHORIZATION": token}
        return wsgi_post(hub, path, form, "application/x-www-form-urlencoded", environ=remote)

    code, answer = status("POST", "Bearer reader")
    assert code == 200 and json.loads(answer)["data"]
    assert status("POST", "Bearer writer")[0] == 403
    assert status("GET", "")[0] == 401
    assert status("DELETE", "Bearer reader")[0] == 405

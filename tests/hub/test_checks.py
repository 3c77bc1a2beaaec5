"""The hub's checks door: POST /api/v1/checks stores active checks' verdicts whole, or refuses the request
whole with a 400 naming the result and field; no body, however hostile, is a 500 or stores anything."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analytics.store import Store
from analytics.store.checks import latest_checks
from analytics.store.hubclient import HubClient
from hub.app import Hub
from hub.auth import Tokens
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.support.hubserver import on_loopback
from tests.support.wsgi import wsgi_post

WRITER, READER = "write-token", "read-token"
T0 = 1_767_000_000.0
EXAMPLES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def started_hub(store: Store, spool: Path) -> Hub:
    """A hub on `store` whose clock reads an hour after T0."""
    tokens = Tokens({WRITER: frozenset({"write"}), READER: frozenset({"read"})})
    return Hub(
        store,
        Writer(store, Spool(spool, 1 << 20)),
        OtlpStepReceiver(),
        tokens=tokens,
        wall_clock=lambda: T0 + 3600,
    )


@pytest.fixture
def hub(store: Store, tmp_path: Path) -> Iterator[Hub]:
    yield started_hub(store, tmp_path / "spool")


def autopilot_lines(hub: Hub) -> list[str]:
    with on_loopback(hub) as url, urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return sorted(line for line in response.read().decode().splitlines() if line.startswith("autopilot_"))


def result(**changes: object) -> dict:
    return {
        "node": "vela-001",
        "check": "ping",
        "target": "peer:vela-002",
        "status": "PASS",
        "value": 0.21,
        "unit": "ms",
        "threshold": 1.0,
        "started": T0,
        "duration_s": 2.5,
        "evidence": {"loss_pct": 0.0},
        **changes,
    }


def post(hub: Hub, body: bytes | list, token: str = WRITER) -> tuple[int, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, answer = wsgi_post(hub, "/api/v1/checks", data, environ={"HTTP_AUTHORIZATION": f"Bearer {token}"})
    return status, answer.decode()


def stored(store: Store) -> int:
    return store.query("SELECT count() FROM checks").rows[0][0]


def test_an_array_and_json_lines_are_stored_and_read_back(hub: Hub, store: Store) -> None:
    assert post(hub, [result(), result(target="", status="FAIL", value=None)]) == (200, '{"stored": 2}')
    line = json.dumps(result(node="vela-003", started=T0 + 1)).encode()
    assert post(hub, line + b"\n") == (200, '{"stored": 1}')
    rows = store.checks_between(T0, T0 + 2)
    assert [(row.node, row.target, row.status, row.value) for row in rows] == [
        ("vela-001", "", "FAIL", None),
        ("vela-001", "peer:vela-002", "PASS", 0.21),
        ("vela-003", "peer:vela-002", "PASS", 0.21),
    ]
    assert json.loads(rows[1].evidence) == {"loss_pct": 0.0}


def test_metrics_show_the_last_result_of_each_check_as_autopilot_s_gauge(hub: Hub) -> None:
    dcgm = {"check": "dcgm_diag", "unit": "", "value": None, "threshold": None}
    post(hub, [result(), result(**dcgm, target="gpu:3", status="FAIL"), result(**dcgm, target="gpu:1")])
    post(hub, [result(value=0.4, started=T0 + 60), result(value=9.0, started=T0 - 60)])  # one late, older
    assert autopilot_lines(hub) == [
        'autopilot_health_checks{health="dcgm_diag",node="vela-001",deviceid="1"} 0',
        'autopilot_health_checks{health="dcgm_diag",node="vela-001",deviceid="3"} 1',
        'autopilot_health_checks{health="ping",node="vela-001",deviceid="peer:vela-002"} 0.4',
    ]


def test_a_restarted_hub_still_shows_the_gauge_and_forgets_results_over_a_day_old(
    hub: Hub, store: Store, tmp_path: Path
) -> None:
    post(hub, [result(status="FAIL", value=None), result(node="vela-009", started=T0 - 2 * 86_400)])
    restarted = started_hub(store, tmp_path / "spool-after-restart")
    assert autopilot_lines(restarted) == [
        'autopilot_health_checks{health="ping",node="vela-001",deviceid="peer:vela-002"} 1',
    ]


def test_a_read_token_may_not_post_checks(hub: Hub, store: Store) -> None:
    assert post(hub, [result()], token=READER)[0] == 403
    assert stored(store) == 0


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"status": "HEALTHY"}, "checks[1].status: expected one of PASS, WARN, FAIL, ERROR"),
        ({"value": "fast"}, "checks[1].value: expected a finite number or null"),
        ({"node": "vela\n001"}, "checks[1].node"),
        ({"target": "peer:"}, "checks[1].target"),
        ({"check": "DROP TABLE"}, "checks[1].check: expected a lower-case identifier"),
        ({"started": -5}, "checks[1].started: expected a number from 0"),
        ({"evidence": ["x"]}, "checks[1].evidence: expected a JSON object"),
        ({"extra": 1}, "checks[1]: unknown field(s) extra"),
    ],
)
def test_one_bad_result_refuses_the_request_whole_naming_it(
    hub: Hub, store: Store, bad: dict, named: str
) -> None:
    status, answer = post(hub, [result(), result(**bad)])
    assert status == 400 and named in answer
    assert stored(store) == 0


def test_a_non_finite_number_in_the_body_is_refused(hub: Hub, store: Store) -> None:
    status, answer = post(hub, json.dumps([result(value=float("nan"))]).encode())
    assert status == 400 and "checks[0].value" in answer
    assert stored(store) == 0


JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
HOSTILE = st.one_of(
    st.binary(max_size=300),
    JSON.map(lambda value: json.dumps(value).encode()),
    st.dictionaries(st.sampled_from(sorted(result())), JSON, max_size=10).map(
        lambda changes: json.dumps([{**result(), **changes, "status": "BAD"}]).encode()
    ),
)


@EXAMPLES
@given(body=HOSTILE)
def test_hostile_bodies_are_refused_and_store_nothing(hub: Hub, store: Store, body: bytes) -> None:
    status, _ = post(hub, body)
    assert status == 400 or (status == 200 and body.strip() in (b"[]", b"")), body
    assert stored(store) == 0


def test_the_latest_results_read_through_the_hubs_query_api_as_from_the_store(hub: Hub, store: Store) -> None:
    post(hub, [result(status="FAIL", value=None), result(started=T0 + 5), result(node="vela-002")])
    with on_loopback(hub) as url:
        through_hub = latest_checks(HubClient(url, token=READER), T0, T0 + 10)
    assert through_hub == latest_checks(store, T0, T0 + 10)
    assert [(row.node, row.status, row.started) for row in through_hub] == [
        ("vela-001", "PASS", T0 + 5),
        ("vela-002", "PASS", T0),
    ]

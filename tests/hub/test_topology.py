"""The hub's topology door: POST /api/v1/topology (write scope, body limits, a bad file refused whole) and
the operator's inventory file re-read when it changes."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from analytics.errors import TopologyError
from analytics.store import Store
from analytics.topology.view import node_views
from hub.app import Hub
from hub.auth import Tokens
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.topology import InventoryFile
from hub.writer import Writer
from tests.support.clock import FakeClock
from tests.support.hubserver import on_loopback

READER, WRITER = "read-token", "write-token"
MAX_BODY = 4096
INVENTORY = "nodes:\n  vela-001: {host: host-000}\nhosts:\n  host-000: {leaf: leaf-00}\n"
T0 = 1_767_000_000.0


@pytest.fixture
def hub_url(store: Store, tmp_path: Path) -> Iterator[str]:
    tokens = Tokens({READER: frozenset({"read"}), WRITER: frozenset({"write"})})
    writer = Writer(store, Spool(tmp_path / "spool", 1 << 20))
    hub = Hub(store, writer, OtlpStepReceiver(), tokens=tokens, max_body_bytes=MAX_BODY)
    with on_loopback(hub) as url:
        yield url


def post(url: str, body: bytes | dict, token: str | None = WRITER) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(f"{url}/api/v1/topology", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def views(store: Store, ts: float) -> list[dict]:
    return node_views(store.topology_at(ts))


def test_a_write_token_stores_an_inventory_and_sending_it_again_changes_nothing(hub_url, store):
    request = {"format": "inventory", "text": INVENTORY, "file": "racks.yaml"}
    assert post(hub_url, request) == (200, {"links": 2, "opened": 2, "closed": 0, "unchanged": 0})
    assert post(hub_url, request) == (200, {"links": 2, "opened": 0, "closed": 0, "unchanged": 2})
    assert [view["leaf"] for view in node_views(store.topology_at(9e9))] == ["leaf-00"]


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("wrong", 401), (READER, 403)])
def test_only_a_write_token_may_send_topology(hub_url, store, token, status):
    assert post(hub_url, {"format": "inventory", "text": INVENTORY}, token)[0] == status
    assert store.topology_at(9e9) == []


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"format": "inventory", "text": "nodes: {a: {rack: [r]}}", "file": "f.yaml"},
            "f.yaml: line 1: nodes.a.rack",
        ),
        (
            {"format": "inventory", "text": "nodes: {a: {host: h}}\nleafs: {}"},
            "the request: line 2: unknown section",
        ),
        (
            {"format": "gml", "text": ""},
            "format: 'gml': not a topology format; known: guest, host-agent, ibnetdiscover",
        ),
        (
            {"format": "inventory", "text": INVENTORY, "reporter": "a\nb"},
            "reporter: name 'a\\nb' holds a control",
        ),
        ({"format": "inventory", "text": INVENTORY, "source": "x"}, "unknown field(s) source"),
        ({"format": "inventory"}, "with format and text strings"),
        ({"format": "inventory", "text": INVENTORY, "file": 3}, "file: expected a string, got a number"),
        (b"[1]", "expected a JSON object"),
        ({"format": "inventory", "text": "#" * MAX_BODY}, "over the limit of max_body_bytes=4096"),
    ],
)
def test_a_bad_request_is_refused_naming_what_is_wrong_and_nothing_is_stored(hub_url, store, body, error):
    status, answer = post(hub_url, body)
    assert status in (400, 413) and error in answer["error"], answer
    assert store.topology_at(9e9) == []


def test_the_inventory_file_is_stored_and_replaced_when_it_changes_and_a_broken_one_keeps_the_last_good(
    store, tmp_path, caplog
):
    path, clock = tmp_path / "topology.yaml", FakeClock(T0)
    path.write_text(INVENTORY)
    watched = InventoryFile(path, store, clock)
    watched.check()
    assert views(store, T0) == [{"node": "vela-001", "host": "host-000", "leaf": "leaf-00"}]
    clock.advance(60)
    path.write_text(INVENTORY.replace("leaf-00", "leaf-01") + "  host-001: {leaf: leaf-01}\n")
    watched.check()
    clock.advance(60)
    path.write_text("nodes: {vela-001: {host: host-000}\n")  # an editor caught half-way
    with caplog.at_level(logging.ERROR, logger="fleetlens.topology"):
        watched.check()
    assert "not YAML or JSON" in caplog.text and "keeping the inventory's last good links" in caplog.text
    assert views(store, T0 + 30) == [{"node": "vela-001", "host": "host-000", "leaf": "leaf-00"}]
    assert views(store, T0 + 150) == [{"node": "vela-001", "host": "host-000", "leaf": "leaf-01"}]


def test_a_hub_does_not_start_on_a_broken_inventory(store, tmp_path):
    path = tmp_path / "topology.yaml"
    path.write_text("nodes: {vela-001: {hots: host-000}}\n")
    with pytest.raises(TopologyError, match=r"topology.yaml: line 1: nodes.vela-001: unknown key 'hots'"):
        InventoryFile(path, store)

"""The read attacks on a real `fleetlens hub` over its HTTP API on loopback: each refused by the store
naming the hub's limit, the hub's peak memory bounded, and a client that holds its query slots answered
429 with Retry-After while another client's SELECT 1 is answered at once."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.hubserver import HubProcess
from tests.support.queryattacks import (
    BIG_VALUE,
    CONCURRENT_BIG_VALUES,
    HUGE_STATE,
    HUGE_VALUE,
    LONG_QUERY,
)

READER_A, READER_B = "reader-a", "reader-b"
QUERY_MAX_S = 5
GiB = 1 << 30


@pytest.fixture(scope="module")
def shared_hub_flags(shared_hub_dir: Path) -> tuple[str, ...]:
    tokens = shared_hub_dir / "tokens"
    tokens.write_text(f"read {READER_A}\nread {READER_B}\n")
    tokens.chmod(0o600)
    return ("--token-file", str(tokens))


@pytest.fixture(scope="module")
def shared_hub_env() -> dict[str, str]:
    return {"FLEETLENS_HUB_QUERY_MAX_SECONDS": str(QUERY_MAX_S), "FLEETLENS_HUB_QUERY_QUEUE_S": "1"}


@pytest.fixture(scope="module")
def hub(shared_hub: HubProcess) -> tuple[str, int]:
    """`fleetlens hub` with two read tokens, queries of at most QUERY_MAX_S that wait 1 s for a slot:
    its URL and process id."""
    return shared_hub.url, shared_hub.process.pid


def ask(url: str, sql: str, token: str) -> tuple[int, dict, dict]:
    """(status, JSON answer, headers) of one query."""
    body = json.dumps({"sql": sql}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url + "/api/v1/sql", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def peak_rss(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def hub_gauge(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} on the hub's /metrics")


def test_the_attacks_are_refused_naming_the_limit_and_the_hubs_memory_stays_bounded(hub):
    url, pid = hub
    for token in (READER_A, READER_B):  # the policy loaded and a session open: what every query costs
        assert ask(url, "SELECT 1", token)[1]["rows"] == [[1]]
    before = peak_rss(pid)
    for sql in (HUGE_VALUE, HUGE_STATE):
        status, answer, _ = ask(url, sql, READER_A)
        assert status == 400 and "(hub.query_max_memory_bytes)" in answer["error"], answer
    answers: list[tuple[int, dict, dict]] = []
    clients = [
        threading.Thread(target=lambda token=token: answers.append(ask(url, BIG_VALUE, token)))
        for token in [READER_A, READER_B] * (CONCURRENT_BIG_VALUES // 2)
    ]
    for client in clients:
        client.start()
    for client in clients:
        client.join(60)
    assert [status for status, _, _ in answers] == [400] * CONCURRENT_BIG_VALUES
    assert all("too large" in answer["error"] for _, answer, _ in answers), answers
    assert peak_rss(pid) - before <= GiB
    assert ask(url, "SELECT count() FROM numbers(1000)", READER_A)[1]["rows"] == [[1000]]


def test_a_client_holding_its_slots_gets_429_and_another_clients_select_1_is_answered(hub):
    url, _ = hub
    held: list[tuple[int, dict, dict]] = []
    holders = [threading.Thread(target=lambda: held.append(ask(url, LONG_QUERY, READER_A))) for _ in range(2)]
    for holder in holders:
        holder.start()
    deadline = time.monotonic() + 60
    while hub_gauge(url, "fleetlens_hub_queries_running") < 2:
        assert time.monotonic() < deadline and all(h.is_alive() for h in holders), held
        time.sleep(0.05)
    status, answer, headers = ask(url, "SELECT 1", READER_A)
    assert status == 429, answer
    assert "(hub.query_slots_per_client)" in answer["error"]
    assert 1 <= int(headers["Retry-After"]) <= QUERY_MAX_S
    status, answer, _ = ask(url, "SELECT 1", READER_B)
    assert (status, answer["rows"]) == (200, [[1]])
    assert all(holder.is_alive() for holder in holders)  # B was answered while A's queries ran
    for holder in holders:
        holder.join(60)
    assert [status for status, _, _ in held] == [400, 400]
    assert all("(hub.query_max_seconds)" in answer["error"] for _, answer, _ in held), held

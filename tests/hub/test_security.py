"""The hub's API boundary, tried as an attacker would against a real `fleetlens hub` scraping a real exporter:
the escape corpus (tests/support/escapes.py) through the query API, scoped tokens, loopback-only service
without a token (and no start on another address without one), bodies over the limit answered in a way
the client reads, and HEAD where GET is served."""

from __future__ import annotations

import collections
import io
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from analytics.store import schema
from collectors.steps import StepTracker
from hub.app import Hub
from hub.otlp import OtlpStepReceiver
from hub.spool import Spool
from hub.writer import Writer
from tests.support import escapes
from tests.support.clock import FakeClock
from tests.support.hubserver import HubProcess, hub_command, hub_environment, hub_process
from tests.support.peers import fleetlens_exporter, free_port, peer

ADMIN, READER, WRITER, ACTOR = "admin-token", "read-token", "write-token", "act-token"
OVER_THE_LIMIT = 25_000_000  # body bytes: over the hub's default max_body_bytes (16 MiB)


class Listener:
    """A loopback TCP server that counts the connections reaching it: any is a query that got out."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()


def post(url: str, path: str, body: bytes, token: str | None, content_type: str = "application/json"):
    """(status, answer) of one POST."""
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def query(url: str, sql: str, token: str = ADMIN) -> list:
    status, answer = post(url, "/api/v1/sql", json.dumps({"sql": sql}).encode(), token)
    assert status == 200, answer
    return json.loads(answer)["rows"]


def step_lines(step: int) -> bytes:
    return "\n".join(
        json.dumps(
            {"ts": time.time(), "job": "j", "rank": r, "node": "vela-001", "step": step, "duration_s": 1}
        )
        for r in range(4)
    ).encode()


@pytest.fixture(scope="module")
def shared_hub_flags(procfs_sys: Path, shared_hub_dir: Path) -> Iterator[tuple[str, ...]]:
    """Scoped tokens in a token file and a real exporter, running while the hub does, scraped every second."""
    exporter_args, metrics_url = fleetlens_exporter(
        "--gpu-backend", "sim", "--sysfs-root", str(procfs_sys), "--node", "vela-001"
    )
    tokens = shared_hub_dir / "tokens"
    tokens.write_text(f"# scoped tokens\nread {READER}\nwrite {WRITER}\nact {ACTOR}\n")
    tokens.chmod(0o600)
    targets = shared_hub_dir / "targets.json"
    targets.write_text(json.dumps([{"targets": [metrics_url.split("/")[2]], "labels": {"node": "vela-001"}}]))
    with peer(exporter_args, metrics_url):
        yield ("--targets", str(targets), "--interval-s", "1", "--token-file", str(tokens))


@pytest.fixture(scope="module")
def shared_hub_env() -> dict[str, str]:
    return {"FLEETLENS_API_TOKEN": ADMIN}


@pytest.fixture(scope="module")
def hub(shared_hub: HubProcess, shared_hub_dir: Path) -> dict:
    """`fleetlens hub` (admin token in FLEETLENS_API_TOKEN, scoped ones in a token file) scraping a real
    exporter every second; its URL, work directory and the canary directory."""
    canary = shared_hub_dir / "canary"
    canary.mkdir()
    return {"url": shared_hub.url, "work": shared_hub_dir, "canary": canary}


def samples_stored(url: str) -> int:
    return query(url, "SELECT count() FROM samples")[0][0]


def test_the_escape_corpus_is_refused_and_leaves_no_trace(hub):
    url, canary = hub["url"], hub["canary"]
    listener = Listener()
    assert post(url, "/api/v1/steps", step_lines(1), WRITER, "application/x-ndjson")[0] == 200
    tables_before = {table: query(url, f"SELECT count() > -1 FROM {table}") for table in schema.READABLE}

    outcomes = escapes.run(url, ADMIN, str(canary), listener.address)

    answered = collections.Counter(outcome.status for outcome in outcomes)
    through = [f"{o.status} {o.family}: {o.sql!r} -> {o.answer[:120]}" for o in outcomes if o.status != 400]
    assert not through, "\n".join(through)
    assert len(outcomes) >= 150 and answered == {400: len(outcomes)}
    assert all("root:x:0:0" not in outcome.answer for outcome in outcomes)  # nothing of /etc/passwd came back
    assert listener.connections == 0  # no URL, remote server or database was reached
    assert list(canary.iterdir()) == []  # no file was written
    assert {
        table: query(url, f"SELECT count() > -1 FROM {table}") for table in schema.READABLE
    } == tables_before
    # ingest keeps working: scrapes keep landing and step records are stored, none set aside
    scraped = samples_stored(url)
    assert post(url, "/api/v1/steps", step_lines(2), WRITER, "application/x-ndjson")[0] == 200
    deadline = time.monotonic() + 20
    while samples_stored(url) <= scraped and time.monotonic() < deadline:
        time.sleep(0.5)
    assert samples_stored(url) > scraped
    assert query(url, "SELECT count() FROM steps") == [[8]]
    assert not any((hub["work"] / "spool" / "rejected").iterdir())


def test_tricky_reads_are_still_answered(hub):
    url = hub["url"]
    assert query(url, "SELECT $$; DROP TABLE steps; $$ AS s") == [["; DROP TABLE steps; "]]
    assert query(url, "SELECT 'INTO OUTFILE file(' AS s -- ; DROP TABLE steps") == [["INTO OUTFILE file("]]
    assert query(url, "WITH q AS (SELECT node FROM samples) SELECT count() > 0 FROM q") == [[1]]
    assert query(url, "SELECT number FROM numbers(3) ORDER BY number DESC") == [[2], [1], [0]]


def request_body(action: str) -> bytes:
    """A person's request to the hub's controller (`fleetlens drain undrain`, `fleetlens alerts test`)."""
    row = {"ts": time.time(), "action": action, "node": "vela-001", "job": "", "reason": "r", "mode": ""}
    return json.dumps({"token": "t", "rows": [row | {"outcome": "requested", "decision_id": ""}]}).encode()


@pytest.mark.parametrize(
    ("path", "body", "content_type", "allowed"),
    [
        ("/api/v1/sql", json.dumps({"sql": "SELECT 1"}).encode(), "application/json", {READER, ADMIN}),
        ("/api/v1/steps", step_lines(3), "application/x-ndjson", {WRITER, ADMIN}),
        (
            "/api/v1/topology",
            json.dumps({"format": "inventory", "text": "nodes: {vela-001: {host: host-000}}"}).encode(),
            "application/json",
            {WRITER, ADMIN},
        ),
        ("/api/v1/actions", request_body("undrain"), "application/json", {ACTOR, ADMIN}),
        ("/api/v1/actions", request_body("test"), "application/json", {ACTOR, ADMIN}),  # the lifecycle's
    ],
)
def test_each_token_reaches_only_its_scope(hub, path, body, content_type, allowed):
    for token in (READER, WRITER, ACTOR, ADMIN):
        status, answer = post(hub["url"], path, body, token, content_type)
        assert (status == 200) == (token in allowed), (token, status, answer)
        if token not in allowed:
            assert status == 403 and "may not" in answer
    for token in (None, "wrong-token"):
        assert post(hub["url"], path, body, token, content_type)[0] == 401


def test_without_a_token_only_loopback_clients_are_served(store, tmp_path):
    hub = Hub(store, Writer(store, Spool(tmp_path / "spool", 1 << 20)), OtlpStepReceiver())
    body = json.dumps({"sql": "SELECT 1"}).encode()

    def answer(address: str) -> str:
        statuses = []
        environ = {
            "REQUEST_METHOD": "POST",
            "PATH_INFO": "/api/v1/sql",
            "REMOTE_ADDR": address,
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body),
        }
        hub.app(environ, lambda status, headers: statuses.append(status))
        return statuses[0]

    try:
        for address in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"):
            assert answer(address).startswith("200"), address
        for address in ("10.1.2.3", "192.168.0.7", "2001:db8::1", "::ffff:10.0.0.1", "not-an-address"):
            assert answer(address).startswith("403"), address
    finally:
        hub.writer.close()


def test_a_hub_without_a_token_says_so_when_it_starts(tmp_path):
    with hub_process(tmp_path) as hub:
        pass
    output = hub.log.read_text()
    assert "the API answers loopback clients only" in output, output


def test_the_step_sdk_sends_its_write_token_from_the_standard_otlp_headers(hub, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{WRITER}")
    clock = FakeClock()
    tracker = StepTracker(
        job="tokened", rank=1, node="vela-001", clock=clock, environ={}, otlp_endpoint=hub["url"]
    )
    for _ in range(3):
        with tracker.step():
            clock.advance(1.0)
    tracker.close()
    assert tracker.otlp_failures == 0
    assert query(hub["url"], "SELECT sum(steps) FROM steps WHERE job = 'tokened'") == [[3]]


def exchange(url: str, head: list[str], body: Iterable[bytes] = ()) -> tuple[int, dict[str, str], bytes]:
    """One request over a plain socket: its head lines, then all of its body sent before anything is read
    (as most clients do), then the whole answer up to the hub's close: (status, headers, body). A reset
    while sending or reading raises, as it does in a client."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as connection:
        connection.sendall(("\r\n".join([*head, f"Host: {host}"]) + "\r\n\r\n").encode())
        for part in body:
            connection.sendall(part)
        answer = bytearray()
        while data := connection.recv(1 << 16):
            answer += data
    head_text, _, content = bytes(answer).partition(b"\r\n\r\n")
    status_line, *header_lines = head_text.decode("latin-1").split("\r\n")
    headers = {
        name.lower(): value.strip() for name, _, value in (line.partition(":") for line in header_lines)
    }
    return int(status_line.split()[1]), headers, content


def chunked(size: int, piece: int = 1 << 20) -> Iterator[bytes]:
    """`size` bytes of step-lines-like text in chunks of `piece` bytes, chunked transfer coding."""
    for start in range(0, size, piece):
        data = b"x" * min(piece, size - start)
        yield b"%x\r\n%s\r\n" % (len(data), data)
    yield b"0\r\n\r\n"


@pytest.mark.parametrize("framing", ["Content-Length", "chunked"])
@pytest.mark.parametrize(("token", "status"), [(WRITER, 413), (None, 401)])
def test_a_body_over_the_limit_gets_an_answer_the_client_reads(hub, framing, token, status):
    """A client that sends 25 MB reads its 413 (or, without a token, its 401) as JSON naming the limit,
    whether it declared the size or its chunks grew past the limit; the hub goes on taking steps."""
    head = ["POST /api/v1/steps HTTP/1.1", "Content-Type: application/x-ndjson"]
    if token:
        head.append(f"Authorization: Bearer {token}")
    if framing == "chunked":
        head.append("Transfer-Encoding: chunked")
        body = chunked(OVER_THE_LIMIT)
    else:
        head.append(f"Content-Length: {OVER_THE_LIMIT}")
        body = [b"x" * OVER_THE_LIMIT]
    answered, headers, answer = exchange(hub["url"], head, body)
    assert (answered, headers["content-type"]) == (status, "application/json"), answer[:300]
    error = json.loads(answer)["error"]
    assert "max_body_bytes=16777216" in error if status == 413 else "token" in error
    assert post(hub["url"], "/api/v1/steps", step_lines(10), WRITER, "application/x-ndjson")[0] == 200


def test_a_chunked_body_within_the_limit_is_read_whole(hub):
    lines = step_lines(11)
    head = [
        "POST /api/v1/steps HTTP/1.1",
        "Content-Type: application/x-ndjson",
        f"Authorization: Bearer {WRITER}",
        "Transfer-Encoding: chunked",
    ]
    pieces = [lines[i : i + 50] for i in range(0, len(lines), 50)]
    body = [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces] + [b"0\r\n\r\n"]
    status, _, answer = exchange(hub["url"], head, body)
    assert (status, json.loads(answer)) == (200, {"rows": 4})


@pytest.mark.parametrize(
    ("framing", "status", "error"),
    [
        (
            ["Transfer-Encoding: chunked", "Content-Length: 5"],
            400,
            "both Transfer-Encoding and Content-Length",
        ),
        (["Transfer-Encoding: gzip, chunked"], 501, "is not supported"),
        (["Transfer-Encoding: chunked"], 400, "bad chunk size line"),
    ],
)
def test_ambiguous_or_broken_framing_is_refused(hub, framing, status, error):
    head = ["POST /api/v1/steps HTTP/1.1", f"Authorization: Bearer {WRITER}", *framing]
    answered, _, answer = exchange(hub["url"], head, [b"zz\r\nhello\r\n0\r\n\r\n"])
    assert answered == status and error in json.loads(answer)["error"]


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
def test_head_is_answered_as_get_without_a_body(hub, path):
    status, get_headers, content = exchange(hub["url"], [f"GET {path} HTTP/1.1"])
    assert status == 200 and content
    status, headers, nothing = exchange(hub["url"], [f"HEAD {path} HTTP/1.1"])
    assert (status, nothing) == (200, b"")
    assert headers["content-type"] == get_headers["content-type"]
    if path == "/healthz":  # /metrics changes between two reads
        assert headers["content-length"] == get_headers["content-length"] == str(len(content))
    status, headers, _ = exchange(hub["url"], [f"POST {path} HTTP/1.1", "Content-Length: 0"])
    assert (status, headers["allow"]) == (405, "GET, HEAD")


def test_a_hub_without_a_token_refuses_to_listen_beyond_loopback(tmp_path):
    """Without a token the API answers loopback clients only: listening on every interface is refused with
    the usual one-line configuration error, before the store is opened, unless the flag says it is meant."""
    env = hub_environment()
    hub_args = hub_command(tmp_path, listen=f"0.0.0.0:{free_port()}")
    refused = subprocess.run(hub_args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("fleetlens: configuration error: hub.listen 0.0.0.0:")
    assert refused.stderr.count("\n") == 1 and "--listen-without-token" in refused.stderr
    assert not (tmp_path / "store").exists()

    with hub_process(tmp_path, "--listen-without-token", listen_host="0.0.0.0") as hub:
        query_body = json.dumps({"sql": "SELECT 1"}).encode()
        assert post(hub.url, "/api/v1/sql", query_body, None)[0] == 200

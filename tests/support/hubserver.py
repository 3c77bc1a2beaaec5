"""A hub for a test: in-process on loopback (`on_loopback`), or the real `fleetlens hub` program as its own
process (`hub_process`) on a free loopback port, ended by its PID."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.httpserver import serve_app
from fleetlens.demo.peers import free_port, stop, wait_http
from fleetlens.errors import DemoError
from hub.app import Hub

READY_TIMEOUT_S = 60.0  # a hub opening a chDB store on a busy machine takes its time
STOP_TIMEOUT_S = 60.0  # a clean stop writes what it holds; SIGKILL only after this


@contextlib.contextmanager
def on_loopback(hub: Hub) -> Iterator[str]:
    """Serve `hub`'s API on a free loopback port until the block ends (its URL), then close its writer."""
    server = serve_app(hub.app, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        hub.writer.close()


@dataclass(frozen=True)
class HubProcess:
    """A running `fleetlens hub`: its base URL on loopback, its process and the file its output goes to."""

    url: str
    process: subprocess.Popen
    log: Path


def hub_command(
    work: Path, *flags: str, store: str | None = None, listen: str, log_level: str | None = None
) -> list[str]:
    """The command line of `fleetlens hub` on `store` (default: chDB in `work`/store) listening on `listen`,
    running no detector unless `flags` say otherwise (a later flag wins)."""
    level = ["--log-level", log_level] if log_level else []
    return [
        *(sys.executable, "-m", "fleetlens.cli", *level, "hub"),
        *("--store", store or f"chdb://{work / 'store'}", "--listen", listen, "--detectors", "none"),
        *flags,
    ]


def hub_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without its FLEETLENS_* settings, plus `env`: a test's hub is configured by
    what the test gives it only."""
    inherited = {key: value for key, value in os.environ.items() if not key.startswith("FLEETLENS_")}
    return {**inherited, **(env or {})}


@contextlib.contextmanager
def hub_process(
    work: Path,
    *flags: str,
    store: str | None = None,
    env: Mapping[str, str] | None = None,
    log_level: str | None = None,
    listen_host: str = "127.0.0.1",
    log_name: str = "hub.log",
) -> Iterator[HubProcess]:
    """Run `fleetlens hub` (see `hub_command`) on a free port until the block ends; it has started once its
    /healthz answers on loopback.

    It runs in `work` (a relative spool lands there), its output in `work`/`log_name`. Its settings come
    from its flags, its config and `env` only (`hub_environment`). A hub that exits or does not answer
    within READY_TIMEOUT_S fails the test with its log. At the end it is ended by its PID (SIGTERM, then
    SIGKILL past STOP_TIMEOUT_S) unless it has exited already.
    """
    port = free_port()
    args = hub_command(work, *flags, store=store, listen=f"{listen_host}:{port}", log_level=log_level)
    log = work / log_name
    with log.open("w") as output:
        process = subprocess.Popen(
            args, cwd=work, env=hub_environment(env), stdout=output, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_http(f"{url}/healthz", process, timeout=READY_TIMEOUT_S)
        except DemoError as failed:  # it exited (ChildExited) or never answered
            raise RuntimeError(
                f"fleetlens hub did not start: {failed}\n{log.read_text(errors='replace')}"
            ) from None
        yield HubProcess(url, process, log)
    finally:
        stop(process, timeout_s=STOP_TIMEOUT_S)


def query_hub(url: str, sql: str) -> list[dict[str, Any]]:
    """The rows `fleetlens query SQL --hub URL --json` prints (run with none of this shell's FLEETLENS_*
    settings), as a user asking the hub would see them."""
    answer = subprocess.run(
        [sys.executable, "-m", "fleetlens.cli", "query", sql, "--hub", url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={key: value for key, value in os.environ.items() if not key.startswith("FLEETLENS_")},
    )
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)

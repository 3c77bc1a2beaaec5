"""How many attempts of the escape corpus (tests/support/escapes.py) get through a hub's query API.

Starts `fleetlens hub` (with an API token, as an attacker holding one would face it), tries every attempt
once, and reports per family how many were answered 200, how many got no answer, what reached a loopback
listener (url(), remote(), ...), what was written to a watched directory, and whether ingest still works
afterwards (a step record posted then must be stored, none set aside). `--hub-code DIR` runs the hub from
another checkout (e.g. the code before a change, from `git archive`), for a before-and-after on one machine.

    .venv/bin/python bench/escape_corpus.py [--hub-code /tmp/old]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import escapes
from tests.support.peers import free_port, stop, wait_http

TOKEN = "bench-token"


def listen() -> tuple[str, list[tuple]]:
    """A loopback listener that notes every connection; its address and the list it notes them in."""
    sock = socket.create_server(("127.0.0.1", 0))
    seen: list[tuple] = []

    def accept() -> None:
        while True:
            connection, peer = sock.accept()
            seen.append(peer)
            connection.close()

    threading.Thread(target=accept, daemon=True).start()
    return f"127.0.0.1:{sock.getsockname()[1]}", seen


def post_steps(url: str, step: int) -> int:
    lines = "\n".join(
        json.dumps({"ts": time.time(), "job": "bench", "rank": r, "node": "n", "step": step, "duration_s": 1})
        for r in range(4)
    )
    headers = {"Content-Type": "application/x-ndjson", "Authorization": f"Bearer {TOKEN}"}
    request = urllib.request.Request(f"{url}/api/v1/steps", lines.encode(), headers, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


def stored_steps(url: str) -> str:
    status, answer = escapes.post_query(url, TOKEN, "SELECT count() FROM steps")
    return str(json.loads(answer)["rows"][0][0]) if status == 200 else f"{status}: {answer[:80]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hub-code", help="a checkout to run the hub from (default: this one)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="escape-corpus-"))
    canary = work / "canary"
    canary.mkdir()
    listener, connections = listen()
    port = free_port()
    env = {**os.environ, "FLEETLENS_API_TOKEN": TOKEN}
    if args.hub_code:
        env["PYTHONPATH"] = args.hub_code
    hub_args = [
        *(sys.executable, "-m", "fleetlens.cli", "--log-level", "WARNING", "hub"),
        *("--store", f"chdb://{work}/store", "--listen", f"127.0.0.1:{port}", "--detectors", "none"),
    ]
    url = f"http://127.0.0.1:{port}"
    with (work / "hub.log").open("w") as log:
        hub = subprocess.Popen(hub_args, cwd=work, env=env, stdout=log, stderr=log)
    try:
        wait_http(f"{url}/healthz", hub, timeout=60)
        post_steps(url, 1)
        outcomes = escapes.run(url, TOKEN, str(canary), listener)
        time.sleep(1)
        after = post_steps(url, 2)
        time.sleep(2)
        steps = stored_steps(url)
    finally:
        stop(hub, timeout_s=30)
    rejected = work / "spool" / "rejected"

    print(f"hub from {args.hub_code or 'this checkout'}: {len(outcomes)} attempts")
    answers = collections.Counter(outcome.status for outcome in outcomes)
    print(
        "answers: " + ", ".join(f"{status or 'none'} x{count}" for status, count in sorted(answers.items()))
    )
    for family in escapes.FAMILIES:
        mine = [outcome for outcome in outcomes if outcome.family == family]
        through = sum(outcome.status == 200 for outcome in mine)
        print(f"  {family}: {through} of {len(mine)} answered 200")
    for outcome in outcomes:
        if outcome.status not in (400, 401, 403):
            print(f"    {outcome.status or 'no answer'}: {outcome.sql!r:.90} -> {outcome.answer[:70]!r}")
    print(f"connections to the loopback listener: {len(connections)}")
    print(f"files written: {sorted(path.name for path in canary.iterdir())}")
    print(f"after the corpus: a step batch answered {after}; steps stored {steps} (8 expected)")
    print(f"batches set aside as rejected: {len(list(rejected.iterdir())) if rejected.is_dir() else 0}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The exec hook backend runs a real command with the decision in its environment and on stdin."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from alerts.backends.exec_hook import ExecBackend
from alerts.errors import AlertConfigError, BackendError
from alerts.model import DrainRequest

REQUEST = DrainRequest("d-1", "vela-007", "gpu_fault", "0123456789abcdef", job="llm", severity="critical")

# Appends what it got (environment and stdin) to the file named by its first argument.
RECORDER = """
import json, os, sys
fields = {k: v for k, v in os.environ.items() if k.startswith("FLEETLENS_")}
with open(sys.argv[1], "a") as out:
    out.write(json.dumps({"env": fields, "stdin": json.load(sys.stdin)}) + "\\n")
"""


def test_drain_and_resume_run_the_command_with_the_decision_in_env_and_on_stdin(tmp_path: Path):
    log = tmp_path / "calls.jsonl"
    backend = ExecBackend([sys.executable, "-c", RECORDER, str(log)])
    backend.drain(REQUEST)
    backend.resume(REQUEST)

    drain, resume = (json.loads(line) for line in log.read_text().splitlines())
    assert drain["env"]["FLEETLENS_ACTION"] == "drain" and resume["stdin"]["action"] == "resume"
    assert drain["env"]["FLEETLENS_NODE"] == "vela-007" and drain["stdin"]["kind"] == "gpu_fault"
    assert drain["env"]["FLEETLENS_REASON"] == "fleetlens: gpu_fault 0123456789abcdef"
    assert drain["stdin"] == {key.removeprefix("FLEETLENS_").lower(): v for key, v in drain["env"].items()}


def test_a_failing_missing_or_hung_command_is_a_backend_error_naming_node_and_command():
    failing = ExecBackend(
        [sys.executable, "-c", "import sys; sys.stderr.write('ticket system down'); sys.exit(3)"]
    )
    with pytest.raises(BackendError, match=r"drain vela-007: .* exited with status 3: ticket system down"):
        failing.drain(REQUEST)
    with pytest.raises(BackendError, match="cannot run"):
        ExecBackend(["/nonexistent/drain-node"]).drain(REQUEST)
    with pytest.raises(BackendError, match=r"did not finish within 0\.5 s"):
        ExecBackend([sys.executable, "-c", "import time; time.sleep(5)"], timeout_s=0.5).resume(REQUEST)
    with pytest.raises(AlertConfigError, match="needs a command"):
        ExecBackend([])

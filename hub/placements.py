"""What runs where on a Slurm cluster, polled: `squeue --json` every POLL_S seconds, read by
analytics.placements.slurm and kept in the store (Store.replace_placements: a job no longer listed ends
now, a job listed as ended ends at its end time, a new one starts at its start time).

A poll that fails (squeue missing, failing or too slow, an answer not of Slurm's shape, the store
unavailable) is logged and changes nothing stored: the placements in force stay until a poll succeeds.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from analytics.errors import PlacementError, StoreError
from analytics.placements.slurm import parse_squeue
from analytics.store.topology import Changes
from analytics.topology.model import Source
from collectors.logtext import printable

log = logging.getLogger("fleetlens.placements")

POLL_S = 30.0
SQUEUE = ("squeue", "--json")
SQUEUE_TIMEOUT_S = 20.0


class SlurmPlacements:
    """The jobs `command` (squeue --json) lists, kept in `store` as the slurm source's placements; `env`
    adds to the environment squeue runs in (SLURM_CONF for a cluster other than the host's)."""

    def __init__(
        self,
        store: Any,
        env: Mapping[str, str] | None = None,
        command: Sequence[str] = SQUEUE,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._env = {**os.environ, **(env or {})}
        self._command = list(command)
        self._wall_clock = wall_clock

    def check(self) -> Changes | None:
        """Poll squeue once and store what it says; what changed, or None when the poll failed (logged)."""
        what = " ".join(self._command)
        try:
            answer = subprocess.run(
                self._command,
                env=self._env,
                capture_output=True,
                text=True,
                timeout=SQUEUE_TIMEOUT_S,
                check=True,
            )
            placements = parse_squeue(answer.stdout, source=what)
            return self._store.replace_placements(Source.SLURM, placements, self._wall_clock())
        except (OSError, subprocess.SubprocessError, UnicodeDecodeError) as exc:
            stderr = getattr(exc, "stderr", None) or ""
            if isinstance(stderr, bytes):  # TimeoutExpired keeps the bytes read, even with text=True
                stderr = stderr.decode(errors="replace")
            log.warning("%s failed; placements kept as they were: %s %s", what, exc, printable(stderr[-500:]))
        except (PlacementError, StoreError) as exc:
            log.warning("placements kept as they were: %s", printable(str(exc)))
        return None

    def run(self, stop: threading.Event) -> None:
        """check() now and every POLL_S seconds until `stop` is set."""
        while True:
            self.check()
            if stop.wait(POLL_S):
                return

"""The errors of the simulator, as one tree.

    SimError
    ├── ScenarioError       a scenario file or flag that cannot be played: the message names file and key
    ├── SimulationError     the run cannot go on: a bad argument, a worker died, a fault without effect
    ├── NodeExporterError   node_exporter is not installed, did not start or did not answer (stock flavour)
    └── BadRequest          a request the loop server cannot serve; `status` is the HTTP status answered

Each is sim's own failure and ends the run (the CLI prints it in one line). What a simulated node plays
to the exporter (an unreadable sysfs file, a lost GPU, a scrape gap) is not raised here: the collectors
and the hub meet it as they would on a real node, and report it through their own errors.
"""

from __future__ import annotations

from http import HTTPStatus


class SimError(Exception):
    """Base of every error raised by the simulator."""


class ScenarioError(SimError):
    """A scenario file is unreadable or invalid; the message names the file and the key."""


class SimulationError(SimError):
    """The simulation cannot go on: a bad argument, or a part of the pipeline that refused its rows."""


class NodeExporterError(SimError):
    """node_exporter is not installed, did not start, or did not answer; the message says which and how."""


class BadRequest(SimError):
    """The request head or body cannot be served; the message says why, the status says how."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status

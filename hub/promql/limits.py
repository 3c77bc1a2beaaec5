"""What one PromQL query may take beyond its reads: evaluation time until its deadline, and the points it
holds (tables of every step, its answer), as Prometheus bounds a query by its timeout and by
--query.max-samples. The hub's reads are bounded by their own limits (hub.app)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from hub.errors import PromQLError


@dataclass
class Limits:
    """`deadline` in time.monotonic() seconds; at most `max_points` points held; `points` so far."""

    deadline: float = math.inf
    max_points: int = 10_000_000
    points: int = 0

    def check_time(self) -> None:
        """PromQLError (timeout, 503, as Prometheus answers) once the deadline has passed."""
        if time.monotonic() > self.deadline:
            raise PromQLError(
                "query timed out in expression evaluation (hub.query_max_seconds)", "timeout", 503
            )

    def hold(self, points: int) -> None:
        """Count `points` more held for the rest of the query; PromQLError past max_points."""
        self.points += points
        self.check_room(0)

    def check_room(self, transient: int) -> None:
        """PromQLError (execution, 422, as Prometheus answers) when the points held and `transient` more
        (a subquery's, held while a function reads them) are past max_points."""
        if self.points + transient > self.max_points:
            raise PromQLError(
                "query processing would load too many samples into memory in query execution"
                f" (more than {self.max_points}, hub.promql_max_samples)",
                "execution",
                422,
            )

"""A sweep's run budget: what the user allows it (`--max-points`, `--max-minutes`, `--point-timeout`), and so when
the run stops before its next point and how long each point may run.

Two deadlines can bind a point: its own (`point_timeout_s`: a point past it is an error, recorded) and what the run's
minutes leave (a point cut by the run's budget is not recorded and re-runs on resume). `Deadline` says which binds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from dsa_lab.errors import check_positive, check_range


@dataclass(frozen=True)
class Deadline:
    """The seconds one point may run (None: no limit) and whether the run's budget, not the point's own timeout,
    set them."""

    seconds: float | None
    run_binds: bool


@dataclass
class RunBudget:
    """At most `max_points` points recorded and `max_minutes` of wall clock from `started`, each point at most
    `point_timeout_s` (None: no such limit); each limit is checked when the budget is made."""

    max_points: int | None = None
    max_minutes: float | None = None
    point_timeout_s: float | None = None
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        if self.max_points is not None:
            check_range("max_points", self.max_points, 1, 1 << 31)
        if self.max_minutes is not None:
            check_positive("max_minutes", self.max_minutes, allow_zero=True)  # 0: record nothing, just open the run
        if self.point_timeout_s is not None:
            check_positive("point_timeout_s", self.point_timeout_s)

    def left_s(self) -> float | None:
        """Seconds the run's minutes leave (None: no limit)."""
        return None if self.max_minutes is None else self.max_minutes * 60 - (time.perf_counter() - self.started)

    def stop(self, recorded: int) -> str | None:
        """Why the run stops before its next point, with `recorded` points recorded so far ('max_points' or
        'max_minutes', the stop reasons the user set and a resume continues), or None."""
        if self.max_points is not None and recorded >= self.max_points:
            return "max_points"
        left = self.left_s()
        return "max_minutes" if left is not None and left <= 0 else None

    def deadline(self) -> Deadline:
        """The next point's deadline: the sooner of its own timeout and what the run's minutes leave."""
        left = self.left_s()
        bounds = [s for s in (self.point_timeout_s, left) if s is not None]
        run_binds = left is not None and (self.point_timeout_s is None or left < self.point_timeout_s)
        return Deadline(min(bounds) if bounds else None, run_binds)

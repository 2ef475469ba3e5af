"""One injectable clock for the coordinator, the scheduler and the simulator."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "WallClock", "ManualClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (wall) or since the start of a simulation."""
        ...


class WallClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to; for tests and the simulator."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

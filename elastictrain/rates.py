"""A rate over a sliding window of a growing count: marks ``(time, count)`` kept at most every
``every`` seconds over about ``window`` seconds; the rate is the count's growth since the oldest
mark, once that mark is at least ``least`` seconds old. (The coordinator's prefetch pacing measures
a job's consumption with it, and each ShardIterator its own.)"""

from __future__ import annotations

from collections import deque

__all__ = ["WindowRate"]


class WindowRate:
    def __init__(self, every: float, window: float, least: float) -> None:
        self.every, self.window, self.least = every, window, least
        self._marks: deque = deque()  # (time, count)

    def mark(self, now: float, count: float) -> None:
        """The count is ``count`` at ``now`` (kept if the last mark is ``every`` seconds old)."""
        marks = self._marks
        if not marks or now - marks[-1][0] >= self.every:
            marks.append((now, count))
            while len(marks) > 2 and now - marks[1][0] >= self.window:
                marks.popleft()

    def rate(self, now: float, count: float) -> float:
        """Growth per second since the oldest mark (0: none yet, or younger than ``least``)."""
        if not self._marks:
            return 0.0
        t0, c0 = self._marks[0]
        return (count - c0) / (now - t0) if now - t0 >= self.least else 0.0

    def clear(self) -> None:
        self._marks.clear()

"""Stragglers: a rank slower than its peers at its own work, found from the workers' resource
samples.

In a synchronous data-parallel job every rank's step takes as long as the slowest one's, so step
times cannot tell which rank is slow. Each rank's *busy time* can: the seconds per step it spent
in its own ``et.stage`` spans, every stage but ``sync`` (where a rank waits for the others). The
worker's monitor sends it with each sample (``ResourceSample.busy_time``).

A rank whose busy time stays above ``factor`` x the median of its peers' latest for ``windows``
samples in a row (each sample is one window of the monitor's period) is *flagged*, with its
measured slowdown (its busy time over that median). The flag clears when it comes back under.
What the coordinator then does about it is :meth:`Coordinator.put_resources`'s business (exclude
its node for a cooldown, where the job's minimum allows).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Optional

from ..errors import ConfigError

__all__ = ["Flag", "StragglerWatch"]


@dataclass
class Flag:
    worker: int
    slowdown: float
    since: float  # the time of the sample that completed the streak
    agent: str = ""  # the etrun agent (node) that ran the rank
    action: str = ""  # what was done: "excluded for 60 s", "kept: ..."


class StragglerWatch:
    def __init__(self, factor: float = 1.5, windows: int = 3, cooldown: float = 60.0) -> None:
        if not 1.0 < factor <= 100.0:
            raise ConfigError(f"--straggler-factor must be in (1, 100], got {factor}")
        if not 1 <= windows <= 1000:
            raise ConfigError(f"--straggler-windows must be in [1, 1000], got {windows}")
        if not 0.0 <= cooldown <= 86_400.0:
            raise ConfigError(f"--straggler-cooldown must be in [0, 86400] s (0: flag only), got {cooldown}")
        self.factor, self.windows, self.cooldown = factor, windows, cooldown
        self._busy: dict[str, dict[int, float]] = {}  # job -> worker -> latest busy seconds per step
        self._streak: dict[str, dict[int, int]] = {}
        self.flags: dict[str, dict[int, Flag]] = {}
        self._gen: dict[str, int] = {}  # job -> the generation counted

    def observe(self, job: str, generation: int, worker: int, samples: Iterable) -> Optional[Flag]:
        """Take a worker's new samples (in time order) in the job's current ``generation``;
        returns a flag raised by them, if any. A new generation starts the count again (ranks may
        be other nodes' now)."""
        if self._gen.get(job) != generation:
            self.forget(job)
            self._gen[job] = generation
        busy = self._busy.setdefault(job, {})
        streaks = self._streak.setdefault(job, {})
        flags = self.flags.setdefault(job, {})
        raised = None
        for s in samples:
            b = getattr(s, "busy_time", None)
            if b is None or b <= 0:
                continue
            busy[worker] = b
            peers = [v for w, v in busy.items() if w != worker]
            if not peers:
                continue
            median = statistics.median(peers)
            if median > 0 and b > self.factor * median:
                streaks[worker] = streaks.get(worker, 0) + 1
                if streaks[worker] >= self.windows and worker not in flags:
                    raised = flags[worker] = Flag(worker, b / median, s.t)
            else:
                streaks[worker] = 0
                flags.pop(worker, None)
        return raised

    def forget(self, job: str) -> None:
        """A new generation: ranks may belong to other nodes now; start counting again."""
        self._busy.pop(job, None)
        self._streak.pop(job, None)

    def current(self, job: str) -> list[Flag]:
        return sorted(self.flags.get(job, {}).values(), key=lambda f: f.worker)

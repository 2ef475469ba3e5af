"""Stragglers: a rank slower than its peers at its own work, found from the workers' resource
samples.

In a synchronous data-parallel job every rank's step takes as long as the slowest one's, so step
times cannot tell which rank is slow. Each rank's *busy time* can: the seconds per step it spent
in its own ``et.stage`` spans, every stage but ``sync`` (where a rank waits for the others). The
worker's monitor sends it with each sample (``ResourceSample.busy_time``).

A rank whose busy time stays above ``factor`` x the median of its peers' latest for ``windows``
samples in a row (each sample is one window of the monitor's period) is *flagged*, with its
measured slowdown (its busy time over that median). The flag clears when it comes back under.

What is done about a flag, in order (:meth:`Coordinator.put_resources` applies it):

1. **Fewer samples per step** (:meth:`StragglerWatch.share_out`), where every rank of the job
   asks for its part of the batch (:meth:`Job.local_batch`): the rank's weight is divided by its
   slowdown, from a training step far enough ahead that every rank has heard of it by then
   (:mod:`elastictrain.runtime.batch_shares`). Its streak starts again, counted from that step.
2. **Replace the node**, when that did not bring it back (flagged again) or cannot be done: its
   node is excluded for a cooldown, where the job's minimum allows.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Iterable, Optional

from ..errors import ConfigError
from ..wire import BatchShares

__all__ = ["Flag", "StragglerWatch"]


@dataclass
class Flag:
    worker: int
    slowdown: float
    since: float  # the time of the sample that completed the streak
    agent: str = ""  # the etrun agent (node) that ran the rank
    action: str = ""  # what was done: "excluded for 60 s", "kept: ..."
    rearmed: bool = False  # its share was cut: a new streak raises it again (to replace its node)


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
        self._part: dict[str, dict[int, int]] = {}  # job -> worker -> samples per step it last asked for
        self._step: dict[str, tuple[int, float]] = {}  # job -> (highest step reported, its step time)
        self._posted: dict[str, dict[int, tuple[float, float]]] = {}  # job -> worker -> (last post, interval)
        self.shares: dict[str, BatchShares] = {}  # job -> the batch shares in force (this generation)
        self._grace: dict[str, dict[int, int]] = {}  # job -> cut worker -> step its streak counts from

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
        grace = self._grace.get(job, {}).get(worker, 0)
        now = time.monotonic()
        posted = self._posted.setdefault(job, {})
        last = posted.get(worker)
        posted[worker] = (now, now - last[0] if last else 0.0)
        raised = None
        for s in samples:
            step, part = getattr(s, "step", None), getattr(s, "local_batch", None)
            if part is not None:
                self._part.setdefault(job, {})[worker] = part
            if step is not None and step >= self._step.get(job, (0, 0.0))[0]:
                self._step[job] = (step, getattr(s, "step_time", None) or self._step.get(job, (0, 0.0))[1])
            b = getattr(s, "busy_time", None)
            if b is None or b <= 0 or (step or 0) < grace:
                continue
            busy[worker] = b
            peers = [v for w, v in busy.items() if w != worker]
            if not peers:
                continue
            median = statistics.median(peers)
            if median > 0 and b > self.factor * median:
                streaks[worker] = streaks.get(worker, 0) + 1
                if streaks[worker] >= self.windows and (worker not in flags or flags[worker].rearmed):
                    raised = flags[worker] = Flag(worker, b / median, s.t)
            else:
                streaks[worker] = 0
                flags.pop(worker, None)
        return raised

    def share_out(self, job: str, flag: Flag, world: int) -> Optional[str]:
        """The first answer to ``flag``: cut the rank's share of each step's batch by its
        slowdown. Returns what was done, or None where it cannot be (not every rank of the job
        asks for its part, or this rank's share was cut already: then its node is replaced)."""
        parts = self._part.get(job, {})
        grace = self._grace.setdefault(job, {})
        if world < 2 or flag.worker in grace or any(w not in parts for w in range(world)):
            return None
        old = self.shares.get(job)
        weights = list(old.weights) if old is not None and len(old.weights) == world else [1.0] * world
        weights[flag.worker] = max(0.02, weights[flag.worker] / flag.slowdown)
        top = max(weights)
        weights = [round(w / top, 4) for w in weights]
        # every rank must have heard of it before it applies: two of the slowest reporter's
        # intervals between reports, in steps, and a few more
        step, step_time = self._step.get(job, (0, 0.0))
        interval = max((iv for _, iv in self._posted.get(job, {}).values()), default=0.0)
        ahead = 20 if step_time <= 0 or interval <= 0 else min(100_000, math.ceil(2 * interval / step_time) + 3)
        start = step + ahead
        self.shares[job] = BatchShares(self._gen.get(job, 0), (old.version + 1) if old else 1, start, weights)
        grace[flag.worker] = start + 2  # its busy time counts again once the new parts are in use
        self._streak.get(job, {}).pop(flag.worker, None)
        flag.rearmed = True
        return (f"fewer samples per step: {weights[flag.worker]:.2f} of a full share from step {start} "
                f"(its node is replaced if it stays slow)")

    def cut(self, job: str) -> set[int]:
        """The ranks whose share of the batch was cut this generation."""
        return set(self._grace.get(job, {}))

    def forget(self, job: str) -> None:
        """A new generation: ranks may belong to other nodes now; start counting again."""
        for book in (self._busy, self._streak, self._part, self._step, self._posted, self.shares, self._grace):
            book.pop(job, None)

    def current(self, job: str) -> list[Flag]:
        return sorted(self.flags.get(job, {}).values(), key=lambda f: f.worker)

"""Gandiva-style time slicing: when GPUs are oversubscribed, jobs take turns each quantum.

Every ``quantum`` seconds the jobs that received the least service run first (round robin in
effect); a job that does not fit is skipped. An arrival or an end re-slices at once; any other
decision within a slice (a run's first step, a periodic round) keeps the slice as it is, when no
GPU is free. Suspend/resume costs come from the engine.
"""

from __future__ import annotations

from operator import attrgetter

from .api import ClusterSnapshot, Decision, register
from .placement import make_placer

__all__ = ["TimeSlice"]
_ATTAINED = attrgetter("attained_gpu")


class TimeSlice:
    def __init__(self, quantum: float = 360.0, placement: str = "consolidated", packlimit: float = 0.5,
                 sticky: bool = False) -> None:
        self.quantum, self.placement, self.packlimit, self.sticky = quantum, placement, packlimit, sticky
        self.name = "gandiva-ts"
        self._next = 0.0

    def decide(self, s: ClusterSnapshot) -> Decision:
        if s.now < self._next and not s.arrived and not s.ended and s.running and \
                sum(j.num_gpu for j in s.running) >= s.total_gpus:
            return Decision({j.job_id: j.placement for j in s.running}, self._next)  # mid-slice, nothing changed
        order = sorted(s.jobs, key=_ATTAINED)  # stable: ties keep arrival order
        run = make_placer(s, self.placement, self.packlimit, self.sticky).fill(order)
        if len(run) == len(s.jobs):  # nobody waits: no need to slice until something changes
            return Decision(run, None)
        if s.now >= self._next:
            self._next = s.now + self.quantum
        return Decision(run, self._next)


register("gandiva-ts", lambda **kw: TimeSlice(**kw), ("quantum", "placement", "packlimit", "sticky"))

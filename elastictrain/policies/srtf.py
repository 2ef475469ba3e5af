"""SRTF and SRSF: preemptive shortest-remaining first, with durations known.

SRTF orders by remaining time, SRSF by remaining *service* (remaining time x GPUs). Every
decision re-places all runnable jobs in that order and skips those that do not fit.
"""

from __future__ import annotations

from .api import ClusterSnapshot, Decision, register
from .placement import make_placer

__all__ = ["ShortestRemaining"]


class ShortestRemaining:
    #: inputs it needs measured (the live loop logs what it assumes meanwhile)
    needs = frozenset({"duration"})
    #: a run's first step cannot change the decision (running jobs only rank higher as they train;
    #: `starting` is not read), so the simulator need not decide again then (sim/engine.py)
    first_step_events = False

    def __init__(self, service: bool = False, placement: str = "consolidated", packlimit: float = 0.5,
                 sticky: bool = False) -> None:
        self.service, self.placement, self.packlimit, self.sticky = service, placement, packlimit, sticky
        self.name = "srsf" if service else "srtf"

    def decide(self, s: ClusterSnapshot) -> Decision:
        if self.service:
            order = sorted(s.jobs, key=lambda j: j.remaining_iterations * j.iteration_time * j.num_gpu)
        else:
            order = sorted(s.jobs, key=lambda j: j.remaining_iterations * j.iteration_time)
        return Decision(make_placer(s, self.placement, self.packlimit, self.sticky).fill(order))


_OPTS = ("placement", "packlimit", "sticky")
register("srtf", lambda **kw: ShortestRemaining(service=False, **kw), _OPTS)
register("srsf", lambda **kw: ShortestRemaining(service=True, **kw), _OPTS)

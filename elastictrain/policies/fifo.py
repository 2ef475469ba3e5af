"""FIFO as YARN-CS (strict: the head of the queue blocks the rest) and best-effort FIFO."""

from __future__ import annotations

from .api import ClusterSnapshot, Decision, register
from .placement import make_placer

__all__ = ["Fifo"]


class Fifo:
    """Non-preemptive FIFO by submit time.

    Args:
        strict: YARN-CS: stop at the first queued job that does not fit (head-of-line
            blocking). False: best effort, skip it and try the next.
        placement: see :mod:`.placement`.
    """

    #: a run's first step cannot change the decision (running jobs keep their GPUs; `starting`
    #: is not read), so the simulator need not decide again then (sim/engine.py)
    first_step_events = False

    def __init__(self, strict: bool = True, placement: str = "consolidated", packlimit: float = 0.5,
                 sticky: bool = False) -> None:
        self.strict, self.placement, self.packlimit, self.sticky = strict, placement, packlimit, sticky
        self.name = "yarn-cs" if strict else "fifo-be"

    def decide(self, s: ClusterSnapshot) -> Decision:
        placer = make_placer(s, self.placement, self.packlimit, self.sticky)
        run = {}
        for j in s.running:  # running jobs keep their GPUs
            placer.take(j.placement)
            run[j.job_id] = j.placement
        # the snapshot lists jobs in arrival order: FIFO's order, with no sort per decision
        run.update(placer.fill((j for j in s.jobs if not j.running), strict=self.strict))
        return Decision(run)


_OPTS = ("placement", "packlimit", "sticky")
register("yarn-cs", lambda **kw: Fifo(strict=True, **kw), _OPTS)
register("fifo", lambda **kw: Fifo(strict=True, **kw), _OPTS)
register("fifo-be", lambda **kw: Fifo(strict=False, **kw), _OPTS)

"""Gandiva-style time slicing: when GPUs are oversubscribed, jobs take turns each quantum.

Every ``quantum`` seconds the jobs that received the least service run first (round robin in
effect); a job that does not fit is skipped. An arrival or an end re-slices at once; any other
decision within a slice (a run's first step, a periodic round) keeps the slice while exactly its
jobs run and the nodes offer what they did (a job that failed or lost its node, or a node that
joined or came back, re-slices). Re-slicing there would preempt a job that
has just paid its start-up, because its service now counts and the waiting jobs' does not. Suspend/resume costs come from the engine.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Optional

from .api import ClusterSnapshot, Decision, Restored, nothing_changed, register, restored_arrivals
from .placement import make_placer

__all__ = ["TimeSlice"]
_ATTAINED = attrgetter("attained_gpu")


class TimeSlice:
    #: a run's first step cannot change the decision: within a slice nothing is re-sliced without
    #: an arrival or an end, so the simulator need not decide again then (sim/engine.py)
    first_step_events = False

    def __init__(self, quantum: float = 360.0, placement: str = "consolidated", packlimit: float = 0.5,
                 sticky: bool = False) -> None:
        self.quantum, self.placement, self.packlimit, self.sticky = quantum, placement, packlimit, sticky
        self.name = "gandiva-ts"
        self._next = 0.0
        self._last: dict = {}  # the last decision's run (a job running outside it was kept against it)
        self._caps: tuple = ()  # the GPUs each node offered to it
        self._known: Optional[set] = None  # the jobs import_state restored, until the next decision

    def export_state(self) -> dict:
        """The current slice (its end, what it runs, the GPUs it was cut for), so that a restarted
        coordinator finishes it instead of re-slicing at once (which preempts a job mid-slice)."""
        return {"next": self._next, "caps": list(self._caps),
                "last": [[str(k), [list(p) for p in where]] for k, where in self._last.items()]}

    def import_state(self, state: dict, jobs, rename: Optional[dict] = None) -> None:
        """Restore :meth:`export_state` for the jobs in ``jobs`` (views; ``rename``: their ids here,
        by exported id), as of the clock it was exported on.

        Raises:
            ValueError, TypeError, KeyError: a malformed state (the caller starts afresh).
        """
        now = Restored(jobs, rename)
        last = {now.id(key): tuple((int(n), int(g)) for n, g in where) for key, where in state["last"]
                if now.id(key) is not None}
        self._next, self._caps, self._last = float(state["next"]), tuple(int(c) for c in state["caps"]), last
        self._known = now.ids()

    def decide(self, s: ClusterSnapshot) -> Decision:
        if self._known is not None:  # the first decision after import_state: the jobs it knew are no arrivals
            s, self._known = restored_arrivals(s, self._known), None
        if s.now < self._next and nothing_changed(s, self._last, self._caps):
            return Decision({j.job_id: j.placement for j in s.running}, self._next)  # mid-slice, as it was
        self._caps = s.gpus_per_node
        order = sorted(s.jobs, key=_ATTAINED)  # stable: ties keep arrival order
        run = self._last = make_placer(s, self.placement, self.packlimit, self.sticky).fill(order)
        if len(run) == len(s.jobs):  # nobody waits: no need to slice until something changes
            return Decision(run, None)
        if s.now >= self._next:
            self._next = s.now + self.quantum
        return Decision(run, self._next)


register("gandiva-ts", lambda **kw: TimeSlice(**kw), ("quantum", "placement", "packlimit", "sticky"))

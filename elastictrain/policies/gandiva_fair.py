"""Gandiva-fair, first part: gang-aware stride scheduling of user tickets.

Users hold tickets; a user's tickets are split equally among its active jobs; every time
quantum the jobs with the lowest *pass* run, as long as their gang fits in the free GPUs, and a
job that runs advances its pass by ``size / tickets``. Over time each user receives GPU time in
proportion to its tickets (the slides' "gang-aware stride scheduling").

Not built yet (issue 8 goes on): the *split* scheduler (a local stride scheduler per server,
a central one for multi-server jobs, load balancing by migration), heterogeneous GPU
generations and the second-price trading between users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..errors import ConfigError
from .api import ClusterSnapshot, Decision, register
from .placement import make_placer

__all__ = ["StrideJob", "gang_stride", "GandivaFair"]


@dataclass
class StrideJob:
    job_id: int
    size: int
    tickets: float
    pass_: float = 0.0


def gang_stride(queue: Sequence[StrideJob], free: int) -> list[int]:
    """One quantum of gang-aware stride: returns the ids scheduled and advances their passes.

    Jobs are taken by lowest pass (ties keep ``queue`` order) while GPUs remain; a job whose
    gang does not fit in what is left is skipped.
    """
    scheduled = []
    for j in sorted(queue, key=lambda j: j.pass_):
        if free <= 0:
            break
        if j.size <= free:
            scheduled.append(j.job_id)
            free -= j.size
            j.pass_ += j.size / j.tickets
    return scheduled


class GandivaFair:
    """Gang-aware stride over the whole cluster, one decision per ``quantum`` seconds.

    Args:
        tickets: tickets per user (``JobState.user``); users not listed get ``default_tickets``.
        quantum: seconds between decisions.
        placement: where a chosen gang goes (see :mod:`.placement`); a gang that cannot be placed
            is skipped for this quantum.
    """

    def __init__(self, tickets: Optional[dict[str, float]] = None, default_tickets: float = 1.0,
                 quantum: float = 60.0, placement: str = "consolidated", packlimit: float = 0.5) -> None:
        if default_tickets <= 0 or any(t <= 0 for t in (tickets or {}).values()):
            raise ConfigError("tickets must be positive")
        self.tickets, self.default = dict(tickets or {}), default_tickets
        self.quantum, self.placement, self.packlimit = quantum, placement, packlimit
        self.name = "gandiva-fair"
        self._jobs: dict[int, StrideJob] = {}
        self._next = 0.0

    def decide(self, s: ClusterSnapshot) -> Decision:
        for jid in s.ended:
            self._jobs.pop(jid, None)
        floor = min((j.pass_ for j in self._jobs.values()), default=0.0)
        for j in s.arrived:  # a newcomer starts level with the others, neither ahead nor owed
            self._jobs[j.job_id] = StrideJob(j.job_id, j.num_gpu, 1.0, floor)
        per_user: dict[str, int] = {}
        for j in s.jobs:
            per_user[j.user] = per_user.get(j.user, 0) + 1
        for j in s.jobs:
            self._jobs[j.job_id].tickets = self.tickets.get(j.user, self.default) / per_user[j.user]
        placer = make_placer(s, self.placement, self.packlimit)
        run: dict[int, tuple] = {}
        candidates = s.jobs
        if s.now < self._next:  # between quanta: what runs keeps running; idle GPUs are filled
            for j in s.running:
                placer.take(j.placement)
                run[j.job_id] = j.placement
            candidates = [j for j in s.jobs if not j.running]
        else:
            self._next = s.now + self.quantum
        by_id = {j.job_id: j for j in s.jobs}
        for jid in gang_stride([self._jobs[j.job_id] for j in candidates], placer.total_free):
            where = placer.place(by_id[jid].num_gpu, by_id[jid].skew)
            if where is None:  # fits by count but not by placement: undo its pass advance
                sj = self._jobs[jid]
                sj.pass_ -= sj.size / sj.tickets
                continue
            run[jid] = where
        return Decision(run, self._next)


register("gandiva-fair", lambda **kw: GandivaFair(**kw),
         ("tickets", "default_tickets", "quantum", "placement", "packlimit"))

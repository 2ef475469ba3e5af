"""Gandiva-fair, first part: gang-aware stride scheduling of user tickets.

Users hold tickets; a user's tickets are split equally among its active jobs; every time
quantum the jobs with the lowest *pass* run, as long as their gang fits in the free GPUs, and a
job that runs advances its pass by ``size / tickets``. Over time each user receives GPU time in
proportion to its tickets (the slides' "gang-aware stride scheduling").

Also here: :func:`trade`, the second-price exchange of fast for slow GPU time between users
(on allocations; see ``elastictrain.sim.fairness.heterogeneous``).

Not built yet (issue 8 goes on): the *split* scheduler (a local stride scheduler per server,
a central one for multi-server jobs, load balancing by migration), and heterogeneous GPU
generations inside the event-driven simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..errors import ConfigError
from .api import ClusterSnapshot, Decision, register
from .placement import make_placer

__all__ = ["StrideJob", "gang_stride", "GandivaFair", "Trade", "trade", "throughput"]


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


# ---------------------------------------------------------------------------- trading
@dataclass(frozen=True)
class Trade:
    seller: str  # gives ``amount`` fast GPUs
    buyer: str  # gives ``amount * price`` slow GPUs
    fast: str
    slow: str
    amount: float
    price: float  # slow GPUs per fast GPU: the next-best bid below the buyer's (second price)


def trade(alloc: dict[str, dict[str, float]], speed: dict[str, dict[str, float]], fast: str, slow: str,
          unit: float = 1.0, eps: float = 1e-9) -> list[Trade]:
    """Trade ``fast`` GPUs for ``slow`` ones between users, in place, Gandiva-fair style.

    Each user bids its speedup ``speed[u][fast] / speed[u][slow]``. The highest bidder who still
    has slow GPUs buys, ``unit`` at a time, from the lowest bidder who still has fast GPUs, at a
    price set by the next-best bid below the buyer's (a second price: no user gains by
    misreporting its speedup). A trade happens only if ``seller's bid <= price < buyer's bid``,
    so neither side's throughput goes down (the seller's stays equal at worst).
    """
    users = list(alloc)
    bid = {u: speed[u][fast] / speed[u][slow] for u in users}
    trades: list[Trade] = []
    while True:
        buyers = sorted((u for u in users if alloc[u].get(slow, 0.0) > eps), key=lambda u: -bid[u])
        done = True
        for b in buyers:
            below = [bid[u] for u in users if u != b and bid[u] < bid[b]]
            if not below:
                continue
            price = max(below)
            sellers = sorted((u for u in users if u != b and alloc[u].get(fast, 0.0) > eps and bid[u] <= price),
                             key=lambda u: bid[u])
            if not sellers:
                continue
            s = sellers[0]
            amount = min(unit, alloc[s][fast], alloc[b][slow] / price)
            if amount <= eps:
                continue
            alloc[s][fast] -= amount
            alloc[b][fast] = alloc[b].get(fast, 0.0) + amount
            alloc[b][slow] -= amount * price
            alloc[s][slow] = alloc[s].get(slow, 0.0) + amount * price
            trades.append(Trade(s, b, fast, slow, amount, price))
            done = False
            break
        if done:
            return trades


def throughput(alloc: dict[str, dict[str, float]], speed: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each user's aggregate rate: GPUs of each type times its speed there."""
    return {u: sum(n * speed[u][t] for t, n in a.items()) for u, a in alloc.items()}

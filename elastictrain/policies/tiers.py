"""Priority tiers over any policy: a job of higher ``priority`` takes GPUs from lower ones.

``elastictrain coordinator --policy P --priority-preemption`` (or ``PriorityTiers(factory)``)
splits the jobs by their ``priority`` (``submit --priority``) into tiers and runs one instance of
the policy per tier, highest tier first. Each tier's instance sees only its tier's jobs and the
GPUs the tiers above it left, so within a tier the policy rules as usual (Tiresias's queues,
Gandiva-fair's shares...), and between tiers priority is strict: a running job whose GPUs a
higher tier's decision takes is preempted (it checkpoints and resumes later, as from any
preemption), as under Slurm's preemption by partition ``PriorityTier`` or QOS, or Kueue's
``withinClusterQueue: LowerPriority``. A job never waits for a lower tier.

A start a higher tier places on a node where a lower tier's job runs is moved, where it can be,
to a node of the same GPU type whose GPUs nobody holds, so that priority preempts only when it
must (a gang on one node; a gang spread over several nodes keeps its placement). "Any node"
placements (``(-1, gpus)``) are resolved here, keeping a running job where it is.

With one tier (every job at the default priority 0, say) the policy decides alone, as without
tiers. A job whose priority changes leaves its old tier's instance (it ended there) and joins
the new one's (never seen: it arrived).

``BORROW_TIER``, below every priority a job may be given, is where the coordinator puts jobs
that run over their user's quota (``coordinator --quota-borrow``, Kueue's borrowing): they get
only the GPUs every other job left, and are preempted first.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..model import MIN_PRIORITY
from .api import ClusterSnapshot, Decision, Policy
from .placement import any_node, best_node, holds, type_mask

__all__ = ["PriorityTiers", "BORROW_TIER"]

BORROW_TIER = MIN_PRIORITY - 1  # below every priority a job may have: jobs over their user's quota


class PriorityTiers:
    """One ``make()`` policy per priority tier; see the module docstring."""

    def __init__(self, make: Callable[[], Policy]) -> None:
        self._make = make
        first = self._first = make()  # (kept: a policy's tiers share what it shares, share_usage)
        self._tiers: dict[int, Policy] = {0: first}
        self._tier_of: dict = {}  # job key -> the tier it was last decided in
        self._tickets: Optional[tuple] = None  # (users', projects') from set_tickets
        self.name = first.name
        for attr in ("first_step_events", "first_step_events_elastic", "single_type", "needs", "rate_window",
                     "default"):
            if hasattr(first, attr):
                setattr(self, attr, getattr(first, attr))
        # what the coordinator calls when the policy has it (hasattr), for every tier
        if hasattr(first, "set_tickets"):
            self.set_tickets = self._set_tickets
        if hasattr(first, "inputs_changed"):
            self.inputs_changed = lambda: [p.inputs_changed() for p in self._tiers.values()]
        if hasattr(first, "annotate"):
            self.annotate = self._annotate
        if hasattr(first, "waiting_reason"):
            self.waiting_reason = self._waiting_reason
        if hasattr(first, "fairshare"):
            self.fairshare = self._fairshare
        if hasattr(first, "export_state") and hasattr(first, "import_state"):
            self.export_state, self.import_state = self._export_state, self._import_state

    # ------------------------------------------------------------------ the tiers' instances
    def _tier(self, p: int) -> Policy:
        pol = self._tiers.get(p)
        if pol is None:
            pol = self._tiers[p] = self._make()
            if hasattr(pol, "share_usage"):  # one usage, whatever the tier (multifactor's fair share)
                pol.share_usage(self._first)
            if self._tickets is not None:
                pol.set_tickets(*self._tickets)
        return pol

    def _set_tickets(self, tickets: dict, projects: Optional[dict] = None, parents: Optional[dict] = None,
                     members: Optional[dict] = None) -> None:
        if projects is None and self._tickets is not None:
            projects = self._tickets[1]  # (left out: as they were)
        if parents is None and self._tickets is not None:
            parents = self._tickets[2]
        if members is None and self._tickets is not None:
            members = self._tickets[3]
        self._tickets = (dict(tickets), projects, parents, members)
        for pol in self._tiers.values():
            pol.set_tickets(tickets, projects, parents, members)

    def _fairshare(self) -> dict:
        """The accounts' fair share: their usage is one (share_usage); each account's share of the
        tickets as the default tier counts it, else as the tier that last saw it."""
        out: dict = {}
        for p in sorted(self._tiers, key=lambda p: (p == 0, p)):
            out.update(self._tiers[p].fairshare())
        return out

    def _annotate(self, key) -> dict:
        pol = self._tiers.get(self._tier_of.get(key, 0))
        return pol.annotate(key) if pol is not None else {}

    def _waiting_reason(self, key, now: float):
        pol = self._tiers.get(self._tier_of.get(key, 0))
        return pol.waiting_reason(key, now) if pol is not None else None

    def _export_state(self) -> dict:
        return {"tiers": {str(p): pol.export_state() for p, pol in self._tiers.items()}}

    def _import_state(self, state: dict, jobs, rename: Optional[dict] = None) -> None:
        tiers = state["tiers"]  # (a KeyError: state saved without tiers; the coordinator relearns)
        for p, data in tiers.items():
            p = int(p)
            self._tier(p).import_state(data, [j for j in jobs if j.priority == p], rename)

    # ------------------------------------------------------------------ decide
    def decide(self, s: ClusterSnapshot) -> Decision:
        tier_of = self._tier_of
        ended: dict[int, list] = {}
        for key in s.ended:
            p = tier_of.pop(key, None)
            if p is not None:
                ended.setdefault(p, []).append(key)
        tiers: dict[int, list] = {}
        for j in s.jobs:
            p = j.priority
            was = tier_of.get(j.job_id)
            if was != p:
                if was is not None:  # its priority changed: it ends in its old tier
                    ended.setdefault(was, []).append(j.job_id)
                tier_of[j.job_id] = p
            tiers.setdefault(p, []).append(j)
        if len(tiers) == 1 and set(ended) <= set(tiers) and set(self._tiers) <= set(tiers):
            return self._tier(next(iter(tiers))).decide(s)  # one tier: the policy decides alone
        return self._decide_tiers(s, tiers, ended)

    def _decide_tiers(self, s: ClusterSnapshot, tiers: dict, ended: dict) -> Decision:
        avail = list(s.gpus_per_node)
        types = s.node_types
        # GPUs each node's running jobs hold, by tier (a higher tier's start avoids the lower ones')
        held: dict[int, list] = {}
        for j in s.running:
            h = held.setdefault(j.priority, [0] * len(avail))
            for n, g in j.placement:
                if 0 <= n < len(h):
                    h[n] += g
        run: dict = {}
        workers, slowdown, limits = {}, {}, {}
        groups: list = []
        notes: list = []
        wakeups = []
        for p in sorted(set(tiers) | (set(ended) & set(self._tiers)), reverse=True):
            jobs = tiers.get(p, [])  # (none: its jobs ended, or are being stopped; it is told of the ends)
            below = [0] * len(avail)  # GPUs the lower tiers' running jobs hold
            for q, h in held.items():
                if q < p:
                    for n, g in enumerate(h):
                        below[n] += g
            sub = ClusterSnapshot(s.now, tuple(jobs), tuple(avail), s.nodes_per_switch,
                                  arrived=tuple(j for j in s.arrived if j.priority == p),
                                  ended=tuple(ended.get(p, ())),
                                  running=tuple(j for j in s.running if j.priority == p), node_types=types,
                                  windows=s.windows)
            d = self._tier(p).decide(sub)
            grouped = {}
            for grp in d.groups:
                for k in grp:
                    grouped[k] = tuple(grp)
            dropped = set()
            # what keeps running where it runs first, then the starts and moves
            order = sorted(d.run.items(), key=lambda kv: not _stays(sub.by_key.get(kv[0]), kv[1]))
            for key, where in order:
                grp = grouped.get(key)
                if grp is not None and grp[0] != key:
                    continue  # a group's follower shares its leader's GPUs
                got = self._fit(sub.by_key.get(key), where, avail, below, types)
                if got is None:
                    dropped.update(grp or (key,))
                    continue
                for k in grp or (key,):
                    run[k] = got
            for key in dropped:
                run.pop(key, None)
            groups += [g for g in d.groups if not dropped & set(g)]
            for src, dst in ((d.workers, workers), (d.slowdown, slowdown), (d.limits, limits)):
                dst.update((k, v) for k, v in src.items() if k not in dropped)
            notes += d.notes
            if d.wakeup is not None:
                wakeups.append(d.wakeup)
        notes += self._preempted(s, run)
        known = set(self._tier_of.values())  # (jobs being stopped are known, not in the snapshot)
        for p in [p for p in self._tiers if p not in known]:
            pol = self._tiers.pop(p)  # every job of its priority ended: a new one starts a new instance
            if hasattr(pol, "retire"):
                pol.retire()
        return Decision(run, min(wakeups, default=None), tuple(groups), slowdown, workers, tuple(notes), limits)

    @staticmethod
    def _preempted(s: ClusterSnapshot, run: dict) -> list:
        """Notes for the running jobs this decision stops where a job of a higher priority takes
        their GPUs (the event log's ``plan`` events say why)."""
        notes = []
        for j in s.running:
            if j.job_id in run:
                continue
            nodes = {n for n, _ in j.placement}
            above = sorted({s.by_key[k].priority for k, where in run.items() if k in s.by_key
                            and s.by_key[k].priority > j.priority and any(n in nodes for n, _ in where)})
            if above and j.priority == BORROW_TIER:
                notes.append((j.job_id, {"decision": "preempt", "why": (
                    "it ran on GPUs borrowed over its user's quota, and jobs within their quotas need them "
                    "(--quota-borrow)")}))
            elif above:
                notes.append((j.job_id, {"decision": "preempt", "why": (
                    f"its GPUs went to jobs of priority {above[-1]}, above its {j.priority} (--priority-preemption)")}))
        return notes

    @staticmethod
    def _fit(view, where, avail: list, below: list, types: tuple) -> Optional[tuple]:
        """``where`` on real nodes within ``avail`` (which it then takes), or None if it cannot be
        had. "Any node" is resolved (a running job keeps its GPUs). A gang on one node that would
        displace a lower tier's running job there, or that no longer fits there (a start moved
        earlier took the GPUs, or a policy that counts GPUs kept a running job where a higher tier
        now is), goes to another node of its GPU type, one nobody holds first."""
        size = sum(g for _, g in where)
        mine = tuple(view.placement) if view is not None and view.running else ()
        if where and where[0][0] < 0:  # any node
            if holds(mine, avail, size):
                where = mine
            else:
                mask = type_mask(view.gpu_type, types) if view is not None and view.gpu_type else None
                where = any_node(size, avail, below, mask)
        elif len(where) == 1:
            n, g = where[0]
            fits = 0 <= n < len(avail) and avail[n] >= g
            if not fits or (tuple(where) != mine and avail[n] - below[n] < g):
                gtype = types[n] if types and 0 <= n < len(types) else None
                m = best_node(g, avail, below, gtype, types)
                if m < 0 and not fits:
                    m = best_node(g, avail, None, gtype, types)
                where = ((m, g),) if m >= 0 else where if fits else None
        elif not all(0 <= n < len(avail) and avail[n] >= g for n, g in where):
            return None
        if where is None:
            return None
        for n, g in where:
            avail[n] -= g
        return tuple(where)


def _stays(view, where) -> bool:
    return view is not None and view.running and tuple(view.placement) == tuple(where)

"""Slurm's default scheduling: ``priority/multifactor`` order with ``sched/backfill``.

Each waiting job's priority is a weighted sum of factors between 0 and 1, as Slurm's multifactor
plugin computes it (``sprio`` shows them; here ``status`` does):

* **age**: how long it has waited since it was submitted, over ``max_age`` (then 1);
* **fair share**: ``2 ** (-U / S)`` for the job's account (:mod:`.shares`: its user, or its
  project and user where the project has tickets), where S is the account's share of the tickets
  of the accounts with jobs or usage (``users set U --tickets N``, ``projects set P --tickets
  N``) and U its share of their GPU time, decayed with a half-life of ``half_life`` (Slurm's
  classic fair-share formula, ``PriorityDecayHalfLife``): a user who used less than its share
  goes first;
* **job size**: its GPUs over the cluster's (``favor_small``: the reverse, 1 for one GPU);
* **QOS**: its ``submit --priority`` from -1000 (0) to 1000 (1).

The jobs are then started, and reserved for, in that order by :class:`.Backfill`: nothing is
preempted, and a job behind a reservation starts now only where it leaves it whole. The decayed
usage is kept across a coordinator restart, and under ``--priority-preemption`` the tiers' instances
share one (an account's GPU time counts whatever the priority of the jobs it ran, as Slurm's usage
of an association counts every QOS).
"""

from __future__ import annotations

import math
from typing import Optional

from ..errors import ConfigError
from ..model import MAX_PRIORITY, MIN_PRIORITY
from .api import ClusterSnapshot, Decision, register
from .backfill import Backfill
from .shares import account, account_tickets, decayed

__all__ = ["Multifactor", "FACTORS", "DEFAULT_WEIGHTS"]

FACTORS = ("age", "fairshare", "size", "qos")
#: as many a Slurm site sets them: fair share first, then age, size and QOS alike
DEFAULT_WEIGHTS = {"age": 1000, "fairshare": 10000, "size": 1000, "qos": 1000}
_WEEK = 7 * 86400.0


class _Ledger:
    """The accounts' decayed GPU-seconds, and the runs each instance (a priority tier's) decided
    last: the first instance to decide at a new time decays the usage to it and charges every
    instance's runs since (``decayed``: each second of a GPU decayed by its age)."""

    def __init__(self) -> None:
        self.usage: dict[str, float] = {}  # account -> decayed GPU-seconds
        self.last: Optional[float] = None
        self.ran: dict = {}  # instance -> its last decision's runs: job key -> (account, GPUs)


class Multifactor(Backfill):
    """See the module docstring.

    Args:
        weights: factor -> weight (``age``, ``fairshare``, ``size``, ``qos``; 0 to 1e9 each; those
            not given keep :data:`DEFAULT_WEIGHTS`).
        half_life: seconds over which past GPU time counts half (Slurm's default, 7 days).
        max_age: seconds of waiting at which the age factor is full (Slurm's default, 7 days).
        favor_small: the size factor favours small jobs instead of large ones.
        tickets, default_tickets, project_tickets: the accounts' shares (as Gandiva-fair's).
        reservations, placement, packlimit, grow: :class:`.Backfill`'s.
    """

    def __init__(self, weights: Optional[dict] = None, half_life: float = _WEEK, max_age: float = _WEEK,
                 favor_small: bool = False, tickets: Optional[dict] = None, default_tickets: float = 1.0,
                 project_tickets: Optional[dict] = None, reservations: int = 1, placement: str = "consolidated",
                 packlimit: float = 0.5, grow: bool = False) -> None:
        super().__init__(reservations, placement, packlimit, grow)
        self.name = "multifactor"
        w = dict(DEFAULT_WEIGHTS)
        for k, v in (weights or {}).items():
            if k not in FACTORS:
                raise ConfigError(f"priority weight {k!r}: the factors are {', '.join(FACTORS)}")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1e9:
                raise ConfigError(f"priority weight {k}={v!r}: give a number from 0 to 1000000000")
            w[k] = float(v)
        self.weights = w
        for what, v in (("half_life", half_life), ("max_age", max_age)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 1.0 <= v <= 3.2e7:
                raise ConfigError(f"{what} must be a number of seconds from 1 to 32000000 (about a year), not {v!r}")
        self.half_life, self.max_age, self.favor_small = float(half_life), float(max_age), bool(favor_small)
        self.default = default_tickets
        self.project_parents: dict[str, str] = {}  # sub-project -> its parent (set_tickets; shares.py's tree)
        self.member_shares: dict[str, float] = {}  # "project/user" -> the member's share there (set_tickets)
        self.set_tickets(dict(tickets or {}), dict(project_tickets or {}))
        self._ledger = _Ledger()  # (shared by the instances of priority tiers: share_usage)
        self.priority: dict = {}  # waiting job key -> its priority at the last decision
        self._static: dict = {}  # job key -> what of its priority does not change while it waits (_fixed)
        self._gpus, self._projects_of = 0, None  # what _static was built for
        self._fair: dict = {}  # account -> fair-share factor, and when, at the last decision
        self._detail: dict = {}  # account -> (its share of the tickets, of the decayed usage) then
        self._now = 0.0

    # ------------------------------------------------------------------ shares
    def set_tickets(self, tickets: dict, projects: Optional[dict] = None, parents: Optional[dict] = None,
                    members: Optional[dict] = None) -> None:
        """The users' tickets (``users set``) and, unless None, the projects' (``projects set
        --tickets``), which project is under which (``--parent``) and members' shares in their
        projects (``--users alice=3``): the fair-share factor's shares."""
        if self.default <= 0 or any(not t > 0 for t in (*tickets.values(), *(projects or {}).values())):
            raise ConfigError("tickets must be positive")
        self.tickets = dict(tickets)
        if projects is not None:
            self.project_tickets = dict(projects)
        if parents is not None:
            self.project_parents = dict(parents)
        if members is not None:
            self.member_shares = dict(members)

    def _account(self, j) -> str:
        return account(j.user, j.project, self.project_tickets, self.project_parents)

    def share_usage(self, other: "Multifactor") -> None:
        """Count usage in ``other``'s ledger (PriorityTiers: one per policy, whatever the tier)."""
        self._ledger = other._ledger

    def retire(self) -> None:
        """This instance decides no more (its tier emptied): its runs were charged up to now."""
        self._ledger.ran.pop(self, None)

    def _charge(self, s: ClusterSnapshot) -> None:
        """Decay the accounts' usage to now and add the GPU time of what ran since the last
        decision (each second of a GPU decayed by its age, integrated exactly)."""
        ledger = self._ledger
        last = ledger.last
        if last is not None and s.now > last:
            decay, held = decayed(s.now - last, self.half_life)
            usage = ledger.usage
            for a in list(usage):
                usage[a] *= decay
                if usage[a] < 1e-9:
                    del usage[a]
            if self not in ledger.ran:  # (its first decision since a restart: what runs now ran since)
                ledger.ran[self] = {j.job_id: (self._account(j), sum(g for _, g in j.placement)) for j in s.running}
            for ran in ledger.ran.values():
                for a, g in ran.values():
                    usage[a] = usage.get(a, 0.0) + g * held
        ledger.last = s.now if last is None else max(last, s.now)

    # ------------------------------------------------------------------ decide
    def decide(self, s: ClusterSnapshot) -> Decision:
        self._charge(s)
        self._rank(s)
        d = super().decide(s)
        by = s.by_key
        self._ledger.ran[self] = {k: (self._account(by[k]), sum(g for _, g in where)) for k, where in d.run.items()
                                  if k in by}
        return d

    def _rank(self, s: ClusterSnapshot) -> None:
        """Each waiting job's priority (:attr:`priority`), highest first in :meth:`_queue`."""
        now, w = s.now, self.weights
        gpus = max(1, sum(g for g in s.gpus_per_node if g > 0))
        static = self._static
        for key in s.ended:
            static.pop(key, None)
        if gpus != self._gpus or (self.project_tickets, self.project_parents) != self._projects_of:
            static.clear()  # (the size factor's cluster, or the accounts, changed)
            self._gpus, self._projects_of = gpus, (dict(self.project_tickets), dict(self.project_parents))
        usage = self._ledger.usage
        accounts = set(usage)
        for j in s.jobs:
            st = static.get(j.job_id)
            if st is None or st[0] is not j:
                st = static[j.job_id] = self._fixed(j, gpus)
            accounts.add(st[1])
        tickets = account_tickets(accounts, self.tickets, self.default, self.project_tickets,
                                  self.project_parents, self.member_shares)
        total_t = sum(tickets.values())
        used = sum(usage.values())
        detail = {a: (t / total_t, usage.get(a, 0.0) / used if used > 0 else 0.0) for a, t in tickets.items()}
        fair = {a: 2.0 ** (-u / share) for a, (share, u) in detail.items()}
        self._detail = detail
        wa, wf, inv = w["age"], w["fairshare"], 1.0 / self.max_age
        prio = {}
        for j in s.jobs:
            if not j.running:
                _, a, fixed, _, _ = static[j.job_id]
                age = (now - j.submit_time) * inv
                prio[j.job_id] = wa * (1.0 if age > 1.0 else age if age > 0.0 else 0.0) + wf * fair[a] + fixed
        self.priority, self._fair, self._now = prio, fair, now

    def _fixed(self, j, gpus: int) -> tuple:
        """(the view it was read from, its account, the weighted size and QOS factors, the two)."""
        size = min(j.num_gpu / gpus, 1.0)
        if self.favor_small:
            size = 1.0 - size + 1.0 / gpus
        qos = min(max((j.priority - MIN_PRIORITY) / (MAX_PRIORITY - MIN_PRIORITY), 0.0), 1.0)
        return j, self._account(j), self.weights["size"] * size + self.weights["qos"] * qos, size, qos

    def factors(self, key) -> Optional[tuple]:
        """(priority, age, fair share, size, QOS) of waiting job ``key`` at the last decision, the
        factors unweighted (``sprio``); None if it did not wait then."""
        p = self.priority.get(key)
        if p is None:
            return None
        j, a, _, size, qos = self._static[key]
        age = min(max(self._now - j.submit_time, 0.0) / self.max_age, 1.0)
        return p, age, self._fair[a], size, qos

    def fairshare(self) -> dict:
        """Each account's (share of the tickets, share of the decayed usage, fair-share factor) at the
        last decision, as Slurm's ``sshare`` shows them (accounts with jobs or usage then)."""
        return {a: (share, u, self._fair[a]) for a, (share, u) in self._detail.items()}

    def _queue(self, s: ClusterSnapshot):
        """The waiting jobs by priority, highest first (ties: submission order)."""
        p = self.priority
        return sorted((j for j in s.jobs if not j.running), key=lambda j: -p[j.job_id])

    # ------------------------------------------------------------------ what status says
    def annotate(self, key) -> dict:
        out = {}
        got = self.factors(key)
        if got is not None:
            p, age, fair, size, qos = got
            w = self.weights
            out["priority"] = (f"{p:.0f} (age {w['age'] * age:.0f}, fairshare {w['fairshare'] * fair:.0f}, "
                               f"size {w['size'] * size:.0f}, qos {w['qos'] * qos:.0f})")
        out.update(super().annotate(key))
        return out

    # ------------------------------------------------------------------ memory across restarts
    def export_state(self) -> dict:
        """The accounts' decayed usage and when it was counted (a coordinator restart keeps the
        fair share)."""
        ledger = self._ledger
        return {"usage": [[a, v] for a, v in ledger.usage.items()], "last": ledger.last}

    def import_state(self, state: dict, jobs, rename: Optional[dict] = None) -> None:
        """Restore :meth:`export_state` (``jobs`` and ``rename`` are not needed: usage is by account).

        Raises:
            ValueError, TypeError, KeyError: a malformed state (the caller starts afresh).
        """
        usage = {str(a): float(v) for a, v in state["usage"]}
        if any(not (v >= 0 and math.isfinite(v)) for v in usage.values()):
            raise ValueError("usage must be finite and >= 0")
        last = state["last"]
        ledger = self._ledger  # (under tiers, shared: every tier's instance imports the same usage)
        ledger.usage.clear()
        ledger.usage.update(usage)
        ledger.last = None if last is None else float(last)
        ledger.ran.pop(self, None)


register("multifactor", lambda **kw: Multifactor(**kw),
         ("weights", "half_life", "max_age", "favor_small", "tickets", "default_tickets", "project_tickets",
          "reservations", "placement", "packlimit", "grow"))

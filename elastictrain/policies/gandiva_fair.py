"""Gandiva-fair (EuroSys 2020): gang-aware split-stride fair share, heterogeneity, trading.

Users hold tickets; a user's tickets are split equally among its active jobs; GPU time is
shared in proportion to tickets by *gang-aware stride*: every quantum the jobs with the lowest
pass run while their gang fits in the free GPUs, and a job that runs advances its pass by
``size / tickets`` (:func:`gang_stride`, the slides' tables).

*Split stride* (the default, ``split=True``), as on slides 9-10:

* every job that fits on one server has a *home server* and is scheduled there by that
  server's local gang-aware stride;
* jobs bigger than a server are scheduled by a central stride, whose other entries are the
  servers themselves (tickets: the sum of their residents'): each quantum, entries are taken
  by pass; a server taken runs its local schedule, a big job takes whole servers (those
  furthest ahead on their pass, empty ones first), pausing their residents for the quantum;
* GPUs a quantum leaves idle (no waiting gang of the server fits, or a big job takes a server
  in part) are lent for the quantum to the jobs it did not schedule, lowest pass first: a
  waiting one where it fits best, a gang spanning several servers' idle GPUs if it must
  (``spread_backfill``), a running one where it runs (work conservation without migrating a
  running job);
* the split schedule is fair when the ticket load (tickets per GPU) is balanced across
  servers, so at every quantum jobs are *migrated* from the most to the least loaded server of
  their GPU type (a waiting job first: moving it is free; a running job loses the engine's
  ``migration_cost``), up to ``migrations`` moves, while the spread exceeds ``balance``.

``split=False`` runs one gang-aware stride over the whole cluster instead (no migrations).

Heterogeneous clusters (``ClusterSnapshot.node_types``): every user is entitled to its ticket
share of *each* GPU type. A new job goes to the fastest type (its ``speeds``) where its user
still has entitlement to spare, i.e. the type with the lowest demand / entitlement ratio, ties
to the faster type ("the fastest GPU subject to contention"). With ``trading=True``
(``gandiva-fair``; ``gandiva-fair-notrade`` is the heterogeneity-agnostic baseline), users
trade entitlement: fast GPUs of low-speedup users for slow GPUs of high-speedup users, at a
second price (:func:`trade`); entitlements are recomputed when the set of users changes.
Each job's tickets on its type are its user's entitlement there divided among the user's
jobs of that type.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Optional, Sequence

from ..errors import ConfigError
from .api import ClusterSnapshot, Decision, Restored, register
from .placement import make_placer, type_matches
from .shares import account, account_tickets, decayed

_PASS = attrgetter("pass_")
_PASS_ID = attrgetter("pass_", "job_id")
_TICKETS = attrgetter("tickets")

__all__ = ["StrideJob", "gang_stride", "GandivaFair", "Trade", "trade", "throughput", "entitlements"]


@dataclass
class StrideJob:
    job_id: int
    size: int
    tickets: float
    pass_: float = 0.0
    home: Optional[int] = None  # home server (local jobs); None: central (bigger than a server)
    gtype: str = "gpu"  # GPU type it runs on
    user: str = ""  # the fair-share account it counts against: its user, or "project/user" (policies/shares.py)
    owner: str = ""  # its user, and the project it is charged to: what ``user`` is made of
    project: str = ""


def gang_stride(queue: Sequence[StrideJob], free: int, quanta: int = 1) -> list[int]:
    """One quantum of gang-aware stride: returns the ids scheduled and advances their passes
    (by ``quanta`` strides: the quantum may be stretched, see ``GandivaFair(stretch=)``).

    Jobs are taken by lowest pass (ties keep ``queue`` order) while GPUs remain; a job whose
    gang does not fit in what is left is skipped.
    """
    scheduled = []
    for j in sorted(queue, key=_PASS):
        if free <= 0:
            break
        if j.size <= free:
            scheduled.append(j.job_id)
            free -= j.size
            j.pass_ += quanta * j.size / j.tickets
    return scheduled


class GandivaFair:
    """Gandiva-fair's scheduler, one decision per ``quantum`` seconds (see the module docstring).

    Args:
        tickets: tickets per user (``JobView.user``); users not listed get ``default_tickets``.
        project_tickets: tickets per project (``JobView.project``): such a project is one share
            beside the users, split among its members with jobs by their own tickets; its jobs
            count against the account ``"project/user"`` (:mod:`.shares`). Jobs of other projects
            count against their users.
        quantum: seconds between decisions.
        split: split stride (local per server + central) or one global stride.
        balance: migrate while (max - min) ticket load exceeds this fraction of the mean load.
        migrations: most migrations per quantum.
        trading: trade GPU types between users at second prices (heterogeneous clusters).
        compensate: half-life (seconds) of the usage that compensation tickets correct for
            (0 disables them; see :meth:`_set_tickets`).
        spread_backfill: a waiting gang may span the idle GPUs of several servers for a quantum.
        stretch: (simulator) the quanta one decision may span. 1 (the default, and always on a
            live cluster) decides every quantum. Above 1, the decision at an arrival or an end
            spans one quantum and each later one, while nothing else arrives or ends, spans
            ``stretch`` quanta; the jobs it runs are charged that many strides. An arrival or an
            end cuts a stretched quantum short (the unused part of the charge is given back)
            and starts a fresh one-quantum decision. Shares and passes stay those of stride
            scheduling; what changes is how finely the slices are cut while nothing happens
            (docs/simulator.md says how much the results move).
        placement, packlimit: where a gang goes under ``split=False`` (see :mod:`.placement`).
    """

    #: a run's first step is no reason to decide (sim/engine.py): every quantum uses every GPU a
    #: waiting or running job fits in (:meth:`_backfill`), so between quanta what runs keeps running
    #: and nothing else fits; usage and tickets change only at quanta, arrivals and ends. Results are
    #: those of deciding at every first step, up to the rounding of event times (a test holds them)
    first_step_events = False

    def __init__(self, tickets: Optional[dict[str, float]] = None, default_tickets: float = 1.0,
                 quantum: float = 60.0, placement: str = "consolidated", packlimit: float = 0.5,
                 split: bool = True, balance: float = 0.1, migrations: int = 4, trading: bool = True,
                 compensate: float = 3600.0, spread_backfill: bool = True, stretch: int = 1,
                 name: str = "gandiva-fair", project_tickets: Optional[dict[str, float]] = None) -> None:
        given = (*(tickets or {}).values(), *(project_tickets or {}).values())
        if default_tickets <= 0 or any(not t > 0 for t in given):
            raise ConfigError("tickets must be positive")
        if quantum <= 0 or balance < 0 or migrations < 0:
            raise ConfigError("quantum must be > 0, balance and migrations >= 0")
        if isinstance(stretch, bool) or not isinstance(stretch, int) or not 1 <= stretch <= 4096:
            raise ConfigError(f"stretch must be a whole number of quanta from 1 to 4096, not {stretch!r}")
        if stretch > 1 and not split:
            raise ConfigError("stretch applies to split stride only (gandiva-fair, gandiva-fair-notrade)")
        self.tickets, self.default = dict(tickets or {}), default_tickets
        self.project_tickets: dict[str, float] = dict(project_tickets or {})
        self.project_parents: dict[str, str] = {}  # sub-project -> its parent (set_tickets; shares.py's tree)
        self.member_shares: dict[str, float] = {}  # "project/user" -> the member's share there (set_tickets)
        self._rekey = False  # the projects' tickets changed: the jobs' accounts are read again
        self.quantum, self.placement, self.packlimit = quantum, placement, packlimit
        self.split, self.balance, self.max_moves, self.trading = split, balance, migrations, trading
        self.name = name
        self.single_type = split  # a gang runs on one GPU type: bigger than every type, it never runs
        self._jobs: dict[int, StrideJob] = {}
        self._planned: dict = {}  # the last quantum's placements (split stride)
        self._spass: dict[int, float] = {}  # central-stride pass of each server entry
        self._next = 0.0
        self._users: Optional[frozenset] = None
        self._njobs = 0  # jobs in the snapshot the users were last read from
        self.entitlement: dict[str, dict[str, float]] = {}  # user -> GPU type -> GPUs
        self.trades: list["Trade"] = []
        self.moves = 0  # migrations decided so far
        self.compensate = compensate
        self.spread_backfill = spread_backfill
        self._usage: dict[tuple, float] = {}  # (user, GPU type) -> decayed GPU-seconds received
        self._last: Optional[float] = None
        self._groups_of: Optional[tuple] = None  # the job ids _groups_cache was built for
        self._groups_cache: dict = {}
        self._homes_of: Optional[tuple] = None  # (job ids, moves) _homes_cache was built for
        self._homes_cache: tuple = ({}, {})
        self.stretch = stretch
        self._k = 1  # quanta the current decision spans (stretch)
        self._event = True  # an arrival or an end since the last quantum (the first one is a fresh start)
        self._qstart = 0.0
        self._charges: list = []  # (StrideJob or node, pass charged) of a stretched quantum
        self._scharges: dict[int, float] = {}  # node -> central pass charged this quantum
        self._shape_of: Optional[tuple] = None  # (GPUs per node, node types) _shape was built for
        self._shape: tuple = ()
        self._reshaped = False  # the servers changed since the last quantum (a live node lost, back, cordoned)
        self._tickets_of: Optional[tuple] = None  # (groups, entitlement) _entitled was built for
        self._entitled: tuple = ({}, {}, {})
        self._notes: list = []  # (job, why) for the next decision's notes
        self._restored: dict = {}  # job id -> (pass, home, GPU type) from import_state, until it is seen

    # ------------------------------------------------------------------ shares
    def set_tickets(self, tickets: dict[str, float], projects: Optional[dict[str, float]] = None,
                    parents: Optional[dict[str, str]] = None, members: Optional[dict[str, float]] = None) -> None:
        """Replace the users' tickets (the live coordinator's ``elastictrain users set``) and, unless
        None, the projects' (``projects set --tickets``), which project is under which (``projects
        set --parent``) and members' shares in their projects (``projects set --users alice=3``:
        :func:`.shares.account_tickets`); the entitlements are recomputed at the next decision."""
        if any(not t > 0 for t in (*tickets.values(), *(projects or {}).values())):
            raise ConfigError("tickets must be positive")
        self.tickets = dict(tickets)
        if projects is not None and projects != self.project_tickets:
            self.project_tickets, self._rekey = dict(projects), True
        if parents is not None and parents != self.project_parents:
            self.project_parents, self._rekey = dict(parents), True
        if members is not None:
            self.member_shares = dict(members)
        self.inputs_changed()

    def inputs_changed(self) -> None:
        """Tickets or measured per-type speeds changed: recompute the entitlements (and the
        trades) at the next decision."""
        self._users = None

    def _who(self, j) -> str:
        """The account ``j``'s GPU time counts against (:func:`.shares.account`): its user, or its
        project and user where its project has tickets."""
        return account(j.user, j.project, self.project_tickets, self.project_parents) if self.project_tickets \
            else j.user

    def _stride(self, j, pass_: float, home: Optional[int], gtype: str) -> StrideJob:
        """``j``'s stride record (1 ticket until :meth:`_set_tickets`), counted against its account."""
        return StrideJob(j.job_id, j.num_gpu, 1.0, pass_, home, gtype, self._who(j), j.user, j.project)

    def _entitle(self, s: ClusterSnapshot, by_type: dict[str, int]) -> None:
        """Each account's entitlement to each GPU type (users, or projects' members), read again
        when the accounts with jobs change. ("Users" below: accounts.)"""
        if self._rekey:  # projects gained or lost tickets: the jobs known count against new accounts
            self._rekey, self._groups_of = False, None
            for sj in self._jobs.values():  # (jobs being stopped too: they are not in the snapshot)
                sj.user = account(sj.owner, sj.project, self.project_tickets, self.project_parents)
        if self._users is not None and not s.arrived and not s.ended and len(s.jobs) == self._njobs:
            return  # the same jobs as last time (jobs being stopped are left out: the count changes)
        self._njobs = len(s.jobs)
        who = [self._who(j) for j in s.jobs]
        users = frozenset(who)
        if users == self._users:
            return
        self._users = users
        speed = None
        if self.trading and len(by_type) > 1:  # a user's bid: the mean speeds of its jobs
            sums: dict[str, dict[str, float]] = {u: dict.fromkeys(by_type, 0.0) for u in users}
            count = dict.fromkeys(users, 0)
            for j, u in zip(s.jobs, who):
                count[u] += 1
                for t in by_type:
                    sums[u][t] += j.speeds.get(t, 1.0)
            speed = {u: {t: v / count[u] for t, v in sums[u].items()} for u in users}
        tickets = account_tickets(users, self.tickets, self.default, self.project_tickets, self.project_parents,
                                  self.member_shares)
        self.entitlement, self.trades = entitlements(tickets, by_type, speed)

    # ------------------------------------------------------------------ memory across restarts
    def export_state(self) -> dict:
        """What stride scheduling remembers, to survive a coordinator restart (and to start a
        forecast from): each job's pass, home server and GPU type, the servers' central passes, the
        users' decayed usage and when it was counted, and when the next quantum falls. Tickets,
        entitlements and trades are derived again from the jobs and the users' tickets."""
        return {"jobs": [[str(jid), sj.pass_, sj.home, sj.gtype] for jid, sj in self._jobs.items()]
                + [[str(jid), *was] for jid, was in self._restored.items()],  # (restored, not seen yet)
                "servers": [[n, v] for n, v in self._spass.items()],
                "usage": [[u, t, v] for (u, t), v in self._usage.items()],
                "last": self._last, "next": self._next, "moves": self.moves}

    def import_state(self, state: dict, jobs, rename: Optional[dict] = None) -> None:
        """Restore :meth:`export_state` for the jobs in ``jobs`` (views; matched by ``str(job_id)``,
        others are dropped), as of the clock it was exported on. ``rename``: the ids these jobs have
        where this instance runs (the forecast's simulation), by exported id. A job keeps its pass
        and home if its home still holds it when it is next seen (else it is placed afresh, level
        with its new peers).

        Raises:
            ValueError, TypeError, KeyError: a malformed state (the caller starts afresh).
        """
        now = Restored(jobs, rename)
        restored = {now.id(key): (float(pass_), None if home is None else int(home), str(gtype))
                    for key, pass_, home, gtype in state["jobs"] if now.id(key) is not None}
        servers = {int(n): float(v) for n, v in state["servers"]}
        usage = {(str(u), str(t)): float(v) for u, t, v in state["usage"]}
        last = None if state["last"] is None else float(state["last"])
        self._next, self.moves = float(state["next"]), int(state["moves"])
        self._restored, self._spass, self._usage, self._last = restored, servers, usage, last
        self._jobs.clear()

    def _join(self, j, caps, nodes_of, by_type) -> StrideJob:
        """A job new to this instance: as restored (:meth:`import_state`) where its home and GPU type
        still hold it, else placed (:meth:`_home`)."""
        was = self._restored.pop(j.job_id, None) if self._restored else None
        if was is not None:
            pass_, home, gtype = was
            if gtype in nodes_of and (home is None or (home in nodes_of[gtype] and caps[home] >= j.num_gpu)) and \
                    (not j.gpu_type or type_matches(j.gpu_type, gtype)):
                return self._stride(j, pass_, home, gtype)
        return self._home(j, caps, nodes_of, by_type)

    # ------------------------------------------------------------------ decide
    def decide(self, s: ClusterSnapshot) -> Decision:
        for jid in s.ended:
            self._jobs.pop(jid, None)
            if self._restored:
                self._restored.pop(jid, None)
        if not self.split:
            return self._decide_global(s)
        caps = full = s.gpus_per_node  # (the two names: what may be placed now, and the structure)
        types, by_type, nodes_of = self._structure(full, s.node_types)
        self._entitle(s, by_type)
        by_id = s.by_key
        known = len(self._jobs)
        for j in s.arrived:
            if j.job_id not in self._jobs:
                self._jobs[j.job_id] = self._join(j, full, nodes_of, by_type)
        if len(self._jobs) != len(s.jobs):  # jobs never seen arriving (e.g. the policy was rebuilt)
            for j in s.jobs:
                if j.job_id not in self._jobs:
                    self._jobs[j.job_id] = self._join(j, full, nodes_of, by_type)
        if self._reshaped:  # the nodes changed: a job that waited for a GPU type no node had may have one now
            for jid, sj in list(self._jobs.items()):
                if sj.gtype not in nodes_of and jid in by_id:
                    self._jobs[jid] = self._home(by_id[jid], full, nodes_of, by_type)
        fresh = bool(s.arrived) or bool(s.ended) or len(self._jobs) != known
        ids = tuple(by_id)  # the snapshot's job ids: what the cached groups and homes were built for
        self._event = self._event or fresh
        quantum = s.now >= self._next or (self._k > 1 and self._event)
        if quantum or fresh or self._last is None:
            # usage and tickets change where the schedule may: at a quantum, an arrival or an end.
            # Between those nothing else starts or stops, so a decision there (a run's first step,
            # a live round) leaves both as they were, and the results do not depend on it. (Live, a
            # start the quantum chose that waited for a stopping job's GPUs is counted from the
            # quantum: a few seconds early. Accounting at every decision instead is as exact, but
            # its rounding differs with the decision points, and the schedule follows it.)
            self._account(s, types)
            self._set_tickets(s, ids)
        if quantum:
            self._start_quantum(s.now)
            for t, nodes in nodes_of.items():
                self._rebalance(nodes, full, by_id)
            self._reshaped = False
        residents, central = self._homes(s, ids)
        run: dict[int, tuple] = {}
        if not quantum:  # between quanta: what runs keeps running; a newcomer starts if its home has room
            free = list(caps)
            for j in s.running:
                run[j.job_id] = j.placement
                for n, g in j.placement:
                    free[n] -= g
            # first the jobs this quantum chose that have not started: on a live cluster a start
            # waits until the preempted jobs' workers have exited (their pass already advanced)
            for jid, where in self._planned.items():
                j = by_id.get(jid)
                if j is not None and not j.running and all(0 <= n < len(free) and free[n] >= g for n, g in where):
                    for n, g in where:
                        free[n] -= g
                    run[jid] = where
            for j in s.jobs:
                if j.job_id in run:
                    continue
                sj = self._jobs[j.job_id]
                if not j.running and sj.home is not None and sj.size <= free[sj.home]:
                    free[sj.home] -= sj.size
                    sj.pass_ += sj.size / sj.tickets
                    run[j.job_id] = ((sj.home, sj.size),)
            return Decision(run, self._wake(s, run), notes=self._said())
        jobs, k = self._jobs, self._k
        for t, nodes in nodes_of.items():
            big = central.get(t, [])
            claimed = self._central(nodes, caps, residents, big, run)
            free = {n: caps[n] for n in nodes if n not in claimed}
            if big:
                for n, who in claimed.items():  # a big job's last server may be taken in part: lend the rest
                    if who != "local":
                        left = caps[n] - sum(g for m, g in run[who] if m == n)
                        if left > 0:
                            free[n] = left
            for n in nodes:
                if claimed.get(n) == "local":
                    left = caps[n]
                    for jid in gang_stride(residents[n], left, k):
                        size = jobs[jid].size
                        run[jid] = ((n, size),)
                        left -= size
                    free[n] = left
            self._backfill(nodes, free, residents, by_id, run)
        self._planned = dict(run)
        if self._k > 1:
            self._charges = [(self._jobs[jid], self._k * self._jobs[jid].size / self._jobs[jid].tickets) for jid in run]
            self._charges += [(n, v) for n, v in self._scharges.items()]
        return Decision(run, self._wake(s, run), notes=self._said())

    def _structure(self, caps: tuple, node_types: tuple) -> tuple:
        """Each node's GPU type, each type's GPUs and nodes: built again only when the nodes'
        GPUs or types change (a node down or back), not at every quantum."""
        if self._shape_of is None or self._shape_of[0] != caps or self._shape_of[1] != node_types:
            types = node_types or ("gpu",) * len(caps)
            by_type: dict[str, int] = {}
            nodes_of: dict[str, list[int]] = {}
            for n, (t, c) in enumerate(zip(types, caps)):
                by_type[t] = by_type.get(t, 0) + c
                nodes_of.setdefault(t, []).append(n)
            self._shape_of, self._shape = (caps, node_types), (types, by_type, nodes_of)
            self._reshaped = True
            self._users = None  # each user's share of each type is of the GPUs there now
        return self._shape

    def _said(self) -> tuple:
        """The notes for this decision (then forgotten: each is said once)."""
        if not self._notes:
            return ()
        notes, self._notes = tuple(self._notes), []
        return notes

    def _start_quantum(self, now: float) -> None:
        """A quantum starts: a stretched one cut short by an arrival or an end gives back the
        strides of the part not used; the new one spans one quantum after an arrival or an end,
        else ``stretch`` quanta."""
        if self._k > 1 and now < self._next:
            unused = 1.0 - (now - self._qstart) / (self._next - self._qstart)
            for who, charged in self._charges:
                if isinstance(who, StrideJob):
                    who.pass_ -= unused * charged
                elif who in self._spass:
                    self._spass[who] -= unused * charged
        self._charges, self._scharges = [], {}
        self._k = 1 if self._event else self.stretch
        self._event = False
        self._qstart, self._next = now, now + self._k * self.quantum

    def replay_hint(self, span: float) -> Optional[str]:
        """What ``elastictrain simulate`` prints before replaying a trace whose arrivals span
        ``span`` seconds, if deciding every quantum would take long (about 120 us a decision)."""
        quanta = span / self.quantum
        if self.stretch > 1 or not self.split or quanta < 400_000:
            return None
        return (f"{self.name} decides every {self.quantum:g} s quantum while a job waits, and this trace's "
                f"arrivals span about {quanta:,.0f} quanta (at least {quanta * 120e-6 / 60:.0f} minutes here); "
                "--stretch 64 decides once per 64 quanta while nothing arrives or ends (coarser slices, same "
                "shares; docs/simulator.md, Speed)")

    def _wake(self, s: ClusterSnapshot, run: dict) -> Optional[float]:
        """The next quantum, while some job waits; with nobody waiting there is nothing to slice
        until a job arrives or ends (which brings a decision anyway, and a quantum then)."""
        return self._next if len(run) < len(s.jobs) else None

    def _backfill(self, nodes: list[int], free: dict, residents: dict, by_id: dict, run: dict) -> None:
        """Work conservation: GPUs the quantum leaves idle (gangs that do not fit in a local
        schedule's rest, or the part of a server a big job does not take) go, for this quantum,
        to the jobs it did not schedule, lowest pass first: a waiting one where it fits best, a
        running one only where it runs (nothing is migrated). They pay for the time in pass."""
        total = sum(free.values())
        if not total:
            return
        left = [sj for n in nodes for sj in residents.get(n, ()) if sj.job_id not in run]
        spread, k = self.spread_backfill, self._k
        for sj in sorted(left, key=_PASS_ID):
            if sj.size > total:
                if not total:
                    break  # nothing fits any more
                continue
            j = by_id[sj.job_id]
            if j.running:  # it keeps its GPUs if idle (on a server a big job took in part, or lent before)
                where = j.placement
                for n, g in where:
                    if free.get(n, 0) < g:
                        break
                else:
                    for n, g in where:
                        free[n] -= g
                    total -= sj.size
                    sj.pass_ += k * sj.size / sj.tickets
                    run[sj.job_id] = where
                continue
            size, n, best = sj.size, -1, 0
            for m, f in free.items():  # the best fit: the fewest free GPUs that hold it, then the lowest node
                if f >= size and (n < 0 or f < best or (f == best and m < n)):
                    n, best = m, f
            if n >= 0:
                free[n] -= size
                where = ((n, size),)
            elif spread:
                take, got = [], 0  # the gang spans the holes of several servers for this quantum
                for n in sorted((m for m in free if free[m] > 0), key=lambda m: (-free[m], m)):
                    g = min(free[n], sj.size - got)
                    take.append((n, g))
                    got += g
                    if got == sj.size:
                        break
                for n, g in take:
                    free[n] -= g
                where = tuple(take)
            else:
                continue
            total -= sj.size
            sj.pass_ += k * sj.size / sj.tickets
            run[sj.job_id] = where

    def _home(self, j, caps, nodes_of, by_type) -> StrideJob:
        """Place a newcomer: its GPU type (lowest demand / entitlement, ties to the faster), then
        its server (lowest ticket load), or the central queue if it is bigger than a server."""
        who = self._who(j)
        ent = self.entitlement.get(who, {})
        demand: dict[str, float] = {}
        for sj in self._jobs.values():
            if sj.user == who:
                demand[sj.gtype] = demand.get(sj.gtype, 0.0) + sj.size

        def score(t: str):
            e = ent.get(t, 0.0)
            return ((demand.get(t, 0.0) + j.num_gpu) / e if e > 0 else float("inf"), -j.speeds.get(t, 1.0))

        # (a type too small for it now may be whole again later: a live node lost or cordoned; on
        # none it waits, central, until one is: the simulator sets aside jobs no type can ever hold)
        kinds = [t for t in nodes_of if type_matches(j.gpu_type, t)] if j.gpu_type else list(nodes_of)
        if not kinds:  # it waits, central on a type of its own that no server serves, until one does
            self._notes.append((j.job_id, {"decision": "wait", "why": (
                f"needs GPU type {j.gpu_type}, and no node offers it now (types: {', '.join(nodes_of)})")}))
            return self._stride(j, 0.0, None, j.gpu_type)
        fits = [t for t in kinds if by_type[t] >= j.num_gpu]
        if not fits:
            self._notes.append((j.job_id, {"decision": "wait", "why": (
                f"needs {j.num_gpu} GPUs, more than any one GPU type offers now ({by_type}); gandiva-fair runs a "
                "gang on one type, so it waits until one does")}))
        gtype = min(fits or kinds, key=score)
        local = [n for n in nodes_of[gtype] if caps[n] >= j.num_gpu]
        sj = self._stride(j, 0.0, None, gtype)
        if local:
            load = self._loads(local, caps)
            sj.home = min(local, key=lambda n: (load[n], n))
        sj.pass_ = self._lowest_pass(sj.home, gtype, 0.0)  # level with its peers: neither ahead nor owed
        return sj

    def _account(self, s: ClusterSnapshot, types) -> None:
        """Decayed GPU-seconds each user received on each type since the previous decision: each
        second of a GPU held counts 0.5 ** (its age / half-life), integrated exactly over the
        interval, so the usage does not depend on where decisions fall in between (a decision at a
        first step or at a live round adds no error; summing ``g * dt`` did: the part of an
        interval before a decision was decayed less than the same part of one long interval)."""
        if self._last is not None and self.compensate > 0:
            decay, held = decayed(s.now - self._last, self.compensate)  # (held: one GPU over the interval)
            usage = self._usage
            for k in usage:
                usage[k] *= decay
            jobs = self._jobs if self.project_tickets else None  # (an account other than the user's)
            for j in s.running:
                u = j.user if jobs is None else jobs[j.job_id].user
                for n, g in j.placement:
                    k = (u, types[n])
                    usage[k] = usage.get(k, 0.0) + g * held
        self._last = s.now

    def _groups(self, s: ClusterSnapshot, ids: tuple) -> dict[tuple, list]:
        """(user, GPU type) -> its jobs, in arrival order; built again only when the snapshot's jobs
        (``ids``) changed (a quantum with nothing arrived or ended reuses it)."""
        if ids != self._groups_of:
            jobs, groups = self._jobs, {}
            for j in s.jobs:
                sj = jobs[j.job_id]
                key = (sj.user, sj.gtype)
                g = groups.get(key)
                if g is None:
                    groups[key] = [sj]
                else:
                    g.append(sj)
            self._groups_of, self._groups_cache = ids, groups
        return self._groups_cache

    def _homes(self, s: ClusterSnapshot, ids: tuple) -> tuple[dict, dict]:
        """Each server's resident jobs and each GPU type's central ones, in arrival order; built
        again only when the snapshot's jobs (``ids``) or a job's home (a migration) changed."""
        key = (ids, self.moves)
        if key != self._homes_of:
            residents: dict[int, list[StrideJob]] = {}
            central: dict[str, list[StrideJob]] = {}
            for j in s.jobs:
                sj = self._jobs[j.job_id]
                if sj.home is None:
                    central.setdefault(sj.gtype, []).append(sj)
                else:
                    residents.setdefault(sj.home, []).append(sj)
            self._homes_of, self._homes_cache = key, (residents, central)
        return self._homes_cache

    def _set_tickets(self, s: ClusterSnapshot, ids: tuple) -> None:
        """A job's tickets: its user's entitlement on its type over the user's jobs there, times
        a *compensation* factor (as in stride scheduling's compensation tickets): gangs fill the
        holes others leave, which favours users with many small jobs per ticket, so a user whose
        recent share of the type (usage decayed with half-life ``compensate``) is below its
        entitled share gets proportionally more tickets, one above it fewer (within 1/4..4x)."""
        groups = self._groups(s, ids)
        usage = self._usage
        of = self._tickets_of
        if of is None or of[0] is not groups or of[1] is not self.entitlement:
            # what depends on the jobs and the entitlements only, not on the usage (changes at events)
            ent = self.entitlement
            entitled = {key: ent.get(key[0], {}).get(key[1], 0.0) for key in groups}
            ent_sum: dict[str, float] = {}
            for key in groups:
                ent_sum[key[1]] = ent_sum.get(key[1], 0.0) + entitled[key]
            floor = {key: max(e, 1e-6) for key, e in entitled.items()}
            self._tickets_of, self._entitled = (groups, ent), (entitled, ent_sum, floor)
        entitled, ent_sum, floor = self._entitled
        use_sum: dict[str, float] = {}
        if self.compensate > 0:
            for key in groups:
                use_sum[key[1]] = use_sum.get(key[1], 0.0) + usage.get(key, 0.0)
        # a user with no entitlement left on this type (traded away) keeps a sliver (floor), so its
        # job still runs on GPUs nobody else wants
        for key, members in groups.items():
            f = 1.0
            if use_sum:
                t = key[1]
                e, used = entitled[key], usage.get(key, 0.0)
                if e > 0 and ent_sum[t] > 0 and use_sum[t] > 0:
                    want, got = e / ent_sum[t], used / use_sum[t]
                    f = min(4.0, max(0.25, want / got if got > 0 else 4.0))
            each = floor[key] * f / len(members)
            for sj in members:
                sj.tickets = each

    def _loads(self, nodes: list[int], caps) -> dict[int, float]:
        load = dict.fromkeys(nodes, 0.0)
        for sj in self._jobs.values():
            h = sj.home
            if h in load:
                load[h] += sj.tickets
        for n in nodes:
            load[n] /= caps[n]
        return load

    def _rebalance(self, nodes: list[int], caps, by_id: dict) -> None:
        """Migrate jobs from the most to the least ticket-loaded server while that lowers the
        maximum load and the spread exceeds ``balance`` of the mean; waiting jobs move first.
        While a server is down, or after the servers changed, jobs are given homes first
        (:meth:`_rehome`)."""
        if self._reshaped or not all(caps[n] for n in nodes):
            nodes = self._rehome(nodes, caps)
        if len(nodes) < 2:
            return
        for _ in range(self.max_moves):
            load = self._loads(nodes, caps)
            hi = lo = nodes[0]  # the most loaded and the least (ties: the lowest node; nodes ascend)
            top = bottom = load[hi]
            for n in nodes:
                v = load[n]
                if v > top:
                    hi, top = n, v
                elif v < bottom:
                    lo, bottom = n, v
            mean = sum(load.values()) / len(load)
            if load[hi] - load[lo] <= self.balance * mean:
                return
            best = None
            for sj in self._jobs.values():
                if sj.home != hi or sj.size > caps[lo]:
                    continue
                after = max(load[hi] - sj.tickets / caps[hi], load[lo] + sj.tickets / caps[lo])
                key = (after, by_id[sj.job_id].running if sj.job_id in by_id else False, sj.job_id)
                if after < load[hi] - 1e-12 and (best is None or key < best[0]):
                    best = (key, sj)
            if best is None:
                return
            sj = best[1]
            floor_hi = self._lowest_pass(hi, sj.gtype, 0.0)
            sj.pass_ += self._lowest_pass(lo, sj.gtype, floor_hi, but=sj) - floor_hi  # its standing among its new peers
            sj.home = lo
            self.moves += 1

    def _rehome(self, nodes: list[int], caps) -> list[int]:
        """Homes on a live cluster whose servers change: the residents of a server that is down (0
        GPUs: a node lost or drained) move to the least loaded server up that holds them, and so
        does a central job (one that arrived while no server up could hold it) once one can; level
        with their new peers. A job that fits no server up waits where it is. Returns the servers up."""
        up = [n for n in nodes if caps[n]]
        for sj in list(self._jobs.values()):
            h = sj.home
            if h is None:
                if sj.gtype != self._shape[0][nodes[0]]:
                    continue
            elif caps[h] or h not in nodes:
                continue
            fits = [n for n in up if caps[n] >= sj.size]
            if not fits:
                continue
            load = self._loads(fits, caps)
            to = min(fits, key=lambda n: (load[n], n))
            sj.pass_ = self._lowest_pass(to, sj.gtype, sj.pass_)
            sj.home = to
            self.moves += 1
        return up

    def _lowest_pass(self, home: Optional[int], gtype: str, default: float, but: Optional[StrideJob] = None) -> float:
        """The lowest pass among the jobs homed on server ``home`` (None: the central ones of type
        ``gtype``), ``but`` one, or ``default`` where there is none: where a job joining them
        starts, neither ahead of them nor owed."""
        if home is None:
            return min((x.pass_ for x in self._jobs.values() if x.home is None and x.gtype == gtype), default=default)
        return min((x.pass_ for x in self._jobs.values() if x.home == home and x is not but), default=default)

    def _central(self, nodes: list[int], caps, residents: dict, big: list[StrideJob], run: dict) -> dict:
        """The central stride of one GPU type: servers (tickets: their residents') and jobs
        bigger than a server, by pass. Returns node -> "local" or the big job's id."""
        spass, k = self._spass, self._k
        servers = []  # those with residents (an empty one leaves the stride)
        for n in nodes:
            if residents.get(n):
                servers.append(n)
            else:
                spass.pop(n, None)
        if any(n not in spass for n in servers):  # a server new to the stride starts level with the lowest entry
            floor = min([spass[n] for n in servers if n in spass] + [b.pass_ for b in big], default=0.0)
            for n in servers:
                spass.setdefault(n, floor)
        # by pass; with no job bigger than a server (the common case) every server runs its local
        # schedule, in any order
        entries = sorted([(spass[n], 0, n) for n in servers] + [(b.pass_, 1, b.job_id) for b in big]) if big \
            else [(0.0, 0, n) for n in servers]
        claimed: dict[int, object] = {}
        order = None  # the servers a big job takes first: empty ones, then those furthest ahead
        for _, kind, key in entries:
            if kind == 0:
                if key not in claimed:
                    claimed[key] = "local"
                    charge = k * caps[key] / sum(map(_TICKETS, residents[key]))
                    spass[key] += charge
                    if k > 1:
                        self._scharges[key] = charge
                continue
            b = self._jobs[key]
            if order is None:  # (only the servers claimed meanwhile change their pass, and they are skipped)
                order = sorted((n for n in nodes if caps[n] > 0), key=lambda n: (n in spass, -spass.get(n, 0.0), n))
            take, got, size = [], 0, b.size
            for n in order:
                if got >= size:
                    break
                if n not in claimed:
                    g = min(caps[n], size - got)
                    take.append((n, g))
                    got += g
            if got < size:
                continue
            for n, _ in take:
                claimed[n] = key
            run[key] = tuple(take)
            b.pass_ += k * size / b.tickets
        return claimed

    def _decide_global(self, s: ClusterSnapshot) -> Decision:
        """One gang-aware stride over the whole cluster (``split=False``)."""
        floor = min((j.pass_ for j in self._jobs.values()), default=0.0)
        for j in (*s.arrived, *s.jobs) if len(self._jobs) != len(s.jobs) else s.arrived:
            if j.job_id not in self._jobs:  # a newcomer starts level with the others, neither ahead nor owed
                was = self._restored.pop(j.job_id, None) if self._restored else None  # (or as restored)
                self._jobs[j.job_id] = self._stride(j, floor if was is None else was[0], None, "gpu")
        who = [self._who(j) for j in s.jobs]
        per_user: dict[str, int] = {}
        for u in who:
            per_user[u] = per_user.get(u, 0) + 1
        tickets = account_tickets(per_user, self.tickets, self.default, self.project_tickets,
                                  self.project_parents, self.member_shares)
        for j, u in zip(s.jobs, who):
            self._jobs[j.job_id].tickets = tickets[u] / per_user[u]
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
            where = placer.place(by_id[jid].num_gpu, by_id[jid].skew, (), by_id[jid].gpu_type)
            if where is None:  # fits by count but not by placement: undo its pass advance
                sj = self._jobs[jid]
                sj.pass_ -= sj.size / sj.tickets
                continue
            run[jid] = where
        return Decision(run, self._wake(s, run))


_OPTIONS = ("tickets", "project_tickets", "default_tickets", "quantum", "placement", "packlimit", "split", "balance",
            "migrations", "compensate", "spread_backfill", "stretch")
register("gandiva-fair", lambda **kw: GandivaFair(**kw), _OPTIONS)
register("gandiva-fair-notrade", lambda **kw: GandivaFair(trading=False, name="gandiva-fair-notrade", **kw), _OPTIONS)
register("gandiva-fair-global", lambda **kw: GandivaFair(split=False, name="gandiva-fair-global", **kw),
         tuple(o for o in _OPTIONS if o not in ("split", "balance", "migrations", "stretch")))


# ---------------------------------------------------------------------------- trading
def entitlements(tickets: dict[str, float], gpus: dict[str, int],
                 speed: Optional[dict[str, dict[str, float]]] = None,
                 unit: float = 0.25) -> tuple[dict[str, dict[str, float]], list["Trade"]]:
    """Each user's GPUs of each type: its ticket share of every type (the heterogeneity-agnostic
    fair share); with ``speed`` (user -> type -> speed), then traded at second prices
    (:func:`trade`), the fastest type (by mean speed) first and the widest speed gap first.
    Returns the allocation and the trades."""
    total = sum(tickets.values())
    alloc = {u: {t: k / total * n for t, n in gpus.items()} for u, k in tickets.items()}
    trades: list[Trade] = []
    if speed is not None and len(gpus) > 1:
        mean = {t: sum(speed[u][t] for u in tickets) / len(tickets) for t in gpus}
        order = sorted(gpus, key=lambda t: -mean[t])  # fastest first
        for i, fast in enumerate(order):
            for slow in reversed(order[i + 1:]):  # the widest speed gap first
                trades += trade(alloc, speed, fast, slow, unit=unit)
    return alloc, trades


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

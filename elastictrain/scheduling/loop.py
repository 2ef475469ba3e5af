"""The scheduling step shared by the simulator and the coordinator: snapshot, decide, plan, act.

``Scheduler.tick()`` reads the time from the injected clock, takes a snapshot of the job
table for its policy, asks the policy to decide, checks the decision (:func:`.plan.plan`) and
hands each action to the backend, updating the table as it goes. A policy that raises, or
whose decision breaks an invariant, costs one decision: the error is logged and reported, the
previous allocation stands, and the changes the policy missed are handed to it again next
time. ``strict=True`` (the simulator's default: a research run should fail loudly) re-raises
instead.

**No preemption before the first step** (``protect_startup``, on by default). A running job
that has not trained its first step yet (``JobTable.starting``) is not preempted: a decision
that leaves it out keeps it where it is, and the starts that would have needed its GPUs wait
for a later decision (``Scheduler.held_back``). Preempting it would throw its start-up away,
and a policy deciding every few seconds would otherwise churn a job that never trains. Moves of
running jobs are never undone for it, nor are interleaving groups (the decision then stands).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import msgspec

from ..clock import Clock
from ..errors import PolicyError
from ..policies.api import ClusterSnapshot, Decision, Policy
from .api import MIGRATE, PREEMPT, START, Action, Backend
from .plan import plan
from .table import JobTable

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)


class Scheduler:
    """Runs ``policy`` over ``table`` on ``backend``.

    Args:
        strict: re-raise policy failures instead of keeping the previous allocation.
        on_error: called with the PolicyError when a decision fails (e.g. to log an event).
        protect_startup: never preempt a job before its run's first training step (see above).
    """

    def __init__(self, policy: Policy, table: JobTable, backend: Backend, clock: Clock, *, strict: bool = False,
                 on_error: Optional[Callable[[PolicyError], None]] = None, protect_startup: bool = True) -> None:
        self.policy, self.table, self.backend, self.clock = policy, table, backend, clock
        self.strict, self.on_error = strict, on_error
        self.protect_startup = protect_startup
        self.held_back: dict = {}  # starts of the last decision that wait for a starting job: key -> that job
        self.kept: set = set()  # starting jobs the last decision left out and protection kept running
        self.feed = table.subscribe()
        self.wakeup: Optional[float] = None
        self.decisions = 0
        self.failures = 0
        self.last_snapshot: Optional[ClusterSnapshot] = None
        self.deferred: list = []  # starts of the last decision that wait for stopping jobs' GPUs
        self.refused: dict = {}  # placements of the last decision the backend refused: key -> why (Backend.refuses)
        self.notes: tuple = ()  # the last decision's reasons (Decision.notes)
        self.limits: dict = {}  # the last decision's per-worker memory limits (Decision.limits)

    def tick(self) -> list[Action]:
        """One decision; returns the actions taken (empty if the policy failed)."""
        now = self.clock.now()
        snap = self.feed.snapshot(now, self.backend.shape())
        self.last_snapshot = snap
        try:
            decision = self.policy.decide(snap)
            if not isinstance(decision, Decision):
                raise PolicyError(f"policy {self.policy.name}: decide() returned {type(decision).__name__}, "
                                  "not a Decision")
            self.held_back = {}
            self.kept = set()
            if self.protect_startup and self.table.starting:
                decision = self._protect(decision)
            actions = plan(self.table, snap, decision, self.policy.name)
        except Exception as exc:  # a policy's failure costs one decision, not the loop
            err = exc if isinstance(exc, PolicyError) else PolicyError(
                f"policy {self.policy.name} failed: {type(exc).__name__}: {exc}")
            if self.strict:
                if err is exc:
                    raise
                raise err from exc
            self.failures += 1
            log.error("%s; keeping the previous allocation", err)
            if self.on_error is not None:
                self.on_error(err)
            return []
        self.feed.consumed()
        self.decisions += 1
        self.wakeup = decision.wakeup
        self.notes = decision.notes
        self.limits = decision.limits
        self.act(actions, now)
        return actions

    def _protect(self, d: Decision) -> Decision:
        """``d`` with every starting job it would preempt kept where it runs, and the starts that
        needed its GPUs held back (the latest placed first). A job it cannot keep that way (a
        grouped one, or one whose GPUs a move takes) is preempted as decided."""
        running, run = self.table.running, d.run
        keep = [running[k] for k in self.table.starting if k in running and k not in run and not running[k].group]
        if not keep:
            return d
        caps = self.backend.shape().gpus_per_node
        run = dict(run)
        grouped = {k for g in d.groups for k in g}
        for e in sorted(keep, key=lambda e: e.seq):
            used, total = [0] * len(caps), 0
            for where in run.values():
                for n, g in where:
                    total += g
                    if 0 <= n < len(used):
                        used[n] += g
            need = e.placement
            if not need or any(n < 0 or n >= len(caps) for n, _ in need):
                continue
            size, want, limit = sum(g for _, g in need), dict(need), sum(caps)
            trial, dropped = dict(run), []
            for key in reversed(list(run)):
                if _fits(need, size, used, total, caps, limit):
                    break
                if key in running or key in grouped:
                    continue  # a job that runs, or moves, is never stopped for it; nor a group's member
                where = run[key]
                if total + size > limit or any(n in want and used[n] + want[n] > caps[n] for n, _ in where):
                    del trial[key]
                    dropped.append(key)
                    for n, g in where:
                        total -= g
                        if 0 <= n < len(used):
                            used[n] -= g
            if _fits(need, size, used, total, caps, limit):
                run = trial
                run[e.key] = need
                self.kept.add(e.key)
                for key in dropped:
                    self.held_back[key] = e.key
        if len(run) == len(d.run) and not self.held_back:
            return d
        workers = {k: v for k, v in d.workers.items() if k in run}
        slowdown = {k: v for k, v in d.slowdown.items() if k in run}
        return msgspec.structs.replace(d, run=run, workers=workers, slowdown=slowdown)

    def act(self, actions: list[Action], now: float) -> None:
        """Preemptions first, then moves, then starts.

        A decision may hand a preempted job's GPUs to another job at once, but real workers take
        seconds to checkpoint and exit, and a stopping job holds its GPUs until they have. So
        while jobs are stopping, a start that does not fit beside the GPUs they hold is deferred
        (the job keeps waiting; the next decision, once the stop completes, places it again), and
        a move that does not fit becomes a stop (the job waits and is placed again). Running
        placements plus held GPUs never exceed a node's capacity. (The simulator's stops complete
        at once, so there nothing is ever deferred.)

        A backend may also refuse a placement (``refuses(action)``: the live one, a start or a move
        onto a cordoned node where the job holds no GPUs): a start is then not made (the job waits
        and is placed again at the next decision), a move becomes a stop, and ``refused`` says why.
        """
        table, backend = self.table, self.backend
        self.deferred = []
        self.refused = {}
        instant = getattr(backend, "instant_stop", False)  # its stops complete at once (the simulator)
        if instant and not table.stopping:  # nothing is ever deferred: starts after the rest
            starts = []
            free_moves = getattr(backend, "free_moves", False)  # its migrations keep the run training
            for a in actions:
                kind = a.kind
                if kind is PREEMPT:
                    table.preempt_now(a.key, now)
                elif kind is START:
                    starts.append(a)
                elif kind is MIGRATE and free_moves:
                    backend.moved(table.move(a.key, a.placement, a.group, a.workers, False), a)
                else:
                    backend.restart(table.move(a.key, a.placement, a.group, a.workers), a)
            for a in starts:
                backend.start(table.start(a.key, a.placement, a.group, now, a.workers), a)
            return
        for a in actions:
            if a.kind is PREEMPT:
                backend.stop(table.stop(a.key, now), a)
        free = None
        if table.stopping:
            moving = {a.key for a in actions if a.kind is not PREEMPT}
            free = self._free(exclude=moving)
        refuses = getattr(backend, "refuses", None)
        for a in actions:
            if a.kind is PREEMPT or a.kind is START:
                continue
            why = self._refused(a, refuses)
            if why or (free is not None and not self._claim(a, free)):
                if not why:
                    self.deferred.append(a.key)
                e = table.get(a.key)
                backend.stop(table.stop(a.key, now), Action(PREEMPT, a.key, (), e.placement, e.num_gpu))
                if free is not None:
                    for n, g in e.held:
                        free[n] -= g
                continue
            backend.restart(table.move(a.key, a.placement, a.group, a.workers), a)
        for a in actions:
            if a.kind is START:
                if self._refused(a, refuses):
                    continue
                if free is not None and not self._claim(a, free):
                    self.deferred.append(a.key)
                    continue
                backend.start(table.start(a.key, a.placement, a.group, now, a.workers), a)

    def _refused(self, a: Action, refuses) -> str:
        """Why the backend refuses ``a`` ("" where it does not); a group's follower goes where its
        leader goes, refused with it."""
        if refuses is None:
            return ""
        why = refuses(a) or (self.refused.get(a.group[0], "") if a.group else "")
        if why:
            self.refused[a.key] = why
        return why

    def _claim(self, a: Action, free: list[int]) -> bool:
        """Take ``a``'s GPUs from ``free`` if they are all there (a group follower shares its
        leader's GPUs: it goes where its leader went)."""
        leader = a.group[0] if a.group else a.key
        if leader != a.key:
            return leader not in self.deferred and self.table.get(leader).running
        if any(n >= 0 and free[n] < g for n, g in a.placement):
            return False
        for n, g in a.placement:
            if n >= 0:
                free[n] -= g
        return True

    def _free(self, exclude: set) -> list[int]:
        """GPUs of each node not held by a stopping job nor placed to a running job (except the
        jobs in ``exclude``, whose placements the caller claims again)."""
        caps = self.backend.shape().gpus_per_node
        free = [c - h for c, h in zip(caps, self.table.held_per_node(len(caps)))]
        for e in self.table.running.values():
            if e.key in exclude or (e.group and e.group[0] != e.key):
                continue  # an interleaving group's followers share its leader's GPUs
            for n, g in e.placement:
                if n >= 0:
                    free[n] -= g
        return free


def _fits(need: tuple, size: int, used: list, total: int, caps: tuple, limit: int) -> bool:
    return total + size <= limit and all(used[n] + g <= caps[n] for n, g in need)

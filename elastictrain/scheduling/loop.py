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

**A minimum run before preemption** (``min_run`` seconds, 0 by default: Slurm's
``PreemptExemptTime``). A run started less than ``min_run`` seconds ago is kept the same way,
whatever the policy or priority that wants its GPUs; the scheduler wakes when the earliest kept
run's time is up (``Scheduler.wakeup``), and decides again. ``kept_until`` says until when.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import msgspec

from ..clock import Clock
from ..errors import ConfigError, PolicyError
from ..policies.api import ClusterSnapshot, Decision, Policy
from .api import MIGRATE, PREEMPT, START, Action, Backend
from .plan import plan
from .table import JobTable

__all__ = ["Scheduler", "MAX_MIN_RUN"]

MAX_MIN_RUN = 30 * 86_400.0  # the longest minimum run before preemption (seconds)

log = logging.getLogger(__name__)


class Scheduler:
    """Runs ``policy`` over ``table`` on ``backend``.

    Args:
        strict: re-raise policy failures instead of keeping the previous allocation.
        on_error: called with the PolicyError when a decision fails (e.g. to log an event).
        protect_startup: never preempt a job before its run's first training step (see above).
        min_run: seconds a run is not preempted for after its start (see above; 0: off).
    """

    def __init__(self, policy: Policy, table: JobTable, backend: Backend, clock: Clock, *, strict: bool = False,
                 on_error: Optional[Callable[[PolicyError], None]] = None, protect_startup: bool = True,
                 min_run: float = 0.0) -> None:
        if not 0.0 <= min_run <= MAX_MIN_RUN:
            raise ConfigError(f"the minimum run before preemption must be 0 to {MAX_MIN_RUN:.0f} seconds (30 days), "
                              f"not {min_run!r}")
        self.policy, self.table, self.backend, self.clock = policy, table, backend, clock
        self.strict, self.on_error = strict, on_error
        self.protect_startup, self.min_run = protect_startup, float(min_run)
        self.kept_until: dict = {}  # running jobs the last decision left out and min_run kept: key -> until when
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
            self.kept_until = {}
            if (self.protect_startup and self.table.starting) or self.min_run:
                decision = self._protect(decision, now)
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
        if self.kept_until:  # decide again when the first kept run may be preempted
            due = min(self.kept_until.values())
            self.wakeup = due if self.wakeup is None else min(self.wakeup, due)
        self.notes = decision.notes
        self.limits = decision.limits
        self.act(actions, now)
        return actions

    def _protect(self, d: Decision, now: float) -> Decision:
        """``d`` with every starting job it would preempt kept where it runs, and the starts that
        needed its GPUs held back (the latest placed first). A job it cannot keep that way (a
        grouped one, or one whose GPUs a move takes) is preempted as decided. With ``min_run``,
        then every run younger than that too (:meth:`_keep_young`)."""
        running, run = self.table.running, d.run
        keep = [running[k] for k in self.table.starting if k in running and k not in run and not running[k].group] \
            if self.protect_startup else []
        young = [e for k, e in running.items() if k not in run and not e.group and now - e.run_at < self.min_run] \
            if self.min_run else []
        if not keep and not young:
            return d
        caps = self.backend.shape().gpus_per_node
        run = dict(run)
        grouped = {k for g in d.groups for k in g}
        for e in sorted(keep, key=lambda e: e.seq):
            used, total = _usage(run, len(caps))
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
        workers = d.workers
        if young:
            followers = {k for g in d.groups for k in tuple(g)[1:]}  # (they share their leader's GPUs)
            run, workers = self._keep_young(run, young, grouped, followers, caps, workers)
        if len(run) == len(d.run) and not self.held_back and workers is d.workers:
            return d
        workers = {k: v for k, v in workers.items() if k in run}
        slowdown = {k: v for k, v in d.slowdown.items() if k in run}
        return msgspec.structs.replace(d, run=run, workers=workers, slowdown=slowdown)

    def _keep_young(self, run: dict, young: list, grouped: set, followers: set, caps: tuple,
                    workers: dict) -> tuple[dict, dict]:
        """``run`` with each run younger than ``min_run`` (oldest job first) kept where it runs: while
        a node (or the cluster) is over capacity, the latest placed start there is held back, or the
        latest move of a running job there is undone (it stays where it runs, at its size). A young run
        that a group's GPUs, or nothing undone, would make room for is preempted as decided. Returns
        the run and the worker counts (a move undone drops its resize)."""
        running, limit, nodes = self.table.running, sum(caps), len(caps)
        for e in sorted(young, key=lambda e: e.seq):
            need = e.placement
            if e.key in run or not need or any(n < 0 or n >= nodes for n, _ in need):
                continue  # (kept for its start-up already)
            trial, dropped, undone = dict(run), [], []
            trial[e.key] = need
            while trial is not None:
                used, total = _usage(trial, nodes, followers)
                over = {n for n in range(nodes) if used[n] > caps[n]}
                if not over and total <= limit:
                    break
                victim = None
                for key in reversed(list(trial)):
                    old = running.get(key)
                    if key in self.kept or key == e.key or key in grouped or (old is not None and (
                            old.group or trial[key] == old.placement)):
                        continue  # kept, grouped, or where it runs
                    if total > limit or any(n in over for n, _ in trial[key]):
                        victim = key
                        break
                if victim is None:
                    trial = None
                elif victim in running:
                    trial[victim] = running[victim].placement
                    undone.append(victim)
                else:
                    del trial[victim]
                    dropped.append(victim)
            if trial is None:
                continue
            run = trial
            self.kept.add(e.key)
            self.kept_until[e.key] = e.run_at + self.min_run
            for key in dropped:
                self.held_back[key] = e.key
            if undone:
                workers = {k: v for k, v in workers.items() if k not in undone}
        return run, workers

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
        refuses = getattr(backend, "refuses", None)
        if instant and not table.stopping:  # nothing is ever deferred: starts after the rest
            starts = []
            free_moves = getattr(backend, "free_moves", False)  # its migrations keep the run training
            for a in actions:
                kind = a.kind
                if kind is PREEMPT:
                    table.preempt_now(a.key, now)
                elif kind is START:
                    starts.append(a)
                elif refuses is not None and self._refused(a, refuses):
                    table.preempt_now(a.key, now)  # (a move the backend refuses is a stop, as below)
                elif kind is MIGRATE and free_moves:
                    backend.moved(table.move(a.key, a.placement, a.group, a.workers, False), a)
                else:
                    backend.restart(table.move(a.key, a.placement, a.group, a.workers), a)
            for a in starts:
                if refuses is None or not self._refused(a, refuses):
                    backend.start(table.start(a.key, a.placement, a.group, now, a.workers), a)
            return
        for a in actions:
            if a.kind is PREEMPT:
                backend.stop(table.stop(a.key, now), a)
        free = None
        if table.stopping:
            moving = {a.key for a in actions if a.kind is not PREEMPT}
            free = self._free(exclude=moving)
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


def _usage(run: dict, nodes: int, followers: frozenset = frozenset()) -> tuple[list, int]:
    """GPUs ``run`` places on each node, and in all (``followers``' placements, a group's members
    but its leader, are not counted: they share their leader's GPUs)."""
    used, total = [0] * nodes, 0
    for key, where in run.items():
        if key in followers:
            continue
        for n, g in where:
            total += g
            if 0 <= n < nodes:
                used[n] += g
    return used, total


def _fits(need: tuple, size: int, used: list, total: int, caps: tuple, limit: int) -> bool:
    return total + size <= limit and all(used[n] + g <= caps[n] for n, g in need)

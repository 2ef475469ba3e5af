"""The scheduling step shared by the simulator and the coordinator: snapshot, decide, plan, act.

``Scheduler.tick()`` reads the time from the injected clock, takes a snapshot of the job
table for its policy, asks the policy to decide, checks the decision (:func:`.plan.plan`) and
hands each action to the backend, updating the table as it goes. A policy that raises, or
whose decision breaks an invariant, costs one decision: the error is logged and reported, the
previous allocation stands, and the changes the policy missed are handed to it again next
time. ``strict=True`` (the simulator's default: a research run should fail loudly) re-raises
instead.
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from ..clock import Clock
from ..errors import PolicyError
from ..policies.api import ClusterSnapshot, Decision, Policy
from .api import Action, ActionKind, Backend
from .plan import plan
from .table import JobTable

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)


class Scheduler:
    """Runs ``policy`` over ``table`` on ``backend``.

    Args:
        strict: re-raise policy failures instead of keeping the previous allocation.
        on_error: called with the PolicyError when a decision fails (e.g. to log an event).
    """

    def __init__(self, policy: Policy, table: JobTable, backend: Backend, clock: Clock, *, strict: bool = False,
                 on_error: Optional[Callable[[PolicyError], None]] = None) -> None:
        self.policy, self.table, self.backend, self.clock = policy, table, backend, clock
        self.strict, self.on_error = strict, on_error
        self.feed = table.subscribe()
        self.wakeup: Optional[float] = None
        self.decisions = 0
        self.failures = 0
        self.last_snapshot: Optional[ClusterSnapshot] = None
        self.deferred: list = []  # starts of the last decision that wait for stopping jobs' GPUs
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

    def act(self, actions: list[Action], now: float) -> None:
        """Preemptions first, then moves, then starts.

        A decision may hand a preempted job's GPUs to another job at once, but real workers take
        seconds to checkpoint and exit, and a stopping job holds its GPUs until they have. So
        while jobs are stopping, a start that does not fit beside the GPUs they hold is deferred
        (the job keeps waiting; the next decision, once the stop completes, places it again), and
        a move that does not fit becomes a stop (the job waits and is placed again). Running
        placements plus held GPUs never exceed a node's capacity. (The simulator's stops complete
        at once, so there nothing is ever deferred.)
        """
        table, backend = self.table, self.backend
        self.deferred = []
        instant = getattr(backend, "instant_stop", False)  # its stops complete at once (the simulator)
        if instant and not table.stopping:  # nothing is ever deferred: starts after the rest
            starts = []
            for a in actions:
                kind = a.kind
                if kind is ActionKind.PREEMPT:
                    table.preempt_now(a.key, now)
                elif kind is ActionKind.START:
                    starts.append(a)
                else:
                    backend.restart(table.move(a.key, a.placement, a.group, a.workers), a)
            for a in starts:
                backend.start(table.start(a.key, a.placement, a.group, now, a.workers), a)
            return
        for a in actions:
            if a.kind is ActionKind.PREEMPT:
                backend.stop(table.stop(a.key, now), a)
        free = None
        if table.stopping:
            moving = {a.key for a in actions if a.kind is not ActionKind.PREEMPT}
            free = self._free(exclude=moving)
        for a in actions:
            if a.kind is ActionKind.PREEMPT or a.kind is ActionKind.START:
                continue
            if free is not None and not self._claim(a, free):
                self.deferred.append(a.key)
                e = table.get(a.key)
                backend.stop(table.stop(a.key, now), Action(ActionKind.PREEMPT, a.key, (), e.placement, e.num_gpu))
                for n, g in e.held:
                    free[n] -= g
                continue
            backend.restart(table.move(a.key, a.placement, a.group, a.workers), a)
        for a in actions:
            if a.kind is ActionKind.START:
                if free is not None and not self._claim(a, free):
                    self.deferred.append(a.key)
                    continue
                backend.start(table.start(a.key, a.placement, a.group, now, a.workers), a)

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
